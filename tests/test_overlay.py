"""VXLAN overlay compiled from the tenant topology (issue: per-tenant isolation)."""
import copy
import os

import pytest
import yaml
from scapy.all import ARP, ICMP, IP, UDP, Dot1Q, Ether, IPv6, Raw
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from dpu.errors import TopologyError
from dpu.topology import compile_topology, load_topology
from helpers.packets import (
    BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, BROADCAST, GW_MAC, NEXTHOP_MAC, RED_REMOTE_IP, RED_REMOTE_MAC,
    RED_VNI, UPLINK_MAC, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VM3_IP, VM3_MAC, VTEP_BLUE, VTEP_LOCAL, VTEP_RED,
    arp_request, five_tuple_hash, udp, vxlan,
)

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")


def topo_dict():
    with open(TOPO) as f:
        return yaml.safe_load(f)


@pytest.fixture
def dp():
    return Dataplane.from_topology(TOPO)


def only(outs, port):
    assert [o.port for o in outs] == [port], [(o.port, Ether(o.data).summary()) for o in outs]
    return Ether(outs[0].data)


def drops(dp, port):
    return dp.stats()["ports"][port]["drops"]


# ---- encapsulation --------------------------------------------------------------------

def test_encap_to_remote_endpoint_on_the_wire(dp):
    inner = udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP, sport=4000, dport=80)
    o = only(dp.process(inner, in_port="vm1"), "p0")
    assert (o.src, o.dst, o.type) == (UPLINK_MAC, NEXTHOP_MAC, 0x0800)
    ip = o[IP]
    assert (ip.src, ip.dst, ip.ttl, ip.proto) == (VTEP_LOCAL, VTEP_BLUE, 64, 17)
    assert ip.flags.DF and not ip.flags.MF and ip.frag == 0
    assert ip.len == 20 + 8 + 8 + len(bytes(inner))
    chk = ip.chksum
    del ip.chksum
    assert IP(bytes(ip)).chksum == chk, "outer IPv4 checksum"
    u = o[UDP]
    assert u.dport == 4789 and u.chksum == 0 and 49152 <= u.sport <= 65535
    assert bytes(o[UDP])[8:16] == bytes([0x08, 0, 0, 0, 0, 0, BLUE_VNI, 0])
    assert bytes(o[UDP])[16:] == bytes(inner), "inner frame untouched"
    want = five_tuple_hash(VM1_IP, BLUE_REMOTE_IP, 17, 4000, 80)
    assert u.sport == 49152 + ((want * 16384) >> 32), "README: source port from the documented hash"


def test_source_port_per_flow_stable_and_spread(dp):
    pkts = [udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP, sport=1000 + i) for i in range(300)]
    first = [Ether(o.data)[UDP].sport for o in dp.process(pkts, in_port="vm1")]
    again = [Ether(o.data)[UDP].sport for o in dp.process(pkts, in_port="vm1")]
    assert first == again
    assert len(set(first)) > 250


def test_source_port_range_and_ttl_configurable():
    t = topo_dict()
    t["uplink"].update(src_port_range=[5000, 5003], ttl=9)
    dp = Dataplane.from_topology(t)
    pkts = [udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP, sport=1000 + i) for i in range(100)]
    outs = [Ether(o.data) for o in dp.process(pkts, in_port="vm1")]
    assert {o[UDP].sport for o in outs} == {5000, 5001, 5002, 5003}
    assert {o[IP].ttl for o in outs} == {9}


def test_same_addresses_in_two_tenants_stay_apart(dp):
    blue = only(dp.process(udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP), in_port="vm1"), "p0")
    red = only(dp.process(udp(VM3_MAC, RED_REMOTE_MAC, VM3_IP, RED_REMOTE_IP), in_port="vm3"), "p0")
    assert (blue[IP].dst, blue[VXLAN].vni) == (VTEP_BLUE, BLUE_VNI)
    assert (red[IP].dst, red[VXLAN].vni) == (VTEP_RED, RED_VNI)
    # red's VM addressing blue's remote MAC is an isolation drop, not a leak
    assert dp.process(udp(VM3_MAC, BLUE_REMOTE_MAC, VM3_IP, BLUE_REMOTE_IP), in_port="vm3") == []
    assert drops(dp, "vm3") == {"isolation": 1}


# ---- decapsulation ----------------------------------------------------------------------

def test_decap_delivers_to_local_port(dp):
    inner = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)
    o = only(dp.process(vxlan(inner, BLUE_VNI, VTEP_BLUE), in_port="p0"), "vm1")
    assert bytes(o) == bytes(inner)


def test_decap_with_valid_nonzero_udp_checksum(dp):
    p = vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE, udp_chksum=None)
    p = Ether(bytes(p))
    assert p[UDP].chksum != 0
    only(dp.process(p, in_port="p0"), "vm1")


def bad_checksum(p):
    p = Ether(bytes(p))
    raw = bytearray(bytes(p))
    raw[14 + 20 + 6:14 + 20 + 8] = b"\x12\x34"
    return bytes(raw)


def cut(p, n):
    """The packet cut to n bytes, its outer IPv4 total length (and checksum) cut with it:
    a total length past the frame is no IPv4 header at all (README "Parsing"), so the
    cut is the UDP/VXLAN layer's to find."""
    p = Ether(bytes(p)[:n])
    p[IP].len = n - 14
    del p[IP].chksum
    return bytes(p)


VXL_DROPS = [
    ("unknown VNI", lambda: vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), 300, VTEP_BLUE), "unknown_vni"),
    ("VNI from a VTEP not named for it", lambda: vxlan(udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP), RED_VNI, VTEP_BLUE), "unknown_vtep"),
    ("unknown VTEP", lambda: vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, "192.0.2.99"), "unknown_vtep"),
    ("I flag missing", lambda: vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE, flags=0x00), "vxlan_bad_flags"),
    ("wrong UDP checksum", lambda: bad_checksum(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE, udp_chksum=None)), "vxlan_bad_checksum"),
    ("truncated VXLAN header", lambda: cut(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE), 14 + 20 + 8 + 4), "vxlan_truncated"),
    ("no inner Ethernet header", lambda: cut(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE), 14 + 20 + 16 + 10), "vxlan_truncated"),
    ("inner VLAN tag", lambda: vxlan(Ether(src=BLUE_REMOTE_MAC, dst=VM1_MAC) / Dot1Q(vlan=5) / IP(src=BLUE_REMOTE_IP, dst=VM1_IP) / UDP(), BLUE_VNI, VTEP_BLUE), "inner_vlan"),
    ("not VXLAN on the uplink", lambda: Ether(src=NEXTHOP_MAC, dst=UPLINK_MAC) / IP(src=VTEP_BLUE, dst=VTEP_LOCAL) / UDP(dport=53), "underlay"),
    ("not to our VTEP MAC", lambda: b"\x02\x00\x00\x00\x00\x77" + bytes(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE))[6:], "underlay"),
    ("outer VLAN tag", lambda: Ether(src=NEXTHOP_MAC, dst=UPLINK_MAC) / Dot1Q(vlan=9) / IP(src=VTEP_BLUE, dst=VTEP_LOCAL) / UDP(sport=1, dport=4789, chksum=0) / VXLAN(flags=0x08, vni=BLUE_VNI) / udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), "underlay"),
    ("bad outer IPv4 header checksum", lambda: outer_ip_patch(10, b"\xde\xad"), "vxlan_bad_checksum"),
    ("IP total length shorter than the UDP datagram", lambda: outer_ip_patch(2, (20 + 8 + 8 + 10).to_bytes(2, "big"), fix_csum=True), "vxlan_truncated"),
]


def outer_ip_patch(offset, value, fix_csum=False):
    raw = bytearray(bytes(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE)))
    raw[14 + offset:14 + offset + len(value)] = value
    if fix_csum:
        raw[24:26] = b"\x00\x00"
        total = sum(int.from_bytes(raw[14 + i:16 + i], "big") for i in range(0, 20, 2))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        raw[24:26] = (~total & 0xFFFF).to_bytes(2, "big")
    return bytes(raw)


@pytest.mark.parametrize("desc,make,reason", VXL_DROPS, ids=[d[0] for d in VXL_DROPS])
def test_decap_drops(dp, desc, make, reason):
    assert dp.process(bytes(make()), in_port="p0") == []
    assert drops(dp, "p0") == {reason: 1}


def test_reserved_bits_ignored_unless_strict():
    inner = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)
    raw = bytearray(bytes(vxlan(inner, BLUE_VNI, VTEP_BLUE)))
    raw[14 + 20 + 8 + 1] = 0xAB   # reserved bits
    raw[14 + 20 + 8 + 7] = 0xCD
    dp = Dataplane.from_topology(TOPO)
    only(dp.process(bytes(raw), in_port="p0"), "vm1")
    t = topo_dict()
    t["uplink"]["strict_vxlan"] = True
    strict = Dataplane.from_topology(t)
    assert strict.process(bytes(raw), in_port="p0") == []
    assert drops(strict, "p0") == {"vxlan_bad_flags": 1}
    # scapy's default VXLAN header is VXLAN-GPE (flags 0x0c): the I flag is set,
    # so RFC 7348 receivers ignore the rest; strict mode refuses it.
    gpe = Ether(src=NEXTHOP_MAC, dst=UPLINK_MAC) / IP(src=VTEP_BLUE, dst=VTEP_LOCAL) / UDP(sport=1, dport=4789, chksum=0) / VXLAN(vni=BLUE_VNI) / inner
    assert bytes(gpe[VXLAN])[0] == 0x0C
    only(dp.process(gpe, in_port="p0"), "vm1")
    assert strict.process(gpe, in_port="p0") == []


def test_decap_only_inside_the_tenant(dp):
    # VNI 100 carrying a frame for red's vm3: never delivered to vm3.
    outs = dp.process(vxlan(udp(BLUE_REMOTE_MAC, VM3_MAC, BLUE_REMOTE_IP, VM3_IP), BLUE_VNI, VTEP_BLUE), in_port="p0")
    assert outs == [] and drops(dp, "p0") == {"isolation": 1}
    # Broadcast from the fabric reaches blue's local ports only, never back to a VTEP.
    outs = dp.process(vxlan(arp_request(BLUE_REMOTE_MAC, BLUE_REMOTE_IP, "10.0.0.99"), BLUE_VNI, VTEP_BLUE), in_port="p0")
    assert sorted(o.port for o in outs) == ["vm1", "vm2"]


# ---- MTU ------------------------------------------------------------------------------------

def test_mtu_exceeded_drops_and_sends_frag_needed(dp):
    inner = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP, flags="DF") / UDP(sport=7, dport=9) / Raw(b"m" * (1500 - 28))
    assert len(inner[IP]) == 1500
    o = only(dp.process(inner, in_port="vm1"), "vm1")
    assert (o.src, o.dst) == (BLUE_REMOTE_MAC, VM1_MAC)
    assert (o[IP].src, o[IP].dst, o[ICMP].type, o[ICMP].code) == (BLUE_REMOTE_IP, VM1_IP, 3, 4)
    assert o[ICMP].nexthopmtu == 1450
    quoted = bytes(o[ICMP])[8:]
    assert quoted[:20] == bytes(inner[IP])[:20]
    for layer in (IP, ICMP):
        c = o[layer].chksum
        del o[layer].chksum
        assert Ether(bytes(o))[layer].chksum == c
    assert drops(dp, "vm1") == {"mtu": 1}
    # One byte less fits.
    small = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP, flags="DF") / UDP() / Raw(b"m" * (1450 - 28))
    assert len(bytes(only(dp.process(small, in_port="vm1"), "p0"))) == 1500 + 14
    # Without DF: dropped, no ICMP.
    nodf = Ether(src=VM1_MAC, dst=BLUE_REMOTE_MAC) / IP(src=VM1_IP, dst=BLUE_REMOTE_IP) / UDP() / Raw(b"m" * 1472)
    assert dp.process(nodf, in_port="vm1") == []


# ---- IPv6 underlay -------------------------------------------------------------------------

def v6_topo():
    t = topo_dict()
    t["uplink"]["ip"] = "2001:db8::1"
    t["tenants"]["blue"]["remote"][0]["vtep"] = "2001:db8::2"
    t["tenants"]["blue"]["flood"] = ["2001:db8::2"]
    t["tenants"]["red"]["remote"][0]["vtep"] = "2001:db8::3"
    t["tenants"]["red"]["flood"] = ["2001:db8::3"]
    return t


def test_ipv6_underlay_encap_and_decap():
    dp = Dataplane.from_topology(v6_topo())
    inner = udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP)
    o = only(dp.process(inner, in_port="vm1"), "p0")
    assert o.type == 0x86DD and (o[IPv6].src, o[IPv6].dst, o[IPv6].nh) == ("2001:db8::1", "2001:db8::2", 17)
    c = o[UDP].chksum
    assert c != 0
    del o[UDP].chksum
    assert Ether(bytes(o))[UDP].chksum == c, "UDP checksum computed over IPv6"
    assert bytes(o[UDP])[16:] == bytes(inner)
    back = Ether(src=NEXTHOP_MAC, dst=UPLINK_MAC) / IPv6(src="2001:db8::2", dst="2001:db8::1") / UDP(sport=5555, dport=4789, chksum=0) / VXLAN(flags=0x08, vni=BLUE_VNI) / udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)
    only(dp.process(back, in_port="p0"), "vm1")
    back6 = Ether(bytes(back))
    back6[UDP].chksum = None
    only(dp.process(Ether(bytes(back6)), in_port="p0"), "vm1")


# ---- ARP, routing, flooding, anti-spoofing ----------------------------------------------------

@pytest.mark.parametrize("asker,port,target,mac", [
    (VM1_MAC, "vm1", "10.0.0.1", GW_MAC),
    (VM1_MAC, "vm1", BLUE_REMOTE_IP, BLUE_REMOTE_MAC),
    (VM1_MAC, "vm1", VM2_IP, VM2_MAC),
    (VM3_MAC, "vm3", RED_REMOTE_IP, RED_REMOTE_MAC),
    (VM3_MAC, "vm3", "10.0.0.1", GW_MAC),
])
def test_arp_suppression(dp, asker, port, target, mac):
    ip = VM3_IP if port == "vm3" else VM1_IP
    o = only(dp.process(arp_request(asker, ip, target), in_port=port), port)
    assert (o.src, o.dst) == (mac, asker)
    a = o[ARP]
    assert (a.op, a.hwsrc, a.psrc, a.hwdst, a.pdst) == (2, mac, target, asker, ip)


def test_unknown_and_cross_tenant_arp_is_flooded_in_tenant(dp):
    outs = dp.process(arp_request(VM3_MAC, VM3_IP, "10.0.1.12"), in_port="vm3")   # blue's vm2 address
    assert [o.port for o in outs] == ["p0"]
    o = Ether(outs[0].data)
    assert (o[IP].dst, o[VXLAN].vni) == (VTEP_RED, RED_VNI)
    # gratuitous ARP from vm1 for itself: flooded, not answered
    outs = dp.process(arp_request(VM1_MAC, VM1_IP, VM1_IP), in_port="vm1")
    assert sorted(o.port for o in outs) == ["p0", "vm2"]


def test_broadcast_head_end_replication(dp):
    b = Ether(src=VM1_MAC, dst=BROADCAST) / IP(src=VM1_IP, dst="10.0.0.255") / UDP(dport=9)
    outs = dp.process(b, in_port="vm1")
    assert sorted(o.port for o in outs) == ["p0", "vm2"]
    o = Ether([x for x in outs if x.port == "p0"][0].data)
    assert (o[IP].dst, o[VXLAN].vni) == (VTEP_BLUE, BLUE_VNI) and bytes(o[VXLAN].payload) == bytes(b)


def test_routing_between_subnets_and_ttl(dp):
    p = udp(VM1_MAC, GW_MAC, VM1_IP, VM2_IP, ttl=10)
    o = only(dp.process(p, in_port="vm1"), "vm2")
    assert (o.src, o.dst, o[IP].ttl) == (GW_MAC, VM2_MAC, 9)
    assert dp.process(udp(VM1_MAC, GW_MAC, VM1_IP, VM2_IP, ttl=1), in_port="vm1") == []
    assert dp.process(udp(VM1_MAC, GW_MAC, VM1_IP, "10.0.1.99"), in_port="vm1") == []
    assert drops(dp, "vm1") == {"ttl_exceeded": 1, "unroutable": 1}


@pytest.mark.parametrize("desc,pkt,allowed", [
    ("own addresses", udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP), True),
    ("spoofed source IP", udp(VM1_MAC, VM2_MAC, "10.0.0.99", VM2_IP), False),
    ("spoofed source MAC", udp(VM2_MAC, BROADCAST, VM1_IP, VM2_IP), False),
    ("spoofed ARP sender", arp_request(VM1_MAC, "10.0.0.50", "10.0.0.1"), False),
    ("ARP probe from 0.0.0.0", arp_request(VM1_MAC, "0.0.0.0", VM1_IP), True),
    ("DHCP discover", Ether(src=VM1_MAC, dst=BROADCAST) / IP(src="0.0.0.0", dst="255.255.255.255") / UDP(sport=68, dport=67), True),
    ("VLAN-tagged", Ether(src=VM1_MAC, dst=VM2_MAC) / Dot1Q(vlan=3) / IP(src=VM1_IP, dst=VM2_IP) / UDP(), False),
    ("IPv6 from another MAC", Ether(src=VM2_MAC, dst=VM2_MAC) / IPv6() / UDP(), False),
    ("IPv6 (no v6 addresses configured)", Ether(src=VM1_MAC, dst=VM2_MAC) / IPv6() / UDP(), "ipv6_unsupported"),
])
def test_anti_spoofing(dp, desc, pkt, allowed):
    outs = dp.process(pkt, in_port="vm1")
    if allowed is True:
        assert outs
    else:  # dropped: spoofed, or the reason named (IPv6 from its own MAC: not carried, not spoofing)
        assert outs == [] and drops(dp, "vm1") == {allowed or "spoofed": 1}


def test_per_tenant_counters(dp):
    dp.process([udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP), udp(VM1_MAC, VM2_MAC, "6.6.6.6", VM2_IP)], in_port="vm1")
    dp.process(vxlan(udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP), RED_VNI, VTEP_RED), in_port="p0")
    dp.process(vxlan(udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP), RED_VNI, "192.0.2.77"), in_port="p0")
    t = dp.stats()["tenants"]
    assert (t["blue"]["rx_packets"], t["blue"]["tx_packets"], t["blue"]["drops"]) == (2, 1, {"spoofed": 1})
    # the forged one (VNI 200 from an unknown VTEP) is charged to no tenant
    assert (t["red"]["rx_packets"], t["red"]["tx_packets"], t["red"]["drops"]) == (1, 1, {})
    assert drops(dp, "p0") == {"unknown_vtep": 1}
    assert t["red"]["tx_bytes"] == len(bytes(udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP)))


# ---- topology file: validation, reload, compile ----------------------------------------------

def mutate(path, value):
    t = topo_dict()
    keys = path.split(".")
    node = t
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return t


DELETE = object()

BAD = [
    ("tenants.red.ports.vm3.ip", "10.0.5.11", "tenants.red.ports.vm3.ip", "not inside any subnet"),
    ("tenants.red.ports.vm3.ip", "10.0.0.300", "tenants.red.ports.vm3.ip", "not an IP address"),
    ("tenants.red.vni", 100, "tenants.red.vni", "already used by tenant blue"),
    ("tenants.red.ports", {"vm1": {"mac": "02:00:00:00:03:99", "ip": "10.0.0.50"}}, "tenants.red.ports.vm1", "already belongs to tenant blue"),
    ("tenants.blue.subnets.1", {"cidr": "10.0.0.128/25", "gateway": "10.0.0.129"}, "tenants.blue.subnets[1].cidr", "overlaps"),
    ("tenants.blue.subnets.1", {"cidr": "10.0.1.0/24", "gateway": "10.0.2.1"}, "tenants.blue.subnets[1].gateway", "outside its subnet"),
    ("tenants.blue.remote.0.vtep", "not-an-ip", "tenants.blue.remote[0].vtep", "not an IP address"),
    ("tenants.blue.remote.0.ip", "192.168.1.1", "tenants.blue.remote[0].ip", "not inside any subnet"),
    ("tenants.blue.remote.0.mac", "01:00:5e:00:00:01", "tenants.blue.remote[0].mac", "multicast"),
    ("tenants.blue.remote.0.vtep", "192.0.2.1", "tenants.blue.remote[0].vtep", "our own VTEP"),
    ("tenants.blue.ports.vm2.ip", "10.0.0.11", "tenants.blue.ports.vm2.ip", "already used"),
    ("tenants.blue.ports.vm2.ip", "10.0.1.1", "tenants.blue.ports.vm2.ip", "gateway address"),
    ("tenants.blue.vni", 1 << 24, "tenants.blue.vni", "out of range"),
    ("uplink.mac", "zz:00:00:00:00:01", "uplink.mac", "not a MAC"),
    ("uplink.mtu", 100, "uplink.mtu", "out of range"),
    ("uplink.vxlan_port", DELETE, None, None),
    ("uplink.ip", DELETE, "uplink.ip", "required"),
    ("tenants.blue.colour", "blue", "tenants.blue.colour", "unknown key"),
    ("tenants.blue.flood", ["2001:db8::9"], "tenants.blue.flood[0]", "not an IPv4"),
]


@pytest.mark.parametrize("path,value,errpath,words", BAD, ids=[b[0] + "=" + str(b[1])[:20] for b in BAD])
def test_validation_errors_name_the_path(path, value, errpath, words):
    t = mutate(path, value)
    if errpath is None:
        load_topology(t)  # optional key
        return
    with pytest.raises(TopologyError) as ei:
        load_topology(t)
    assert ei.value.path == errpath
    assert str(ei.value).startswith(errpath + ": ") and words in str(ei.value)


def test_invalid_reload_applies_nothing_and_valid_reload_is_atomic(dp):
    dp.add_flow("table=0,priority=60000,in_port=vm2,udp,tp_dst=7,actions=output:vm1")  # a user flow
    before = [str(f.match) + f.actions for f in dp.dump_flows()]
    with pytest.raises(TopologyError):
        dp.load_topology(mutate("tenants.red.ports.vm3.ip", "10.9.9.9"))
    assert [str(f.match) + f.actions for f in dp.dump_flows()] == before
    t = topo_dict()
    t["tenants"]["blue"]["ports"]["vm4"] = {"mac": "02:00:00:00:01:14", "ip": "10.0.0.14"}
    del t["tenants"]["red"]
    dp.load_topology(t)
    assert "vm4" in dp.ports and "vm3" not in dp.ports
    only(dp.process(udp(VM1_MAC, "02:00:00:00:01:14", VM1_IP, "10.0.0.14"), in_port="vm1"), "vm4")
    assert any(f.match == "priority=60000,udp,in_port=vm2,tp_dst=7" for f in dp.dump_flows()), "user flows survive"
    assert set(dp.stats()["tenants"]) == {"blue"}


def test_user_flows_layer_on_top():
    dp = Dataplane.from_topology(TOPO, flows=["table=0,priority=65000,in_port=vm1,udp,tp_dst=9999,actions=drop(policy)"])
    assert dp.process(udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP, dport=9999), in_port="vm1") == []
    assert drops(dp, "vm1") == {"policy": 1}


def test_compile_output_loads_back(tmp_path):
    comp = compile_topology(load_topology(TOPO))
    text = comp.text()
    assert "# tenant blue (vni 100)" in text and "drop(spoofed)" in text
    f = tmp_path / "compiled.txt"
    f.write_text(text)
    dp = Dataplane.from_topology(TOPO)
    n = len(dp.dump_flows())
    dp2 = Dataplane()
    with dp2.transaction() as t:
        for p in comp.ports:
            t.add_ports.append(p)
    assert dp2.load_flows(f) == n
    pkt = udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP)
    assert [o.data for o in dp2.process(pkt, in_port="vm1")] == [o.data for o in dp.process(pkt, in_port="vm1")]
