"""The fabric mirror's kernel side (dpu.fabric; docs/fabric.md) against FRR and a Linux VTEP.

One lab for the module (tests/evpn_lab.py): a route reflector, h1 a plain Linux VTEP (FRR,
bridges, real endpoints, configured by the lab as FRR's documentation shows) and h2 a bare
namespace standing for a dpu host: its kernel shadow is built by `Shadow`, its FRR is
`ManagedFrr` running `render()`'s configuration. Two tenants use the same addresses on
different VNIs. What each test proves is in its docstring; the tests that change the shadow
put it back as BASE before they end. The first tests need no root: the validation, the
rendered configuration and the debouncer's timing (with a clock the test advances).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import evpn_lab
from evpn_lab import GATEWAY_MAC, RR_IP, TENANTS, Lab, leftovers
from helpers import child_env
from helpers.wait import settle as settled
from dpu.errors import FabricError, InvalidArgumentError
from dpu.fabric import underlay
from dpu.fabric.frr import FRR_TMP, ManagedFrr, Peer, render
from dpu.fabric.shadow import (Learned, Shadow, ShadowPort, ShadowSubnet, ShadowTenant, kernel_vrfs_available,
                               validate)
from dpu.fabric import watch as watch_mod
from dpu.fabric.watch import Debouncer
from netns import Capture, ip, nsexec, sh, socket_in

DPU = "h2"                        # the lab host standing for a dpu host
ROUTER_MAC = "02:b0:00:00:00:02"   # h2's, as the lab numbers router MACs


BASE = evpn_lab.shadow_tenants(2)


def _with_ports(tenants, name: str, ports) -> tuple:
    return tuple(ShadowTenant(t.name, t.l3vni, t.router_mac, t.subnets, tuple(ports)) if t.name == name else t
                 for t in tenants)


# ---- no root: what is refused, what is rendered, when a watch calls back ---------------------

def _bad(**change):
    """BASE's red tenant with one thing changed (a field of the tenant, its first subnet or
    its first port), and blue as it is."""
    red, blue = BASE
    subnet = {k[7:]: v for k, v in change.items() if k.startswith("subnet_")}
    port = {k[5:]: v for k, v in change.items() if k.startswith("port_")}
    tenant = {k: v for k, v in change.items() if not k.startswith(("subnet_", "port_"))}
    s0 = ShadowSubnet(**{**red.subnets[0].__dict__, **subnet})
    p0 = ShadowPort(**{**red.ports[0].__dict__, **port})
    red = ShadowTenant(**{**red.__dict__, "subnets": (s0,) + red.subnets[1:], "ports": (p0,) + red.ports[1:],
                          **tenant})
    return (red, blue)


@pytest.mark.parametrize("change, message", [
    ({"port_mac": "02:d0:zz:00:00:01"}, "tenant 'red': port 'p100': mac: '02:d0:zz:00:00:01' is not a MAC address"),
    ({"port_mac": "03:00:00:00:00:01"}, "is a multicast MAC address"),
    ({"port_vni": 300}, "tenant 'red': port 'p100': vni 300 is not one of the tenant's subnets (100, 101)"),
    ({"port_ip": "10.9.0.12"}, "tenant 'red': port 'p100': ip 10.9.0.12 is outside subnet 100 (10.0.0.1/24)"),
    ({"port_ip": "10.0.0.1"}, "ip 10.0.0.1 is the subnet's gateway address"),
    ({"port_ip": "10.0.0.12/24"}, "ip '10.0.0.12/24' is not an IP address"),
    ({"port_name": "br100"}, "a port name is an interface name"),
    ({"port_name": "a-name-too-long-for-linux"}, "a port name is an interface name"),
    ({"port_mac": GATEWAY_MAC}, "is the tenant's gateway or router MAC"),
    ({"subnet_vni": 200}, "tenant 'blue': vni 200 is already vni of tenant 'red'"),
    ({"subnet_vni": 0}, "subnet vni: 0 is not a VNI"),
    ({"subnet_gateways": ("10.0.1.5/24",)}, "subnet 101: gateway 10.0.1.1/24 overlaps subnet 100's 10.0.1.0/24"),
    ({"subnet_gateways": ("10.0.0.1",)}, "gateway '10.0.0.1' needs its prefix length"),
    ({"l3vni": 4002}, "tenant 'blue': l3vni 4002 is already l3vni of tenant 'red'"),
    ({"l3vni": 1 << 24}, "l3vni: 16777216 is not a VNI"),
    ({"name": "default"}, "tenant 'default': the name must be"),
    ({"name": "blue"}, "tenant 'blue': named twice"),
    ({"router_mac": "02:b0"}, "router_mac: '02:b0' is not a MAC address"),
])
def test_bad_tenants_are_refused_naming_the_mistake(change, message):
    with pytest.raises(InvalidArgumentError) as e:
        validate(_bad(**change))
    assert message in str(e.value)


def test_every_mistake_is_named_at_once_and_values_are_normalised():
    with pytest.raises(InvalidArgumentError) as e:
        validate(_bad(port_mac="nope", l3vni=0))
    assert len(str(e.value).splitlines()) == 2, str(e.value)
    red = validate(_bad(port_mac="02:D0:02:01:01:0A"))[0]
    assert red.ports[0].mac == "02:d0:02:01:01:0a"


def test_render_writes_what_nvue_writes_for_hbn():
    """zebra.conf maps each VRF to its L3 VNI; bgpd.conf has the datacenter profile, the
    peers (iBGP with the local AS, eBGP with theirs) activated in l2vpn evpn with
    advertise-all-vni, and per tenant a VRF instance advertising ipv4 unicast into EVPN."""
    confs = render(65000, "172.31.0.12", [Peer("172.31.0.2"), Peer("172.31.0.3", remote_asn=65101)], BASE,
                   graceful_restart=True, connect_retry=1)
    assert set(confs) == {"zebra.conf", "bgpd.conf"}
    zebra, bgpd = confs["zebra.conf"].splitlines(), confs["bgpd.conf"].splitlines()
    assert zebra[0] == bgpd[0] == "frr defaults datacenter"
    assert "vrf red\n vni 4001\nexit-vrf" in confs["zebra.conf"]
    assert "vrf blue\n vni 4002\nexit-vrf" in confs["zebra.conf"]
    for line in ["router bgp 65000", " bgp router-id 172.31.0.12", " no bgp default ipv4-unicast",
                 " bgp graceful-restart", " neighbor 172.31.0.2 remote-as 65000",
                 " neighbor 172.31.0.3 remote-as 65101", " neighbor 172.31.0.2 timers connect 1",
                 " address-family l2vpn evpn", "  neighbor 172.31.0.2 activate", "  neighbor 172.31.0.3 activate",
                 "  advertise-all-vni", "router bgp 65000 vrf red", "router bgp 65000 vrf blue",
                 "  advertise ipv4 unicast"]:
        assert line in bgpd, line
    assert bgpd.count("  advertise ipv4 unicast") == 2
    assert "redistribute connected" not in confs["bgpd.conf"]
    assert "  redistribute connected" in render(65000, "172.31.0.12", [], BASE,
                                                redistribute_connected=True)["bgpd.conf"].splitlines()


@pytest.mark.parametrize("args, message", [
    ((0, "172.31.0.12", [], ()), "asn 0 is not an AS number"),
    ((65000, "2001:db8::1", [], ()), "a BGP router ID is an IPv4 address"),
    ((65000, "172.31.0.12", [Peer("172.31.0.2"), Peer("172.31.0.2")], ()), "peer 172.31.0.2 is listed twice"),
    ((65000, "172.31.0.12", [Peer("rr")], ()), "peer 'rr' is not an IP address"),
    ((65000, "172.31.0.12", [Peer("172.31.0.2", remote_asn=-1)], ()), "remote_asn -1 is not an AS number"),
    ((65000, "172.31.0.12", [], _bad(port_vni=7)), "vni 7 is not one of the tenant's subnets"),
])
def test_render_refuses_what_frr_would_not_run(args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        render(*args)


def test_managed_frr_wants_both_configurations():
    with pytest.raises(InvalidArgumentError, match="confs: expected"):
        ManagedFrr("/nonexistent", None, {}, {"bgpd.conf": ""})


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_debouncer_coalesces_and_bounds_the_delay():
    """Marks come due `quiet` after the last one, at most `max_delay` after the first
    (a steady stream still gets through), and never within `quiet` of the last firing.
    (Times in binary fractions, so that the clock's sums are exact.)"""
    clock = _Clock()
    d = Debouncer(0.25, 1.0, clock)
    assert d.due_in() is None
    d.add({"red"})
    assert d.due_in() == 0.25
    clock.now += 0.125
    assert d.due_in() == 0.125
    d.add({"red"})                                # another event: quiet starts again
    assert d.due_in() == 0.25
    while d.due_in() != 0.0:                      # an event every 0.125 s: quiet never comes
        clock.now += 0.125
        d.add({"red", "blue"} if clock.now > 100.5 else {"red"})
    assert clock.now == 101.0                     # max_delay after the first
    assert d.take() == {"red", "blue"} and d.due_in() is None
    assert d.taken_since == 100.0                 # the batch's first mark: its latency starts there
    d.add({"red"})                                # right after firing: not before quiet has passed
    clock.now += 0.125
    assert d.due_in() == 0.125
    clock.now += 0.125
    assert d.due_in() == 0.0 and d.take() == {"red"}
    with pytest.raises(InvalidArgumentError, match="max_delay_s 0.01 is shorter than debounce_s 0.02"):
        Debouncer(0.02, 0.01)
    with pytest.raises(InvalidArgumentError, match="debounce_s 0 is not a positive number"):
        Debouncer(0)


def test_shadow_arguments_are_checked():
    with pytest.raises(InvalidArgumentError) as e:
        Shadow("bad tag", "not-an-ip", vxlan_port=0, mode="vrf")
    text = str(e.value)
    for fragment in ["tag 'bad tag'", "vtep_ip 'not-an-ip' is not an IP address", "vxlan_port 0",
                     "mode 'vrf': expected one of netns, kernel, auto"]:
        assert fragment in text


# ---- the lab -----------------------------------------------------------------------------

def _missing() -> str | None:
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed (pip install pyroute2): dpu.fabric parses netlink with it"
    return evpn_lab.missing()


def _need_nft() -> None:
    if not shutil.which("nft", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
        pytest.skip("nft is not installed (apt-get install nftables)")


class Fabric:
    def __init__(self, lab: Lab, shadow: Shadow, frr: ManagedFrr):
        self.lab, self.shadow, self.frr = lab, shadow, frr
        self.vtep, self.dpu = lab.host("h1"), lab.host(DPU)

    def advertised(self, tenants=BASE, with_ip: bool = True) -> set:
        """The type-2 routes the dpu host's ports give, as evpn_lab.evpn_routes says them."""
        out = set()
        for t in tenants:
            for p in t.ports:
                out.add(f"[2]:[0]:[48]:[{p.mac}] vni {p.vni} via {self.dpu.vtep_ip}")
                if with_ip and p.ip:
                    out.add(f"[2]:[0]:[48]:[{p.mac}]:[32]:[{p.ip}] vni {p.vni} via {self.dpu.vtep_ip}")
        return out

    def from_dpu(self) -> set:
        """The dpu host's type-2 routes in the Linux VTEP's EVPN table."""
        return {r for r in self.lab.evpn_routes(self.vtep.frr)
                if r.startswith("[2]") and r.endswith(f"via {self.dpu.vtep_ip}")}

    def wait_advertised(self, want: set, timeout: float = 30.0) -> set:
        return settled(self.from_dpu, lambda got: got == want, timeout)

    def expected(self, tenant: str) -> Learned:
        """What the shadow should read for tenant: the Linux VTEP's endpoints, flood entry,
        router MAC, host routes and loopback (type 5), nothing else."""
        t = next(t for t in TENANTS if t.name == tenant)
        eps = [ep for ep in self.vtep.endpoints if ep.tenant == tenant]
        v = self.vtep.vtep_ip
        routes = {f"{ep.ip}/32": v for ep in eps}
        routes[f"{evpn_lab.tenant_loopback(self.vtep.index)}/32"] = v
        return Learned(macs={(ep.vni, ep.mac): v for ep in eps}, flood={s.vni: {v} for s in t.subnets},
                       neighs={(ep.vni, ep.ip): ep.mac for ep in eps}, rmacs={v: self.vtep.router_mac},
                       routes=routes, seq={})

    def restore(self) -> None:
        self.shadow.apply(BASE)
        assert self.wait_advertised(self.advertised()) == self.advertised()


@pytest.fixture(scope="module")
def fabric(netns_ok):
    missing = _missing()
    if missing:
        pytest.skip(missing)
    with Lab(("vtep", "bare")) as lab:
        host = lab.host(DPU)
        shadow = Shadow(f"{lab.tag}-dpu", host.vtep_ip, underlay_netns=host.ns)
        frr = None
        try:
            shadow.apply(BASE)
            confs = render(evpn_lab.ASN, host.vtep_ip, [Peer(RR_IP)], BASE, hostname=DPU, connect_retry=1)
            frr = ManagedFrr(f"{lab.dir}/dpu", host.ns, shadow.namespaces(), confs, name="dpu-frr")
            frr.start()
            evpn_lab.wait_until("the dpu host's session", lambda: frr.established().get(RR_IP), 60)
            shadow.resignal()                       # zebra runs now: the neighbours are advertised
            fab = Fabric(lab, shadow, frr)
            assert fab.wait_advertised(fab.advertised(), 60) == fab.advertised()
            want = {t.name: fab.expected(t.name) for t in BASE}      # and the other way: all installed here
            assert settled(shadow.read, lambda got: got == want, 60) == want
            yield fab
        finally:
            if frr is not None:
                frr.stop()
            shadow.destroy()
    assert leftovers(lab.tag, lab.dir, lab.daemon_pids().values()) == []


def _shadow_events(fab: Fabric, fn) -> list:
    """The netlink events (links, addresses, neighbours and FDB, routes) in the dpu host's
    tenant namespaces while fn() runs, leaving out FRR's own (extern_learn entries, bgp
    routes), and the link events in its underlay namespace (where the VXLAN devices are
    born; its ARP for the reflector is the kernel's)."""
    from dpu.fabric.netlink import NTF_EXT_LEARNED, RTMGRP_IPV4_ROUTE, RTMGRP_LINK, RTMGRP_NEIGH, RTPROT_BGP, Rtnl
    groups = RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | 0x10        # 0x10: RTMGRP_IPV4_IFADDR
    socks = {ns: Rtnl(ns, groups) for ns in fab.shadow.namespaces().values()}
    socks[fab.dpu.ns] = Rtnl(fab.dpu.ns, RTMGRP_LINK)
    try:
        fn()
        out = []
        for ns, s in socks.items():
            for m in s.events():
                if m.get("event", "").endswith("NEIGH") and m["flags"] & NTF_EXT_LEARNED:
                    continue
                if m.get("event", "").endswith("ROUTE") and m["proto"] == RTPROT_BGP:
                    continue
                out.append((ns, m.get("event"), m.get_attr("IFLA_IFNAME") or m.get_attr("NDA_DST")
                            or m.get_attr("NDA_LLADDR")))
        return out
    finally:
        for s in socks.values():
            s.close()


def test_ports_are_advertised_and_installed_at_the_linux_vtep(fabric):
    """The shadow's ports exist only as a static FDB entry on a representor without carrier
    and a permanent neighbour on the SVI; the Linux VTEP gets their type-2 MAC and MAC+IP
    routes (each on its own VNI, next hop the dpu host), and its zebra installs them in the
    right tenant: the MAC behind the dpu host's VTEP, the neighbour, the host route."""
    fab = fabric
    for t in BASE:
        ns = fab.shadow.namespaces()[t.name]
        for p in t.ports:
            link = json.loads(ip(ns, "-j", "link", "show", p.name).stdout)[0]
            assert "NO-CARRIER" in link["flags"] and link["master"] == f"br{p.vni}", link
    assert fab.from_dpu() == fab.advertised()
    v = fab.dpu.vtep_ip
    for t in BASE:
        macs = {(p.vni, p.mac, v) for p in t.ports}
        neighbours = {(f"br{p.vni}", p.ip, p.mac) for p in t.ports}
        routes = {(f"{p.ip}/32", v, f"br{t.l3vni}") for p in t.ports}
        got = settled(lambda: evpn_lab.read_installed(fab.vtep.tenant_ns[t.name], {t.l3vni}),
                      lambda g: macs <= g.macs and neighbours <= g.neighbours and routes <= g.routes)
        assert {m for m in got.macs if m[2] == v} == macs
        assert {n for n in got.neighbours if n[0] != f"br{t.l3vni}" and n[1].endswith(".12")} == neighbours
        assert {r for r in got.routes if r[1] == v} == routes
        assert (t.l3vni, ROUTER_MAC, v) in got.router_macs


@pytest.mark.parametrize("tenant", [t.name for t in TENANTS])
def test_read_returns_exactly_what_frr_installed(fabric, tenant):
    """read() in the dpu host's tenant namespace: exactly the Linux VTEP's MACs and flood
    entry on this tenant's VNIs, its neighbours, its router MAC, its host routes and type-5
    loopback; nothing of the other tenant, which uses the same addresses."""
    want = fabric.expected(tenant)
    got = settled(lambda: fabric.shadow.read([tenant])[tenant], lambda g: g == want)
    assert got.macs == want.macs
    assert got.flood == want.flood
    assert got.neighs == want.neighs
    assert got.rmacs == want.rmacs
    assert got.routes == want.routes
    assert got.seq == {}
    assert set(fabric.shadow.read()) == {"red", "blue"}


def test_a_removed_port_is_withdrawn(fabric):
    """apply() without red's p101 withdraws its MAC and MAC+IP routes at the Linux VTEP (and
    its zebra uninstalls the MAC); every other route stays. Putting it back advertises it."""
    fab = fabric
    red = BASE[0]
    gone = red.ports[1]
    try:
        fab.shadow.apply(_with_ports(BASE, "red", red.ports[:1]))
        want = fab.advertised() - fab.advertised((_with_ports(BASE[:1], "red", [gone])))
        assert fab.wait_advertised(want) == want
        got = settled(lambda: evpn_lab.read_installed(fab.vtep.tenant_ns["red"], {red.l3vni}),
                      lambda g: all(m[1] != gone.mac for m in g.macs))
        assert all(m[1] != gone.mac for m in got.macs)
        assert gone.name not in {d["ifname"] for d in json.loads(ip(fab.shadow.namespaces()["red"], "-j", "link",
                                                                    "show").stdout)}
    finally:
        fab.restore()


def test_a_mac_moved_to_another_port_and_vni(fabric):
    """red's p100 MAC moves to a new port on VNI 101 with an address there: the Linux VTEP
    loses the routes on VNI 100 and gets them on VNI 101, and installs the MAC on vx101."""
    fab = fabric
    red = BASE[0]
    old = red.ports[0]
    new = ShadowPort("p100b", 101, old.mac, "10.0.1.50")
    moved = _with_ports(BASE, "red", [red.ports[1], new])
    try:
        fab.shadow.apply(moved)
        assert fab.wait_advertised(fab.advertised(moved)) == fab.advertised(moved)
        assert f"[2]:[0]:[48]:[{old.mac}]:[32]:[10.0.1.50] vni 101 via {fab.dpu.vtep_ip}" in fab.from_dpu()
        got = settled(lambda: evpn_lab.read_installed(fab.vtep.tenant_ns["red"], {red.l3vni}),
                      lambda g: {(m[0], m[1]) for m in g.macs if m[1] == old.mac} == {(101, old.mac)})
        assert {(m[0], m[2]) for m in got.macs if m[1] == old.mac} == {(101, fab.dpu.vtep_ip)}
    finally:
        fab.restore()


def test_apply_twice_is_a_noop(fabric):
    """apply() of what the kernel already has changes nothing: no link, address, FDB entry,
    neighbour or route event in the dpu host's namespaces (the same watch sees the events
    of a real change, so it is listening)."""
    fab = fabric
    assert _shadow_events(fab, lambda: fab.shadow.apply(BASE)) == []
    red = BASE[0]
    changed = _with_ports(BASE, "red", [ShadowPort(red.ports[0].name, 100, red.ports[0].mac, "10.0.0.99"),
                                        red.ports[1]])
    try:
        seen = _shadow_events(fab, lambda: fab.shadow.apply(changed))
        last = {what: e for _, e, what in seen}      # a deletion is announced FAILED first, then deleted
        assert last == {"10.0.0.12": "RTM_DELNEIGH", "10.0.0.99": "RTM_NEWNEIGH"}, seen
    finally:
        fab.restore()


def test_bad_input_changes_nothing(fabric):
    """A refused apply() touches nothing: red's new port is not made when blue has a mistake;
    the mistake is named and no event happens."""
    fab = fabric
    red, blue = BASE
    wanted = (ShadowTenant(red.name, red.l3vni, red.router_mac, red.subnets,
                           red.ports + (ShadowPort("p100new", 100, "02:d0:02:01:01:77", "10.0.0.77"),)),
              ShadowTenant(blue.name, blue.l3vni, blue.router_mac, blue.subnets,
                           blue.ports + (ShadowPort("pbad", 999, "02:d0:02:02:01:77"),)))

    def attempt():
        with pytest.raises(InvalidArgumentError, match="tenant 'blue': port 'pbad': vni 999 is not one of"):
            fab.shadow.apply(wanted)
    assert _shadow_events(fab, attempt) == []


def test_a_new_shadow_adopts_the_kernel_state(fabric):
    """A dpu restart: a new Shadow (nothing in memory) finds the tenants in the kernel by their
    marks, reads them, and its apply() of the same tenants changes nothing, so FRR withdraws
    nothing; its device indexes are the old ones."""
    fab = fabric
    ns = fab.shadow.namespaces()
    before = {n: json.loads(ip(v, "-j", "link", "show").stdout) for n, v in ns.items()}
    again = Shadow(fab.shadow.tag, fab.dpu.vtep_ip, underlay_netns=fab.dpu.ns, keep=True)
    assert again.namespaces() == ns
    want = {t.name: fab.expected(t.name) for t in BASE}
    assert settled(again.read, lambda g: g == want) == want
    assert _shadow_events(fab, lambda: again.apply(BASE)) == []
    assert {n: json.loads(ip(v, "-j", "link", "show").stdout) for n, v in ns.items()} == before
    assert fab.from_dpu() == fab.advertised()


def _fdb(ns: str, op: str, mac: str, dev: str) -> float:
    t0 = time.monotonic()
    subprocess.run(["bridge", "-n", ns, "fdb", op, mac, "dev", dev, "master", "static"], check=True)
    return t0


def test_watch_calls_back_for_a_change_on_the_linux_vtep(fabric):
    """A static MAC added on the Linux VTEP (then deleted) reaches the dpu host's red
    namespace as netlink events; watch() calls back with {"red"} only, after the events.
    Prints the time from the change on the remote to the callback, and from the first event
    in the namespace to the callback (the watch's own share; docs/fabric.md)."""
    from evpn_lab import NeighWatch
    fab = fabric
    calls = []
    vtep_ns = fab.vtep.tenant_ns["red"]
    events = NeighWatch(fab.shadow.namespaces()["red"])
    fab.shadow.watch(lambda tenants: calls.append((time.monotonic(), set(tenants))))
    rows = []
    try:
        for i in range(5):
            mac = f"02:ee:01:00:00:{i:02x}"
            for op in ("add", "del"):
                t0 = _fdb(vtep_ns, op, mac, "e100")
                ev = events.wait(lambda e: e.t >= t0 and e.bridge and e.mac == mac, timeout=30)
                t_cb, _ = evpn_lab.wait_until(f"a callback after the events of fdb {op} {mac}",
                                              lambda: next((c for c in calls if c[0] >= ev.t), None), 30, 0.005)
                rows.append((op, (ev.t - t0) * 1e3, (t_cb - ev.t) * 1e3, (t_cb - t0) * 1e3))
        assert {frozenset(t) for _, t in calls} == {frozenset({"red"})}
    finally:
        fab.shadow.stop()
        events.close()
    for op in ("add", "del"):
        r = sorted((x for x in rows if x[0] == op), key=lambda x: x[3])
        print(f"\nwatch, fdb {op} on h1: change -> first event {r[2][1]:.0f} ms, event -> callback "
              f"{r[2][2]:.1f} ms (max {max(x[2] for x in r):.1f}), change -> callback {r[2][3]:.0f} ms (median of 5)")


def test_watch_coalesces_a_burst_of_1000_changes(fabric):
    """1,000 static MACs added on the Linux VTEP in one `bridge -batch`: the watch calls back a
    few times, not once per change, and a read() made in the last callback sees all 1,000
    (then the same for their deletion). Prints the events, the callbacks, the time to the one
    that saw them all and how long its read() took."""
    from evpn_lab import NeighWatch
    fab = fabric
    vtep_ns = fab.vtep.tenant_ns["red"]
    base = len(fab.expected("red").macs)
    macs = [f"02:ee:02:00:{i >> 8:02x}:{i & 0xff:02x}" for i in range(1000)]
    seen, took = [], []

    def on_change(tenants):
        t = time.monotonic()
        n = len(fab.shadow.read(tenants)["red"].macs)
        took.append(time.monotonic() - t)
        seen.append((t, set(tenants), n))

    events = NeighWatch(fab.shadow.namespaces()["red"])
    fab.shadow.watch(on_change)
    try:
        for op, want in (("add", base + 1000), ("del", base)):
            start, first_event = len(seen), len(events.events)
            batch = "".join(f"fdb {op} {m} dev e100 master static\n" for m in macs)
            t0 = time.monotonic()
            subprocess.run(["bridge", "-n", vtep_ns, "-batch", "-"], input=batch, text=True, check=True)
            evpn_lab.wait_until(f"a callback whose read() has {want} MACs",
                                lambda: any(n == want for _, _, n in seen[start:]), 60, 0.01)
            calls = seen[start:]
            done = next(t for t, _, n in calls if n == want)
            assert calls[-1][2] == want
            assert all(t == {"red"} for _, t, _ in calls)
            assert len(calls) <= 50, f"{len(calls)} callbacks for 1,000 changes"
            burst = [e for e in events.events[first_event:] if e.mac in set(macs)]
            span = (f"over {(burst[-1].t - burst[0].t) * 1e3:.0f} ms" if burst
                    else f"(the test's own listener overran {events.overruns} times)")
            print(f"\nburst of 1,000 fdb {op}: {len(burst)} FDB events {span} "
                  f"-> {len(calls)} callbacks; all in read() {done - t0:.2f} s after the batch began; "
                  f"that read() took {took[seen.index(next(c for c in calls if c[2] == want))] * 1e3:.0f} ms")
    finally:
        fab.shadow.stop()
        events.close()
        subprocess.run(["bridge", "-n", vtep_ns, "-batch", "-"], text=True, capture_output=True,
                       input="".join(f"fdb del {m} dev e100 master static\n" for m in macs))


def test_the_watch_keeps_what_read_returns_from_its_events(fabric, monkeypatch):
    """What the watch builds from netlink events alone (Shadow.watched(), no dump) equals a
    fresh read() after every kind of change: MAC and MAC+IP routes added and withdrawn on the
    Linux VTEP, a VXLAN device flapping here (dumped again), FRR stopped (zebra flushes every
    MAC, neighbour, router MAC and route) and started (all installed again). And the check
    against a dump that runs once a minute, made to run now, finds nothing to correct."""
    fab = fabric
    vtep_ns = fab.vtep.tenant_ns["red"]
    dpu_ns = fab.shadow.namespaces()["red"]
    snaps = []
    fab.shadow.watch(lambda tenants: snaps.append(fab.shadow.watched()))
    watcher = fab.shadow._watcher

    def caught_up(what):
        evpn_lab.wait_until(f"the watch's state to equal read() after {what}",
                            lambda: snaps and snaps[-1] == fab.shadow.read(), 60, 0.05)

    hosts = [(f"02:ee:03:00:00:{i:02x}", f"10.0.0.{210 + i}") for i in range(3)]
    try:
        n = len(snaps)
        for mac, addr in hosts:
            _fdb(vtep_ns, "add", mac, "e100")
            sh("ip", "-n", vtep_ns, "neigh", "replace", addr, "lladdr", mac, "dev", "br100", "nud", "permanent")
        evpn_lab.wait_until("the MAC+IP routes", lambda: snaps and all(
            snaps[-1]["red"].neighs.get((100, a)) == m for m, a in hosts), 60, 0.05)
        caught_up("MAC and MAC+IP routes added")
        assert len(snaps) > n and snaps[-1]["red"].macs[(100, hosts[0][0])] == fab.vtep.vtep_ip
        for mac, addr in hosts:
            sh("ip", "-n", vtep_ns, "neigh", "del", addr, "dev", "br100")
            _fdb(vtep_ns, "del", mac, "e100")
        evpn_lab.wait_until("the withdrawals", lambda: snaps and not any(
            (100, m) in snaps[-1]["red"].macs for m, _ in hosts), 60, 0.05)
        caught_up("MAC and MAC+IP routes withdrawn")
        # Entries keyed as the kernel keys them, written here as zebra would: an IPv6 neighbour
        # is no MAC+IP route (read() dumps IPv4); a router MAC's FDB entry moved to another
        # VTEP is one entry, not two; a kernel route that replaces zebra's route clears it.
        l3 = BASE[0].l3vni
        rmac, rmac2 = "02:ee:04:00:00:01", "02:ee:04:00:00:02"
        vteps, prefix = ("198.51.100.77", "198.51.100.78"), "10.99.0.0/24"
        v6 = "net.ipv6.conf.br100.disable_ipv6"
        try:
            nsexec(dpu_ns, "sysctl", "-qw", f"{v6}=0")       # the shadow has IPv6 off on its devices
            ip(dpu_ns, "-6", "neigh", "replace", "fd00:99::5", "lladdr", hosts[0][0], "dev", "br100",
               "extern_learn")
            for verb, vtep in zip(("add", "replace"), vteps):
                sh("bridge", "-n", dpu_ns, "fdb", verb, rmac, "dev", f"vx{l3}", "dst", vtep, "self", "extern_learn")
                evpn_lab.wait_until(f"router MAC at {vtep}", lambda: snaps and snaps[-1]["red"].rmacs.get(vtep) == rmac,
                                    30, 0.05)
                caught_up(f"a router MAC's FDB entry {verb}d")
            assert vteps[0] not in snaps[-1]["red"].rmacs
            # two router MACs at one VTEP: the lowest, whatever order the kernel lists them in
            sh("bridge", "-n", dpu_ns, "fdb", "add", rmac2, "dev", f"vx{l3}", "dst", vteps[1], "self", "extern_learn")
            caught_up("a second router MAC at the VTEP")
            assert snaps[-1]["red"].rmacs[vteps[1]] == rmac < rmac2
            assert not any(ip_ == "fd00:99::5" for _, ip_ in snaps[-1]["red"].neighs)
            ip(dpu_ns, "route", "add", prefix, "via", vteps[1], "dev", f"br{l3}", "onlink", "proto", "bgp",
               "metric", "20")
            evpn_lab.wait_until("the route", lambda: snaps and snaps[-1]["red"].routes.get(prefix) == vteps[1], 30, 0.05)
            ip(dpu_ns, "route", "add", prefix, "dev", f"br{l3}", "metric", "30")   # another metric: another route
            caught_up("a kernel route beside zebra's")
            assert snaps[-1]["red"].routes.get(prefix) == vteps[1]
            ip(dpu_ns, "route", "del", prefix, "metric", "30")
            ip(dpu_ns, "route", "replace", prefix, "dev", f"br{l3}", "metric", "20")
            evpn_lab.wait_until("the route replaced", lambda: snaps and prefix not in snaps[-1]["red"].routes, 30, 0.05)
            caught_up("zebra's route replaced by a kernel route")
        finally:
            subprocess.run(["ip", "-n", dpu_ns, "route", "del", prefix, "metric", "20"], capture_output=True)
            for m in (rmac, rmac2):
                subprocess.run(["bridge", "-n", dpu_ns, "fdb", "del", m, "dev", f"vx{l3}", "self"], capture_output=True)
            subprocess.run(["ip", "-n", dpu_ns, "-6", "neigh", "del", "fd00:99::5", "dev", "br100"], capture_output=True)
            nsexec(dpu_ns, "sysctl", "-qw", f"{v6}=1")
        caught_up("the entries written by hand removed")
        ip(dpu_ns, "link", "set", "vx100", "down")
        ip(dpu_ns, "link", "set", "vx100", "up")
        time.sleep(1)
        caught_up("a VXLAN device flap")
        want = {t.name: fab.expected(t.name) for t in BASE}
        assert want["red"].routes and want["red"].rmacs, "the routes and router MACs are part of what is checked"
        fab.frr.stop()
        empty = {t.name: Learned() for t in BASE}
        evpn_lab.wait_until("everything flushed", lambda: snaps and snaps[-1] == empty, 60, 0.05)
        caught_up("FRR stopped")
        fab.frr.start()
        fab.shadow.resignal()
        evpn_lab.wait_until("everything installed again", lambda: snaps and snaps[-1] == want, 90, 0.05)
        caught_up("FRR started again")
        # The once-a-minute check, made to run now, with a MAC installed while it runs (after
        # the events were read, before the dump): the dump has it, the events that built the
        # state not yet; folded into both, it is no drift.
        late = "02:ee:03:00:00:77"
        real_dump = watch_mod.dump_ns

        def dump_during_a_change(ns, *args, **kw):
            if ns == dpu_ns:
                subprocess.run(["bridge", "-n", dpu_ns, "fdb", "replace", late, "dev", "vx100", "dst", vteps[0],
                                "self", "extern_learn"], check=False)
            return real_dump(ns, *args, **kw)
        monkeypatch.setattr(watch_mod, "dump_ns", dump_during_a_change)
        drifts, verify_at = watcher.drifts, watcher._next_verify
        watcher._next_verify = 0.0
        watcher._wake()
        evpn_lab.wait_until("the check against a dump", lambda: watcher._next_verify > verify_at, 30, 0.05)
        monkeypatch.setattr(watch_mod, "dump_ns", real_dump)
        assert watcher.drifts == drifts == 0
        caught_up("a MAC installed during the check")
        assert snaps[-1]["red"].macs.get((100, late)) == vteps[0]
        sh("bridge", "-n", dpu_ns, "fdb", "del", late, "dev", "vx100", "self")
        caught_up("that MAC removed")
    finally:
        fab.shadow.stop()
        ip(dpu_ns, "link", "set", "vx100", "up")
        if not fab.frr.alive():
            fab.frr.start()
        fab.restore()


def test_the_watch_heals_an_overrun_without_its_check(fabric, monkeypatch):
    """20,000 MACs installed in the dpu host's red namespace as zebra installs them, then
    removed, each in one `bridge -batch`, into a watch whose socket is made small and whose dumps
    take as long as a big fabric's: it overruns (ENOBUFS), and what it builds equals a fresh
    read() again soon after each, with the once-a-minute check against a dump held off. It
    takes the socket emptied at once after an overrun (until its queue has been empty, the
    kernel drops what overflows it again without a word) and dumps trusted once two agree, with
    a recheck after one that did not (before both: 2 runs of 3 timed out on the deletion)."""
    fab = fabric
    dpu_ns = fab.shadow.namespaces()["red"]
    monkeypatch.setattr(watch_mod, "RCVBUF", 16 << 10)
    real_dump = watch_mod.dump_ns

    def slow_dump(*args, **kw):       # as a dump of tens of thousands of entries: events queue up
        scan = real_dump(*args, **kw)
        time.sleep(0.2)
        return scan
    monkeypatch.setattr(watch_mod, "dump_ns", slow_dump)
    snaps = []
    fab.shadow.watch(lambda tenants: snaps.append(fab.shadow.watched()))
    watcher = fab.shadow._watcher
    watcher._next_verify = time.monotonic() + 3600
    vtep, N = "198.51.100.79", 20000
    macs = [f"02:ee:05:{i >> 16:02x}:{i >> 8 & 0xff:02x}:{i & 0xff:02x}" for i in range(N)]

    def batch(op):
        tail = f"dst {vtep} self extern_learn" if op == "add" else f"dst {vtep} self"
        return "".join(f"fdb {op} {m} dev vx100 {tail}\n" for m in macs)
    try:
        for op in ("add", "del"):
            subprocess.run(["bridge", "-n", dpu_ns, "-batch", "-"], input=batch(op), text=True, check=True)
            want = fab.shadow.read()      # the batch is done: nothing changes under this dump
            assert sum(m.startswith("02:ee:05:") for _, m in want["red"].macs) == (N if op == "add" else 0)
            evpn_lab.wait_until(f"the watch's state to equal read() after {N:,} fdb {op}",
                                lambda: snaps and snaps[-1] == want, 30, 0.05)
        assert watcher.overruns > 0, "the watch's socket never overran: this test tested nothing"
        assert watcher.drifts == 0
    finally:
        fab.shadow.stop()
        subprocess.run(["bridge", "-n", dpu_ns, "-batch", "-"], input=batch("del"), text=True, capture_output=True)


def test_a_dump_that_never_settled_keeps_what_any_dump_listed_newest_last():
    """settled_dump(merge=True)'s union of dumps that never agreed, folded as read() folds it:
    an entry only older dumps listed is kept (the FDB dump skips entries, so absent is not
    gone), and where the dumps disagree on a MAC's remote or a neighbour's MAC the newest wins."""
    from dpu.fabric import netlink as nl
    from dpu.fabric.fold import Link, Place, Scan, learned_of
    from dpu.fabric.netlink import _Msg

    def fdb(mac, vtep):
        return _Msg(nl.RTM_NEWNEIGH, 0, 0, {"family": socket.AF_BRIDGE, "ifindex": 5, "state": nl.NUD_NOARP,
                                            "flags": nl.NTF_SELF | nl.NTF_EXT_LEARNED},
                    {"NDA_LLADDR": mac, "NDA_DST": vtep})

    def neigh(ip, mac):
        return _Msg(nl.RTM_NEWNEIGH, 0, 0, {"family": socket.AF_INET, "ifindex": 4, "state": nl.NUD_NOARP,
                                            "flags": nl.NTF_EXT_LEARNED}, {"NDA_DST": ip, "NDA_LLADDR": mac})
    links = {4: Link(4, "br100", "bridge", 0, "", "02:00:00:00:00:04", 0),
             5: Link(5, "vx100", "vxlan", 4, "", "02:00:00:00:00:05", 0, vni=100)}
    dumps = [Scan(links, {}, [fdb("02:00:00:00:00:01", "10.9.0.1"), fdb("02:00:00:00:00:02", "10.9.0.1")],
                  [neigh("10.0.0.7", "02:00:00:00:00:01")], []),
             Scan(links, {}, [fdb("02:00:00:00:00:01", "10.9.0.2"), fdb("02:00:00:00:00:03", "10.9.0.1")],
                  [neigh("10.0.0.7", "02:00:00:00:00:03")], []),
             Scan(links, {}, [fdb("02:00:00:00:00:03", "10.9.0.1")], [], [])]
    got = learned_of(watch_mod._union(dumps), Place(None, None, 254), "t")
    assert got.macs == {(100, "02:00:00:00:00:01"): "10.9.0.2", (100, "02:00:00:00:00:02"): "10.9.0.1",
                        (100, "02:00:00:00:00:03"): "10.9.0.1"}
    assert got.neighs == {(100, "10.0.0.7"): "02:00:00:00:00:03"}
    assert learned_of(dumps[-1], Place(None, None, 254), "t").macs == {(100, "02:00:00:00:00:03"): "10.9.0.1"}
    # A MAC at A, then B, then A again, then skipped: A, its newest listing. Flood entries (the
    # all-zero MAC, one per VTEP) from different dumps are all kept. A neighbour rewritten FAILED
    # without a MAC (zebra deleting it) in a later dump is gone.
    mac, zero = "02:00:00:00:00:09", "00:00:00:00:00:00"
    failed = neigh("10.0.0.8", None)
    failed.fields["state"] = nl.NUD_FAILED
    dumps = [Scan(links, {}, [fdb(mac, "10.9.0.1"), fdb(zero, "10.9.0.1")], [neigh("10.0.0.8", mac)], []),
             Scan(links, {}, [fdb(mac, "10.9.0.2"), fdb(zero, "10.9.0.2")], [failed], []),
             Scan(links, {}, [fdb(mac, "10.9.0.1")], [], []),
             Scan(links, {}, [], [], [])]
    got = learned_of(watch_mod._union(dumps), Place(None, None, 254), "t")
    assert got.macs == {(100, mac): "10.9.0.1"}
    assert got.flood == {100: {"10.9.0.1", "10.9.0.2"}}
    assert got.neighs == {}
    with pytest.raises(InvalidArgumentError, match="1 dumps cannot agree"):
        watch_mod.settled_dump(None, attempts=1)

class _FdbChurn:
    """20 remote MACs that stay and 20,000 that come and go on vx100 of namespace ns (all
    `extern_learn`, as zebra's, to VTEP dst), by `bridge -batch`; failures in .errors."""

    def __init__(self, ns: str, dst: str) -> None:
        self.ns, self.dst, self.errors = ns, dst, []
        self.stay = {f"02:aa:00:00:00:{i:02x}" for i in range(20)}
        self.churn = [f"02:bb:00:{i >> 8 & 0xff:02x}:{i & 0xff:02x}:00" for i in range(20000)]

    def batch(self, op: str, macs) -> None:
        tail = f"dst {self.dst} self" + (" extern_learn" if op == "add" else "")
        r = subprocess.run(["bridge", "-n", self.ns, "-batch", "-"], text=True, capture_output=True,
                           input="".join(f"fdb {op} {m} dev vx100 {tail}\n" for m in macs))
        if r.returncode:
            self.errors.append(f"fdb {op}: {r.stderr[-300:]}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a network namespace")
def test_a_settled_dump_lacks_no_entry_a_racing_fdb_dump_skips():
    """The kernel's FDB dump resumes each part by counting entries: while 20,000 entries are
    deleted under it, it may leave out entries that stay. A dump that settled_dump() says two
    dumps agreed on has every one of them (eight rounds); plain dumps at the same moments lacked
    some (else there is nothing to compare, and the test says so)."""
    import threading
    ns = f"dpu-fdbrace-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        sh("ip", "-n", ns, "link", "add", "vx100", "type", "vxlan", "id", "100", "dstport", "4789",
           "local", "10.9.0.1", "nolearning")
        sh("ip", "-n", ns, "link", "set", "vx100", "up")
        fdb = _FdbChurn(ns, "10.9.0.2")
        stay, churn, errors, batch = fdb.stay, fdb.churn, fdb.errors, fdb.batch

        def macs(scan):
            return {m.get_attr("NDA_LLADDR") for m in scan.fdb}
        batch("add", sorted(stay))
        plain = settled = lacking = 0
        for _ in range(8):
            batch("add", churn)
            deleting = threading.Thread(target=batch, args=("del", churn))
            deleting.start()
            while deleting.is_alive():
                plain += not stay <= macs(watch_mod.dump_ns(ns))
                scan, agreed = watch_mod.settled_dump(ns)
                settled += agreed
                lacking += agreed and not stay <= macs(scan)
            deleting.join()
            assert not errors, errors
        print(f"\nplain FDB dumps racing deletions that lacked a staying entry: {plain}; "
              f"settled dumps: {settled}, lacking one: {lacking}")
        assert lacking == 0
        if not plain or settled < 8:
            pytest.skip(f"nothing to compare: {plain} plain dumps lacked an entry, {settled} settled")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)



def test_read_lacks_no_learned_mac_while_the_fdb_churns(netns_ok, caplog):
    """Shadow.read() (what a sync without a watch commits) while 20,000 FDB entries of the same
    VXLAN device are deleted 500 at a time: every remote MAC that stays is in what it returns,
    each time (three rounds), also when its dumps never agreed and it returned what any of them
    listed. A read from one plain FDB dump lacked one in 5 to 13 of about 40 such reads, and dpu
    would have withdrawn it."""
    import threading
    from dpu import cleanup
    ul = f"fxr-{os.getpid()}-ul"
    handle = cleanup.register(cleanup.netns_remove, ul)
    caplog.set_level("INFO", logger="dpu.fabric")
    try:
        subprocess.run(["ip", "netns", "add", ul], check=True)
        shadow = Shadow(f"fxr-{os.getpid()}", "172.31.9.1", underlay_netns=ul)
        shadow.apply(BASE)
        fdb = _FdbChurn(shadow.namespaces()["red"], "172.31.9.2")
        stay, churn, errors, batch = fdb.stay, fdb.churn, fdb.errors, fdb.batch

        def delete_slowly():
            for i in range(0, len(churn), 500):
                batch("del", churn[i:i + 500])
        batch("add", sorted(stay))
        assert not errors, errors
        want = {(100, m): "172.31.9.2" for m in stay}
        assert shadow.read(["red"])["red"].macs == want
        reads = lacking = 0
        for _ in range(3):
            batch("add", churn)
            deleting = threading.Thread(target=delete_slowly)
            deleting.start()
            while deleting.is_alive():
                got = shadow.read(["red"])["red"].macs
                reads += 1
                lacking += not want.items() <= got.items()
            deleting.join()
            assert not errors, errors
        merged = sum("kept changing while it was read" in r.getMessage() for r in caplog.records)
        print(f"\nreads racing deletions: {reads} ({merged} of them merged), lacking a staying MAC: {lacking}")
        assert lacking == 0
        assert shadow.read(["red"])["red"].macs == want   # what was deleted is gone once it settles
        shadow.destroy()
        if not merged:
            pytest.skip(f"no read of {reads} had to merge its dumps: nothing of that case to check")
    finally:
        handle.run()

def test_watch_resignals_after_a_vxlan_flap(fabric):
    """vx100 of the dpu host goes down (zebra withdraws VNI 100) and up again: zebra re-reads
    the MAC but not the neighbour, so only the watch's re-signal brings the MAC+IP route back
    to the Linux VTEP."""
    fab = fabric
    ns = fab.shadow.namespaces()["red"]
    p = BASE[0].ports[0]
    mac_ip = f"[2]:[0]:[48]:[{p.mac}]:[32]:[{p.ip}] vni 100 via {fab.dpu.vtep_ip}"
    fab.shadow.watch(lambda tenants: None)
    try:
        ip(ns, "link", "set", "vx100", "down")
        got = settled(fab.from_dpu, lambda g: mac_ip not in g)
        assert mac_ip not in got
        ip(ns, "link", "set", "vx100", "up")
        assert fab.wait_advertised(fab.advertised()) == fab.advertised()
    finally:
        fab.shadow.stop()
        ip(ns, "link", "set", "vx100", "up")
        fab.restore()


def test_frr_restart_flushes_and_resignal_readvertises(fabric):
    """Stopping the managed FRR flushes what zebra installed (read() finds nothing) and removes
    the daemons' /var/tmp/frr directories; started again, everything is installed again, the
    MACs are advertised again, and resignal() brings back the MAC+IP routes."""
    fab = fabric
    empty = {t.name: Learned() for t in BASE}
    old = dict(fab.frr.pids)
    fab.frr.stop()
    assert not fab.frr.alive()
    assert [d for d, pid in old.items() if os.path.exists(f"{FRR_TMP}/{d}.{pid}")] == []
    assert settled(fab.shadow.read, lambda g: g == empty) == empty
    fab.frr.start()
    want = {t.name: fab.expected(t.name) for t in BASE}
    assert settled(fab.shadow.read, lambda g: g == want, 60) == want
    macs = fab.advertised(with_ip=False)
    got = settled(fab.from_dpu, lambda g: macs <= g, 60)
    assert macs <= got
    print(f"\nafter the restart, before resignal(): {len(got - macs)} of {len(fab.advertised() - macs)} "
          "MAC+IP routes advertised")
    fab.shadow.resignal()
    assert fab.wait_advertised(fab.advertised()) == fab.advertised()


def _probe(fab: Fabric, payload: bytes) -> None:
    """VXLAN from the Linux VTEP's underlay address to the dpu host's, VNI 100, carrying an
    echo request from h1's red endpoint to the anycast gateway."""
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import Ether
    from scapy.layers.vxlan import VXLAN
    ep = next(e for e in fab.vtep.endpoints if e.vni == 100)
    inner = Ether(src=ep.mac, dst=GATEWAY_MAC) / IP(src=ep.ip, dst="10.0.0.1") / ICMP(id=0x1ab, seq=1) / payload
    s = socket_in(fab.vtep.ns, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(bytes(VXLAN(vni=100, flags=0x08)) + bytes(inner), (fab.dpu.vtep_ip, 4789))
    finally:
        s.close()


def _answers(frames, src: str) -> list:
    """Frames from src in a capture on the Linux VTEP's uplink other than echo replies to
    its own ping of the underlay address: VXLAN or ICMP (e.g. port unreachable)."""
    from scapy.layers.inet import ICMP, IP, UDP
    from scapy.layers.l2 import Ether
    out = []
    for f in frames:
        pkt = Ether(f)
        if IP not in pkt or pkt[IP].src != src:
            continue
        if ICMP in pkt and pkt[ICMP].type == 0 and UDP not in pkt:
            continue
        out.append(pkt.summary())
    return out


def test_guard_vxlan_keeps_the_kernel_from_answering(fabric):
    """Without the guard the dpu host's kernel decapsulates VXLAN sent to its underlay address
    and answers it; with guard_vxlan() on its uplink a packet socket there still sees the
    frame, nothing comes back (no reply, no ICMP port unreachable; a ping of the underlay
    address sent after it is answered first), BGP stays Established. The undo removes it."""
    _need_nft()
    fab = fabric
    h1, h2 = fab.vtep, fab.dpu
    bpf = f"host {h2.vtep_ip} and (icmp or udp port 4789)"
    with Capture(h1.ns, "uplink", f"{fab.lab.dir}/unguarded.pcap", bpf=bpf, direction="in") as back:
        _probe(fab, b"unguarded")
        back.wait(1, timeout=10)
    assert _answers(back.frames(), h2.vtep_ip), "the kernel did not answer the unguarded probe"
    undo = underlay.guard_vxlan("uplink", 4789, h2.ns)
    try:
        with Capture(h2.ns, "uplink", f"{fab.lab.dir}/seen.pcap", bpf="udp port 4789", direction="in") as seen, \
                Capture(h1.ns, "uplink", f"{fab.lab.dir}/guarded.pcap", bpf=bpf, direction="in") as back:
            _probe(fab, b"guarded")
            nsexec(h1.ns, "ping", "-c", "1", "-W", "5", h2.vtep_ip)
            seen.wait(1, timeout=10)
        assert [f for f in seen.frames() if b"guarded" in f], "the packet socket did not see the probe"
        assert _answers(back.frames(), h2.vtep_ip) == []
        assert underlay.dropped("uplink", h2.ns) >= 1
        assert fab.frr.established() == {RR_IP: True}
    finally:
        undo()
    assert underlay.table_name("uplink") not in nsexec(h2.ns, "nft", "list", "tables").stdout
    undo()                                              # idempotent


def test_guard_without_nft_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(underlay, "SBIN", ())
    with pytest.raises(FabricError, match=r"nft is not installed \(apt-get install nftables\)"):
        underlay.guard_vxlan("uplink", 4789, None)


# ---- teardown ----------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from evpn_lab import shadow_tenants
    BASE = shadow_tenants(2)
    from dpu.fabric.frr import ManagedFrr, Peer, render
    from dpu.fabric.shadow import Shadow
    from dpu.fabric.underlay import guard_vxlan
    tag, ul, statedir, how = sys.argv[1:5]
    shadow = Shadow(tag, "172.31.9.1", underlay_netns=ul)
    shadow.apply(BASE)
    frr = ManagedFrr(statedir, ul, shadow.namespaces(), render(65000, "172.31.9.1", [Peer("172.31.9.2")], BASE))
    frr.start()
    undo = guard_vxlan("uplink", 4789, ul)
    shadow.resignal()
    shadow.watch(lambda tenants: None)
    print(json.dumps([sorted(shadow.namespaces().values()), list(frr.pids.values())]), flush=True)
    if how == "destroy":
        undo(); frr.stop(); shadow.destroy()
        print("destroyed", flush=True)
        os._exit(0)                       # no atexit cleanup: destroy() alone must have done it all
    signal.pause()
""")


def _teardown_leftovers(tag: str, ul: str, statedir: str, pids) -> list:
    found = [f"namespace {n}" for n in os.listdir("/run/netns") if n.startswith(f"{tag}-")]
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            with open(f"/proc/{proc}/cmdline", "rb") as f:
                if statedir.encode() in f.read():
                    found.append(f"process {proc}")
            with open(f"/proc/{proc}/mountinfo") as f:
                found += [f"mount {line.split()[4]} in process {proc}" for line in f if statedir in line]
        except OSError:
            continue
    found += [f"directory {d}" for d in os.listdir(FRR_TMP) for pid in pids if d.endswith(f".{pid}")] \
        if os.path.isdir(FRR_TMP) else []
    tables = nsexec(ul, "nft", "list", "tables", check=False).stdout
    found += [f"nft {line}" for line in tables.splitlines() if "dpu_vxlan" in line]
    links = json.loads(ip(ul, "-j", "link", "show").stdout)
    found += [f"device {d['ifname']} in {ul}" for d in links if d["ifname"] not in ("lo", "uplink", "peer")]
    return found


@pytest.mark.parametrize("how", ["destroy", "SIGTERM"])
def test_teardown_leaves_nothing(netns_ok, how):
    """A process with a shadow (two tenants), its managed FRR, the VXLAN guard and a watch,
    ended by destroy()/stop()/undo (without the exit-time cleanup) or by SIGTERM (dpu.cleanup),
    leaves no namespace, daemon, mount, /var/tmp/frr directory, nft table or device behind."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    _need_nft()
    from dpu import cleanup
    ul = f"fxt-{os.getpid()}-ul"
    tag = f"fxt-{os.getpid()}-{how.lower()}"
    handle = cleanup.register(cleanup.netns_remove, ul)
    try:
        subprocess.run(["ip", "netns", "add", ul], check=True)
        ip(ul, "link", "set", "lo", "up")
        ip(ul, "link", "add", "uplink", "type", "veth", "peer", "name", "peer")
        ip(ul, "addr", "add", "172.31.9.1/24", "dev", "uplink")
        ip(ul, "link", "set", "uplink", "up")
        ip(ul, "link", "set", "peer", "up")
        statedir = f"/tmp/{tag}-frr"             # user frr must reach it: not below pytest's 0700 tmp_path
        child = subprocess.Popen([sys.executable, "-c", _CHILD, tag, ul, statedir, how],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            line = child.stdout.readline()
            assert line, f"the child did not come up: {child.stderr.read()[-2000:]}"
            namespaces, pids = json.loads(line)
            assert len(namespaces) == 2 and len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
            assert _teardown_leftovers(tag, ul, statedir, pids) != []
            if how == "SIGTERM":
                child.send_signal(signal.SIGTERM)
            else:
                assert child.stdout.readline().strip() == "destroyed", child.stderr.read()[-2000:]
            child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        err = child.stderr.read()
        assert child.returncode == (0 if how == "destroy" else -signal.SIGTERM), err
        assert _teardown_leftovers(tag, ul, statedir, pids) == []
    finally:
        handle.run()
        shutil.rmtree(f"/tmp/{tag}-frr", ignore_errors=True)


def test_kernel_vrf_mode(netns_ok):
    """Where the kernel has VRF devices: each tenant is a VRF device (table base + L3 VNI) in
    the underlay namespace holding its bridges, whose ports and VXLAN devices hang below;
    read() and destroy() find them through the VRF."""
    if not kernel_vrfs_available():
        pytest.skip("this kernel has no VRF device (`ip link add type vrf` fails): the netns VRF mode is "
                    "the one that runs here (docs/fabric.md)")
    from dpu import cleanup
    ul = f"fxk-{os.getpid()}-ul"
    handle = cleanup.register(cleanup.netns_remove, ul)
    try:
        subprocess.run(["ip", "netns", "add", ul], check=True)
        shadow = Shadow(f"fxk-{os.getpid()}", "172.31.9.1", underlay_netns=ul, mode="kernel")
        shadow.apply(BASE)
        assert shadow.namespaces() == {}
        links = {d["ifname"]: d for d in json.loads(ip(ul, "-j", "-d", "link", "show").stdout)}
        for t in BASE:
            assert links[t.name]["linkinfo"]["info_kind"] == "vrf"
            for v in [t.l3vni] + [s.vni for s in t.subnets]:
                assert links[f"br{v}"]["master"] == t.name and links[f"vx{v}"]["master"] == f"br{v}"
            for p in t.ports:
                assert links[p.name]["master"] == f"br{p.vni}"
        assert shadow.read() == {t.name: Learned() for t in BASE}
        assert _shadow_events_in(ul, lambda: shadow.apply(BASE)) == []
        shadow.destroy()
        left = [d["ifname"] for d in json.loads(ip(ul, "-j", "link", "show").stdout)]
        assert left == ["lo"]
    finally:
        handle.run()


def _shadow_events_in(ns: str, fn) -> list:
    from dpu.fabric.netlink import RTMGRP_IPV4_ROUTE, RTMGRP_LINK, RTMGRP_NEIGH, Rtnl
    with Rtnl(ns, RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | 0x10) as s:
        fn()
        return [m.get("event") for m in s.events()]
