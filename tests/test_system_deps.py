"""tools/system_deps.py, the one list of Debian packages the suite uses: what it reports missing,
what it would run to install it, and the one line a test session ends with when something is
missing. Each child runs with a PATH that holds only this Python's directory, so the tools in
/usr/bin (tshark, tcpdump, ping, setpriv, pkg-config) are missing whatever this machine has."""
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "tools", "system_deps.py")
BARE = {**os.environ, "PATH": os.path.dirname(sys.executable)}


def run(*args, env=BARE):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _deps():
    spec = importlib.util.spec_from_file_location("system_deps", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Missing under BARE on any machine; what is in /usr/sbin (ip, ethtool, ovs-vswitchd) is found there.
IN_USR_BIN = ["tshark", "tcpdump", "ping", "setpriv", "libxdp libbpf"]


def test_missing_tools_are_one_line_with_the_packages_to_install():
    r = run(SCRIPT)
    assert r.returncode == 1, r.stderr
    (line,) = r.stdout.splitlines()
    m = re.fullmatch(r"dpu tests: missing (.+), so their tests skip: `apt-get install ([^`]+)` as root \(Debian names\); "
                     r"a test run as root installs them itself unless DPU_TEST_INSTALL=0", line)
    assert m, line
    names = m.group(1).split(", ")
    assert [n for n in names if n in IN_USR_BIN] == IN_USR_BIN, names
    packages = {w.split(":", 1)[-1]: pkgs for w, pkgs, _ in _deps().NEEDS}
    assert m.group(2).split() == [p for n in names for p in packages[n]], line


def test_install_plan_answers_debconf_then_updates_once_then_installs():
    r = run(SCRIPT, "install", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if not line.startswith("write /usr/sbin/policy-rc.d")]
    assert lines[0] == "debconf-set-selections <<< 'wireshark-common wireshark-common/install-setuid boolean false'"
    assert lines[1] == "apt-get update -qq"
    assert lines[2].startswith("apt-get install -y -qq "), lines[2]
    wanted = {"tshark", "tcpdump", "iputils-ping", "util-linux", "pkg-config", "libxdp-dev", "libbpf-dev"}
    assert wanted <= set(lines[2].split()[4:]), lines[2]
    assert len(lines) == 3, lines


def test_bad_arguments_are_a_usage_line():
    r = run(SCRIPT, "uninstall")
    assert r.returncode == 2 and r.stdout == "" and r.stderr == "usage: system_deps.py [install [--dry-run]]\n"


def test_a_test_session_ends_with_the_line_naming_what_to_install(tmp_path):
    """The session's own conftest, installing nothing (DPU_TEST_INSTALL=0, as a user without root
    gets): the run passes and its output ends, above pytest's summary, with the one line."""
    r = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"),
            "tests/test_topology_strict.py::test_anchors_without_aliases_are_harmless",
            env={**BARE, "DPU_TEST_INSTALL": "0"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    hints = [line for line in lines if line.startswith("dpu tests:")]
    assert len(hints) == 1 and hints[0] == lines[-2], lines
    assert hints[0].startswith("dpu tests: missing tshark,") and "apt-get install tshark " in hints[0], hints
    assert lines[-1].startswith("1 passed"), lines


def test_without_root_the_line_also_says_the_namespace_tests_skip():
    deps = _deps()
    assert deps.hint([], root=True) is None
    assert deps.hint([], root=False) == ("dpu tests: not root, so the network-namespace tests skip: run the tests as "
                                         "root for the whole suite")
    tshark = [n for n in deps.NEEDS if n[0] == "tshark"]
    line = deps.hint(tshark, root=False)
    assert line.startswith("dpu tests: missing tshark, so their tests skip: `apt-get install tshark` as root"), line
    assert line.endswith("or run the tests as root: that installs them, and runs the network-namespace tests"), line
