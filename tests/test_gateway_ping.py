"""The anycast gateway answers ping for its own addresses, and a VM's first IPv6
breath (router and neighbour solicitations, MLD reports) is ipv6_unsupported, not
spoofed (issue 30, "Logs and views"): through the API, a replay whose outputs
tshark judges, and set_field on ICMP's type against the checksum verifier.

The exact model of the compiled pipeline (test_isolation.py) covers both under
hostile traffic; the live side (real ping, a real interface coming up) is in
test_live_views.py.
"""
import os

import pytest
from scapy.all import ICMP, IP, Ether, IPv6, Raw, wrpcap
from scapy.layers.inet6 import (ICMPv6EchoRequest, ICMPv6MLReport2, ICMPv6ND_NS, ICMPv6ND_RS, IPv6ExtHdrHopByHop,
                                RouterAlert)

from dpu import Dataplane
from helpers.checksums import assert_checksums
from helpers.packets import BLUE_GW1, BLUE_GW2, GW_MAC, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VM3_IP, VM3_MAC

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")


def echo(src_mac, src_ip, dst_ip, ttl=64, ident=0x1234, seq=1, payload=b"ping" * 14, icmp_type=8, **ip):
    return Ether(src=src_mac, dst=GW_MAC) / IP(src=src_ip, dst=dst_ip, ttl=ttl, **ip) / ICMP(
        type=icmp_type, id=ident, seq=seq) / Raw(payload)


def test_the_gateway_answers_each_of_its_addresses():
    dp = Dataplane.from_topology(TOPO)
    cases = [("vm1", VM1_MAC, VM1_IP, BLUE_GW1), ("vm2", VM2_MAC, VM2_IP, BLUE_GW2), ("vm3", VM3_MAC, VM3_IP, BLUE_GW1)]
    for port, mac, ip_, gw in cases:
        for ttl in (64, 1, 255):  # the reply's TTL is its own, whatever the request's (no ttl_exceeded)
            req = echo(mac, ip_, gw, ttl=ttl)
            [out] = dp.process(bytes(req), in_port=port)
            assert out.port == port, "back out the port it came from"
            assert "ICMP" in assert_checksums(out.data) and "IPv4 header" in assert_checksums(out.data)
            r = Ether(out.data)
            assert (r.src, r.dst) == (GW_MAC, mac)
            assert (r[IP].src, r[IP].dst, r[IP].ttl, r[IP].id) == (gw, ip_, 64, req[IP].id)
            assert (r[ICMP].type, r[ICMP].code, r[ICMP].id, r[ICMP].seq) == (0, 0, 0x1234, 1)
            assert bytes(r[ICMP].payload) == b"ping" * 14 and len(out.data) == len(bytes(req))
    st = dp.stats()
    assert all(not p["drops"] for p in st["ports"].values()), st["ports"]
    assert st["tenants"]["blue"]["tx_packets"] == 6 and st["tenants"]["red"]["tx_packets"] == 3


def test_security_groups_never_judge_what_the_gateway_answers():
    """A port whose groups allow it only DNS out still pings its gateway (security_flows.py:
    traffic to a gateway address is never judged), and the reply comes back to it."""
    dp = Dataplane.from_topology(os.path.join(os.path.dirname(TOPO), "security-groups.yaml"))
    vm5_mac, vm5_ip = "02:00:00:00:01:15", "10.0.0.15"
    [out] = dp.process(bytes(echo(vm5_mac, vm5_ip, BLUE_GW1)), in_port="vm5")
    assert out.port == "vm5" and Ether(out.data)[ICMP].type == 0 and "ICMP" in assert_checksums(out.data)
    assert dp.process(bytes(echo(vm5_mac, vm5_ip, "10.0.0.14")), in_port="vm5") == [], "a VM: judged, denied"
    assert dp.stats()["ports"]["vm5"]["drops"] == {"security_group": 1}


@pytest.mark.parametrize("what,pkt,reason", [
    ("an address that is no gateway's", echo(VM1_MAC, VM1_IP, "10.0.2.1"), "unroutable"),
    ("an echo reply is not answered", echo(VM1_MAC, VM1_IP, BLUE_GW1, icmp_type=0), "unroutable"),
    ("a first fragment", echo(VM1_MAC, VM1_IP, BLUE_GW1, flags="MF"), "unroutable"),
    ("a later fragment", echo(VM1_MAC, VM1_IP, BLUE_GW1, frag=100), "unroutable"),
    ("from a forged source", echo(VM1_MAC, "10.0.0.99", BLUE_GW1), "spoofed"),
])
def test_what_the_gateway_does_not_answer(what, pkt, reason):
    dp = Dataplane.from_topology(TOPO)
    assert dp.process(bytes(pkt), in_port="vm1") == [], what
    assert dp.stats()["ports"]["vm1"]["drops"] == {reason: 1}, what


def test_echo_reply_checksums_stay_right_for_every_field_value():
    """The reply is made by incremental checksum updates (RFC 1624): requests whose
    checksums sit at the edges (0x0000, 0xffff, carries) and every TTL still come back
    with right IPv4 and ICMP checksums."""
    dp = Dataplane.from_topology(TOPO)
    reqs = []
    for i in range(512):
        ident, ttl = (i * 2654435761) & 0xFFFF, 1 + i % 255
        reqs.append(bytes(echo(VM1_MAC, VM1_IP, BLUE_GW1, ttl=ttl, ident=ident, seq=i, payload=bytes([i % 256]) * (i % 40),
                               id=(i * 40503) & 0xFFFF)))
    outs = dp.process(reqs, in_port="vm1")
    assert len(outs) == len(reqs)
    for o in outs:
        assert assert_checksums(o.data) == ["IPv4 header", "ICMP"]


def test_replayed_pings_leave_wire_valid_replies(tmp_path, tshark):
    from helpers.tshark import assert_clean, tshark_fields

    wrpcap(str(tmp_path / "in.pcap"), [echo(VM1_MAC, VM1_IP, BLUE_GW1, seq=s) for s in range(5)])
    dp = Dataplane.from_topology(TOPO)
    s = dp.replay({"vm1": str(tmp_path / "in.pcap")}, tmp_path / "out")
    assert s.ports["vm1"]["tx_packets"] == 5
    assert_clean(tshark, tmp_path / "out" / "vm1.pcap", 5)
    rows = tshark_fields(tshark, tmp_path / "out" / "vm1.pcap", ["icmp.type", "ip.src", "ip.dst", "icmp.checksum.status"])
    assert rows == [["0", BLUE_GW1, VM1_IP, "1"]] * 5


def test_the_compiled_flow_is_a_plain_flow_with_its_datapath_actions():
    dp = Dataplane.from_topology(TOPO)
    flows = [f for f in dp.dump_flows("table=10") if "icmp_type=8" in f.match]
    assert len(flows) == 3, "one per gateway address: blue's two, red's one"
    tr = dp.trace(echo(VM1_MAC, VM1_IP, BLUE_GW1), "vm1")
    acts = tr.passes[0].datapath_actions
    assert "set(icmp(type=0))" in acts and "set(ipv4(src=10.0.0.1,dst=10.0.0.11,ttl=64))" in acts, acts
    assert acts.endswith("vm1"), acts


# ---- set_field on ICMP's type and code, as OpenFlow writes them ------------------------------------

@pytest.mark.parametrize("v6", [False, True], ids=["icmp", "icmp6"])
def test_set_field_icmp_type_and_code_keep_the_checksum(v6):
    dp = Dataplane(ports=["a", "b"])
    if v6:
        dp.add_flow("in_port=a,icmp6,icmp_type=128,actions=set_field:129->icmpv6_type,set_field:3->icmpv6_code,output:b")
        pkt = Ether() / IPv6(src="2001:db8::1", dst="2001:db8::2") / ICMPv6EchoRequest(id=1, seq=1, data=b"x" * 20)
    else:
        dp.add_flow("in_port=a,icmp,icmp_type=8,actions=set_field:0->icmp_type,set_field:3->icmp_code,output:b")
        pkt = Ether() / IP(src="192.0.2.1", dst="192.0.2.2") / ICMP(type=8, id=1, seq=1) / Raw(b"x" * 20)
    [o] = dp.process(bytes(pkt), in_port="a")
    assert ("ICMPv6" if v6 else "ICMP") in assert_checksums(o.data)
    l4 = o.data[14 + (40 if v6 else 20):]
    assert (l4[0], l4[1]) == ((129, 3) if v6 else (0, 3))
    assert "set(icmp" in dp.trace(bytes(pkt), "a").passes[0].datapath_actions


# ---- IPv6 from a VM ---------------------------------------------------------------------------------

LL = "fe80::11"
FIRST_BREATH = [  # what Linux sends when an interface comes up with IPv6 on
    ("router solicitation", Ether(src=VM1_MAC, dst="33:33:00:00:00:02") / IPv6(src=LL, dst="ff02::2", hlim=255)
     / ICMPv6ND_RS()),
    ("neighbour solicitation (DAD)", Ether(src=VM1_MAC, dst="33:33:ff:00:00:11")
     / IPv6(src="::", dst="ff02::1:ff00:11", hlim=255) / ICMPv6ND_NS(tgt=LL)),
    ("MLDv2 report", Ether(src=VM1_MAC, dst="33:33:00:00:00:16") / IPv6(src=LL, dst="ff02::16", hlim=1)
     / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6MLReport2()),
]


def test_a_vms_first_ipv6_breath_is_ipv6_unsupported_not_spoofed():
    dp = Dataplane.from_topology(TOPO)
    for what, pkt in FIRST_BREATH:
        assert dp.process(bytes(pkt), in_port="vm1") == [], what
    st = dp.stats()
    assert st["ports"]["vm1"]["drops"] == {"ipv6_unsupported": 3}
    assert st["tenants"]["blue"]["drops"] == {"ipv6_unsupported": 3}, "charged to the VM's tenant"
    assert dp.trace(bytes(FIRST_BREATH[0][1]), "vm1").drop_reason == "ipv6_unsupported"


def test_ipv6_from_another_mac_is_still_spoofed():
    dp = Dataplane.from_topology(TOPO)
    forged = Ether(src="02:00:00:00:09:09", dst="33:33:00:00:00:02") / IPv6(src=LL, dst="ff02::2") / ICMPv6ND_RS()
    tagged = Ether(bytes(FIRST_BREATH[0][1])[:12] + b"\x81\x00\x00\x05" + bytes(FIRST_BREATH[0][1])[12:])
    for pkt in (forged, tagged):
        assert dp.process(bytes(pkt), in_port="vm1") == []
    assert dp.stats()["ports"]["vm1"]["drops"] == {"spoofed": 2}


def test_the_new_reason_is_listed_with_its_meaning():
    from dpu import _core

    names = [n for n, _ in _core.drop_reasons()]
    assert names[-1] == "ipv6_unsupported", "appended: the others keep their numbers"
    assert "IPv6" in dict(_core.drop_reasons())["ipv6_unsupported"]
