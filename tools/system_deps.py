#!/usr/bin/env python3
"""The Debian packages dpu's test suite needs, listed once, and how to get them.

Two callers: .ci/run (as root on a clean Debian 12, before it makes its venv) and the test
session (tests/conftest.py: as root it installs what is missing before the tests are collected;
otherwise it ends the run with one line saying what to install). A test whose tool is missing
skips with that reason, so nothing here is needed to run the suite, only to run all of it.

    python3 tools/system_deps.py                     # one line: what is missing (exit 1 if anything)
    python3 tools/system_deps.py install [--dry-run] # as root: apt-get install it (--dry-run: print the plan)

Installing follows what a clean machine needs: debconf answers wireshark-common's question
(no setuid dumpcap) so the install asks nothing; a policy-rc.d that says "don't" (exit 101)
keeps openvswitch-switch from starting the system's ovs-vswitchd, which would want the kernel
module (the tests start their own in a temporary directory); apt-get update runs once.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence, Tuple

# What the suite looks for -> the Debian packages that bring it. "pkg-config:A B" is a set of
# pkg-config modules, "python:M" a module of the running Python, anything else a program.
NEEDS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("tshark", ("tshark",), "decodes what dpu writes with checksum validation"),
    ("tcpdump", ("tcpdump",), "captures in the kernel-interop tests"),
    ("ip", ("iproute2",), "network namespaces, veth and vxlan devices"),
    ("ethtool", ("ethtool",), "offloads and queue counts in the live tests"),
    ("ping", ("iputils-ping",), "reachability in the live tests"),
    ("sysctl", ("procps",), "settings inside the test namespaces"),
    ("setpriv", ("util-linux",), "dpu run without CAP_NET_RAW"),
    ("ovs-vswitchd", ("openvswitch-switch",), "Open vSwitch as the oracle (test_ovs_compat.py)"),
    ("vtysh", ("frr",), "FRRouting, the fabric's BGP EVPN speaker (test_fabric_*.py, test_evpn_lab.py)"),
    ("nft", ("nftables",), "the uplink's VXLAN guard (dpu run with evpn:)"),
    ("pkg-config:libxdp libbpf", ("pkg-config", "libxdp-dev", "libbpf-dev"),
     "the AF_XDP backend (--io afxdp), found when the core is built"),
    ("python:ensurepip", ("python3-venv",), "python3 -m venv, for CI's own environment"),
    ("man", ("man-db",), "renders docs/dpu.1 (test_completion_manpage.py)"),
    ("groff", ("groff",), "checks docs/dpu.1 for warnings (test_completion_manpage.py)"),
    ("zsh", ("zsh",), "checks the syntax of `dpu completion zsh`"),
)

SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")  # a user's PATH often lacks them
POLICY_RC_D = "/usr/sbin/policy-rc.d"
DEBCONF = "wireshark-common wireshark-common/install-setuid boolean false\n"


def present(what: str) -> bool:
    """Whether ``what`` (an entry of NEEDS) is on this machine."""
    if what.startswith("python:"):
        return importlib.util.find_spec(what[len("python:"):]) is not None
    if what.startswith("pkg-config:"):
        if not shutil.which("pkg-config"):
            return False
        return subprocess.run(["pkg-config", "--exists", *what[len("pkg-config:"):].split()]).returncode == 0
    return bool(shutil.which(what) or any(os.access(os.path.join(d, what), os.X_OK) for d in SBIN))


def missing() -> List[Tuple[str, Tuple[str, ...], str]]:
    """The entries of NEEDS that are not on this machine."""
    return [n for n in NEEDS if not present(n[0])]


def packages(needs: Sequence[Tuple[str, Tuple[str, ...], str]]) -> List[str]:
    return [p for _, pkgs, _ in needs for p in pkgs]


def hint(needs: Sequence[Tuple[str, Tuple[str, ...], str]], root: Optional[bool] = None) -> Optional[str]:
    """One line for the end of a test run: what is missing and the command that installs it, and,
    without root (``root`` defaults to this process's), that the namespace tests skip as well;
    None when nothing is left out."""
    if root is None:
        root = os.geteuid() == 0
    if not needs:
        return None if root else ("dpu tests: not root, so the network-namespace tests skip: run the tests as root "
                                  "for the whole suite")
    what = ", ".join(w.split(":", 1)[-1] for w, _, _ in needs)
    line = f"dpu tests: missing {what}, so their tests skip: `apt-get install {' '.join(packages(needs))}` as root"
    if root:
        return line + " (Debian names); a test run as root installs them itself unless DPU_TEST_INSTALL=0"
    return line + " (Debian names), or run the tests as root: that installs them, and runs the network-namespace tests"


def plan(needs: Sequence[Tuple[str, Tuple[str, ...], str]]) -> List[Tuple[List[str], Optional[str]]]:
    """The commands that install ``needs`` on Debian, in order, each with its standard input."""
    pkgs = packages(needs)
    cmds: List[Tuple[List[str], Optional[str]]] = []
    if "tshark" in pkgs:
        cmds.append((["debconf-set-selections"], DEBCONF))
    return cmds + [(["apt-get", "update", "-qq"], None), (["apt-get", "install", "-y", "-qq", *pkgs], None)]


def install(needs: Sequence[Tuple[str, Tuple[str, ...], str]], dry_run: bool = False, out=None) -> int:
    """Installs ``needs`` with apt-get (root only); returns 0 when all of them are there after.
    The commands' output goes to ``out`` (a file; None: this process's)."""
    if not needs:
        return 0
    stop_rc = "openvswitch-switch" in packages(needs) and not os.path.exists(POLICY_RC_D)
    if dry_run:
        if stop_rc:
            print(f"write {POLICY_RC_D} (exit 101: packages start no service), removed after")
        for cmd, stdin in plan(needs):
            print(" ".join(cmd) + (f" <<< '{stdin.strip()}'" if stdin else ""))
        return 0
    if os.geteuid() != 0:
        print(hint(needs, root=False), file=sys.stderr)
        return 1
    if not shutil.which("apt-get"):
        print(f"dpu: no apt-get here: install what these Debian packages bring: {' '.join(packages(needs))}",
              file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if stop_rc:
            with open(POLICY_RC_D, "w") as f:
                f.write("#!/bin/sh\nexit 101\n")
            os.chmod(POLICY_RC_D, 0o755)
        for cmd, stdin in plan(needs):
            r = subprocess.run(cmd, input=stdin, text=True, env=env, stdout=out, stderr=out)
            if r.returncode != 0 and cmd[0] == "apt-get":
                print(f"dpu: `{' '.join(cmd)}` failed (exit status {r.returncode})", file=sys.stderr)
                return 1
    finally:
        if stop_rc and os.path.exists(POLICY_RC_D):
            os.remove(POLICY_RC_D)
    left = [w for w, _, _ in needs if not present(w)]
    if left:
        print(f"dpu: still missing after apt-get install: {', '.join(left)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    dry_run = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    if args not in ([], ["install"]) or (dry_run and not args):
        print("usage: system_deps.py [install [--dry-run]]", file=sys.stderr)
        return 2
    needs = missing()
    if args == ["install"]:
        if not dry_run:
            print(f"system_deps: installing {' '.join(packages(needs))}" if needs else
                  "system_deps: every tool the suite uses is installed", flush=True)
        return install(needs, dry_run)
    line = hint(needs, root=True)
    print(line or "dpu tests: every tool the suite uses is installed")
    return 1 if line else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
