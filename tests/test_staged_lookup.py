"""Staged lookup in the OpenFlow tables (classifier.h): a subtable that a packet
misses at one stage (metadata, L2, L3, L4) puts only the bits of the stages it
looked at into the megaflow, as Open vSwitch's classifier does. Before, a
gateway's ICMP echo rule put the ICMP type and code (the L4 ports' low byte) into
the megaflow of every packet of its tenant: 256 megaflows where one does."""
import pytest
from scapy.all import ICMP, IP, UDP, Ether

from dpu import Dataplane

PORTS = ["p1", "p2", "p3", "p4"]
GW_MAC = "02:00:00:00:01:01"
ECHO_RULE = f"priority=150,icmp,dl_dst={GW_MAC},nw_dst=10.0.0.1,icmp_type=8,icmp_code=0,actions=output:p3"
DEFAULT = "priority=10,in_port=p1,actions=output:p2"


def udp(dst_mac="02:00:00:00:00:bb", sport=1000):
    return Ether(src="02:00:00:00:00:aa", dst=dst_mac) / IP(src="10.0.0.5", dst="10.0.0.9") / UDP(sport=sport, dport=53)


def echo(dst_mac=GW_MAC, dst="10.0.0.1", type_=8):
    return Ether(src="02:00:00:00:00:aa", dst=dst_mac) / IP(src="10.0.0.5", dst=dst) / ICMP(type=type_)


def ports_of(dp, pkt):
    return [o.port for o in dp.process(pkt, in_port="p1")]


def only_megaflow(dp):
    mfs = dp.dump_megaflows()
    assert len(mfs) == 1, mfs
    return mfs[0].match


def test_a_miss_at_l2_leaves_l3_and_l4_out_of_the_megaflow():
    dp = Dataplane(ports=PORTS, flows=[ECHO_RULE, DEFAULT])
    dp.process([udp(sport=s) for s in range(1000, 1300)], in_port="p1")
    match = only_megaflow(dp)
    # What OVS 3.1 makes of it too (ofproto/trace: recirc_id=0,eth,ip,in_port=1,dl_dst=...,nw_frag=no)
    assert "dl_dst=02:00:00:00:00:bb" in match, match
    for field in ("nw_dst", "nw_proto", "icmp", "udp", "tp_src", "tp_dst", "nw_frag"):
        assert field not in match, match
    w = dp.stats()["workers_total"]
    assert w["upcalls"] == 1 and w["packets"] == 300


def test_a_miss_at_l3_stops_before_l4_and_a_hit_has_the_whole_mask():
    dp = Dataplane(ports=PORTS, flows=[ECHO_RULE, DEFAULT])
    assert ports_of(dp, echo(dst="10.0.0.9")) == ["p2"]
    match = only_megaflow(dp)
    assert "nw_dst=10.0.0.9" in match and "icmp_type" not in match and "icmp_code" not in match, match
    dp = Dataplane(ports=PORTS, flows=[ECHO_RULE, DEFAULT])
    assert ports_of(dp, echo()) == ["p3"]
    match = only_megaflow(dp)
    assert "nw_dst=10.0.0.1" in match and "icmp_type=8" in match and "icmp_code=0" in match, match
    # The megaflows are not too wide: each packet still goes its own rule's way.
    assert ports_of(dp, echo(type_=0)) == ["p2"]
    assert ports_of(dp, echo(dst="10.0.0.2")) == ["p2"]
    assert ports_of(dp, echo()) == ["p3"]


def test_a_rule_that_gives_a_stage_a_new_value_takes_the_packets_a_wide_megaflow_held():
    """The megaflow of an L2 miss covers every ICMP echo to that MAC; a rule added
    to the same subtable with that MAC must take the echoes from the next packet
    on (revalidation), and its deletion give them back."""
    dp = Dataplane(ports=PORTS, flows=[ECHO_RULE, DEFAULT])
    mac = "02:00:00:00:00:bb"
    assert ports_of(dp, udp(dst_mac=mac)) == ["p2"]
    assert ports_of(dp, echo(dst_mac=mac)) == ["p2"]  # the same megaflow
    assert dp.stats()["workers_total"]["upcalls"] == 1
    rule = f"priority=150,icmp,dl_dst={mac},nw_dst=10.0.0.1,icmp_type=8,icmp_code=0,actions=output:p4"
    dp.add_flow(rule)
    assert ports_of(dp, echo(dst_mac=mac)) == ["p4"]
    assert ports_of(dp, udp(dst_mac=mac)) == ["p2"]
    assert ports_of(dp, echo()) == ["p3"]
    dp.del_flows(rule.replace(",actions=output:p4", ""), strict=True)
    assert ports_of(dp, echo(dst_mac=mac)) == ["p2"]
    assert ports_of(dp, echo()) == ["p3"]


def test_stage_indexes_follow_many_adds_and_deletes():
    """600 rules in one subtable, each its own L2 stage value (the index grows and is
    rebuilt), every other one deleted (counts fall to zero): each MAC's UDP port 53
    goes to p3 exactly while its rule is there, everything else to the default."""
    n = 600
    macs = [f"02:00:00:00:{i >> 8:02x}:{i & 255:02x}" for i in range(n)]
    dp = Dataplane(ports=PORTS, flows=[DEFAULT] + [f"priority=100,dl_dst={m},udp,tp_dst=53,actions=output:p3" for m in macs])
    for m in macs[::2]:
        dp.del_flows(f"dl_dst={m},udp,tp_dst=53")
    sample = list(range(0, n, 7)) + [n - 1, n - 2]
    for i in sample:
        want = ["p2"] if i % 2 == 0 else ["p3"]
        assert ports_of(dp, udp(dst_mac=macs[i])) == want, (i, dp.dump_megaflows())
        other = Ether(src="02:00:00:00:00:aa", dst=macs[i]) / IP(src="10.0.0.5", dst="10.0.0.9") / UDP(sport=9, dport=54)
        assert ports_of(dp, other) == ["p2"]
    # A MAC no rule ever had, and one whose rule was deleted (its count back to
    # zero): the L2 stage misses, and the megaflow has no L4 bits.
    for mac in ("02:00:00:00:ff:ff", macs[2]):
        before = len(dp.dump_megaflows())
        dp.process([udp(dst_mac=mac, sport=s) for s in range(2000, 2100)], in_port="p1")
        new = [m.match for m in dp.dump_megaflows() if f"dl_dst={mac}," in m.match + ","]
        assert len(dp.dump_megaflows()) == before + 1 and len(new) == 1 and "tp_dst" not in new[0], new


def _fields(match: str) -> set:
    """The field names of a megaflow match (dpu's or OVS's Megaflow: line), without
    what only OVS prints (eth, and nw_frag, which its IPv4 megaflows always have)."""
    return {f.split("=")[0] for f in match.split(",")} - {"eth", "nw_frag"}


@pytest.mark.parametrize("pkt", [udp(), echo(), echo(dst_mac="02:00:00:00:00:bb")], ids=["udp-l2-miss", "echo-hit", "echo-l2-miss"])
def test_the_megaflow_has_the_fields_ovs_puts_in_it(ovs, pkt):
    """Asked of Open vSwitch (ofproto/trace's Megaflow:) where its prefix tries play no
    part: the same fields (a miss at L3 is where they do: README, "Where dpu differs")."""
    flows = [ECHO_RULE, DEFAULT]
    dp = Dataplane(ports=PORTS, flows=flows)
    dp.process(pkt, in_port="p1")
    ours = only_megaflow(dp)
    ovs.load(flows)
    lines = [ln for ln in ovs.trace("p1", bytes(pkt)).splitlines() if ln.startswith("Megaflow: ")]
    assert len(lines) == 1, lines
    assert _fields(ours) == _fields(lines[0][len("Megaflow: "):]), (ours, lines[0])
