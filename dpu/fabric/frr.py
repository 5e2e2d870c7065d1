"""FRRouting as dpu's BGP EVPN speaker: its configuration, rendered from dpu's tenants, and its
daemons (zebra + bgpd), run by dpu beside its control socket (docs/fabric.md, "FRR").

- `render()` writes zebra.conf and bgpd.conf as NVUE does for HBN: `frr defaults datacenter`
  (the profile Cumulus Linux and HBN run: keepalive 3 s / hold 9 s, eBGP without a policy
  requirement and with no advertisement delay), `router bgp <asn>` with `no bgp default
  ipv4-unicast` and the peers activated in `address-family l2vpn evpn` with
  `advertise-all-vni`; per tenant `vrf <name> / vni <l3vni>` (zebra) and `router bgp <asn> vrf
  <name>` with `advertise ipv4 unicast` (symmetric IRB, type-5); graceful restart when asked.
- `ManagedFrr` runs the two daemons unmodified, as Debian ships them, several side by side
  (tests/EVPN_LAB.md, "How FRR runs"): each with `-f`, `-i`, `-z`, `--vty_socket` and the
  log in one state directory, `-P 0` (no TCP vty). With the netns VRF backend, zebra runs with
  `-n` in a private mount namespace whose /run/netns holds exactly the tenant namespaces,
  under the tenants' names (zebra takes every file there for a VRF); bgpd joins zebra's
  mount and network namespaces. Both are this process's children (no -d), stopped by stop(),
  by dpu.cleanup on SIGTERM/SIGINT/exit, and their `/var/tmp/frr/<daemon>.<pid>` directories
  removed (zebra leaves its own even on SIGTERM). A start() first ends daemons a previous,
  killed run left on the same state directory.

Nothing here is called from the packet path; every method blocks (vtysh, process waits).
"""
from __future__ import annotations

import contextlib
import glob
import ipaddress
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .. import cleanup
from ..errors import FabricError, InvalidArgumentError
from .shadow import ShadowTenant, validate

FRR_DIR = "/usr/lib/frr"          # Debian's frr package
FRR_USER = "frr"                   # the daemons drop to frr:frr
FRR_TMP = "/var/tmp/frr"          # each daemon makes <daemon>.<pid>/ here
DAEMONS = ("zebra", "bgpd")
CONFS = tuple(f"{d}.conf" for d in DAEMONS)


@dataclass(frozen=True)
class Peer:
    """A BGP neighbour: iBGP (remote_asn None: the local AS) or eBGP (another AS)."""
    address: str
    remote_asn: Optional[int] = None


def _asn_ok(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and 1 <= v <= 0xFFFFFFFF


def render(asn: int, router_id: str, peers: Sequence[Peer], tenants: Sequence[ShadowTenant], *,
           hostname: str = "dpu", graceful_restart: bool = False, redistribute_connected: bool = False,
           timers: Optional[Tuple[int, int]] = None, connect_retry: Optional[int] = None) -> Dict[str, str]:
    """{"zebra.conf": ..., "bgpd.conf": ...} for a dpu host (module docstring).

    redistribute_connected: each tenant VRF also advertises its connected prefixes (the SVI
    subnets) as type-5 routes; timers: (keepalive, hold) in seconds instead of the profile's
    3/9; connect_retry: seconds between connection attempts to a peer."""
    problems: List[str] = []
    if not _asn_ok(asn):
        problems.append(f"asn {asn!r} is not an AS number (1 to 4294967295)")
    try:
        if ipaddress.ip_address(router_id).version != 4:
            problems.append(f"router_id {router_id!r}: a BGP router ID is an IPv4 address")
    except ValueError:
        problems.append(f"router_id {router_id!r} is not an IPv4 address")
    if not isinstance(hostname, str) or not hostname or any(c.isspace() for c in hostname):
        problems.append(f"hostname {hostname!r}: one word expected")
    seen = set()
    for p in peers:
        if not isinstance(p, Peer):
            problems.append(f"peers: {p!r} is not a Peer")
            continue
        try:
            addr = str(ipaddress.ip_address(p.address))
        except ValueError:
            problems.append(f"peer {p.address!r} is not an IP address")
            continue
        if addr in seen:
            problems.append(f"peer {addr} is listed twice")
        seen.add(addr)
        if p.remote_asn is not None and not _asn_ok(p.remote_asn):
            problems.append(f"peer {addr}: remote_asn {p.remote_asn!r} is not an AS number (1 to 4294967295)")
    if timers is not None and not (isinstance(timers, tuple) and len(timers) == 2
                                   and all(isinstance(t, int) and not isinstance(t, bool) for t in timers)
                                   and 1 <= timers[0] <= timers[1] // 3 and timers[1] <= 65535):
        problems.append(f"timers {timers!r}: (keepalive, hold) in seconds, hold at least 3 x keepalive")
    if connect_retry is not None and (isinstance(connect_retry, bool) or not isinstance(connect_retry, int)
                                      or not 1 <= connect_retry <= 65535):
        problems.append(f"connect_retry {connect_retry!r}: seconds, 1 to 65535")
    try:
        tenants = validate(tenants)
    except InvalidArgumentError as e:
        problems.append(str(e))
    if problems:
        raise InvalidArgumentError("\n".join(problems))

    head = ["frr defaults datacenter", f"hostname {hostname}", "log timestamp precision 3", "!"]
    zebra = list(head)
    for t in tenants:
        zebra += [f"vrf {t.name}", f" vni {t.l3vni}", "exit-vrf", "!"]
    bgp = list(head) + [f"router bgp {asn}", f" bgp router-id {router_id}", " no bgp default ipv4-unicast"]
    if graceful_restart:
        bgp += [" bgp graceful-restart", " bgp graceful-restart preserve-fw-state"]
    if timers:
        bgp.append(f" timers bgp {timers[0]} {timers[1]}")
    addrs = [str(ipaddress.ip_address(p.address)) for p in peers]
    for p, addr in zip(peers, addrs):
        bgp.append(f" neighbor {addr} remote-as {p.remote_asn if p.remote_asn is not None else asn}")
        if connect_retry:
            bgp.append(f" neighbor {addr} timers connect {connect_retry}")
    bgp.append(" address-family l2vpn evpn")
    bgp += [f"  neighbor {addr} activate" for addr in addrs]
    bgp += ["  advertise-all-vni", " exit-address-family", "exit", "!"]
    for t in tenants:
        bgp += [f"router bgp {asn} vrf {t.name}", f" bgp router-id {router_id}"]
        if redistribute_connected:
            bgp += [" address-family ipv4 unicast", "  redistribute connected", " exit-address-family"]
        bgp += [" address-family l2vpn evpn", "  advertise ipv4 unicast", " exit-address-family", "exit", "!"]
    return {"zebra.conf": "\n".join(zebra) + "\n", "bgpd.conf": "\n".join(bgp) + "\n"}


def _vty_up(path: str) -> bool:
    """The daemon answers on its vty socket (a connect; one that stays unanswered for a second,
    a daemon whose backlog is full, counts as down rather than blocking the caller)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def missing_tools() -> Optional[str]:
    """What ManagedFrr needs and this machine lacks, as one line naming the package; None if
    nothing is missing."""
    for d in DAEMONS:
        if not os.access(f"{FRR_DIR}/{d}", os.X_OK):
            return f"FRRouting is not installed ({FRR_DIR}/{d} is missing; apt-get install frr)"
    for tool, pkg in (("vtysh", "frr"), ("unshare", "util-linux"), ("nsenter", "util-linux"),
                      ("mount", "mount"), ("ip", "iproute2")):
        if not shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])):
            return f"{tool} is not installed (apt-get install {pkg})"
    try:
        pwd.getpwnam(FRR_USER)
    except KeyError:
        return f"no user {FRR_USER!r} for the FRR daemons (Debian's frr package makes it)"
    return None


def _unreachable(path: str, user: str) -> Optional[str]:
    """The first directory above path that `user` cannot search (the daemons drop to it and
    must reach their state directory), or None."""
    pw = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, pw.pw_gid))
    d = os.path.dirname(path)
    while True:
        try:
            st = os.stat(d)
        except FileNotFoundError:
            st = None                       # made by start(), with mode 0755
        if st is not None:
            bit = 0o100 if st.st_uid == pw.pw_uid else 0o010 if st.st_gid in groups else 0o001
            if not st.st_mode & bit:
                return d
        if d == os.path.dirname(d):
            return None
        d = os.path.dirname(d)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class _Vty:
    """What ManagedFrr and ExternalFrr ask their daemons, through vtysh on the vty sockets in
    self.dir."""

    dir: str
    name: str

    def _ready(self) -> None:
        raise NotImplementedError

    def vtysh(self, command: str) -> Any:
        """One vtysh command against these daemons; its output, parsed when the command ends
        in `json`. FabricError with vtysh's words when it fails."""
        self._ready()
        try:
            r = subprocess.run(["vtysh", "--vty_socket", self.dir, "-c", command], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FabricError(f"{self.name}: vtysh -c {command!r}: {e}") from None
        if r.returncode != 0:
            raise FabricError(f"{self.name}: vtysh -c {command!r} failed (exit status {r.returncode}): "
                              f"{(r.stderr or r.stdout).strip()}")
        if not command.rstrip().endswith("json"):
            return r.stdout
        try:
            return json.loads(r.stdout) if r.stdout.strip() else {}
        except json.JSONDecodeError as e:
            raise FabricError(f"{self.name}: vtysh -c {command!r} did not print JSON ({e}): "
                              f"{r.stdout[:200]}") from None

    def established(self) -> Dict[str, bool]:
        """peer address -> whether its BGP session is Established."""
        return {addr: n.get("bgpState") == "Established"
                for addr, n in self.vtysh("show bgp neighbors json").items() if isinstance(n, dict)}

    def mac_sequences(self) -> Dict[Tuple[int, str], int]:
        """(vni, mac) -> the MAC mobility sequence zebra holds for it (RFC 7432 section 15):
        the remote one for a remote MAC, the local one for a local MAC."""
        out = {}
        for vni, entry in self.vtysh("show evpn mac vni all json").items():
            for mac, m in (entry.get("macs") or {}).items() if isinstance(entry, dict) else ():
                seq = m.get("remoteSequence" if m.get("type") == "remote" else "localSequence")
                if isinstance(seq, int):
                    out[(int(vni), mac)] = seq
        return out

    def vnis(self) -> Set[int]:
        """The VNIs zebra knows (bgpd has told it advertise-all-vni and found their devices)."""
        return {int(v) for v in self.vtysh("show evpn vni json")}


class ManagedFrr(_Vty):
    """zebra and bgpd with their own state directory (module docstring).

    state_dir: configs, pid files, sockets and logs (made if missing, handed to user frr);
    netns: the namespace the daemons run in, the host's underlay (None: this process's);
    vrfs: VRF name -> network namespace, for zebra's netns backend ({}: no -n, kernel VRFs);
    confs: {"zebra.conf": ..., "bgpd.conf": ...}, as render() returns them."""

    def __init__(self, state_dir: str, netns: Optional[str], vrfs: Dict[str, str], confs: Dict[str, str], *,
                 name: str = "frr", start_timeout: float = 30.0):
        self._check(confs, vrfs)
        self.dir = os.path.abspath(state_dir)
        self.netns, self.vrfs, self.confs = netns, dict(vrfs or {}), dict(confs)
        self.name, self.start_timeout = name, start_timeout
        self.procs: Dict[str, subprocess.Popen] = {}
        self.pids: Dict[str, int] = {}           # every daemon started, kept after stop()
        self._cleanup: Optional[cleanup.Cleanup] = None

    @staticmethod
    def _check(confs, vrfs) -> None:
        if not isinstance(confs, dict) or set(confs) != set(CONFS) or \
                not all(isinstance(v, str) for v in confs.values()):
            raise InvalidArgumentError(f"confs: expected {{{', '.join(map(repr, CONFS))}}} with the configuration "
                                       f"texts (render() makes them), got {sorted(confs) if isinstance(confs, dict) else confs!r}")
        for vrf, ns in (vrfs or {}).items():
            if not isinstance(vrf, str) or not vrf or "/" in vrf or vrf in (".", ".."):
                raise InvalidArgumentError(f"vrfs: {vrf!r} is not a VRF name")
            if not isinstance(ns, str) or not ns or "/" in ns:
                raise InvalidArgumentError(f"vrfs: {vrf}: {ns!r} is not a network namespace name")

    # -- life cycle

    def start(self) -> None:
        """Starts zebra, then bgpd, each waited for until its vty socket answers; FabricError
        naming the daemon and the end of its log if one fails (both are stopped then)."""
        if self.procs:
            raise FabricError(f"{self.name}: already started (stop() first)")
        missing = missing_tools()
        if missing:
            raise FabricError(f"{self.name}: {missing}")
        blocked = _unreachable(self.dir, FRR_USER)
        if blocked:
            raise FabricError(f"{self.name}: the FRR daemons run as user {FRR_USER}, who cannot reach the state "
                              f"directory {self.dir}: {blocked} is mode {os.stat(blocked).st_mode & 0o777:04o}")
        for vrf, ns in self.vrfs.items():
            if not os.path.exists(f"/run/netns/{ns}"):
                raise FabricError(f"{self.name}: VRF {vrf}: network namespace {ns!r} does not exist")
        if self.netns is not None and not os.path.exists(f"/run/netns/{self.netns}"):
            raise FabricError(f"{self.name}: network namespace {self.netns!r} does not exist")
        self._reap_previous()
        self._write()
        with cleanup.deferred():
            self._cleanup = cleanup.register(self._stop)
        try:
            self._spawn("zebra", self._zebra_cmd())
            self._spawn("bgpd", ["nsenter", f"--target={self.procs['zebra'].pid}", "--mount", "--net"]
                        + self._args("bgpd"))
        except BaseException:
            self.stop()
            raise

    def _args(self, daemon: str) -> List[str]:
        d = self.dir
        return [f"{FRR_DIR}/{daemon}", "-P", "0", "-f", f"{d}/{daemon}.conf", "-i", f"{d}/{daemon}.pid",
                "-z", f"{d}/zserv.api", "--vty_socket", d, "--log", f"file:{d}/{daemon}.log"]

    def _zebra_cmd(self) -> List[str]:
        """zebra in a private mount namespace whose /run/netns shows each VRF's namespace under
        the VRF's name; `ip netns exec`, `unshare` and `sh` all exec, so the pid is zebra's."""
        script = ["set -e"]
        if self.vrfs:
            for vrf, ns in self.vrfs.items():
                script.append(f"mount --bind {shlex.quote('/run/netns/' + ns)} {shlex.quote(self.dir + '/vrfs/' + vrf)}")
            script.append(f"mount --rbind {shlex.quote(self.dir + '/vrfs')} /run/netns")
        script.append("exec " + " ".join(map(shlex.quote, self._args("zebra") + (["-n"] if self.vrfs else []))))
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
        return (["ip", "netns", "exec", self.netns] + cmd) if self.netns else cmd

    def _write(self) -> None:
        """The state directory: the configs, empty files for the VRF bind mounts, no stale
        sockets or pid files; everything owned by frr."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            for f in glob.glob(f"{self.dir}/*.vty") + glob.glob(f"{self.dir}/*.pid") + [f"{self.dir}/zserv.api"]:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f)
            for conf, text in self.confs.items():
                with open(f"{self.dir}/{conf}", "w") as f:
                    f.write(text)
            shutil.rmtree(f"{self.dir}/vrfs", ignore_errors=True)
            if self.vrfs:
                os.makedirs(f"{self.dir}/vrfs")
                for vrf in self.vrfs:
                    open(f"{self.dir}/vrfs/{vrf}", "w").close()
            for root, dirs, files in os.walk(self.dir):
                for n in [root] + [os.path.join(root, f) for f in dirs + files]:
                    shutil.chown(n, FRR_USER, FRR_USER)
        except OSError as e:
            raise FabricError(f"{self.name}: preparing {self.dir}: {e.strerror or e}") from None

    def _spawn(self, daemon: str, cmd: List[str]) -> None:
        with open(f"{self.dir}/{daemon}.out", "wb") as out, cleanup.deferred():
            self.procs[daemon] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            self.pids[daemon] = self.procs[daemon].pid
        deadline = time.monotonic() + self.start_timeout
        while not _vty_up(f"{self.dir}/{daemon}.vty"):
            if self.procs[daemon].poll() is not None:
                raise FabricError(f"{self.name}: {daemon} exited with status {self.procs[daemon].returncode} "
                                  f"while starting: {self.tail(daemon) or '(no output)'}")
            if time.monotonic() > deadline:
                raise FabricError(f"{self.name}: {daemon} did not open {self.dir}/{daemon}.vty within "
                                  f"{self.start_timeout:.0f} s: {self.tail(daemon) or '(no output)'}")
            time.sleep(0.02)

    def tail(self, daemon: str, lines: int = 10) -> str:
        """The end of a daemon's output and log, for error messages."""
        text = []
        for suffix in ("out", "log"):
            with contextlib.suppress(OSError), open(f"{self.dir}/{daemon}.{suffix}", errors="replace") as f:
                text += f.readlines()[-lines:]
        return " | ".join(line.strip() for line in text if line.strip())

    def _reap_previous(self) -> None:
        """Daemons a killed run left on this state directory (their pid file names a process
        whose command line names the directory) are ended, and their /var/tmp/frr dirs go."""
        for daemon in DAEMONS:
            try:
                with open(f"{self.dir}/{daemon}.pid") as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if self.dir in _cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while _cmdline(pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
            shutil.rmtree(f"{FRR_TMP}/{daemon}.{pid}", ignore_errors=True)

    def stop(self) -> None:
        """bgpd, then zebra: SIGTERM, SIGKILL after 10 s; then their /var/tmp/frr/<d>.<pid>
        directories, pid files and sockets. Idempotent; the configs and logs stay."""
        if self._cleanup is not None and self._cleanup.pending:
            self._cleanup.run()
        else:
            self._stop()

    def _stop(self) -> None:
        for daemon in reversed(DAEMONS):
            p = self.procs.pop(daemon, None)
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            shutil.rmtree(f"{FRR_TMP}/{daemon}.{p.pid}", ignore_errors=True)
        for f in glob.glob(f"{self.dir}/*.vty") + glob.glob(f"{self.dir}/*.pid") + [f"{self.dir}/zserv.api"]:
            with contextlib.suppress(OSError):
                os.remove(f)

    def alive(self) -> bool:
        """Both daemons run."""
        return all(d in self.procs and self.procs[d].poll() is None for d in DAEMONS)

    def _ready(self) -> None:
        if not self.procs:
            raise FabricError(f"{self.name}: not running (start() first)")

    def reload(self, confs: Dict[str, str], vrfs: Optional[Dict[str, str]] = None) -> None:
        """Applies new configurations (and VRF namespaces). FRR 8.4 cannot add a netns VRF to
        a running zebra (its /run/netns is fixed when it starts) and has no reload that keeps
        sessions for every change, so dpu restarts both daemons: sessions reset (peers keep
        the routes with graceful restart) and zebra forgets the neighbours, so call
        Shadow.resignal() afterwards. Nothing happens when nothing changed."""
        vrfs = self.vrfs if vrfs is None else dict(vrfs)
        self._check(confs, vrfs)
        if dict(confs) == self.confs and vrfs == self.vrfs and self.alive():
            return
        self.stop()
        self.confs, self.vrfs = dict(confs), vrfs
        self.start()


class ExternalFrr(_Vty):
    """An operator's FRR (``evpn: frr: external``): dpu neither starts nor stops it, and finds
    it by what it leaves in its run directory (Debian's: /var/run/frr): the pid files
    zebra.pid and bgpd.pid and the vty sockets zebra.vty and bgpd.vty.

    zebra reads static MACs when it starts, but not the permanent neighbours already there:
    the owner re-signals them (Shadow.resignal) once a new zebra knows the VNIs (vnis())."""

    def __init__(self, run_dir: str, *, name: str = "frr") -> None:
        self.dir, self.name = os.path.abspath(run_dir), name

    def pid(self, daemon: str) -> Optional[int]:
        """The daemon's pid when its pid file names a live process and its vty answers."""
        try:
            with open(f"{self.dir}/{daemon}.pid") as f:
                pid = int(f.read().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid if _vty_up(f"{self.dir}/{daemon}.vty") else None

    def alive(self) -> bool:
        """Both daemons run and answer."""
        return all(self.pid(d) is not None for d in DAEMONS)

    def _ready(self) -> None:
        down = [d for d in DAEMONS if self.pid(d) is None]
        if down:
            raise FabricError(f"{self.name}: the operator's FRR is not running: no live {' or '.join(down)} "
                              f"with its pid file and vty socket in {self.dir}")

