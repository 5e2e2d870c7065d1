"""The source distribution carries what building and testing it needs; the
package says what it is (license, classifiers); the README's Building commands
(`python3 setup.py ...`) work in the environment its install line makes."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv

import pytest
from helpers import core_levels

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    if not os.access(ROOT, os.W_OK):
        pytest.skip("setup.py sdist writes dpu.egg-info into the checkout, which this user cannot write")
    out = tmp_path_factory.mktemp("sdist")
    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = out.iterdir()
    with tarfile.open(path) as tf:
        return {"/".join(m.split("/")[1:]) for m in tf.getnames()}


def test_sdist_has_sources_tests_and_their_data(sdist):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: nothing to compare the sdist with")
    wanted = [f for f in tracked if f.startswith(("native/", "dpu/", "tests/", "examples/", "pcap/", "docs/", "bench/",
                                                  "tools/"))]
    missing = [f for f in wanted if f not in sdist]
    assert not missing, missing
    for f in ("LICENSE", "README.md", "setup.py", "pyproject.toml", ".ci/run"):
        assert f in sdist, f
    assert not [f for f in sdist if f.endswith((".so", ".o"))]
    assert not [f for f in sdist if f.startswith(".ci/venv")]  # CI's own venv, there while CI runs this


def test_metadata_names_license_and_platform():
    r = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; md = m.metadata('dpu'); "
                        "print(md.get('License')); print('\\n'.join(md.get_all('Classifier') or []))"],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert "Apache-2.0" in r.stdout
    assert "Operating System :: POSIX :: Linux" in r.stdout


def test_debug_build_compiles(tmp_path):
    """README, Building: DPU_DEBUG=1 builds both extensions under ASan and UBSan, at -O0,
    where nothing is constant-folded (a __builtin_prefetch whose read/write argument was a
    variable built at -O3 only). Built into a temporary directory, not over the real one."""
    cpu = core_levels()
    best = cpu.best(cpu.cpu_flags()).name  # one level of the core is enough to see it compile
    env = {**os.environ, "DPU_DEBUG": "1", "DPU_CORE_VARIANTS": best}
    if shutil.which("ccache"):  # as test_wheel: what changed is compiled again, and a failure is never cached
        env.update(CC="ccache gcc", CXX="ccache g++", CCACHE_BASEDIR=os.path.abspath(ROOT), CCACHE_NOHASHDIR="1")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp", str(tmp_path / "temp"),
                        "--build-lib", str(tmp_path / "lib")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    built = [p.name for p in (tmp_path / "lib" / "dpu").iterdir()]
    assert any(n.startswith(f"_core_{best}.") and n.endswith(".so") for n in built), built


def test_sdist_needs_only_setuptools(tmp_path):
    """The README's venv before anything is installed in it (Python 3.11's venv brings pip and
    setuptools, nothing else): `setup.py sdist` makes the sdist; pybind11, Cython and numpy are
    asked for only by a build."""
    venv.EnvBuilder(with_pip=True).create(tmp_path / "v")
    py = str(tmp_path / "v" / "bin" / "python")
    if subprocess.run([py, "-c", "import setuptools"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "setuptools"], capture_output=True, timeout=300)
    for m in ("pybind11", "Cython", "numpy"):
        assert subprocess.run([py, "-c", f"import {m}"], capture_output=True).returncode != 0, m
    r = subprocess.run([py, "setup.py", "-q", "sdist", "-d", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = (tmp_path / "out").iterdir()
    with tarfile.open(path) as tf:
        names = {"/".join(m.split("/")[1:]) for m in tf.getnames()}
    assert {"setup.py", "dpu/_gen.pyx", "dpu/_core.py", "dpu/_cpu.py", "native/bindings/module.cc"} <= names
    r = subprocess.run([py, "setup.py", "-q", "build_ext"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "setup.py: pybind11, Cython, numpy not installed" in r.stderr.strip().splitlines()[-1], r.stderr


def test_a_build_without_libxdp_headers_says_so(tmp_path):
    """pkg-config finds no libxdp (as on a host without libxdp-dev): the build says, in one
    warning line, that AF_XDP is left out and what to install, instead of `--io afxdp` saying
    it later (a dry run: the line comes before anything is compiled)."""
    env = {**os.environ, "PKG_CONFIG_LIBDIR": str(tmp_path), "PKG_CONFIG_PATH": str(tmp_path)}
    env.pop("DPU_NO_AFXDP", None)
    r = subprocess.run([sys.executable, "setup.py", "-q", "--dry-run", "build_ext", "--build-temp", str(tmp_path / "t"),
                        "--build-lib", str(tmp_path / "l")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("setup.py: warning:")]
    assert "no AF_XDP" in line and "libxdp-dev libbpf-dev" in line, line


def _names(requirements) -> set:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-") for r in requirements}


def test_test_extra_brings_the_build_requirements():
    """`pip install -e '.[test]'` builds in an isolated environment and keeps none of it: the
    README's `python3 setup.py build_ext --inplace` / `sdist` (and the tests that run them) then
    found no pybind11 in a fresh venv. The test extra brings every build requirement."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    build = _names(pyproject["build-system"]["requires"])
    test = _names(pyproject["project"]["optional-dependencies"]["test"])
    assert build - test == set(), f"build requirements missing from the test extra: {sorted(build - test)}"


def test_setup_py_without_its_requirements_says_what_to_install(tmp_path):
    """setup.py run by a Python that has none of the build requirements (a venv without pip:
    no setuptools, no pybind11) ends in one line naming them and how to get them."""
    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    r = subprocess.run([str(tmp_path / "bare" / "bin" / "python"), "setup.py", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("setup.py: ") and "pybind11" in line and "setuptools" in line, line
    assert "pip install -e '.[test]'" in line, line


def test_ci_runs_the_readmes_commands():
    """.ci/run runs the README's first two lines as written, so CI tries what a new user tries."""
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"```sh\n(.*?)```", f.read(), re.S).group(1)
    readme = [line.split(" #")[0].strip() for line in block.strip().splitlines()]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f]
    at = next(i for i, line in enumerate(lines) if line.startswith("# The README's two commands"))
    assert lines[at + 1:at + 3] == readme


def test_the_demo_names_the_live_io_built(tmp_path):
    """The README's install line ends with `dpu demo`: its last line says which live I/O backends
    this build has and, when AF_XDP was left out (no libxdp at build time), how to get it.
    IO_BACKENDS is checked against the binary: one built with AF_XDP names libxdp.so.1, which it
    opens when asked for AF_XDP, and links neither it nor libbpf (test_wheel.py)."""
    import dpu._core

    with open(dpu._core.__file__, "rb") as f:
        links_libxdp = b"libxdp.so.1" in f.read()
    assert ("afxdp" in dpu._core.IO_BACKENDS) == links_libxdp, dpu._core.IO_BACKENDS
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "demo", "--packets", "2000", "--out-dir", str(tmp_path / "d")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    if links_libxdp:
        assert last == "Live I/O built (dpu run --io): afpacket, afxdp"
    else:
        assert last.startswith("Live I/O built (dpu run --io): afpacket only;") and "libxdp-dev" in last, last
