"""Network namespaces, veth, the kernel's vxlan driver and packet captures for interop tests.

Two namespaces per `KernelVtep`, both named uniquely for this process so that parallel or
aborted runs never collide:

    <fab ns>  wire  ==== veth ====  uplink  <kern ns>  +  vxlan device "vx<vni>"

- the *kern* namespace is a remote VTEP run by Linux's own vxlan driver (our peer);
- the *fab* namespace holds the other end of the wire, where the test plays dpu's uplink:
  it injects dpu's frames (`send`) and captures what the kernel sends back
  (`capture_wire`; `capture_uplink`/`capture_overlay` look inside the kernel VTEP).
  It has no addresses and forwarding is off, so it never answers or routes anything,
  and nothing reaches the root namespace.

Nothing here loads modules or touches the root namespace's links. Everything is torn down
by `close()` (ending the processes in the namespaces, captures included, then deleting them,
which destroys their links), and the same happens at exit and on SIGTERM, SIGINT or SIGHUP
(dpu.cleanup); `reap_stale()` removes namespaces left behind by runs whose process is gone
(killed by SIGKILL).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time

from dpu import cleanup

PREFIX = "dpui"                       # namespace names: dpui-<pid>-<n>-{fab,kern}
_counter = itertools.count()
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
ETH_P_ALL = 0x0003
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x00000017


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def ip(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "-n", ns, *args, check=check)


def nsexec(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *args, check=check)


def sysctl(ns: str, key: str, value, check: bool = True) -> None:
    nsexec(ns, "sysctl", "-q", "-w", f"{key}={value}", check=check)


@contextlib.contextmanager
def in_netns(ns: str):
    """Run the block with this thread in namespace `ns`; sockets made there stay there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(target, _CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({ns}): {os.strerror(e)}")
        try:
            yield
        finally:
            if _libc.setns(own, _CLONE_NEWNET) != 0:   # never leave the thread elsewhere
                e = ctypes.get_errno()
                raise OSError(e, f"setns(back): {os.strerror(e)}")
    finally:
        os.close(target)
        os.close(own)


def socket_in(ns: str, family: int, type_: int, proto: int = 0) -> socket.socket:
    with in_netns(ns):
        return socket.socket(family, type_, proto)


def tx_checksum_offload(ns: str, ifname: str, on: bool) -> None:
    """`ethtool -K IF tx on|off` without ethtool (legacy ETHTOOL_STXCSUM ioctl).

    veth hands CHECKSUM_PARTIAL skbs to its peer without filling the checksum in, so a
    capture after a veth shows half-done checksums no real NIC would send. Turning tx
    checksum offload off on the kernel VTEP's uplink makes the stack finish every
    checksum (outer and, for locally generated traffic, inner) before the "wire".
    """
    s = socket_in(ns, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ev = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_STXCSUM, 1 if on else 0))
        ifr = struct.pack("16sP", ifname.encode(), ctypes.addressof(ev)).ljust(40, b"\0")
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
    finally:
        s.close()


ETHTOOL_OFFLOADS = {"rx": 0x15, "tx": 0x17, "sg": 0x19, "tso": 0x1F, "gso": 0x24, "gro": 0x2C}


def set_offloads(ns: str, ifname: str, on: bool = False, which=("tx", "tso", "gso", "gro")) -> None:
    """`ethtool -K IF tx off tso off gso off gro off` without ethtool (legacy ioctls).

    With segmentation offloads on, a capture on a veth sees 64 KB super-packets
    and half-done checksums that never existed on a wire; off, it sees what a
    NIC would have sent."""
    s = socket_in(ns, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for k in which:
            ev = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_OFFLOADS[k], 1 if on else 0))
            ifr = struct.pack("16sP", ifname.encode(), ctypes.addressof(ev)).ljust(40, b"\0")
            try:
                fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
            except OSError:
                pass  # not every offload can be changed on every device
    finally:
        s.close()


class HostPair:
    """Two namespaces ("a", "b") joined by a veth pair, each with an address
    and an on-link route to the other's subnet, offloads off: two real Linux
    hosts whose conversation a capture on a.veth records as a wire would."""

    def __init__(self, a_ip: str, b_ip: str, a_mac: str, b_mac: str, prefix: int = 24):
        n = next(_counter)
        self.a, self.b = f"{PREFIX}-{os.getpid()}-{n}-fab", f"{PREFIX}-{os.getpid()}-{n}-kern"
        self.a_ip, self.b_ip = a_ip, b_ip
        self._cleanup = cleanup.register(remove_namespaces, self.a, self.b)
        try:
            for ns in (self.a, self.b):
                netns_add(ns)
                ip(ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", "veth-a", "netns", self.a, "address", a_mac, "type", "veth",
               "peer", "name", "veth-b", "netns", self.b, "address", b_mac)
            for ns, dev, addr, peer in ((self.a, "veth-a", a_ip, b_ip), (self.b, "veth-b", b_ip, a_ip)):
                ip(ns, "addr", "add", f"{addr}/{prefix}", "dev", dev)
                ip(ns, "link", "set", dev, "up")
                ip(ns, "route", "add", f"{peer}/32", "dev", dev)
                ip(ns, "neigh", "replace", peer, "lladdr", b_mac if ns == self.a else a_mac, "dev", dev)
                set_offloads(ns, dev)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        self._cleanup.run()

    def __enter__(self) -> "HostPair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def netns_add(ns: str) -> None:
    """`ip netns add`: for a lab whose cleanup (registered before) removes `ns`."""
    with cleanup.deferred():  # a signal meanwhile: acted on once the namespace exists (and is removed)
        sh("ip", "netns", "add", ns)


def remove_namespaces(*names: str) -> None:
    for ns in names:
        cleanup.netns_remove(ns)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> list[str]:
    """Delete namespaces of this helper whose creating process no longer exists, after
    ending what still runs inside them (a capture orphaned by a killed run)."""
    gone = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(rf"({PREFIX}-(\d+)-\d+-(?:fab|kern))\b", line)
        if m and int(m.group(2)) != os.getpid() and not pid_alive(int(m.group(2))):
            cleanup.netns_remove(m.group(1))
            gone.append(m.group(1))
    return gone


# ---- captures -----------------------------------------------------------------------------

def read_pcap(path: str) -> list[bytes]:
    """Every complete record of a classic pcap file (tolerates a record being written)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    if len(data) < 24:
        return []
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file")
    out, off = [], 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
        if off + 16 + incl > len(data):
            break
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


def write_pcap(path: str, frames: list[bytes]) -> str:
    """A classic microsecond Ethernet pcap holding `frames` (1 ms apart)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1_700_000_000, i * 1000, len(fr), len(fr)) + fr)
    return path


class Capture:
    """tcpdump in a namespace writing `path`; started (and really listening) on enter.

    direction: "in", "out" or None (both), as tcpdump -Q.
    """

    def __init__(self, ns: str, iface: str, path: str, bpf: str = "", direction: str | None = None):
        self.ns, self.iface, self.path, self.bpf, self.direction = ns, iface, str(path), bpf, direction
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 5.0) -> "Capture":
        cmd = ["ip", "netns", "exec", self.ns, "tcpdump", "-i", self.iface, "-n", "-U", "-s", "0",
               "-Z", "root", "--immediate-mode", "-w", self.path]
        if self.direction:
            cmd += ["-Q", self.direction]
        if self.bpf:
            cmd += [self.bpf]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=cleanup.die_with_parent)
        # tcpdump says "listening on IF" once the capture is active: only then send.
        deadline, err = time.monotonic() + timeout, b""
        while b"listening on" not in err:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"tcpdump on {self.ns}/{self.iface} did not start: {err.decode(errors='replace')}")
            r, _, _ = select.select([self.proc.stderr], [], [], left)
            if r:
                chunk = os.read(self.proc.stderr.fileno(), 4096)
                if not chunk:
                    continue
                err += chunk
        return self

    def frames(self) -> list[bytes]:
        return read_pcap(self.path)

    def wait(self, count: int, timeout: float = 3.0) -> list[bytes]:
        """Frames captured so far, once there are at least `count` or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.frames()
            if len(got) >= count or time.monotonic() >= deadline:
                return got
            time.sleep(0.02)

    def stop(self) -> list[bytes]:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
        return self.frames()

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- the kernel VTEP ------------------------------------------------------------------------

class KernelVtep:
    """A Linux VTEP (vxlan driver) in its own namespace, wired to a 'fabric' namespace.

    local/peer: the kernel VTEP's underlay address and ours (both IPv4 or both IPv6).
    udpcsum: the vxlan device's udpcsum flag (IPv4 underlay only; IPv6 always checksums).
    """

    def __init__(self, *, vni: int, local: str, peer: str, local_mac: str, peer_mac: str,
                 overlay_mac: str, overlay_ip: str, overlay_prefix: int,
                 neighbours: dict[str, str], fdb: list[str], udpcsum: bool = False,
                 dstport: int = 4789):
        n = next(_counter)
        self.fab = f"{PREFIX}-{os.getpid()}-{n}-fab"
        self.kern = f"{PREFIX}-{os.getpid()}-{n}-kern"
        self.wire, self.uplink, self.vx = "wire", "uplink", f"vx{vni}"
        self.vni, self.local, self.peer, self.v6 = vni, local, peer, ":" in local
        self.local_mac, self.peer_mac = local_mac, peer_mac
        self.overlay_mac, self.overlay_ip = overlay_mac, overlay_ip
        self._send_sock: socket.socket | None = None
        self._cleanup = cleanup.register(self._remove)
        try:
            self._build(overlay_prefix, neighbours, fdb, udpcsum, dstport)
        except BaseException:
            self.close()
            raise

    def _build(self, prefix, neighbours, fdb, udpcsum, dstport):
        reap_stale()
        netns_add(self.fab)
        netns_add(self.kern)
        for ns in (self.fab, self.kern):
            # no stray IPv6 (router solicitations, MLD, DAD) unless the underlay needs it;
            # best effort when it is not needed (a kernel booted with ipv6.disable=1)
            need = self.v6 and ns == self.kern
            for scope in ("default", "all"):
                sysctl(ns, f"net.ipv6.conf.{scope}.disable_ipv6", 0 if need else 1, check=need)
        ip(self.fab, "link", "add", self.wire, "type", "veth", "peer", "name", self.uplink, "netns", self.kern)
        sysctl(self.fab, f"net.ipv6.conf.{self.wire}.disable_ipv6", 1, check=False)
        ip(self.kern, "link", "set", self.uplink, "address", self.local_mac)
        ip(self.fab, "link", "set", self.wire, "address", self.peer_mac)
        tx_checksum_offload(self.kern, self.uplink, False)
        if self.v6:
            ip(self.kern, "link", "set", self.uplink, "addrgenmode", "none")
            ip(self.kern, "-6", "addr", "add", f"{self.local}/64", "dev", self.uplink, "nodad")
        else:
            ip(self.kern, "addr", "add", f"{self.local}/24", "dev", self.uplink)
        ip(self.kern, "neigh", "replace", self.peer, "lladdr", self.peer_mac, "dev", self.uplink, "nud", "permanent")
        # without `dev` the vxlan device would default to MTU 1500 and the kernel would
        # fragment the outer packets; size it for the 1500-byte underlay as `dev` would
        overlay_mtu = 1500 - (40 if self.v6 else 20) - 8 - 8 - 14
        args = ["link", "add", self.vx, "mtu", str(overlay_mtu), "type", "vxlan", "id", str(self.vni),
                "local", self.local, "dstport", str(dstport), "nolearning"]
        if not self.v6:
            args.append("udpcsum" if udpcsum else "noudpcsum")
        ip(self.kern, *args)
        if self.v6:
            sysctl(self.kern, f"net.ipv6.conf.{self.vx}.disable_ipv6", 1)   # overlay is IPv4 only
        ip(self.kern, "link", "set", self.vx, "address", self.overlay_mac)
        ip(self.kern, "addr", "add", f"{self.overlay_ip}/{prefix}", "dev", self.vx)
        for mac in fdb:
            sh("bridge", "-n", self.kern, "fdb", "append", mac, "dev", self.vx, "dst", self.peer)
        for addr, mac in neighbours.items():
            ip(self.kern, "neigh", "replace", addr, "lladdr", mac, "dev", self.vx, "nud", "permanent")
        for ns, dev in ((self.kern, "lo"), (self.kern, self.uplink), (self.kern, self.vx), (self.fab, self.wire)):
            ip(ns, "link", "set", dev, "up")
        self.wait_ready()

    def wait_ready(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            out = ip(self.kern, "-o", "link", "show", self.uplink).stdout
            if "LOWER_UP" in out and ",UP" in out:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kern}/{self.uplink} not up: {out}")
            time.sleep(0.02)

    # -- traffic ------------------------------------------------------------------------------

    def send(self, *frames: bytes) -> None:
        """Put Ethernet frames on the wire toward the kernel VTEP (as dpu's uplink would)."""
        if self._send_sock is None:
            s = socket_in(self.fab, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((self.wire, 0))
            self._send_sock = s
        for f in frames:
            self._send_sock.send(bytes(f))

    def capture_wire(self, path, bpf: str = "udp port 4789", direction: str | None = "in") -> Capture:
        """What arrives on the fabric side from the kernel VTEP (direction "in" there)."""
        return Capture(self.fab, self.wire, path, bpf, direction)

    def capture_uplink(self, path, bpf: str = "", direction: str | None = "in") -> Capture:
        """What the kernel VTEP's uplink receives from the fabric."""
        return Capture(self.kern, self.uplink, path, bpf, direction)

    def capture_overlay(self, path, bpf: str = "", direction: str | None = "in") -> Capture:
        """What the vxlan device hands to the kernel's stack after decapsulation."""
        return Capture(self.kern, self.vx, path, bpf, direction)

    def udp_socket(self, bind: tuple[str, int] = ("", 0)) -> socket.socket:
        s = socket_in(self.kern, socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(bind)
        return s

    def counters(self, dev: str) -> dict:
        """rx/tx statistics of a device in the kern namespace (ip -s -j)."""
        j = json.loads(ip(self.kern, "-s", "-j", "link", "show", dev).stdout)
        return j[0]["stats64"]

    def close(self) -> None:
        self._cleanup.run()

    def _remove(self) -> None:
        if self._send_sock is not None:
            self._send_sock.close()
            self._send_sock = None
        remove_namespaces(self.kern, self.fab)

    def __enter__(self) -> "KernelVtep":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tshark(path, *args: str, prefs=("ip.check_checksum:TRUE", "udp.check_checksum:TRUE"),
           decode_as: tuple[str, ...] = ()) -> list[str]:
    """tshark -r path with checksum validation on; returns its output lines (stdout)."""
    cmd = ["tshark", "-n", "-r", str(path)]
    for p in prefs:
        cmd += ["-o", p]
    for d in decode_as:
        cmd += ["-d", d]
    r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd + list(args))} failed: {r.stderr}")
    return [l for l in r.stdout.splitlines() if l.strip()]


# ---- dpu run on a veth ------------------------------------------------------------------------

class DpuOnVeth:
    """`dpu [GLOBAL...] run ARGS... --ctl CTL` started in a namespace of its own (`ns`) that holds
    one veth pair, both ends up: `dpa` for dpu's ports, `dpb` its peer for the test to send from.
    With ipv6=False the namespace has IPv6 off, so no kernel chatter (router solicitations,
    MLD) reaches dpu and moves a counter. `with` starts it and waits until its control socket answers;
    leaving stops it with SIGTERM and deletes the namespace, and then `out`, `err` and
    `returncode` hold what it printed and how it ended."""

    def __init__(self, ctl: str, *run_args: str, global_args=(), ipv6: bool = True, cwd: str | None = None):
        self.ctl, self.ns = ctl, f"dpuveth-{os.getpid()}-{next(_counter)}"
        self.cmd = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "dpu.cli", *global_args, "run",
                    *run_args, "--ctl", ctl]
        self.ipv6, self.cwd, self.proc = ipv6, cwd, None
        self.out = self.err = ""
        self.returncode = None

    def __enter__(self) -> "DpuOnVeth":
        sh("ip", "netns", "add", self.ns)
        try:
            if not self.ipv6:
                for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
                    sysctl(self.ns, key, 1)
            ip(self.ns, "link", "add", "dpa", "type", "veth", "peer", "name", "dpb")
            ip(self.ns, "link", "set", "dpa", "up")
            ip(self.ns, "link", "set", "dpb", "up")
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         cwd=self.cwd)
            deadline = time.monotonic() + 60
            while not self._answers() and self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._answers():
                raise AssertionError(f"dpu run does not answer at {self.ctl}: {self._stop()}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _answers(self) -> bool:
        """Whether its control socket answers (the file exists a moment before it listens)."""
        from dpu.control import call
        from dpu.errors import ControlError

        try:
            return bool(call(self.ctl, "ping"))
        except ControlError:
            return False

    def send(self, frame: bytes) -> None:
        """One frame into dpu's port, from the peer."""
        with socket_in(self.ns, socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind(("dpb", 0))
            s.send(frame)

    def _stop(self) -> str:
        if self.proc is not None and self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            self.out, self.err = self.proc.communicate(timeout=60)
            self.returncode = self.proc.returncode
        return self.err

    def __exit__(self, *exc) -> None:
        try:
            self._stop()
        finally:
            sh("ip", "netns", "del", self.ns, check=False)
