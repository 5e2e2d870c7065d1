"""Shared fixtures: skips that say why, and small helpers; and, before any test is collected,
the tools the suite uses (tools/system_deps.py, the list .ci/run installs from too).

As root the session installs the Debian packages that are missing, and rebuilds the core in
place when it was built without AF_XDP and libxdp is here now (both before a test imports
dpu._core); DPU_TEST_INSTALL=0 turns both off. Otherwise, and when either fails, the run ends
with one line saying what to install or rebuild: the tests that need it skip with a reason.
"""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The one place the tests directory goes on sys.path: test modules import the shared
# helpers package (tests/helpers) and the labs (tests/netns.py, ...) by name, whatever
# pytest's import mode. A child interpreter gets it through PYTHONPATH (helpers.child_env).
if HERE not in sys.path:
    sys.path.insert(0, HERE)
_NOTES = []  # lines for the end of the run

# A shell without job control starts a command run with & with SIGINT and SIGQUIT ignored, and
# the children the tests start (and signal) would inherit that: a Python child then installs no
# KeyboardInterrupt handler and dpu's cleanup rightly leaves an ignored signal alone. The suite
# takes them back (an interrupt of the run itself is then a KeyboardInterrupt, as pytest expects).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_configure(config):
    config.addinivalue_line("markers", "netns: needs root and network namespaces")
    config.addinivalue_line("markers", "tshark: needs tshark")
    _prepare_system()


@pytest.hookimpl(trylast=True)        # under the durations table: the line above pytest's summary
def pytest_terminal_summary(terminalreporter):
    for line in _NOTES:
        terminalreporter.write_line(line, yellow=True)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _system_deps():
    """tools/system_deps.py, or None in a tree without it (the tests copied alone)."""
    path = os.path.join(ROOT, "tools", "system_deps.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("dpu_system_deps", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_tail(cmd, **kw) -> str:
    """Runs cmd with its output kept; returns "" on success, else the end of the output."""
    with tempfile.TemporaryFile("w+") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, **kw)
        log.seek(0)
        return "" if r.returncode == 0 else (log.read()[-1500:] or f"exit status {r.returncode}")


def _core_build():
    """(path of dpu._core, its IO_BACKENDS) as the tests will import it, asked of a child so that
    this process does not map a file a rebuild may replace; None when it does not import."""
    r = subprocess.run([sys.executable, "-c", "import dpu._core as c; print(c.__file__); print(*c.IO_BACKENDS)"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    path, backends = (r.stdout.splitlines() + ["", ""])[:2]
    return path, backends.split()


def _prepare_system() -> None:
    deps = _system_deps()
    if deps is None:
        return
    may = os.geteuid() == 0 and os.environ.get("DPU_TEST_INSTALL", "1") != "0" and shutil.which("apt-get")
    needs = deps.missing()
    if needs and may:
        _say(f"dpu tests: installing {' '.join(deps.packages(needs))} with apt-get (as root; DPU_TEST_INSTALL=0 "
             "to skip)")
        with tempfile.TemporaryFile("w+") as log:
            if deps.install(needs, out=log) != 0:
                log.seek(0)
                _say(log.read()[-1500:])
        needs = deps.missing()
    line = deps.hint(needs)
    if line:
        _NOTES.append(line)
    _check_afxdp(deps, bool(may))


def _check_afxdp(deps, may_rebuild: bool) -> None:
    """The core lacks AF_XDP while libxdp is here now (installed after the core was built)."""
    built = _core_build()
    if built is None or "afxdp" in built[1] or not deps.present("pkg-config:libxdp libbpf"):
        return
    in_place = os.path.dirname(os.path.realpath(built[0])) == os.path.realpath(os.path.join(ROOT, "dpu"))
    why = "the core was built without AF_XDP and libxdp is installed now"
    if not in_place:
        _NOTES.append(f"dpu tests: {why}; test_afxdp.py skips: reinstall dpu to build it")
        return
    # --force: the sources have not changed since the build without it, only what pkg-config finds
    rebuild = ["setup.py", "build_ext", "--inplace", "--force"]
    if may_rebuild and not os.environ.get("DPU_NO_AFXDP"):
        _say(f"dpu tests: {why}: rebuilding it (python3 {' '.join(rebuild)}, a few minutes)")
        err = _run_tail([sys.executable, *rebuild], cwd=ROOT)
        built = _core_build()
        if not err and built is not None and "afxdp" in built[1]:
            return
        _say(err or "dpu tests: the rebuilt core has no AF_XDP either")
    _NOTES.append(f"dpu tests: {why}; test_afxdp.py skips: rebuild it with `python3 {' '.join(rebuild)}`")


@pytest.fixture
def tshark():
    path = shutil.which("tshark")
    if not path:
        pytest.skip("tshark is not installed (apt-get install tshark; CI installs it)")
    return path


def can_netns() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    r = subprocess.run(["ip", "netns", "add", "dpu-probe"], capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", "dpu-probe"], capture_output=True)
    return True


@pytest.fixture(scope="session")
def netns_ok():
    if not can_netns():
        pytest.skip("needs root and network namespaces (CI runs as root)")
    return True


@pytest.fixture
def run_python():
    """Runs Python code in a child interpreter with this checkout importable: for
    what could crash or bloat the test process. Asserts a zero exit status and
    returns the child's stdout."""
    def run(code: str, timeout: int = 120) -> str:
        env = {**os.environ, "PYTHONPATH": ROOT}
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=env)
        assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
        return r.stdout
    return run


@pytest.fixture(scope="session")
def ovs():
    """One Open vSwitch (ovs_oracle.OvsOracle) with ports p1..p4 for the session,
    or a skip that says what is missing."""
    from ovs_oracle import OvsOracle, missing_reason

    why = missing_reason()
    if why:
        pytest.skip(why)
    o = OvsOracle(["p1", "p2", "p3", "p4"]).start()
    try:
        yield o
    finally:
        o.stop()
