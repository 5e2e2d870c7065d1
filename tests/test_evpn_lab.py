"""The EVPN lab (tests/evpn_lab.py): FRRouting and the kernel's VXLAN in namespaces.

One lab for the module: a route reflector, two plain Linux VTEPs (h1, h2: real endpoints)
and a shadow host (h3: static FDB entries and permanent neighbours only, as dpu will write
them), two tenants with the same addresses. What each test proves is in its docstring;
tests/EVPN_LAB.md has the wiring, the configurations and the numbers.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

import evpn_lab
from evpn_lab import GATEWAY_MAC, TENANTS, Lab, LabError, NeighWatch, leftovers
from evpn_lab import missing as _frr_missing
from helpers import child_env
from helpers.wait import settle
from netns import Capture, ip, nsexec, sh, socket_in

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def lab(netns_ok):
    missing = _frr_missing()
    if missing:
        pytest.skip(missing)
    with Lab(("vtep", "vtep", "shadow")) as lab:
        yield lab
    assert leftovers(lab.tag, lab.dir, lab.daemon_pids().values()) == []


def _vxlan(frame: bytes):
    """(VNI, inner frame) of a VXLAN frame, else None."""
    from scapy.layers.l2 import Ether
    from scapy.layers.vxlan import VXLAN
    pkt = Ether(frame)
    return (pkt[VXLAN].vni, pkt[VXLAN].payload) if VXLAN in pkt else None


def test_bgp_sessions_establish(lab):
    """Every VTEP's l2vpn evpn session with the route reflector is Established, seen from both ends."""
    assert lab.sessions() == {h.vtep_ip: "Established" for h in lab.hosts}
    for h in lab.hosts:
        peers = h.frr.show("show bgp l2vpn evpn summary")["peers"]
        assert peers[evpn_lab.RR_IP]["state"] == "Established", h.name


def test_type2_and_type3_routes_exchanged(lab):
    """Each VTEP holds, through the reflector, the other hosts' type-2 MAC and MAC+IP routes
    (real endpoints learnt from traffic, shadow ones from static entries) and their type-3
    routes, each with its VNI's route target and the originator as next hop; and zebra put
    the remote MACs into its EVPN tables."""
    for h in lab.hosts:
        others = set().union(*(lab.expected_routes(o) for o in lab.hosts if o is not h))
        assert others <= settle(lambda: lab.evpn_routes(h.frr), lambda got: others <= got), h.name
    ep1, ep3 = lab.endpoint("h1", "red", 100), lab.endpoint("h3", "red", 100)
    macs = settle(lambda: lab.host("h2").frr.show("show evpn mac vni 100")["macs"],
                    lambda got: {ep1.mac, ep3.mac} <= got.keys())
    assert macs[ep1.mac]["type"] == "remote" and macs[ep1.mac]["remoteVtep"] == "172.31.0.11"
    assert macs[ep3.mac]["type"] == "remote" and macs[ep3.mac]["remoteVtep"] == "172.31.0.13"


@pytest.mark.parametrize("tenant", [t.name for t in TENANTS])
def test_ping_same_subnet(lab, tenant):
    """h1's endpoint reaches h2's in the same subnet, bridged: requests and replies cross
    the underlay on the subnet's own VNI, between the endpoints' own MACs."""
    t = next(t for t in TENANTS if t.name == tenant)
    for s in t.subnets:
        src, dst = lab.endpoint("h1", tenant, s.vni), lab.endpoint("h2", tenant, s.vni)
        with Capture(lab.underlay, "h2", f"{lab.dir}/l2-{s.vni}.pcap", bpf="udp port 4789") as cap:
            assert lab.ping(src, dst.ip, count=3, pattern="12b0"), f"{tenant}: {src.ip} -> {dst.ip}"
        seen = {(vni, inner.src, inner.dst) for vni, inner in filter(None, map(_vxlan, cap.frames()))
                if inner.haslayer("ICMP") and bytes(inner["ICMP"].payload).endswith(b"\x12\xb0" * 4)}
        assert seen == {(s.vni, src.mac, dst.mac), (s.vni, dst.mac, src.mac)}, tenant


def test_ping_across_subnets_is_symmetric_irb(lab):
    """10.0.0.11 (h1) reaches 10.0.1.12 (h2): both directions cross the underlay on the
    tenant's L3 VNI 4001, addressed to the other host's router MAC (symmetric IRB)."""
    src, dst = lab.endpoint("h1", "red", 100), lab.endpoint("h2", "red", 101)
    with Capture(lab.underlay, "h2", f"{lab.dir}/irb.pcap", bpf="udp port 4789") as cap:
        assert lab.ping(src, dst.ip, count=3, pattern="1eb0")
    h1, h2 = lab.host("h1"), lab.host("h2")
    seen = set()
    for vni, inner in filter(None, map(_vxlan, cap.frames())):
        if inner.haslayer("ICMP") and bytes(inner["ICMP"].payload).endswith(b"\x1e\xb0" * 4):
            seen.add((vni, inner.dst, inner["IP"].dst, inner["ICMP"].type))
    assert seen == {(4001, h2.router_mac, dst.ip, 8), (4001, h1.router_mac, src.ip, 0)}


def test_type5_route_reaches_a_remote_loopback(lab):
    """A type-5 route (h2's red loopback 10.255.2.1/32, redistributed connected) reaches
    h1 with the L3 VNI's route target and carries h1's endpoint's pings."""
    route = "[5]:[0]:[32]:[10.255.2.1] vni 4001 via 172.31.0.12"
    assert route in settle(lambda: lab.evpn_routes(lab.host("h1").frr), lambda got: route in got)
    assert lab.ping(lab.endpoint("h1", "red", 100), evpn_lab.tenant_loopback(2), count=2)


@pytest.mark.parametrize("tenant, other", [("red", "blue"), ("blue", "red")])
def test_tenants_are_isolated(lab, tenant, other):
    """One tenant's pings to the addresses both tenants use reach its own endpoints only:
    the replies come from its endpoints' MACs, every frame of the conversation crosses the
    underlay on that tenant's VNIs, and none reaches an endpoint of the other tenant."""
    mine = next(t for t in TENANTS if t.name == tenant)
    my_vnis = {mine.l3vni} | {s.vni for s in mine.subnets}
    pattern = {"red": "0e1a01", "blue": "0e1a02"}[tenant]      # ping -p fills the payload with it
    marker = bytes.fromhex(pattern)
    src = lab.endpoint("h1", tenant, mine.subnets[0].vni)
    caps = [Capture(lab.underlay, h, f"{lab.dir}/iso-{tenant}-{h}.pcap", bpf="udp port 4789")
            for h in ("h1", "h2")]
    caps += [Capture(ep.ns, "eth0", f"{lab.dir}/iso-{tenant}-{ep.ns}.pcap")
             for h in ("h1", "h2") for ep in lab.host(h).endpoints if ep.tenant == other]
    for c in caps:
        c.start()
    try:
        for s in mine.subnets:
            dst = lab.endpoint("h2", tenant, s.vni)
            assert lab.ping(src, dst.ip, count=2, pattern=pattern), f"{tenant}: {src.ip} -> {dst.ip}"
    finally:
        frames = [c.stop() for c in caps]
    same_subnet = lab.endpoint("h2", tenant, mine.subnets[0].vni)
    neigh = json.loads(nsexec(src.ns, "ip", "-j", "neigh", "show", same_subnet.ip).stdout)
    assert [n["lladdr"] for n in neigh] == [same_subnet.mac]
    carried = [v for f in frames[0] + frames[1] if (v := _vxlan(f)) and marker * 2 in bytes(v[1])]
    assert carried and {vni for vni, _ in carried} <= my_vnis
    leaked = [f for fs in frames[2:] for f in fs if marker * 2 in f]
    assert leaked == [], f"{len(leaked)} of {tenant}'s frames reached {other}'s endpoints"


def test_shadow_endpoints_are_learnt_as_type2(lab):
    """h3's endpoints exist only as a static FDB entry on a representor without carrier and
    a permanent neighbour on the SVI; h1 learns them as type-2 MAC and MAC+IP routes, and its
    zebra installs them: the MAC behind VTEP 172.31.0.13, the neighbour, the host route."""
    h1, h3 = lab.host("h1"), lab.host("h3")
    for ep in h3.endpoints:
        rep = json.loads(ip(h3.tenant_ns[ep.tenant], "-j", "link", "show", f"rep{ep.vni}").stdout)[0]
        assert "NO-CARRIER" in rep["flags"], rep
    want = {r for r in lab.expected_routes(h3) if r.startswith("[2]")}     # MAC and MAC+IP
    assert want <= settle(lambda: lab.evpn_routes(h1.frr), lambda got: want <= got)
    pytest.importorskip("pyroute2", reason="the netlink reader needs pyroute2 (pip install pyroute2)")
    for t in TENANTS:
        eps = [e for e in h3.endpoints if e.tenant == t.name]
        macs = {(ep.vni, ep.mac, h3.vtep_ip) for ep in eps}
        neighbours = {(f"br{ep.vni}", ep.ip, ep.mac) for ep in eps}
        routes = {(f"{ep.ip}/32", h3.vtep_ip, f"br{t.l3vni}") for ep in eps}
        got = settle(lambda: evpn_lab.read_installed(h1.tenant_ns[t.name], {t.l3vni}),
                       lambda g: macs <= g.macs and neighbours <= g.neighbours and routes <= g.routes)
        assert macs <= got.macs
        assert neighbours <= got.neighbours
        assert routes <= got.routes


@pytest.mark.parametrize("tenant", [t.name for t in TENANTS])
def test_reader_lists_exactly_what_frr_installed(lab, tenant):
    """In the shadow host's tenant namespace the netlink reader finds exactly the other
    hosts' MACs with their VTEP, the flood list, the router MACs on the L3 VNI, the remote
    neighbours (and the VTEPs' router MACs as neighbours on the L3 VNI bridge), and the
    host and type-5 routes via each VTEP on the L3 VNI bridge: nothing of the other tenant."""
    pytest.importorskip("pyroute2", reason="the netlink reader needs pyroute2 (pip install pyroute2)")
    t = next(t for t in TENANTS if t.name == tenant)
    remote = [lab.host("h1"), lab.host("h2")]
    eps = [(h, ep) for h in remote for ep in h.endpoints if ep.tenant == tenant]
    l3 = f"br{t.l3vni}"
    want = evpn_lab.Installed(
        macs=frozenset((ep.vni, ep.mac, h.vtep_ip) for h, ep in eps),
        flood=frozenset((s.vni, h.vtep_ip) for h in remote for s in t.subnets),
        router_macs=frozenset((t.l3vni, h.router_mac, h.vtep_ip) for h in remote),
        neighbours=frozenset({(f"br{ep.vni}", ep.ip, ep.mac) for h, ep in eps}
                             | {(l3, h.vtep_ip, h.router_mac) for h in remote}),
        routes=frozenset({(f"{ep.ip}/32", h.vtep_ip, l3) for h, ep in eps}
                         | {(f"{evpn_lab.tenant_loopback(h.index)}/32", h.vtep_ip, l3) for h in remote}))
    got = settle(lambda: evpn_lab.read_installed(lab.host("h3").tenant_ns[tenant], {t.l3vni}),
                   lambda g: g == want)
    assert got.macs == want.macs
    assert got.flood == want.flood
    assert got.router_macs == want.router_macs
    assert got.neighbours == want.neighbours
    assert got.routes == want.routes


def test_netlink_events_reach_the_shadow_host(lab):
    """A MAC, then a MAC+IP, added on h1 arrive at the shadow host's tenant namespace as
    netlink events: an FDB entry `dst 172.31.0.11 self extern_learn` on vx100 and an
    extern_learn neighbour (with the MAC) on br100; deleting them on h1 deletes both there.
    Prints the latency from each change on h1 to its event at h3 (EVPN_LAB.md's numbers)."""
    pytest.importorskip("pyroute2", reason="the event watch parses with pyroute2 (pip install pyroute2)")
    h1, h3 = lab.host("h1"), lab.host("h3")
    vx100 = json.loads(ip(h3.tenant_ns["red"], "-j", "link", "show", "vx100").stdout)[0]["ifindex"]
    br100 = json.loads(ip(h3.tenant_ns["red"], "-j", "link", "show", "br100").stdout)[0]["ifindex"]
    changes = evpn_lab.propagation(lab, "h1", "h3", "red", rounds=3)
    assert [c.what for c in changes] == ["fdb add", "neigh add", "neigh del", "fdb del"] * 3
    for c in changes:
        e = c.event
        if c.what.startswith("fdb"):
            assert (e.ifindex, e.dst) == (vx100, h1.vtep_ip) and e.flags & evpn_lab.NTF_SELF, c
        else:
            assert e.ifindex == br100, c
        if c.what.endswith("add"):
            assert e.flags & evpn_lab.NTF_EXT_LEARNED and e.mac.startswith("02:ee:01:"), c
    for what in ("fdb add", "neigh add", "neigh del", "fdb del"):
        ms = [c.ms for c in changes if c.what == what]
        print(f"h1 -> h3 {what}: {', '.join(f'{m:.0f}' for m in ms)} ms")


def test_a_forked_child_leaves_the_lab_alone(lab):
    """pyroute2's netns support forks; so may anything else. A forked child of the process
    running the lab neither closes it nor unwinds through `with Lab()` on SIGTERM: it exits
    with 143 and the lab keeps working."""
    pid = os.fork()
    if pid == 0:
        try:
            lab.close()
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 143
    assert lab.sessions() == {h.vtep_ip: "Established" for h in lab.hosts}
    assert lab.ping(lab.endpoint("h1", "red", 100), lab.endpoint("h2", "red", 100).ip)


def _probe(lab, frm: str, to: str, vni: int, payload: bytes):
    """A VXLAN packet from namespace frm's underlay address to to:4789 carrying an echo
    request from h1's endpoint in VNI vni to its gateway."""
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import Ether
    from scapy.layers.vxlan import VXLAN
    ep = next(e for e in lab.host("h1").endpoints if e.vni == vni)
    inner = (Ether(src=ep.mac, dst=GATEWAY_MAC) / IP(src=ep.ip, dst=lab.subnet(vni).gateway)
             / ICMP(id=0x1ab, seq=vni) / payload)
    s = socket_in(frm, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(bytes(VXLAN(vni=vni)) + bytes(inner), (to, 4789))
    finally:
        s.close()


def _icmp_unreachable(frames):
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import Ether
    return [Ether(f)[IP].src for f in frames if ICMP in Ether(f) and Ether(f)[ICMP].type == 3
            and Ether(f)[ICMP].code == 3]


def _vx_links(lab, host):
    return [(tns, d["ifname"]) for tns in host.tenant_ns.values()
            for d in json.loads(ip(tns, "-j", "link", "show", "type", "vxlan").stdout)]


def test_kernel_vxlan_socket_of_a_shadow_host(lab):
    """The shadow host's kernel owns UDP 4789 on its underlay address: with its VXLAN devices
    up it decapsulates a frame sent there and answers (the echo reply comes back over the L3
    VNI), so dpu must take such frames first. With one tenant's devices down the socket stays
    (the others hold it) and the frame vanishes silently; with all down, or with no VXLAN
    device at all (the route reflector), the kernel answers ICMP port unreachable.
    Bringing the devices up again, the MACs are advertised again; the permanent neighbours
    are not until they are deleted and added again."""
    h1, h3 = lab.host("h1"), lab.host("h3")
    path = f"{lab.dir}/vxsock.pcap"

    with Capture(h1.ns, "uplink", path, bpf="icmp or udp port 4789", direction="in") as cap:
        _probe(lab, h1.ns, h3.vtep_ip, 100, b"probe-up")
        got = cap.wait(1, timeout=10)
    replies = [(vni, inner) for vni, inner in filter(None, map(_vxlan, got))
               if inner.haslayer("ICMP") and bytes(inner["ICMP"].payload) == b"probe-up"]
    assert [(vni, inner["ICMP"].type, inner["IP"].dst) for vni, inner in replies] == [(4001, 0, "10.0.0.11")]

    links = _vx_links(lab, h3)
    try:
        for tns, dev in links:
            if tns == h3.tenant_ns["red"]:
                ip(tns, "link", "set", dev, "down")
        with Capture(h1.ns, "uplink", path, bpf="icmp or udp port 4789", direction="in") as cap:
            _probe(lab, h1.ns, h3.vtep_ip, 100, b"probe-red-down")
            _probe(lab, h1.ns, h3.vtep_ip, 200, b"probe-blue-up")   # its reply comes after
            cap.wait(1, timeout=10)
        frames = cap.frames()
        assert any(v and v[1].haslayer("ICMP") and bytes(v[1]["ICMP"].payload) == b"probe-blue-up"
                   for v in map(_vxlan, frames))
        assert _icmp_unreachable(frames) == []

        for tns, dev in links:
            ip(tns, "link", "set", dev, "down")
        with Capture(h1.ns, "uplink", path, bpf="icmp", direction="in") as cap:
            _probe(lab, h1.ns, h3.vtep_ip, 100, b"probe-all-down")
            _probe(lab, h1.ns, evpn_lab.RR_IP, 100, b"probe-no-vxlan")
            cap.wait(2, timeout=10)
        assert sorted(_icmp_unreachable(cap.frames())) == sorted([h3.vtep_ip, evpn_lab.RR_IP])
    finally:
        for tns, dev in links:
            ip(tns, "link", "set", dev, "up")
    for ep in h3.endpoints:                      # re-signal: zebra re-reads MACs, not neighbours
        ip(h3.tenant_ns[ep.tenant], "neigh", "del", ep.ip, "dev", f"br{ep.vni}")
        lab.write_shadow_endpoint(h3, ep)
    lab.wait_routes()


def test_an_ingress_drop_after_the_packet_socket_keeps_vxlan_from_the_kernel(lab):
    """The way for a dataplane on AF_PACKET: an nftables netdev ingress rule dropping UDP
    4789 on the shadow host's uplink. A packet socket there still sees the VXLAN frame, the
    kernel does not answer it (a ping sent after it is answered first), BGP stays up."""
    if not shutil.which("nft"):
        pytest.skip("nft is not installed (apt-get install nftables)")
    h1, h3 = lab.host("h1"), lab.host("h3")
    rules = ["add table netdev dpu",
             "add chain netdev dpu in { type filter hook ingress device uplink priority 0 ; }",
             "add rule netdev dpu in udp dport 4789 counter drop"]
    for r in rules:
        nsexec(h3.ns, "nft", r)
    try:
        with Capture(h3.ns, "uplink", f"{lab.dir}/drop-h3.pcap", bpf="udp port 4789", direction="in") as seen, \
                Capture(h1.ns, "uplink", f"{lab.dir}/drop-h1.pcap", bpf="icmp or udp port 4789",
                        direction="in") as back:
            _probe(lab, h1.ns, h3.vtep_ip, 100, b"probe-dropped")
            nsexec(h1.ns, "ping", "-c", "1", "-W", "5", h3.vtep_ip)   # answered after any answer to the probe
            seen.wait(1, timeout=10)
        answers = [f for f in back.frames() if not (_echo_reply_from(f, h3.vtep_ip))]
        assert [bytes(v[1]["ICMP"].payload) for v in map(_vxlan, seen.frames()) if v] == [b"probe-dropped"]
        assert answers == []
        counter = json.loads(nsexec(h3.ns, "nft", "-j", "list", "table", "netdev", "dpu").stdout)
        assert [e["counter"]["packets"] for r in counter["nftables"] if "rule" in r
                for e in r["rule"]["expr"] if "counter" in e] == [1]
    finally:
        nsexec(h3.ns, "nft", "delete table netdev dpu", check=False)
    assert lab.sessions()[h3.vtep_ip] == "Established"


def _echo_reply_from(frame: bytes, src: str) -> bool:
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import Ether
    pkt = Ether(frame)
    return IP in pkt and pkt[IP].proto == 1 and pkt[IP].src == src and pkt[ICMP].type == 0


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "exception"])
def test_teardown_leaves_nothing(netns_ok, how):
    """A lab (route reflector + shadow host) in a child process, ended by SIGTERM, SIGINT or
    an exception inside `with Lab()`, removes every namespace, daemon, mount, state directory
    and /var/tmp/frr/<daemon>.<pid> directory it made."""
    missing = _frr_missing()
    if missing:
        pytest.skip(missing)
    code = ("import json, signal; import evpn_lab\n"
            "with evpn_lab.Lab(('shadow',)) as lab:\n"
            "    print(json.dumps([lab.tag, lab.dir, list(lab.daemon_pids().values())]), flush=True)\n"
            f"    if {how == 'exception'}: raise RuntimeError('a test failed inside the lab')\n"
            "    signal.pause()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=child_env())
    try:
        line = child.stdout.readline()
        assert line, f"the lab did not come up: {child.stderr.read()[-2000:]}"
        tag, statedir, pids = json.loads(line)
        assert len(pids) == 4 and all(evpn_lab.pid_alive(p) for p in pids)
        if how != "exception":
            child.send_signal(getattr(signal, how))
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    err = child.stderr.read()
    assert child.returncode != 0, err
    if how == "exception":
        assert "a test failed inside the lab" in err
    assert leftovers(tag, statedir, pids) == []


def test_bad_host_kind_is_refused():
    with pytest.raises(ValueError, match="host kind 'router'"):
        Lab(("vtep", "router"))


def test_wait_until_names_what_it_waited_for():
    with pytest.raises(LabError, match="timed out after 0 s waiting for the moon"):
        evpn_lab.wait_until("the moon", lambda: False, timeout=0.05)
