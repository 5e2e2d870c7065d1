"""The internet gateway compiled from a topology (README "Internet gateway and
NAT", docs/conntrack.md): SNAT, floating addresses, port forwards, hairpinning,
ICMP errors, filtering, per-tenant zones and quotas, and the validation of the
nat: section. Traffic is built with scapy and checked field by field, with
every checksum recomputed."""
import os

import pytest
from scapy.all import ARP, ICMP, IP, TCP, UDP, UDPerror, TCPerror, IPerror, Ether, Raw

from dpu import Dataplane
from dpu.errors import TopologyError
from dpu.topology import load_topology
from helpers.checksums import assert_checksums
from helpers.packets import (BLUE_FLOATING, BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_SNAT, GW_MAC, INET_MAC, INET_NEXTHOP_MAC,
                     OTHER_SERVER, RED_SNAT, SERVER, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VM3_IP, VM3_MAC, VTEP_BLUE,
                     from_internet, from_vm, vxlan)

HERE = os.path.dirname(__file__)
NAT_TOPO = os.path.join(HERE, "..", "examples", "nat-gateway.yaml")

# The topology addition as issue 6 writes it, verbatim (under a minimal tenant).
ISSUE_YAML = """
uplink: {port: p0, ip: 192.0.2.1, mac: 02:00:00:00:00:01, nexthop_mac: 02:00:00:00:00:02}
internet:
  port: inet
  mac: 02:00:00:00:00:31
  nexthop_mac: 02:00:00:00:00:32
tenants:
  blue:
    vni: 100
    gateway_mac: 02:00:00:00:01:01
    subnets: [{cidr: 10.0.1.0/24, gateway: 10.0.1.1}]
    ports: {vm2: {mac: 02:00:00:00:01:12, ip: 10.0.1.12}}
    nat:
      snat: 203.0.113.10                 # or a pool: 203.0.113.10-203.0.113.13
      floating:
        - {private: 10.0.1.12, public: 203.0.113.12}
      forwards:
        - {proto: tcp, public: 203.0.113.10, port: 8080, to: 10.0.1.12, to_port: 80}
    limits:
      connections: 100000                # per-tenant conntrack quota
"""


@pytest.fixture
def dp():
    return Dataplane.from_topology(NAT_TOPO)


def one(outs, port):
    assert [o.port for o in outs] == [port], [(o.port, Ether(o.data).summary()) for o in outs]
    return Ether(outs[0].data)


def drops(dp, tenant):
    return dp.stats()["tenants"][tenant]["drops"]


# ---- the file as users write it ---------------------------------------------------------


def test_issue_yaml_loads_as_written():
    topo = load_topology(ISSUE_YAML)
    blue = topo.tenants["blue"]
    assert topo.internet.port == "inet" and topo.internet.nexthop_mac == "02:00:00:00:00:32"
    assert [str(a) for a in blue.nat.snat] == ["203.0.113.10", "203.0.113.10"]
    assert [(str(a), str(b)) for a, b in blue.nat.floating] == [("10.0.1.12", "203.0.113.12")]
    f = blue.nat.forwards[0]
    assert (f.proto, str(f.public), f.port, str(f.to), f.to_port) == ("tcp", "203.0.113.10", 8080, "10.0.1.12", 80)
    assert blue.connection_limit == 100000 and blue.zone == 100
    dp = Dataplane.from_topology(ISSUE_YAML)
    assert "inet" in dp.ports


# ---- source NAT -------------------------------------------------------------------------------


def test_snat_out_and_back(dp):
    out = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, TCP(sport=40000, dport=80, flags="S", seq=1000)),
                         in_port="vm1"), "inet")
    assert (out.src, out.dst) == (INET_MAC, INET_NEXTHOP_MAC)
    assert (out[IP].src, out[IP].dst, out[IP].ttl) == (BLUE_SNAT, SERVER, 63)  # TTL decremented once
    assert (out[TCP].sport, out[TCP].dport) == (40000, 80)                      # the source port is kept
    assert_checksums(out)
    back = one(dp.process(from_internet(SERVER, BLUE_SNAT, TCP(sport=80, dport=40000, flags="SA", seq=5000, ack=1001)),
                          in_port="inet"), "vm1")
    assert (back.src, back.dst) == (GW_MAC, VM1_MAC)
    assert (back[IP].src, back[IP].dst, back[IP].ttl) == (SERVER, VM1_IP, 63)
    assert (back[TCP].sport, back[TCP].dport) == (80, 40000)
    assert_checksums(back)
    [c] = dp.conntrack(zone=100)
    assert c.state == "ESTABLISHED" and c.snat and c.reply["dst"] == BLUE_SNAT


def test_snat_udp_zero_checksum_stays_zero(dp):
    pkt = from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=5353, dport=53, chksum=0) / Raw(b"q" * 12))
    out = one(dp.process(pkt, in_port="vm1"), "inet")
    assert out[UDP].chksum == 0 and out[IP].src == BLUE_SNAT


def test_endpoint_independent_mapping(dp):
    """One internal ip:port keeps one public ip:port whatever the destination."""
    a = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=6000, dport=53)), in_port="vm1"), "inet")
    b = one(dp.process(from_vm(VM1_MAC, VM1_IP, OTHER_SERVER, UDP(sport=6000, dport=123)), in_port="vm1"), "inet")
    assert (a[IP].src, a[UDP].sport) == (b[IP].src, b[UDP].sport) == (BLUE_SNAT, 6000)
    # Another internal endpoint with the same source port gets another public port.
    c = one(dp.process(from_vm(VM2_MAC, VM2_IP, SERVER, UDP(sport=6000, dport=53)), in_port="vm2"), "inet")
    assert c[IP].src == BLUE_FLOATING  # vm2 leaves through its floating address


def test_port_collision_picks_another_port():
    topo = load_topology(NAT_TOPO)
    topo.tenants["blue"].nat.floating = []
    topo.tenants["blue"].nat.forwards = []
    dp = Dataplane.from_topology(topo)
    a = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=7000, dport=53)), in_port="vm1"), "inet")
    b = one(dp.process(from_vm(VM2_MAC, VM2_IP, SERVER, UDP(sport=7000, dport=53)), in_port="vm2"), "inet")
    assert a[UDP].sport == 7000 and b[UDP].sport != 7000 and b[IP].src == BLUE_SNAT
    back = one(dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=53, dport=b[UDP].sport)), in_port="inet"), "vm2")
    assert (back[IP].dst, back[UDP].dport) == (VM2_IP, 7000)


def test_address_and_port_dependent_filtering(dp):
    """Only the endpoint a mapping talked to can answer through it."""
    dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=6100, dport=53)), in_port="vm1")
    assert dp.process(from_internet(OTHER_SERVER, BLUE_SNAT, UDP(sport=53, dport=6100)), in_port="inet") == []
    assert dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=54, dport=6100)), in_port="inet") == []
    assert drops(dp, "blue")["nat_unsolicited"] == 2
    one(dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=53, dport=6100)), in_port="inet"), "vm1")


def test_endpoint_independent_filtering_option():
    topo = load_topology(NAT_TOPO)
    topo.tenants["blue"].nat.endpoint_independent_filtering = True
    dp = Dataplane.from_topology(topo)
    dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=6200, dport=3478)), in_port="vm1")
    back = one(dp.process(from_internet(OTHER_SERVER, BLUE_SNAT, UDP(sport=999, dport=6200)), in_port="inet"), "vm1")
    assert (back[IP].src, back[IP].dst, back[UDP].dport) == (OTHER_SERVER, VM1_IP, 6200)
    # An unmapped port is still unsolicited.
    assert dp.process(from_internet(OTHER_SERVER, BLUE_SNAT, UDP(sport=999, dport=6201)), in_port="inet") == []


def test_icmp_echo_identifier_mapped_like_a_port(dp):
    out = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, ICMP(type=8, id=77, seq=1)), in_port="vm1"), "inet")
    assert out[IP].src == BLUE_SNAT and out[ICMP].id == 77
    assert_checksums(out)
    back = one(dp.process(from_internet(SERVER, BLUE_SNAT, ICMP(type=0, id=77, seq=1)), in_port="inet"), "vm1")
    assert back[IP].dst == VM1_IP and back[ICMP].id == 77
    assert_checksums(back)


@pytest.mark.parametrize("icmp", [ICMP(type=3, code=3), ICMP(type=11, code=0), ICMP(type=3, code=4, nexthopmtu=1400)],
                         ids=["port-unreachable", "time-exceeded", "frag-needed"])
@pytest.mark.parametrize("l4", ["udp", "tcp"])
def test_icmp_error_translated_back(dp, icmp, l4):
    if l4 == "udp":
        first = UDP(sport=6300, dport=33434) / Raw(b"probe")
    else:
        first = TCP(sport=6300, dport=80, flags="S", seq=42)
    sent = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, first), in_port="vm1"), "inet")
    router = "198.51.100.254"
    err = from_internet(router, BLUE_SNAT, icmp / sent[IP])  # the router quotes what it received
    back = one(dp.process(err, in_port="inet"), "vm1")
    assert (back[IP].src, back[IP].dst) == (router, VM1_IP)
    quoted = back[IPerror]
    assert (quoted.src, quoted.dst) == (VM1_IP, SERVER)
    inner = back[UDPerror] if l4 == "udp" else back[TCPerror]
    assert (inner.sport, inner.dport) == (6300, first.dport)
    # Every checksum: outer IP, ICMP, the quoted IP header and the quoted L4 header.
    fresh = Ether(bytes(back))
    assert IP(bytes(fresh[IP])[:20]).chksum == IP(bytes(IP(bytes(fresh[IP])[:20]) / b"")[:20]).chksum
    check = Ether(bytes(back))
    del check[IP].chksum
    del check[ICMP].chksum
    rebuilt = Ether(bytes(check))
    assert rebuilt[IP].chksum == fresh[IP].chksum and rebuilt[ICMP].chksum == fresh[ICMP].chksum
    q = IP(bytes(fresh[IPerror]))  # the quoted packet as a packet of its own
    qfix = IP(bytes(q))
    del qfix.chksum
    assert IP(bytes(qfix)).chksum == q.chksum
    if l4 == "udp":
        # the quote holds the whole UDP datagram: its checksum must verify
        u = IP(bytes(q))
        del u[UDP].chksum
        assert IP(bytes(u))[UDP].chksum == q[UDP].chksum
    # ICMP never ends a mapping: the connection still answers.
    assert len(dp.conntrack(zone=100)) == 1
    if l4 == "udp":
        one(dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=33434, dport=6300)), in_port="inet"), "vm1")


# ---- destination NAT ----------------------------------------------------------------------------


def test_floating_address_both_ways(dp):
    inb = one(dp.process(from_internet(SERVER, BLUE_FLOATING, TCP(sport=50000, dport=22, flags="S")), in_port="inet"),
              "vm2")
    assert (inb.src, inb.dst, inb[IP].dst, inb[TCP].dport, inb[IP].ttl) == (GW_MAC, VM2_MAC, VM2_IP, 22, 63)
    assert_checksums(inb)
    reply = one(dp.process(from_vm(VM2_MAC, VM2_IP, SERVER, TCP(sport=22, dport=50000, flags="SA")), in_port="vm2"),
                "inet")
    assert (reply[IP].src, reply[TCP].sport) == (BLUE_FLOATING, 22)
    out = one(dp.process(from_vm(VM2_MAC, VM2_IP, OTHER_SERVER, UDP(sport=9000, dport=53)), in_port="vm2"), "inet")
    assert out[IP].src == BLUE_FLOATING  # the machine's own outbound traffic too


def test_forward_to_port_and_replies_leave_from_it(dp):
    inb = one(dp.process(from_internet(SERVER, BLUE_SNAT, TCP(sport=51000, dport=8080, flags="S")), in_port="inet"),
              "vm2")
    assert (inb[IP].dst, inb[TCP].dport) == (VM2_IP, 80)
    reply = one(dp.process(from_vm(VM2_MAC, VM2_IP, SERVER, TCP(sport=80, dport=51000, flags="SA")), in_port="vm2"),
                "inet")
    assert (reply[IP].src, reply[TCP].sport) == (BLUE_SNAT, 8080)
    assert_checksums(reply)
    # A forward is TCP only: UDP to the same port is unsolicited.
    assert dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=1, dport=8080)), in_port="inet") == []


def test_forward_reserves_its_public_port(dp):
    """SNAT never hands out a forward's public port: vm1 leaving from port 8080
    gets another one."""
    out = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, TCP(sport=8080, dport=80, flags="S")), in_port="vm1"), "inet")
    assert out[IP].src == BLUE_SNAT and out[TCP].sport != 8080


def test_unsolicited_inbound_dropped_and_counted(dp):
    assert dp.process(from_internet(SERVER, BLUE_SNAT, TCP(sport=1, dport=22, flags="S")), in_port="inet") == []
    assert drops(dp, "blue") == {"nat_unsolicited": 1}
    assert dp.conntrack() == []


def test_floating_to_remote_endpoint_goes_over_vxlan():
    topo = load_topology(NAT_TOPO)
    topo.tenants["blue"].nat.floating = [(topo.tenants["blue"].remote[0].ip, topo.tenants["blue"].nat.floating[0][1])]
    dp = Dataplane.from_topology(topo)
    out = one(dp.process(from_internet(SERVER, BLUE_FLOATING, UDP(sport=1000, dport=53)), in_port="inet"), "p0")
    assert out[IP].dst == VTEP_BLUE
    inner = Ether(bytes(out[UDP].payload)[8:])
    assert (inner.dst, inner[IP].dst) == (BLUE_REMOTE_MAC, BLUE_REMOTE_IP)


# ---- hairpinning -------------------------------------------------------------------------------------


def test_hairpin_to_own_floating_address(dp):
    """vm1 reaches vm2 through vm2's public address; vm2 sees vm1's public address."""
    pkt = from_vm(VM1_MAC, VM1_IP, BLUE_FLOATING, UDP(sport=7100, dport=53) / Raw(b"hi"))
    for _ in range(2):  # the second packet finds the connections the first made
        inb = one(dp.process(pkt, in_port="vm1"), "vm2")
        assert (inb[IP].src, inb[UDP].sport, inb[IP].dst, inb[UDP].dport) == (BLUE_SNAT, 7100, VM2_IP, 53)
        assert inb[IP].ttl == 63  # routed once
        assert_checksums(inb)
    back = one(dp.process(from_vm(VM2_MAC, VM2_IP, BLUE_SNAT, UDP(sport=53, dport=7100)), in_port="vm2"), "vm1")
    assert (back[IP].src, back[UDP].sport, back[IP].dst, back[UDP].dport) == (BLUE_FLOATING, 53, VM1_IP, 7100)


def _through_own_forward(dp, mac, ip, port, public):
    """A SYN from (mac, ip) on `port` to the forward BLUE_SNAT:8080 reaches
    vm2:80 from `public`, the sender's public address; vm2's SYN-ACK goes back
    to the sender from BLUE_SNAT:8080."""
    syn = one(dp.process(from_vm(mac, ip, BLUE_SNAT, TCP(sport=41000, dport=8080, flags="S")), in_port=port), "vm2")
    assert (syn[IP].src, syn[IP].dst, syn[TCP].dport) == (public, VM2_IP, 80)
    sa = one(dp.process(from_vm(VM2_MAC, VM2_IP, public, TCP(sport=80, dport=syn[TCP].sport, flags="SA")),
                        in_port="vm2"), port)
    assert (sa[IP].src, sa[TCP].sport, sa[IP].dst, sa[TCP].dport) == (BLUE_SNAT, 8080, ip, 41000)


def test_hairpin_to_own_forward(dp):
    _through_own_forward(dp, VM1_MAC, VM1_IP, "vm1", BLUE_SNAT)


def test_machine_reaches_its_own_floating_address_and_forward(dp):
    """vm2 (floating BLUE_FLOATING, forward BLUE_SNAT:8080 -> vm2:80) reaching
    its own public addresses: the packet comes back out vm2's own port with
    the public address as source (a Linux NAT router's hairpin), and the
    reply goes back the same way."""
    pkt = from_vm(VM2_MAC, VM2_IP, BLUE_FLOATING, UDP(sport=7200, dport=53) / Raw(b"me"))
    for _ in range(2):  # the second packet finds the connections the first made
        inb = one(dp.process(pkt, in_port="vm2"), "vm2")
        assert (inb[Ether].src, inb[Ether].dst) == (GW_MAC, VM2_MAC)
        assert (inb[IP].src, inb[UDP].sport, inb[IP].dst, inb[UDP].dport) == (BLUE_FLOATING, 7200, VM2_IP, 53)
        assert_checksums(inb)
    back = one(dp.process(from_vm(VM2_MAC, VM2_IP, BLUE_FLOATING, UDP(sport=53, dport=7200)), in_port="vm2"), "vm2")
    assert (back[IP].src, back[UDP].sport, back[IP].dst, back[UDP].dport) == (BLUE_FLOATING, 53, VM2_IP, 7200)
    _through_own_forward(dp, VM2_MAC, VM2_IP, "vm2", BLUE_FLOATING)
    assert drops(dp, "blue") == {}
    # A frame vm2 switches to its own MAC is still never sent back to it.
    assert dp.process(Ether(src=VM2_MAC, dst=VM2_MAC) / IP(src=VM2_IP, dst=VM2_IP) / UDP(), in_port="vm2") == []


# ---- ARP, tenants without NAT, zones ----------------------------------------------------------------


def test_arp_for_public_addresses_answered_on_internet_port(dp):
    ask = Ether(src=INET_NEXTHOP_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=INET_NEXTHOP_MAC, psrc="203.0.113.1",
                                                                     pdst=BLUE_FLOATING)
    ans = one(dp.process(ask, in_port="inet"), "inet")
    assert (ans[ARP].op, ans[ARP].hwsrc, ans[ARP].psrc, ans[ARP].pdst) == (2, INET_MAC, BLUE_FLOATING, "203.0.113.1")
    other = ask.copy()
    other[ARP].pdst = "203.0.113.99"
    assert dp.process(other, in_port="inet") == []


def test_tenant_without_nat_has_no_internet(dp):
    assert dp.process(from_vm(VM3_MAC, VM3_IP, SERVER, UDP(sport=1, dport=53)), in_port="vm3") == []
    assert drops(dp, "red") == {"unroutable": 1}
    # and the internal subnets of a NAT tenant stay internal: unknown host, not the internet
    assert dp.process(from_vm(VM1_MAC, VM1_IP, "10.0.1.99", UDP(sport=1, dport=53)), in_port="vm1") == []
    assert drops(dp, "blue") == {"unroutable": 1}


def _two_nat_tenants(**red):
    topo = load_topology(NAT_TOPO)
    from dpu.topology import Nat

    lo = topo.tenants["blue"].nat.snat[0].__class__(RED_SNAT)
    topo.tenants["red"].nat = Nat((lo, lo), [], [])
    for k, v in red.items():
        setattr(topo.tenants["red"], k, v)
    return Dataplane.from_topology(topo)


def test_same_private_addresses_in_two_tenants_get_distinct_mappings():
    dp = _two_nat_tenants()
    blue = one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=5000, dport=53)), in_port="vm1"), "inet")
    red = one(dp.process(from_vm(VM3_MAC, VM3_IP, SERVER, UDP(sport=5000, dport=53)), in_port="vm3"), "inet")
    assert (blue[IP].src, red[IP].src) == (BLUE_SNAT, RED_SNAT)
    assert [c.zone for c in dp.conntrack()] == [100, 200]
    assert len(dp.conntrack(zone=100)) == len(dp.conntrack(zone=200)) == 1
    one(dp.process(from_internet(SERVER, RED_SNAT, UDP(sport=53, dport=5000)), in_port="inet"), "vm3")
    one(dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=53, dport=5000)), in_port="inet"), "vm1")


def test_quota_syn_flood_leaves_other_tenant_alone():
    dp = _two_nat_tenants(connection_limit=20)
    # blue: one established connection before the flood
    dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, TCP(sport=40000, dport=443, flags="S", seq=1)), in_port="vm1")
    dp.process(from_internet(SERVER, BLUE_SNAT, TCP(sport=443, dport=40000, flags="SA", seq=9, ack=2)), in_port="inet")
    # red: an established connection, then a flood of SYNs far over its quota of 20
    dp.process(from_vm(VM3_MAC, VM3_IP, SERVER, TCP(sport=30000, dport=80, flags="S", seq=1)), in_port="vm3")
    dp.process(from_internet(SERVER, RED_SNAT, TCP(sport=80, dport=30000, flags="SA", seq=9, ack=2)), in_port="inet")
    flood = [from_vm(VM3_MAC, VM3_IP, SERVER, TCP(sport=p, dport=80, flags="S")) for p in range(31000, 31200)]
    outs = dp.process(flood, in_port="vm3")
    assert len(outs) == 19 and dp.stats()["conntrack"]["zones"][200] == 20
    assert drops(dp, "red")["ct_quota"] == 181
    # red's established connection still works
    one(dp.process(from_vm(VM3_MAC, VM3_IP, SERVER, TCP(sport=30000, dport=80, flags="A", seq=2, ack=10)),
                   in_port="vm3"), "inet")
    # blue: new and established connections untouched
    one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, TCP(sport=40000, dport=443, flags="A", seq=2, ack=10)),
                   in_port="vm1"), "inet")
    one(dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, TCP(sport=40001, dport=443, flags="S")), in_port="vm1"), "inet")
    assert "ct_quota" not in drops(dp, "blue")


def test_reload_keeps_connections(dp):
    dp.process(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=6400, dport=53)), in_port="vm1")
    dp.load_topology(NAT_TOPO)
    one(dp.process(from_internet(SERVER, BLUE_SNAT, UDP(sport=53, dport=6400)), in_port="inet"), "vm1")


def test_trace_follows_the_nat(dp):
    text = str(dp.trace(from_vm(VM1_MAC, VM1_IP, SERVER, UDP(sport=6500, dport=53)), "vm1"))
    assert "recirc(0x" in text and "ct(commit,zone=100,nat(src=203.0.113.10))" in text
    assert "translated to udp 203.0.113.10:6500 > 198.51.100.1:53" in text
    assert "Output: inet" in text
    assert dp.conntrack() == []  # a trace changes nothing


# ---- validation --------------------------------------------------------------------------------------

BAD = [
    ("a public address in two tenants", "red", {"snat": "203.0.113.12"}, "tenants.red.nat", "already used by tenant blue"),
    ("forward to an address outside the tenant", "blue",
     {"snat": "203.0.113.10", "forwards": [{"proto": "tcp", "public": "203.0.113.10", "port": 1, "to": "10.9.9.9"}]},
     "tenants.blue.nat.forwards[0].to", "not an endpoint of tenant blue"),
    ("pool reversed", "blue", {"snat": "203.0.113.13-203.0.113.10"}, "tenants.blue.nat.snat", "reversed"),
    ("port out of range", "blue",
     {"snat": "203.0.113.10", "forwards": [{"proto": "tcp", "public": "203.0.113.10", "port": 70000, "to": VM1_IP}]},
     "tenants.blue.nat.forwards[0].port", "out of range"),
    ("to_port out of range", "blue",
     {"snat": "203.0.113.10",
      "forwards": [{"proto": "udp", "public": "203.0.113.10", "port": 53, "to": VM1_IP, "to_port": 0}]},
     "tenants.blue.nat.forwards[0].to_port", "out of range"),
    ("bad protocol", "blue",
     {"snat": "203.0.113.10", "forwards": [{"proto": "sctp", "public": "203.0.113.10", "port": 1, "to": VM1_IP}]},
     "tenants.blue.nat.forwards[0].proto", "not tcp or udp"),
    ("floating private not an endpoint", "blue",
     {"snat": "203.0.113.10", "floating": [{"private": "10.0.0.99", "public": "203.0.113.50"}]},
     "tenants.blue.nat.floating[0].private", "not an endpoint"),
    ("public address inside the tenant's subnets", "blue", {"snat": "10.0.0.200"}, "tenants.blue.nat.snat",
     "inside tenant blue's own subnets"),
    ("one floating address for two machines", "blue",
     {"snat": "203.0.113.10", "floating": [{"private": VM2_IP, "public": "203.0.113.12"},
                                           {"private": VM1_IP, "public": "203.0.113.12"}]},
     "tenants.blue.nat.floating[1].public", "203.0.113.12 is already the floating address of 10.0.1.12"),
    ("broadcast snat address", "blue", {"snat": "255.255.255.255"}, "tenants.blue.nat.snat", "not a public address"),
    ("reserved floating address", "blue",
     {"snat": "203.0.113.10", "floating": [{"private": VM2_IP, "public": "240.0.0.1"}]},
     "tenants.blue.nat.floating[0].public", "240.0.0.1 is a reserved address"),
    ("loopback forward address", "blue",
     {"snat": "203.0.113.10", "forwards": [{"proto": "tcp", "public": "127.0.0.1", "port": 1, "to": VM1_IP}]},
     "tenants.blue.nat.forwards[0].public", "127.0.0.1 is a loopback address"),
    ("pool reaching into loopback", "blue", {"snat": "126.255.255.254-127.0.0.1"}, "tenants.blue.nat.snat",
     "127.0.0.0 is a loopback address"),
    ("unknown key", "blue", {"snat": "203.0.113.10", "masquerade": True}, "tenants.blue.nat.masquerade", "unknown key"),
    ("bad filtering", "blue", {"snat": "203.0.113.10", "filtering": "full-cone"}, "tenants.blue.nat.filtering",
     "not endpoint-independent"),
]


@pytest.mark.parametrize("desc,tenant,nat,path,words", BAD, ids=[b[0] for b in BAD])
def test_bad_nat_config_names_the_path(desc, tenant, nat, path, words):
    import yaml

    with open(NAT_TOPO) as f:
        data = yaml.safe_load(f)
    data["tenants"][tenant]["nat"] = nat
    with pytest.raises(TopologyError) as e:
        load_topology(data)
    assert e.value.path == path and words in str(e.value), str(e.value)


def test_nat_needs_the_internet_section():
    import yaml

    with open(NAT_TOPO) as f:
        data = yaml.safe_load(f)
    del data["internet"]
    with pytest.raises(TopologyError, match=r"tenants\.blue\.nat: NAT needs the internet: section"):
        load_topology(data)


def test_zone_collision_and_explicit_zone():
    import yaml

    with open(NAT_TOPO) as f:
        data = yaml.safe_load(f)
    data["tenants"]["red"]["nat"] = {"snat": RED_SNAT}
    data["tenants"]["red"]["zone"] = 100
    with pytest.raises(TopologyError, match="conntrack zone 100 is already used by tenant blue"):
        load_topology(data)
    data["tenants"]["red"]["zone"] = 7
    dp = Dataplane.from_topology(data)
    dp.process(from_vm(VM3_MAC, VM3_IP, SERVER, UDP(sport=1, dport=53)), in_port="vm3")
    assert [c.zone for c in dp.conntrack()] == [7]


def test_bad_nat_config_applies_nothing(dp):
    import yaml

    with open(NAT_TOPO) as f:
        data = yaml.safe_load(f)
    data["tenants"]["blue"]["nat"]["snat"] = "203.0.113.99-203.0.113.98"
    before = [f.spec for f in dp.dump_flows()]
    with pytest.raises(TopologyError):
        dp.load_topology(data)
    assert [f.spec for f in dp.dump_flows()] == before
