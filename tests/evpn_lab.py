"""An EVPN fabric in network namespaces, FRRouting as its control plane: groundwork for
dpu's fabric mirror (/work/shared/DESIGN.md, "The fabric mirror"; tests/EVPN_LAB.md says
what was measured with it).

One `Lab` builds, in namespaces named `evl-<pid>-<n>-*` (nothing in the root namespace):

                      <tag>-ul: bridge "fabric", 172.31.0.0/24, MTU 1600
        ┌───────────────────┬─────────────────────┬─────────────────────┐
     <tag>-rr          <tag>-h1             <tag>-h2            <tag>-h3 (shadow)
     172.31.0.2        172.31.0.11          172.31.0.12         172.31.0.13
     zebra + bgpd      zebra -n + bgpd      ...                 ...
     route reflector   the VXLAN sockets
                       ├─ <tag>-h1-red   (VRF "red", a namespace)
                       │    br100 10.0.0.1/24 (anycast gateway) ─ vx100 (VNI 100), e100
                       │    br101 10.0.1.1/24                    ─ vx101 (VNI 101), e101
                       │    br4001 (router MAC)                  ─ vx4001 (L3 VNI 4001)
                       │    e100 ══ veth ══ eth0 of <tag>-h1-red-100, 10.0.0.11/24
                       └─ <tag>-h1-blue  the same addresses; VNIs 200, 201, 4002

- The kernel has no VRF device here, so each tenant VRF is a namespace (FRR's netns VRF
  backend, `zebra -n`). Each VXLAN device is made in its host's namespace, where the
  underlay address lives, then moved into the tenant's: its UDP socket stays behind.
- zebra -n takes every file in /run/netns for a VRF, so each host's zebra runs in a mount
  namespace of its own whose /run/netns holds its tenants only, under the tenants' names
  ("red", "blue": the same VRF names on every host). bgpd joins zebra's mount and network
  namespaces. Each FRR instance has its state directory (configs, pid files, sockets, logs).
- A *shadow* host (kind="shadow") has the same kernel objects but no real endpoints: each
  endpoint is a static FDB entry on a representor (a TAP nobody opened: no carrier) and a
  permanent neighbour on the SVI, as dpu will write them, once FRR runs (zebra does not
  read permanent neighbours that exist before it starts). FRR advertises them all the same.
- A *bare* host (kind="bare") is only a namespace on the underlay with its address, a client
  of the reflector: a test builds the rest (tests/test_fabric_shadow.py puts dpu's kernel
  shadow and managed FRR there).
- iBGP AS 65000, `address-family l2vpn evpn`, every host a client of the route reflector;
  `advertise-all-vni`; symmetric IRB through each tenant's L3 VNI; each tenant VRF also
  redistributes its connected routes as type-5 (its loopback 10.255.<host>.1/32 shows one).

`Lab.close()` (also on exceptions, SIGTERM and SIGINT inside `with Lab(...)`) stops every
daemon, deletes every namespace (the mounts die with zebra's mount namespace), and removes
the state directory and the daemons' /var/tmp/frr/<daemon>.<pid> directories.
`reap_stale()` does the same for labs whose process died without closing them.

`read_installed(ns, l3vnis)` lists what zebra installed in a tenant namespace, `NeighWatch`
collects its neighbour and FDB events, `propagation()` times a change on one host to its
event on another; all over netlink sockets made in the namespace (dpu.fabric.netlink;
pyroute2 only parses: its own netns support forks). FRR runs as dpu runs it
(dpu.fabric.frr.ManagedFrr); the configurations are the lab's own, written as FRR's
documentation shows, so that dpu's renderer is checked against them, not with them.
`python3 tests/evpn_lab.py up|measure|reap` runs it by hand.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import ipaddress
import itertools
import os
import re
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from dpu.errors import FabricError
from dpu.fabric.frr import FRR_TMP, ManagedFrr, missing_tools
from dpu.fabric.netlink import NTF_EXT_LEARNED, NTF_SELF, RTMGRP_NEIGH, RTPROT_BGP, ZERO_MAC, Rtnl
from netns import ip, nsexec, pid_alive, sh, sysctl

PREFIX = "evl"                   # namespaces evl-<pid>-<n>-*, state dirs <tmp>/evl-<pid>-<n>
ASN = 65000
UNDERLAY = ipaddress.ip_network("172.31.0.0/24")
RR_IP = "172.31.0.2"
UNDERLAY_MTU = 1600              # room for VXLAN's 50 bytes around a 1,500-byte tenant frame
GATEWAY_MAC = "02:a0:00:00:00:01"   # the anycast gateway's MAC, on every SVI of every host
_counter = itertools.count()


@dataclass(frozen=True)
class Subnet:
    vni: int
    cidr: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(self.cidr)

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    def address(self, host_index: int) -> str:
        """The endpoint address of host h<host_index> in this subnet: .1<host_index>."""
        return str(self.network.network_address + 10 + host_index)


@dataclass(frozen=True)
class Tenant:
    name: str
    l3vni: int
    subnets: tuple[Subnet, ...]


# Two tenants with the same addresses and different VNIs.
TENANTS = (
    Tenant("red", 4001, (Subnet(100, "10.0.0.0/24"), Subnet(101, "10.0.1.0/24"))),
    Tenant("blue", 4002, (Subnet(200, "10.0.0.0/24"), Subnet(201, "10.0.1.0/24"))),
)


@dataclass(frozen=True)
class Endpoint:
    """A tenant endpoint: a namespace with eth0 (kind "vtep"), or only a static FDB entry
    and a permanent neighbour in its shadow host's tenant namespace (ns is None)."""
    host: str
    tenant: str
    vni: int
    ip: str
    mac: str
    ns: str | None


@dataclass
class Host:
    name: str                    # h1, h2, ...: also its FRR hostname
    index: int
    kind: str                    # "vtep" (real endpoints), "shadow" (static entries), "bare" (nothing)
    ns: str                      # the host's own namespace: underlay address, VXLAN sockets
    frr: "Frr | None"            # None for a bare host
    tenant_ns: dict[str, str] = field(default_factory=dict)     # tenant -> namespace
    endpoints: list[Endpoint] = field(default_factory=list)

    @property
    def vtep_ip(self) -> str:
        return str(UNDERLAY.network_address + 10 + self.index)

    @property
    def router_mac(self) -> str:
        return f"02:b0:00:00:00:{self.index:02x}"


def shadow_tenants(host_index: int) -> tuple:
    """The lab's tenants as dpu's kernel shadow on host h<host_index> (dpu.fabric.shadow): red
    (VNIs 100, 101, L3 4001) and blue (200, 201, L3 4002), both 10.0.0.0/24 and 10.0.1.0/24, a
    port p<vni> per subnet with the host's address there and MAC 02:d0:<host>:<tenant>:<subnet>:01."""
    from dpu.fabric.shadow import ShadowPort, ShadowSubnet, ShadowTenant

    out = []
    for ti, t in enumerate(TENANTS, start=1):
        subnets = tuple(ShadowSubnet(s.vni, GATEWAY_MAC, (f"{s.gateway}/{s.network.prefixlen}",)) for s in t.subnets)
        ports = tuple(ShadowPort(f"p{s.vni}", s.vni, f"02:d0:{host_index:02x}:{ti:02x}:{si:02x}:01",
                                 s.address(host_index)) for si, s in enumerate(t.subnets, start=1))
        out.append(ShadowTenant(t.name, t.l3vni, f"02:b0:00:00:00:{host_index:02x}", subnets, ports))
    return tuple(out)


def endpoint_mac(host: int, tenant: int, subnet: int) -> str:
    return f"02:e0:{host:02x}:{tenant:02x}:{subnet:02x}:01"


def tenant_loopback(host_index: int) -> str:
    return f"10.255.{host_index}.1"


class LabError(RuntimeError):
    pass


def wait_until(what: str, probe, timeout: float = 60.0, interval: float = 0.1):
    """Polls probe() until it returns something true; returns it, or raises naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(interval)
    raise LabError(f"timed out after {timeout:.0f} s waiting for {what}")


def missing() -> str | None:
    """Why the lab cannot run here (FRR, its user, vtysh, tcpdump), as one line; None if it can."""
    if missing_tools():
        return missing_tools()
    return None if shutil.which("tcpdump") else "tcpdump is not installed (apt-get install tcpdump)"


# ---- FRR ------------------------------------------------------------------------------------

class Frr(ManagedFrr):
    """zebra and bgpd for one namespace, with their own state directory and sockets: dpu's
    ManagedFrr (dpu/fabric/frr.py), started with the configurations the lab writes.

    vrfs: VRF name -> namespace, for zebra's netns VRF backend; zebra runs in a private
    mount namespace whose /run/netns holds exactly these, under the VRF names."""

    def __init__(self, name: str, ns: str, statedir: str, vrfs: dict[str, str] | None = None):
        super().__init__(statedir, ns, vrfs or {}, {"zebra.conf": "", "bgpd.conf": ""}, name=name)
        self.ns = ns

    def start(self, zebra_conf: str, bgpd_conf: str) -> None:
        self.confs = {"zebra.conf": zebra_conf, "bgpd.conf": bgpd_conf}
        super().start()

    def show(self, command: str) -> dict:
        """`vtysh -c "<command> json"`, parsed."""
        return self.vtysh(f"{command} json")


# ---- configurations -------------------------------------------------------------------------

def _bgp_common(router_id: str) -> list[str]:
    return [f"router bgp {ASN}",
            f" bgp router-id {router_id}",
            " no bgp default ipv4-unicast",
            " timers bgp 3 9"]


def _neighbor(peer: str) -> list[str]:
    return [f" neighbor {peer} remote-as {ASN}",
            f" neighbor {peer} timers connect 1",
            f" neighbor {peer} advertisement-interval 0"]


def rr_bgpd_conf(clients: list[str]) -> str:
    lines = ["hostname rr", "!"] + _bgp_common(RR_IP)
    for c in clients:
        lines += _neighbor(c)
    lines.append(" address-family l2vpn evpn")
    for c in clients:
        lines += [f"  neighbor {c} activate", f"  neighbor {c} route-reflector-client"]
    lines += [" exit-address-family", "exit", "!"]
    return "\n".join(lines) + "\n"


def vtep_zebra_conf(host: Host, tenants: tuple[Tenant, ...]) -> str:
    lines = [f"hostname {host.name}", "!"]
    for t in tenants:
        lines += [f"vrf {t.name}", f" vni {t.l3vni}", "exit-vrf", "!"]
    return "\n".join(lines) + "\n"


def vtep_bgpd_conf(host: Host, tenants: tuple[Tenant, ...]) -> str:
    lines = [f"hostname {host.name}", "!"] + _bgp_common(host.vtep_ip) + _neighbor(RR_IP)
    lines += [" address-family l2vpn evpn",
              f"  neighbor {RR_IP} activate",
              "  advertise-all-vni",
              " exit-address-family", "exit", "!"]
    for t in tenants:
        lines += [f"router bgp {ASN} vrf {t.name}",
                  f" bgp router-id {host.vtep_ip}",
                  " address-family ipv4 unicast",
                  "  redistribute connected",
                  " exit-address-family",
                  " address-family l2vpn evpn",
                  "  advertise ipv4 unicast",
                  " exit-address-family", "exit", "!"]
    return "\n".join(lines) + "\n"


# ---- the lab --------------------------------------------------------------------------------

class Lab:
    """A route reflector and hosts h1..hN (kinds: "vtep", "shadow" or "bare") on one underlay."""

    def __init__(self, kinds: tuple[str, ...] = ("vtep", "vtep"), tenants: tuple[Tenant, ...] = TENANTS):
        for k in kinds:
            if k not in ("vtep", "shadow", "bare"):
                raise ValueError(f"host kind {k!r}: expected 'vtep', 'shadow' or 'bare'")
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.kinds, self.tenants = tuple(kinds), tuple(tenants)
        self.dir = os.path.join(tempfile.gettempdir(), self.tag)
        self.underlay = f"{self.tag}-ul"
        self.rr: Frr | None = None
        self.hosts: list[Host] = []
        self._undo = contextlib.ExitStack()
        self._owner = os.getpid()                # a forked child must not tear the lab down
        self._old_handlers: dict[int, object] = {}
        # seconds: build (namespaces, devices), daemons (all started), and since then:
        # established (every session), routes (every type-2/3 route at the reflector)
        self.timings: dict[str, float] = {}

    # -- life cycle

    def __enter__(self) -> "Lab":
        if threading.current_thread() is threading.main_thread():
            # SIGINT already unwinds (KeyboardInterrupt); SIGTERM is made to.
            self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
            self._old_handlers[signal.SIGINT] = signal.getsignal(signal.SIGINT)
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame):
        if os.getpid() == self._owner:
            raise SystemExit(128 + signum)   # unwinds through `with Lab()`, which closes the lab
        os._exit(128 + signum)               # a forked child inherited the handler: just go

    def start(self) -> "Lab":
        reap_stale()
        t0 = time.monotonic()
        try:
            os.makedirs(self.dir)
            self._undo.callback(shutil.rmtree, self.dir, True)
            self._build_underlay()
            self._attach(f"{self.tag}-rr", "rr", RR_IP)
            self.rr = Frr("rr", f"{self.tag}-rr", f"{self.dir}/rr")
            self.hosts = [self._build_host(i + 1, kind) for i, kind in enumerate(self.kinds)]
            t1 = time.monotonic()
            self.timings["build"] = t1 - t0
            self._undo.callback(self.rr.stop)
            self.rr.start("hostname rr\n", rr_bgpd_conf([h.vtep_ip for h in self.hosts]))
            for h in self.hosts:
                if h.frr is None:
                    continue
                self._undo.callback(h.frr.stop)
                h.frr.start(vtep_zebra_conf(h, self.tenants), vtep_bgpd_conf(h, self.tenants))
            t2 = time.monotonic()
            self.timings["daemons"] = t2 - t1
            self.wait_established()
            self.timings["established"] = time.monotonic() - t2
            self._announce_endpoints()
            self.wait_routes()
            self.timings["routes"] = time.monotonic() - t2
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stops the daemons, deletes the namespaces and state; safe to call twice. Does
        nothing in a forked child (which unwinds through the same `with Lab()`)."""
        if os.getpid() != self._owner:
            return
        restore, self._old_handlers = self._old_handlers, {}
        for s in restore:                       # a second signal must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        try:
            self._undo.close()
        finally:
            for s, h in restore.items():
                signal.signal(s, h)

    def daemon_pids(self) -> dict[str, int]:
        """"<instance>/<daemon>" -> pid of every daemon this lab started (also once stopped)."""
        return {f"{frr.name}/{d}": pid for frr in [self.rr] + [h.frr for h in self.hosts] if frr
                for d, pid in frr.pids.items()}

    def _netns(self, name: str) -> str:
        sh("ip", "netns", "add", name)
        self._undo.callback(sh, "ip", "netns", "del", name, check=False)
        ip(name, "link", "set", "lo", "up")
        # No IPv6: keeps router solicitations and MLD out of the tenants' captures.
        sysctl(name, "net.ipv6.conf.all.disable_ipv6", 1)
        sysctl(name, "net.ipv6.conf.default.disable_ipv6", 1)
        return name

    def _build_underlay(self) -> None:
        ns = self._netns(self.underlay)
        ip(ns, "link", "add", "fabric", "mtu", str(UNDERLAY_MTU), "type", "bridge")
        ip(ns, "link", "set", "fabric", "up")

    def _attach(self, ns: str, port: str, address: str) -> str:
        """A namespace on the underlay: `uplink` in ns, `port` on the fabric bridge."""
        self._netns(ns)
        ip(ns, "link", "add", "uplink", "mtu", str(UNDERLAY_MTU), "type", "veth", "peer", "name", port,
           "mtu", str(UNDERLAY_MTU), "netns", self.underlay)
        ip(self.underlay, "link", "set", port, "master", "fabric", "up")
        ip(ns, "addr", "add", f"{address}/{UNDERLAY.prefixlen}", "dev", "uplink")
        ip(ns, "link", "set", "uplink", "up")
        return ns

    def _build_host(self, index: int, kind: str) -> Host:
        name = f"h{index}"
        ns = f"{self.tag}-{name}"
        if kind == "bare":
            host = Host(name, index, kind, ns, None)
            self._attach(ns, name, host.vtep_ip)
            return host
        tenant_ns = {t.name: f"{ns}-{t.name}" for t in self.tenants}
        host = Host(name, index, kind, ns, Frr(name, ns, f"{self.dir}/{name}", vrfs=tenant_ns), tenant_ns)
        self._attach(ns, name, host.vtep_ip)
        for ti, t in enumerate(self.tenants, start=1):
            tns = self._netns(tenant_ns[t.name])
            sysctl(tns, "net.ipv4.ip_forward", 1)
            ip(tns, "addr", "add", f"{tenant_loopback(index)}/32", "dev", "lo")
            self._vni(host, tns, t.l3vni, f"br{t.l3vni}", mac=host.router_mac)
            for si, s in enumerate(t.subnets, start=1):
                br = f"br{s.vni}"
                self._vni(host, tns, s.vni, br, mac=GATEWAY_MAC)
                ip(tns, "addr", "add", f"{s.gateway}/{s.network.prefixlen}", "dev", br)
                ep = Endpoint(name, t.name, s.vni, s.address(index), endpoint_mac(index, ti, si),
                              f"{tns}-{s.vni}" if kind == "vtep" else None)
                (self._real_endpoint if kind == "vtep" else self._shadow_endpoint)(tns, s, ep)
                host.endpoints.append(ep)
        return host

    def _vni(self, host: Host, tns: str, vni: int, bridge: str, mac: str) -> None:
        """bridge + VXLAN device for one VNI in tenant namespace tns, as FRR's docs wire them;
        the VXLAN device is made in the host's namespace and moved, keeping its socket there."""
        ip(tns, "link", "add", bridge, "address", mac, "type", "bridge")
        vx = f"vx{vni}"
        ip(host.ns, "link", "add", vx, "mtu", "1500", "type", "vxlan", "id", str(vni), "local", host.vtep_ip,
           "dstport", "4789", "nolearning")
        ip(host.ns, "link", "set", vx, "netns", tns)
        ip(tns, "link", "set", vx, "master", bridge)
        sh("bridge", "-n", tns, "link", "set", "dev", vx, "neigh_suppress", "on", "learning", "off")
        ip(tns, "link", "set", vx, "up")
        ip(tns, "link", "set", bridge, "up")

    def _real_endpoint(self, tns: str, subnet: Subnet, ep: Endpoint) -> None:
        """A namespace whose eth0 is a veth to port e<vni> on the subnet's bridge."""
        port = f"e{ep.vni}"
        self._netns(ep.ns)
        ip(tns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "address", ep.mac, "netns", ep.ns)
        ip(tns, "link", "set", port, "master", f"br{ep.vni}", "up")
        ip(ep.ns, "addr", "add", f"{ep.ip}/{subnet.network.prefixlen}", "dev", "eth0")
        ip(ep.ns, "link", "set", "eth0", "up")
        ip(ep.ns, "route", "add", "default", "via", subnet.gateway)

    def _shadow_endpoint(self, tns: str, subnet: Subnet, ep: Endpoint) -> None:
        """A representor without carrier (a TAP nobody opened) on the endpoint's bridge; its
        entries are written once FRR runs (`write_shadow_endpoint`)."""
        rep = f"rep{ep.vni}"
        ip(tns, "tuntap", "add", "dev", rep, "mode", "tap")
        ip(tns, "link", "set", rep, "master", f"br{ep.vni}", "up")

    def write_shadow_endpoint(self, host: Host, ep: Endpoint) -> None:
        """What dpu will write for a local endpoint: a static FDB entry on its representor,
        then a permanent neighbour on the SVI. zebra (netns backend) does not read permanent
        neighbours that were there before it started: write them while it runs."""
        tns = host.tenant_ns[ep.tenant]
        sh("bridge", "-n", tns, "fdb", "replace", ep.mac, "dev", f"rep{ep.vni}", "master", "static")
        ip(tns, "neigh", "replace", ep.ip, "lladdr", ep.mac, "dev", f"br{ep.vni}", "nud", "permanent")

    def _announce_endpoints(self) -> None:
        """Real endpoints say hello to their gateway, so that their bridge learns the MAC and
        the SVI the neighbour; shadow endpoints are written. zebra advertises both."""
        for h in self.hosts:
            for ep in h.endpoints:
                if ep.ns:
                    self.ping(ep, self.subnet(ep.vni).gateway)
                else:
                    self.write_shadow_endpoint(h, ep)

    # -- looking at it

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def endpoint(self, host: str, tenant: str, vni: int) -> Endpoint:
        for ep in self.host(host).endpoints:
            if ep.tenant == tenant and ep.vni == vni:
                return ep
        raise KeyError((host, tenant, vni))

    def subnet(self, vni: int) -> Subnet:
        for t in self.tenants:
            for s in t.subnets:
                if s.vni == vni:
                    return s
        raise KeyError(vni)

    def ping(self, src: Endpoint, dst, count: int = 1, pattern: str | None = None,
             timeout: float = 5.0) -> bool:
        """True when `count` echo requests from src to dst got replies (waits up to timeout)."""
        cmd = ["ping", "-c", str(count), "-i", "0.2", "-W", "1", "-w", str(int(timeout)), "-q", str(dst)]
        if pattern:
            cmd[1:1] = ["-p", pattern]
        return nsexec(src.ns, *cmd, check=False).returncode == 0

    def sessions(self) -> dict[str, str]:
        """Route reflector's view: client address -> BGP state (l2vpn evpn)."""
        peers = self.rr.show("show bgp l2vpn evpn summary").get("peers", {})
        return {addr: p.get("state", "?") for addr, p in peers.items()}

    def wait_established(self, timeout: float = 60.0) -> None:
        """Every client but the bare hosts (whose speaker the test starts)."""
        want = {h.vtep_ip for h in self.hosts if h.frr is not None}
        wait_until("every client's session with the route reflector to be Established",
                   lambda: {a for a, s in self.sessions().items() if s == "Established"} >= want, timeout)

    def evpn_routes(self, frr: Frr) -> set[str]:
        """frr's EVPN table as "<prefix> vni <first route target's number> via <next hop>",
        e.g. "[2]:[0]:[48]:[02:e0:01:01:01:01]:[32]:[10.0.0.11] vni 100 via 172.31.0.11"."""
        out = set()
        for rd, prefixes in frr.show("show bgp l2vpn evpn route").items():
            if not isinstance(prefixes, dict):
                continue                                # "numPrefix", "numPaths"
            for prefix, entry in prefixes.items():
                if not isinstance(entry, dict):
                    continue                            # "rd"
                for path in itertools.chain.from_iterable(entry.get("paths", [])):
                    rt = re.search(r"RT:\d+:(\d+)", path.get("extendedCommunity", {}).get("string", ""))
                    for nh in path.get("nexthops", []):
                        out.add(f"{prefix} vni {rt.group(1) if rt else '?'} via {nh.get('ip')}")
        return out

    def expected_routes(self, host: Host) -> set[str]:
        """The type-2 (MAC, MAC+IP) and type-3 routes host originates, as evpn_routes says them
        (none for a bare host: what it originates is the test's)."""
        out = set()
        if host.kind == "bare":
            return out
        for ep in host.endpoints:
            out.add(f"[2]:[0]:[48]:[{ep.mac}] vni {ep.vni} via {host.vtep_ip}")
            out.add(f"[2]:[0]:[48]:[{ep.mac}]:[32]:[{ep.ip}] vni {ep.vni} via {host.vtep_ip}")
        for t in self.tenants:
            for s in t.subnets:
                out.add(f"[3]:[0]:[32]:[{host.vtep_ip}] vni {s.vni} via {host.vtep_ip}")
        return out

    def wait_routes(self, timeout: float = 60.0) -> None:
        want = set().union(*(self.expected_routes(h) for h in self.hosts))
        wait_until("every host's type-2 and type-3 routes at the route reflector",
                   lambda: want <= self.evpn_routes(self.rr), timeout)


def leftovers(tag: str, statedir: str, pids) -> list[str]:
    """What a closed lab left behind, as readable lines; [] when nothing: its namespaces,
    processes naming its state directory, mounts naming it (here), /var/tmp/frr/<d>.<pid>
    directories of its daemons, the state directory."""
    found = [f"namespace {n}" for n in _netns_names() if n.startswith(f"{tag}-")]
    for proc in glob.glob("/proc/[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            cmd = open(proc, "rb").read().replace(b"\0", b" ").decode(errors="replace")
            if statedir in cmd:
                found.append(f"process {proc.split('/')[2]}: {cmd.strip()}")
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if tag in line]
    for pid in pids:
        found += [f"directory {d}" for d in glob.glob(f"{FRR_TMP}/*.{pid}")]
    if os.path.exists(statedir):
        found.append(f"directory {statedir}")
    return found


def _netns_names() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list", check=False).stdout.splitlines() if line.strip()]


# ---- cleaning up after runs that died -------------------------------------------------------

def reap_stale() -> list[str]:
    """Removes what labs of dead processes left: daemons, namespaces, state directories."""
    gone = []
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}-*-*")):
        m = re.fullmatch(rf"{PREFIX}-(\d+)-\d+", os.path.basename(d))
        if not m or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        for pidfile in glob.glob(f"{d}/*/*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(open(pidfile).read().strip())
                if d in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
                shutil.rmtree(f"{FRR_TMP}/{os.path.basename(pidfile)[:-4]}.{pid}", ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    for name in _netns_names():
        m = re.match(rf"{PREFIX}-(\d+)-\d+-", name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            sh("ip", "netns", "del", name, check=False)
            gone.append(name)
    return gone


# ---- what FRR installed, read over netlink --------------------------------------------------

NUD_FAILED, NUD_NOARP, NUD_PERMANENT = 0x20, 0x40, 0x80


@dataclass(frozen=True)
class Installed:
    """One tenant namespace's view of what zebra installed for EVPN.

    macs:        (vni, mac, vtep)    remote MACs: `dst VTEP self extern_learn` on an L2 VNI device
    flood:       (vni, vtep)         flood list: the all-zero MAC, `dst VTEP self permanent`
    router_macs: (vni, mac, vtep)    remote router MACs: `dst VTEP self extern_learn` on an L3 VNI device
    neighbours:  (dev, ip, mac)      `extern_learn` neighbours: remote hosts on the SVIs, remote VTEPs
                                     (with their router MAC) on the L3 VNI bridge
    routes:      (prefix, vtep, dev) `proto bgp` routes: type-2 host routes and type-5 prefixes
    """
    macs: frozenset
    flood: frozenset
    router_macs: frozenset
    neighbours: frozenset
    routes: frozenset


def _vxlan_vnis(links) -> dict[int, int]:
    """ifindex -> VNI of the VXLAN devices among pyroute2 link messages."""
    out = {}
    for link in links:
        info = link.get_attr("IFLA_LINKINFO")
        if info and info.get_attr("IFLA_INFO_KIND") == "vxlan":
            out[link["index"]] = info.get_attr("IFLA_INFO_DATA").get_attr("IFLA_VXLAN_ID")
    return out


def read_installed(ns: str, l3vnis) -> Installed:
    """Dumps links, FDB, neighbours and routes of namespace ns over netlink and keeps what
    zebra installed. l3vnis: the VNIs that are L3 VNIs (zebra's `vrf X / vni N`)."""
    with Rtnl(ns) as sock:
        links, fdb, neigh, routes = (sock.dump(what) for what in ("links", "fdb", "neighbours", "routes"))
    names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in links}
    vnis = _vxlan_vnis(links)
    macs, flood, rmacs = set(), set(), set()
    for e in fdb:
        vni, mac, vtep = vnis.get(e["ifindex"]), e.get_attr("NDA_LLADDR"), e.get_attr("NDA_DST")
        if vni is None or vtep is None or not e["flags"] & NTF_SELF:
            continue
        if mac == ZERO_MAC:
            flood.add((vni, vtep))
        elif e["flags"] & NTF_EXT_LEARNED:
            (rmacs if vni in l3vnis else macs).add((vni, mac, vtep))
    neighbours = {(names.get(n["ifindex"]), n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR"))
                  for n in neigh if n["flags"] & NTF_EXT_LEARNED}
    installed_routes = set()
    for r in routes:
        if r["proto"] != RTPROT_BGP:
            continue
        prefix = f"{r.get_attr('RTA_DST') or '0.0.0.0'}/{r['dst_len']}"
        hops = r.get_attr("RTA_MULTIPATH") or [r]
        for hop in hops:
            installed_routes.add((prefix, hop.get_attr("RTA_GATEWAY"),
                                  names.get(hop.get_attr("RTA_OIF") if hop is r else hop["oif"])))
    return Installed(frozenset(macs), frozenset(flood), frozenset(rmacs), frozenset(neighbours),
                     frozenset(installed_routes))


@dataclass(frozen=True)
class NeighEvent:
    t: float                  # time.monotonic() when the message was read
    event: str                # "RTM_NEWNEIGH" or "RTM_DELNEIGH"
    bridge: bool              # an FDB entry (AF_BRIDGE), else an IPv4 neighbour
    ifindex: int
    mac: str | None
    dst: str | None           # FDB: the remote VTEP; neighbour: its IP
    flags: int
    state: int


class NeighWatch:
    """Neighbour and FDB events (RTNLGRP_NEIGH) of namespace ns, read by a thread as they
    come, each stamped with its arrival time. A plain netlink socket made in ns; pyroute2
    only parses the messages. Its buffer holds a burst of thousands; if the kernel still
    drops some (ENOBUFS) it counts them in `overruns` and goes on."""

    def __init__(self, ns: str):
        self.sock = Rtnl(ns, RTMGRP_NEIGH, rcvbuf=8 << 20)
        self.events: list[NeighEvent] = []
        self.overruns = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"neighwatch-{ns}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not select.select([self.sock], [], [], 0.2)[0]:
                continue
            try:
                msgs = self.sock.events()
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
                continue
            now = time.monotonic()
            with self._cond:
                for m in msgs:
                    if m.get("event") in ("RTM_NEWNEIGH", "RTM_DELNEIGH"):
                        self.events.append(NeighEvent(now, m["event"], m["family"] == socket.AF_BRIDGE, m["ifindex"],
                                                      m.get_attr("NDA_LLADDR"), m.get_attr("NDA_DST"),
                                                      m["flags"], m["state"]))
                self._cond.notify_all()

    def wait(self, match, timeout: float = 30.0) -> NeighEvent:
        """The first event (since the watch began) for which match(event) is true."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if match(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LabError(f"no matching neighbour event within {timeout:.0f} s "
                                   f"({len(self.events)} events seen)")
                self._cond.wait(left)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def __enter__(self) -> "NeighWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- measuring ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """One change made on a VTEP and the event it caused in another host's tenant namespace."""
    what: str                 # "fdb add", "neigh add", "neigh del", "fdb del"
    t0: float                 # time.monotonic() just before the change was made
    event: NeighEvent

    @property
    def ms(self) -> float:
        return (self.event.t - self.t0) * 1e3


def propagation(lab: Lab, src: str = "h1", dst: str = "h3", tenant: str = "red",
                rounds: int = 5) -> list[Change]:
    """On real VTEP src, in tenant's first subnet: adds a static MAC, then a permanent
    neighbour for it, then deletes both; each time waits for what zebra makes of it in
    dst's tenant namespace. Returns the changes with their events, in order."""
    h, d = lab.host(src), lab.host(dst)
    s = next(t for t in lab.tenants if t.name == tenant).subnets[0]
    sns, dns, out = h.tenant_ns[tenant], d.tenant_ns[tenant], []
    with NeighWatch(dns) as watch:
        def change(what, match, *cmd):
            t0 = time.monotonic()
            sh(*cmd)
            out.append(Change(what, t0, watch.wait(lambda e: e.t >= t0 and match(e))))
        for i in range(rounds):
            mac, addr = f"02:ee:{h.index:02x}:00:00:{i:02x}", str(s.network.network_address + 200 + i)
            change("fdb add", lambda e: e.bridge and e.event == "RTM_NEWNEIGH" and e.mac == mac and e.dst,
                   "bridge", "-n", sns, "fdb", "add", mac, "dev", f"e{s.vni}", "master", "static")
            change("neigh add", lambda e: not e.bridge and e.event == "RTM_NEWNEIGH" and e.dst == addr,
                   "ip", "-n", sns, "neigh", "add", addr, "lladdr", mac, "dev", f"br{s.vni}", "nud", "permanent")
            change("neigh del", lambda e: not e.bridge and e.event == "RTM_DELNEIGH" and e.dst == addr,
                   "ip", "-n", sns, "neigh", "del", addr, "dev", f"br{s.vni}")
            change("fdb del", lambda e: e.bridge and e.event == "RTM_DELNEIGH" and e.mac == mac and e.dst,
                   "bridge", "-n", sns, "fdb", "del", mac, "dev", f"e{s.vni}", "master", "static")
    return out


def hops(lab: Lab, changes: list[Change], pcap: str, src: str = "h1", dst: str = "h3") -> list[tuple]:
    """Splits each change's latency at the BGP UPDATEs in pcap (a capture of the route
    reflector's port): (what, src change -> UPDATE to the RR, RR in -> out to dst,
    dst's UPDATE -> event), in ms. Needs tshark."""
    from netns import tshark
    offset = time.time() - time.monotonic()
    s, d = lab.host(src).vtep_ip, lab.host(dst).vtep_ip
    updates = [(float(t) - offset, a, b) for t, a, b in
               (line.split("\t") for line in tshark(pcap, "-Y", "bgp.type == 2", "-T", "fields",
                                                    "-e", "frame.time_epoch", "-e", "ip.src", "-e", "ip.dst"))]
    out = []
    for c in changes:
        up = min(t for t, a, b in updates if (a, b) == (s, RR_IP) and t >= c.t0)
        down = min(t for t, a, b in updates if (a, b) == (RR_IP, d) and t >= up)
        out.append((c.what, (up - c.t0) * 1e3, (down - up) * 1e3, (c.event.t - down) * 1e3))
    return out


def main(argv: list[str]) -> int:
    """`python3 tests/evpn_lab.py up|measure|reap [kinds]`: build a lab and wait for Ctrl-C
    (printing where everything is); or measure convergence and the latency from a change
    on h1 to its event at h3, split at the BGP UPDATEs; or remove what dead labs left."""
    import argparse
    from netns import Capture
    p = argparse.ArgumentParser(prog="evpn_lab.py", description=main.__doc__)
    p.add_argument("command", choices=["up", "measure", "reap"])
    p.add_argument("kinds", nargs="?", default="vtep,vtep,shadow", help="host kinds, e.g. vtep,vtep,shadow")
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args(argv)
    if a.command == "reap":
        print("\n".join(reap_stale()) or "nothing to reap")
        return 0
    try:
        with Lab(tuple(a.kinds.split(","))) as lab:
            print(" ".join(f"{k} {v:.2f} s" for k, v in lab.timings.items()))
            if a.command == "measure":
                pcap = f"{lab.dir}/bgp.pcap"
                with Capture(lab.underlay, "rr", pcap, bpf="tcp port 179"):
                    changes = propagation(lab, rounds=a.rounds)
                    time.sleep(0.2)                  # the last UPDATEs into the file
                split = hops(lab, changes, pcap)
                print("change on h1 -> event at h3, ms: median (min-max) of", a.rounds)
                for what in dict.fromkeys(c.what for c in changes):
                    cols = [sorted(c.ms for c in changes if c.what == what)]
                    cols += [sorted(r[i] for r in split if r[0] == what) for i in (1, 2, 3)]
                    print(f"  {what:9s} total {_spread(cols[0])}   h1 to UPDATE {_spread(cols[1])}   "
                          f"RR {_spread(cols[2])}   h3 UPDATE to event {_spread(cols[3])}")
                return 0
            for frr in [lab.rr] + [h.frr for h in lab.hosts]:
                print(f"{frr.name}: vtysh --vty_socket {frr.dir}    ip netns exec {frr.ns} ...")
            for h in lab.hosts:
                print(f"{h.name} tenants: {' '.join(h.tenant_ns.values())}")
            print("Ctrl-C ends the lab")
            signal.pause()
    except (LabError, FabricError, ValueError) as e:
        print(f"evpn_lab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _spread(ms: list[float]) -> str:
    return f"{ms[len(ms) // 2]:5.1f} ({ms[0]:.0f}-{ms[-1]:.0f})"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
