"""Regressions found by review: each case failed before its fix.

The cache cases all have the same shape: a first packet installs a megaflow, a
second packet that differs only in bits the megaflow must not ignore comes
after it, and its output must be what a fresh dataplane gives it alone."""

import numpy as np
import pytest
from scapy.all import ICMPv6EchoRequest, IP, TCP, UDP, Dot1Q, Ether, IPv6, Raw

from dpu import Dataplane
from dpu.errors import DpuError, FlowParseError, InvalidArgumentError

E = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb")
PORTS = ["a", "b", "c"]


def alone(flows, pkt, port="a"):
    return [(o.port, o.data) for o in Dataplane(ports=PORTS, flows=flows).process(bytes(pkt), in_port=port)]


def after(flows, first, second, port="a"):
    dp = Dataplane(ports=PORTS, flows=flows)
    dp.process(bytes(first), in_port=port)
    return [(o.port, o.data) for o in dp.process(bytes(second), in_port=port)]


V6 = E / IPv6(src="2001:db8::1", dst="2001:db8::2")
CACHE_CASES = [
    ("ipv6 rewrite: TCP after UDP", ["ipv6,actions=set_field:2001:db8::99->ipv6_dst,output:b"],
     V6 / UDP(sport=1, dport=2) / Raw(b"yy" * 8), V6 / TCP(sport=1, dport=2, seq=0x11111111)),
    ("ipv6 rewrite: UDP after TCP", ["ipv6,actions=set_field:2001:db8::99->ipv6_dst,output:b"],
     V6 / TCP(sport=1, dport=2), V6 / UDP(sport=1, dport=2) / Raw(b"yy" * 8)),
    ("ipv6 rewrite: TCP after ICMPv6", ["ipv6,actions=set_field:2001:db8::99->ipv6_src,output:b"],
     V6 / ICMPv6EchoRequest(), V6 / TCP(sport=1, dport=2)),
    ("push_vlan copies the packet's own tag", ["actions=push_vlan:0x88a8,output:b"],
     E / Dot1Q(vlan=10) / IP() / UDP(), E / Dot1Q(vlan=20, prio=3) / IP() / UDP()),
    ("mod_vlan_vid keeps the packet's PCP", ["actions=mod_vlan_vid:5,output:b"],
     E / Dot1Q(vlan=1, prio=3) / IP() / UDP(), E / Dot1Q(vlan=1, prio=5) / IP() / UDP()),
    ("mod_vlan_pcp keeps the packet's VID", ["actions=mod_vlan_pcp:7,output:b"],
     E / Dot1Q(vlan=1) / IP() / UDP(), E / Dot1Q(vlan=9) / IP() / UDP()),
    ("strip then re-tag depends on the TPID", ["actions=strip_vlan,mod_vlan_vid:5,output:b"],
     E / Dot1Q(vlan=1) / IP() / UDP(), Ether(bytes(Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb", type=0x88a8) / Dot1Q(vlan=1) / IP() / UDP()))),
    ("pop of a pushed tag shows the packet's tag again",
     ["table=0,in_port=a,actions=push_vlan:0x88a8,mod_vlan_vid:5,pop_vlan,resubmit(,1)",
      "table=1,dl_vlan=10,actions=output:b", "table=1,dl_vlan=20,actions=output:c"],
     E / Dot1Q(vlan=10) / IP() / UDP(), E / Dot1Q(vlan=20) / IP() / UDP()),
]


@pytest.mark.parametrize("desc,flows,first,second", CACHE_CASES, ids=[c[0] for c in CACHE_CASES])
def test_megaflow_keeps_what_the_actions_read(desc, flows, first, second):
    want = alone(flows, second)
    assert want, "the case must produce output"
    got = after(flows, first, second)
    assert got == want, f"{desc}\n--- alone\n{Ether(want[0][1]).show2(dump=True)}\n--- after\n{Ether(got[0][1]).show2(dump=True)}"


def test_mod_flows_cannot_install_a_backward_goto():
    dp = Dataplane(ports=PORTS, flows=["table=0,actions=goto_table:1", "table=1,in_port=a,actions=goto_table:2",
                                       "table=2,in_port=a,actions=output:b"])
    with pytest.raises(FlowParseError, match="needs table="):
        dp.mod_flows("in_port=a,actions=goto_table:1")
    with pytest.raises(FlowParseError, match="later table"):
        dp.mod_flows("table=1,in_port=a,actions=goto_table:1")
    assert [o.port for o in dp.process(bytes(E / IP() / UDP()), in_port="a")] == ["b"]


def test_long_goto_chains_do_not_exhaust_the_stack(run_python):
    """goto_table through 150 tables, then resubmit back: the resubmit limit
    ends it (run in a child: before the fix this crashed the process)."""
    code = (
        "from dpu import Dataplane\n"
        "flows = [f'table={t},actions=goto_table:{t + 1}' for t in range(150)] + ['table=150,actions=resubmit(,0)']\n"
        "dp = Dataplane(ports=['a', 'b'], flows=flows)\n"
        "print(dp.process(bytes(64), in_port='a'), dp.stats()['ports']['a']['drops'])\n"
        "dp2 = Dataplane(ports=['a', 'b'], flows=[f'table={t},actions=goto_table:{t + 1}' for t in range(254)] + ['table=254,actions=output:b'])\n"
        "print(len(dp2.process(bytes(64), in_port='a')))\n"
    )
    assert run_python(code).splitlines() == ["[] {'resubmit_limit': 1}", "1"]


def _mtu_dp():
    dp = Dataplane(ports=["a", "up"])
    dp.add_tunnel_port("vx", underlay="up", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01",
                       nexthop_mac="02:00:00:00:00:02", mtu=600)
    dp.add_group("group_id=1,type=all,bucket=actions=set_field:0x5->tun_id,set_field:192.0.2.2->tun_dst,output:vx,"
                 "bucket=actions=set_field:0x5->tun_id,set_field:192.0.2.3->tun_dst,output:vx")
    dp.add_flow("in_port=a,actions=group:1")
    return dp


def test_too_big_is_answered_once_and_never_to_broadcast():
    dp = _mtu_dp()
    big = Raw(b"b" * 700)
    uni = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IP(src="10.0.0.1", dst="10.0.0.2", flags="DF") / UDP() / big
    outs = dp.process(bytes(uni), in_port="a")
    assert [o.port for o in outs] == ["a"], "one ICMP for the arrival, not one per VTEP copy"
    bcast = Ether(src="02:00:00:00:00:aa", dst="ff:ff:ff:ff:ff:ff") / IP(src="0.0.0.0", dst="255.255.255.255", flags="DF") / UDP(sport=68, dport=67) / big
    mcast = Ether(src="02:00:00:00:00:aa", dst="01:00:5e:00:00:fb") / IP(src="10.0.0.1", dst="224.0.0.251", flags="DF") / UDP() / big
    assert dp.process([bytes(bcast), bytes(mcast)], in_port="a") == []
    assert dp.stats()["ports"]["a"]["drops"] == {"mtu": 3}


def test_replay_refuses_to_overwrite_its_own_input(tmp_path):
    from scapy.all import wrpcap

    (tmp_path / "out").mkdir()
    src = tmp_path / "out" / "b.pcap"
    wrpcap(str(src), [E / IP() / UDP()] * 3)
    size = src.stat().st_size
    dp = Dataplane(ports=["b", "c"], flows=["actions=output:c"])
    with pytest.raises(InvalidArgumentError, match="also the output"):
        dp.replay({"b": str(src)}, tmp_path / "out")
    assert src.stat().st_size == size


def test_core_process_refuses_offsets_past_the_buffer():
    dp = Dataplane(ports=["a", "b"], flows=["actions=output:b"])
    data = bytes(64)
    with pytest.raises(ValueError):
        dp._core.process(data, np.array([2**64 - 32], dtype=np.uint64), np.array([64], dtype=np.uint32),
                         np.array([dp.port_number("a")], dtype=np.uint32), None)


def test_pcapng_with_a_hostile_timestamp_offset_is_an_error(tmp_path):
    import struct

    def block(t, body):
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", t, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))

    shb = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb = block(1, struct.pack("<HHI", 1, 0, 65535) + struct.pack("<HHq", 14, 8, 2**62) + struct.pack("<HH", 0, 0))
    f = tmp_path / "x.pcapng"
    f.write_bytes(shb + idb)
    with pytest.raises(DpuError, match="if_tsoffset"):
        Dataplane(ports=["a", "b"]).replay({"a": str(f)}, tmp_path / "o")


def test_a_huge_group_bucket_keeps_its_rewrites_and_counts_lost_copies():
    """Issue 9: a bucket with tens of thousands of actions. Its rewrites stay in
    its own copy (the next bucket and the rule's own output see the original),
    and copies the packet pool cannot make are counted as no_buffer drops, never
    silently lost."""
    dp = Dataplane(ports=["p1", "p2", "p3"])
    rewrites = ",".join(["mod_nw_dst:10.9.9.9"] * 20000 + ["output:p2"])
    with dp.transaction() as t:
        t.add_group(f"group_id=1,type=all,bucket=actions={rewrites},bucket=actions=output:p3")
        t.add_flow("in_port=p1,actions=group:1,output:p3")
    out = dp.process([("p1", bytes(Ether() / IP(dst="10.0.0.1") / UDP()))])
    assert [(o.port, Ether(o.data)[IP].dst) for o in out] == [("p2", "10.9.9.9"), ("p3", "10.0.0.1"),
                                                              ("p3", "10.0.0.1")]

    dp = Dataplane(ports=["p1", "p2"])
    with dp.transaction() as t:
        t.add_group("group_id=1,type=all,bucket=actions=" + ",".join(["output:p2"] * 40000))
        t.add_flow("in_port=p1,actions=group:1")
    out = dp.process([("p1", bytes(Ether() / IP(dst="10.0.0.1") / UDP()))] * 4)
    p1 = dp.stats()["ports"]["p1"]
    assert len(out) + p1["drops"]["no_buffer"] == 4 * 40000
    assert p1["dropped"] == 0 and len(out) > 0  # every packet got copies out


def test_a_bucket_of_more_than_65535_actions_keeps_its_rewrites():
    """Issue 26: the nested action count of a bucket was 16 bits, so a bucket of
    65,536 datapath actions (65,534 outputs, a rewrite, an output) wrapped to a
    clone of 0 and its rewrite leaked into the rule's own output after the group."""
    dp = Dataplane(ports=["p1", "p2", "p3"])
    acts = ",".join(["output:p2"] * 65534 + ["mod_dl_dst:02:00:00:00:00:99", "output:p2"])
    with dp.transaction() as t:
        t.add_group(f"group_id=1,type=all,bucket=actions={acts}")
        t.add_flow("in_port=p1,actions=group:1,output:p3")
    out = dp.process([("p1", bytes(Ether(dst="02:00:00:00:00:01") / IP(dst="10.0.0.1") / UDP()))])
    assert [Ether(o.data).dst for o in out if o.port == "p3"] == ["02:00:00:00:00:01"]
    p1 = dp.stats()["ports"]["p1"]
    # copies the pool could not make are counted one by one (README, Counters)
    assert len(out) + p1["drops"]["no_buffer"] == 65535 + 1 and p1["dropped"] == 0  # to p2, to p3


@pytest.mark.parametrize("stamp", [2 ** 63, 2 ** 63 + 12345, 2 ** 64 - 1])
def test_a_timestamp_of_2_63_ns_or_later_moves_the_conntrack_clock(stamp):
    """Issue 26: a packet stamped 2^63 ns or later read as a negative time and
    expired nothing; it now moves the clock to its end (2^62 ns)."""
    dp = Dataplane(ports=["a", "b"], flows=["in_port=a,ip,actions=ct(commit,zone=1),output:b",
                                            "in_port=b,ip,actions=output:a"])
    dp.stop_clock()
    dp.process(bytes(E / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2)), in_port="a",
               timestamps=[10 ** 9])
    assert dp.stats()["conntrack"]["connections"] == 1
    dp.process(bytes(E / IP(src="10.0.0.9", dst="10.0.0.2") / UDP()), in_port="b", timestamps=[stamp])
    dp.process(bytes(E / IP(src="10.0.0.9", dst="10.0.0.2") / UDP()), in_port="b")  # expiry runs per batch
    st = dp.stats()["conntrack"]
    assert (st["connections"], st["expired"]) == (0, 1)


def test_a_tunnels_underlay_cannot_be_deleted_alone_and_its_settings_are_checked():
    """Deleting the underlay left the tunnel sending VXLAN to a port number
    no port had; ttl=0, mtu=0 and dst_port=0 were taken (outer TTL 0)."""
    dp = Dataplane(ports=["a", "up"])
    tnl = dict(underlay="up", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01", nexthop_mac="02:00:00:00:00:02")
    dp.add_tunnel_port("vx", **tnl)
    with pytest.raises(DpuError, match="cannot delete port 'up': tunnel port 'vx' sends through it"):
        dp.del_port("up")
    assert sorted(dp.ports) == ["a", "up", "vx"]
    with dp.transaction() as t:  # both at once is fine
        t.del_port("vx")
        t.del_port("up")
    assert sorted(dp.ports) == ["a"]
    dp.add_port("up")
    for bad, what in ((dict(ttl=0), "ttl must be 1..255"), (dict(mtu=0), "mtu must be 576..10000"),
                      (dict(dst_port=0), "dst_port must be 1..65535"),
                      (dict(src_port_range=(0, 10)), "src_port_range must be 1..65535"),
                      (dict(local_ip="2001:db8::1", mtu=600), "an IPv6 underlay's mtu must be 1280..10000")):
        with pytest.raises(InvalidArgumentError, match=what):
            dp.add_tunnel_port("vx", **{**tnl, **bad})
    assert sorted(dp.ports) == ["a", "up"]


def test_settings_of_the_wrong_type_are_refused_by_name():
    """They reached the C++ binding, which said 'Unable to cast Python instance
    to C++ type' (a RuntimeError)."""
    dp = Dataplane()
    for call, what in ((lambda: dp.ct_config(timeouts={"udp": "5"}), "ct timeout 'udp' must be a number"),
                       (lambda: dp.ct_config(max_connections=1.5), "max_connections must be 1..1073741824"),
                       (lambda: dp.ct_config(max_connections=2 ** 63), "max_connections must be 1..1073741824"),
                       (lambda: dp.add_port(None), "a port name is a string, not NoneType"),
                       (lambda: dp.add_port("x", ofport=-1), "ofport must be 0 .* or 1..65279")):
        with pytest.raises(InvalidArgumentError, match=what):
            call()
    assert dp.ports == {} and dp.ct_config()["timeouts"]["udp"] == 300
