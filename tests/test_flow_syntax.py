"""ovs-ofctl flow syntax: parsing, canonical dumps, errors, flow_mod semantics."""
import os

import pytest

from dpu import Dataplane
from dpu.errors import (
    BadValueError,
    ConflictError,
    DpuError,
    FlowParseError,
    UnknownFieldError,
    UnknownGroupError,
    UnknownPortError,
    UnknownTableError,
)

PORTS = ["vm1", "vm2", "vm3"]


def dp_with(*flows):
    dp = Dataplane(ports=PORTS)
    if flows:
        dp.add_flows(list(flows))
    return dp


# {input, canonical dump (match + actions)}: parse -> format must give the canonical
# text, and that text must parse back to the same rule.
ROUND_TRIP = [
    ("in_port=vm1,actions=output:vm2", "in_port=vm1", "output:vm2"),
    ("priority=100,ip,nw_dst=10.0.0.0/24,actions=mod_dl_dst:02:00:00:00:00:02,dec_ttl,output:vm2",
     "priority=100,ip,nw_dst=10.0.0.0/24", "mod_dl_dst:02:00:00:00:00:02,dec_ttl,output:vm2"),
    ("tcp,tp_dst=0x50/0xfff0,actions=drop", "tcp,tp_dst=0x50/0xfff0", "drop"),
    ("udp6,ipv6_src=2001:db8::/32,udp_dst=53,actions=vm3", "udp6,ipv6_src=2001:db8::/32,tp_dst=53", "output:vm3"),
    ("arp,arp_op=1,arp_tpa=10.0.0.1,actions=in_port", "arp,arp_tpa=10.0.0.1,arp_op=1", "in_port"),
    ("dl_vlan=10,actions=strip_vlan,output:vm2", "dl_vlan=10", "strip_vlan,output:vm2"),
    ("dl_vlan=0xffff,actions=mod_vlan_vid:7,output:vm2", "vlan_tci=0x0000", "mod_vlan_vid:7,output:vm2"),
    ("dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,actions=flood", "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00", "flood"),
    ("ip,nw_src=10.0.0.0/255.0.255.0,actions=drop", "ip,nw_src=10.0.0.0/255.0.255.0", "drop"),
    ("ip,nw_frag=later,actions=drop", "ip,nw_frag=later", "drop"),
    ("icmp,icmp_type=8,icmp_code=0,actions=drop", "icmp,icmp_type=8,icmp_code=0", "drop"),
    ("icmp6,icmpv6_type=135,actions=drop", "icmp6,icmp_type=135", "drop"),
    ("reg0=0x5/0xff,metadata=0x64,actions=resubmit(,2)", "metadata=0x64,reg0=0x5/0xff", "resubmit(,2)"),
    ("arp,actions=load:0x2->NXM_OF_ARP_OP[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]", "arp",
     "load:0x2->NXM_OF_ARP_OP[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]"),
    ("actions=load:0x1->reg0[0..3],move:reg0[0..3]->reg1[4..7],resubmit(vm2,3)", "",
     "load:0x1->NXM_NX_REG0[0..3],move:NXM_NX_REG0[0..3]->NXM_NX_REG1[4..7],resubmit(vm2,3)"),
    # mod_nw_ttl/mod_nw_ecn need no ip in the match, as in OVS: they dump as written
    ("actions=mod_nw_ttl:9,mod_nw_ecn:2,output:vm2", "", "mod_nw_ttl:9,mod_nw_ecn:2,output:vm2"),
    ("ip,actions=load:0x28->NXM_OF_IP_TOS[],move:NXM_OF_IN_PORT[]->NXM_NX_REG0[0..15]", "ip",
     "load:0x28->NXM_OF_IP_TOS[],move:NXM_OF_IN_PORT[]->NXM_NX_REG0[0..15]"),
    ("ip,actions=set_field:10.1.1.1->ip_dst,set_field:0x5->tun_id,output:vm2", "ip",
     "set_field:10.1.1.1->nw_dst,set_field:0x5->tun_id,output:vm2"),
    ("tcp,tcp_flags=+syn-ack,actions=drop", "tcp,tcp_flags=+syn-ack", "drop"),
    ("ip,nw_tos=16,nw_ecn=1,nw_ttl=3,actions=mod_nw_tos:32,output:vm2", "ip,nw_tos=16,nw_ecn=1,nw_ttl=3",
     "mod_nw_tos:32,output:vm2"),
    ("actions=write_metadata:0x10/0xff,note:de.ad.be.ef,goto_table:5", "",
     "write_metadata:0x10/0xff,note:de.ad.be.ef,goto_table:5"),
    ("actions=push_vlan:0x8100,mod_vlan_pcp:5,pop_vlan,all", "", "push_vlan:0x8100,mod_vlan_pcp:5,pop_vlan,all"),
    ("in_port=vm1 priority=7 actions=drop(spoofed)", "priority=7,in_port=vm1", "drop(spoofed)"),
    ("ct_state=+trk+est,tun_id=0x64/0xff,tun_src=192.0.2.2,actions=drop", "ct_state=+est+trk,tun_id=0x64/0xff,tun_src=192.0.2.2", "drop"),
]


@pytest.mark.parametrize("text,match,actions", ROUND_TRIP, ids=[r[0][:40] for r in ROUND_TRIP])
def test_round_trip(text, match, actions):
    dp = dp_with(text)
    (f,) = dp.dump_flows()
    assert f.match == match
    assert f.actions == actions
    dp2 = Dataplane(ports=PORTS)
    dp2.add_flow(f.spec)
    (g,) = dp2.dump_flows()
    assert (g.match, g.actions, g.table, g.priority) == (f.match, f.actions, f.table, f.priority)


def test_dump_flows_line_format():
    dp = dp_with("table=3,priority=100,cookie=0x2a,in_port=vm1,actions=output:vm2")
    (f,) = dp.dump_flows()
    assert f.startswith("cookie=0x2a, duration=")
    assert f.endswith("table=3, n_packets=0, n_bytes=0, priority=100,in_port=vm1 actions=output:vm2")
    dp.warp(5)
    (f,) = dp.dump_flows()
    assert f.duration >= 5.0


# {flow, exception, token, 0-based position}
ERRORS = [
    ("in_port=vm1,nw_dsst=10.0.0.1,actions=drop", UnknownFieldError, "nw_dsst", 12),
    ("in_port=vm9,actions=drop", UnknownPortError, "vm9", 8),
    ("table=300,actions=drop", UnknownTableError, "table=300", 0),
    ("ip,nw_dst=10.0.0.0/33,actions=drop", BadValueError, "10.0.0.0/33", 10),
    ("ip,nw_dst=10.0.0.256,actions=drop", BadValueError, "10.0.0.256", 10),
    ("tcp_dst=80,actions=drop", FlowParseError, "tcp_dst=80", 0),
    ("nw_src=1.2.3.4,actions=drop", FlowParseError, "nw_src=1.2.3.4", 0),
    ("in_port=vm1", FlowParseError, None, None),
    ("ip,actions=output:vm7", UnknownPortError, "vm7", 18),
    ("table=2,actions=goto_table:1", FlowParseError, "1", 27),
    ("actions=goto_table:2,output:vm1", FlowParseError, "output:vm1", 21),
    ("actions=resubmit(,2),bogus", FlowParseError, "bogus", 21),
    ("actions=controller", FlowParseError, "controller", 8),
    ("actions=output:vm1,drop", FlowParseError, "drop", 19),
    ("actions=drop(nonsense)", FlowParseError, "nonsense", 13),
    ("actions=drop(spoofed),output:vm1", FlowParseError, "output:vm1", 22),
    ("dl_src=02:00:00:00:00,actions=drop", BadValueError, "02:00:00:00:00", 7),
    ("ip,nw_tos=3,actions=drop", BadValueError, "3", 10),
    ("dl_type=0x0800,dl_type=0x86dd,actions=drop", FlowParseError, "dl_type=0x86dd", 15),
    ("actions=set_field:1.2.3.4->ip_dst", FlowParseError, "set_field:1.2.3.4->ip_dst", 8),
    ("actions=load:0x1ff->reg0[0..7]", BadValueError, "0x1ff", 13),
    ("actions=move:reg0[0..7]->reg1[0..3]", BadValueError, None, 8),
    ("priority=70000,actions=drop", BadValueError, "priority=70000", 0),
    ("in_port=vm1,idle_timeout=10,actions=drop", FlowParseError, "idle_timeout=10", 12),
    ("actions=resubmit(,300)", UnknownTableError, "300", 18),
    ("recirc_id=1,actions=drop", UnknownFieldError, "recirc_id", 0),
    ("actions=output(", FlowParseError, None, None),
]


@pytest.mark.parametrize("text,exc,token,pos", ERRORS, ids=[e[0][:40] for e in ERRORS])
def test_errors_name_token_and_position(text, exc, token, pos):
    dp = Dataplane(ports=PORTS)
    with pytest.raises(exc) as ei:
        dp.add_flow(text)
    if token is not None:
        assert ei.value.token == token
        assert text[ei.value.position:].startswith(token)
        assert f"column {pos + 1}" in str(ei.value)
    assert not dp.dump_flows(), "nothing may be applied"


def test_add_flows_is_all_or_nothing_and_names_the_line():
    dp = dp_with("priority=1,actions=drop")
    with pytest.raises(BadValueError) as ei:
        dp.add_flows(["ip,actions=output:vm2", "# comment", "ip,nw_src=1.2.3,actions=drop", "arp,actions=drop"])
    assert ei.value.line == 3  # the list's third item (a comment is a line too)
    assert [f.match for f in dp.dump_flows()] == ["priority=1"]


def test_a_port_error_is_not_blamed_on_the_one_flow_beside_it():
    dp = Dataplane(ports=["a"])
    t = dp.transaction()
    t.add_port("a")  # exists already
    t.add_flows("# my flows\n\npriority=5,actions=drop")
    with pytest.raises(DpuError) as ei:
        t.commit()
    assert ei.value.line is None and "line" not in str(ei.value) and "already exists" in str(ei.value)


def test_add_flows_text_errors_name_the_text_line():
    """A multi-line string's error names its line (comments and blank lines
    count), and flows on top of a topology name their own place, not one
    after the topology's compiled flows."""
    dp = dp_with("priority=1,actions=drop")
    with pytest.raises(UnknownFieldError) as ei:
        dp.add_flows("# c\npriority=2,actions=drop\n\n# c\nnw_dsst=1,actions=drop")
    assert ei.value.line == 5 and str(ei.value).startswith("line 5: ") and ei.value.message == str(ei.value)
    topo = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
    with pytest.raises(UnknownFieldError) as ei:
        Dataplane().load_topology(topo, flows=["priority=1,actions=drop", "nw_dsst=1,actions=drop"])
    assert ei.value.line == 2, str(ei.value)


def test_flows_file_errors_name_file_line(tmp_path):
    f = tmp_path / "rules.txt"
    f.write_text("# rules\n\nin_port=vm1,actions=output:vm2\nin_port=vm2,actions=output:vm9\n")
    dp = Dataplane(ports=PORTS)
    with pytest.raises(UnknownPortError) as ei:
        dp.load_flows(f)
    assert ei.value.line == 4 and ei.value.file == str(f)
    assert str(ei.value).startswith(f"{f}:4: ")
    assert not dp.dump_flows()


def test_flows_file_on_a_topology_errors_name_file_line(tmp_path):
    """dpu run --config --flows, and its reloads, load both in one transaction:
    an error in the file names the file and its line, as load_flows does, not
    the place in the transaction after the topology's own flows; nothing applies."""
    topo = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
    f = tmp_path / "extra.txt"
    f.write_text("group_id=9,type=all,bucket=actions=output:vm2\n# x\ntable=0,priority=9,in_port=vm1,actions=group:9\n"
                 "ip,nw_dsst=10.0.0.1,actions=drop\n")
    dp = Dataplane()
    with pytest.raises(DpuError) as ei:
        dp.load_topology(topo, flows_file=f)
    assert (ei.value.line, ei.value.file) == (4, str(f))
    assert str(ei.value).startswith(f"{f}:4: ") and "nw_dsst" in str(ei.value)
    assert not dp.dump_flows() and dp.topology is None
    f.write_text(f.read_text().replace("nw_dsst", "nw_dst"))
    dp.load_topology(topo, flows_file=f)
    assert [g.group_id for g in dp.dump_groups() if g.group_id == 9] == [9]
    assert any("nw_dst=10.0.0.1" in str(x) for x in dp.dump_flows())


def test_flows_file_with_groups(tmp_path):
    f = tmp_path / "rules.txt"
    f.write_text("in_port=vm1,actions=group:7\ngroup_id=7,type=all,bucket=actions=output:vm2,bucket=actions=output:vm3\n")
    dp = Dataplane(ports=PORTS)
    assert dp.load_flows(f) == 1
    assert [g.group_id for g in dp.dump_groups()] == [7]


def test_del_flows_non_strict_and_strict():
    dp = dp_with(
        "table=0,priority=10,in_port=vm1,actions=drop",
        "table=0,priority=20,in_port=vm1,ip,actions=drop",
        "table=1,priority=10,in_port=vm1,actions=drop",
        "table=0,priority=10,in_port=vm2,actions=drop",
    )
    # strict: exact match and priority only
    assert dp.del_flows("table=0,priority=20,in_port=vm1", strict=True) == 0
    assert dp.del_flows("table=0,priority=20,in_port=vm1,ip", strict=True) == 1
    # non-strict: every flow the match covers, any priority; no table = all tables
    assert dp.del_flows("in_port=vm1") == 2
    assert [f.match for f in dp.dump_flows()] == ["priority=10,in_port=vm2"]
    assert dp.del_flows() == 1
    assert dp.dump_flows() == []


def test_del_flows_by_cookie_and_out_port():
    dp = dp_with(
        "cookie=0x100,in_port=vm1,actions=output:vm2",
        "cookie=0x101,in_port=vm2,actions=output:vm3",
        "cookie=0x200,in_port=vm3,actions=output:vm2",
    )
    assert dp.del_flows("cookie=0x100/0xff00") == 2
    assert [f.cookie for f in dp.dump_flows()] == [0x200]
    assert dp.del_flows("out_port=vm3") == 0
    assert dp.del_flows("out_port=vm2") == 1


def test_cookies_select_with_a_mask_and_set_without_one():
    """As ovs-ofctl(8): cookie=V/M selects flows (a mask of -1 exactly V);
    cookie=V without a mask sets the cookie in mod-flows (on every flow the
    rest selects: cookie given twice, once with a mask, changes one cookie),
    and selects nothing in del-flows or dump-flows, where it is an error."""
    dp = dp_with("cookie=0x1,priority=100,in_port=vm1,actions=output:vm2",
                 "cookie=0x2,priority=200,in_port=vm1,ip,actions=output:vm3")
    assert dp.mod_flows("cookie=0x1/-1,cookie=0x9,actions=drop") == 1
    assert sorted((f.cookie, f.actions) for f in dp.dump_flows()) == [(0x2, "output:vm3"), (0x9, "drop")]
    assert dp.mod_flows("cookie=0x7,actions=output:vm2") == 2
    assert {(f.cookie, f.actions) for f in dp.dump_flows()} == {(0x7, "output:vm2")}
    for call in (lambda: dp.del_flows("cookie=0x7"), lambda: dp.dump_flows("cookie=0x7")):
        with pytest.raises(FlowParseError, match="without a mask sets a cookie"):
            call()
    assert dp.del_flows("cookie=0x7/-1") == 2


def test_add_replaces_same_match_and_priority_keeping_counters():
    dp = dp_with("priority=5,in_port=vm1,actions=output:vm2")
    dp.process(b"\x02" * 60, in_port="vm1")
    dp.add_flow("priority=5,in_port=vm1,actions=output:vm3")
    (f,) = dp.dump_flows()
    assert f.actions == "output:vm3" and f.n_packets == 1
    assert [o.port for o in dp.process(b"\x02" * 60, in_port="vm1")] == ["vm3"]


def test_mod_flows():
    dp = dp_with("priority=5,in_port=vm1,actions=output:vm2", "priority=6,in_port=vm1,ip,actions=output:vm2")
    assert dp.mod_flows("in_port=vm1,actions=output:vm3") == 2
    assert {f.actions for f in dp.dump_flows()} == {"output:vm3"}
    assert dp.mod_flows("priority=6,in_port=vm1,ip,actions=drop", strict=True) == 1


def test_dump_flows_selector_and_order():
    dp = dp_with("table=1,priority=1,actions=drop", "table=0,priority=1,actions=drop", "table=0,priority=9,ip,actions=drop")
    assert [(f.table, f.priority) for f in dp.dump_flows()] == [(0, 9), (0, 1), (1, 1)]
    assert [(f.table, f.priority) for f in dp.dump_flows("table=0,ip")] == [(0, 9)]


def test_groups_validation():
    dp = Dataplane(ports=PORTS)
    with pytest.raises(UnknownGroupError):
        dp.add_flow("actions=group:1")
    dp.add_group("group_id=1,type=select,bucket=weight:3,actions=output:vm2,bucket=weight:1,actions=output:vm3")
    with pytest.raises(ConflictError):
        dp.add_group("group_id=1,type=all,bucket=actions=output:vm2")
    with pytest.raises(UnknownPortError):
        dp.add_group("group_id=2,type=all,bucket=actions=output:nope")
    with pytest.raises(BadValueError):
        dp.add_group("group_id=3,type=fast_failover,bucket=actions=output:vm2")
    with pytest.raises(BadValueError):
        dp.add_group("group_id=3,type=select,bucket=weight:0,actions=output:vm2")
    dp.add_flow("in_port=vm1,actions=group:1")
    (g,) = dp.dump_groups()
    assert g.text == ("group_id=1,type=select,bucket=bucket_id:0,weight:3,actions=output:vm2,"
                      "bucket=bucket_id:1,weight:1,actions=output:vm3")
    # Deleting a group deletes the flows that use it (OpenFlow).
    assert dp.del_groups("group_id=1") == 1
    assert dp.dump_flows() == [] and dp.dump_groups() == []


def test_transaction_is_atomic():
    dp = dp_with("priority=1,in_port=vm1,actions=output:vm2")
    with pytest.raises(UnknownPortError):
        with dp.transaction() as t:
            t.del_flows()
            t.add_flow("in_port=vm1,actions=output:vm3")
            t.add_flow("in_port=vm1,actions=output:nope")
    assert [f.actions for f in dp.dump_flows()] == ["output:vm2"]


def test_unknown_port_in_process_and_duplicate_port():
    dp = Dataplane(ports=PORTS)
    with pytest.raises(UnknownPortError):
        dp.process(b"\x00" * 60, in_port="nope")
    with pytest.raises(ConflictError):
        dp.add_port("vm1")


def test_group_loops_are_refused():
    dp = Dataplane(ports=PORTS)
    with pytest.raises(ConflictError, match=r"1 -> 1"):
        dp.add_group("group_id=1,type=all,bucket=actions=group:1")
    dp.add_group("group_id=2,type=all,bucket=actions=output:vm2")
    dp.add_group("group_id=3,type=indirect,bucket=actions=group:2")
    with pytest.raises(ConflictError, match=r"2 -> 3 -> 2"):
        dp.mod_group("group_id=2,type=all,bucket=actions=group:3")
    assert [g.group_id for g in dp.dump_groups()] == [2, 3]


def test_deeply_nested_ct_exec_is_a_parse_error_not_a_crash():
    """ct inside ct(exec(...)) is refused before its own list is parsed: 5,000
    levels once overflowed the parser's stack (SIGSEGV)."""
    dp = Dataplane(ports=PORTS)
    with pytest.raises(FlowParseError, match="ct exec\\(\\) takes only set_field or load"):
        dp.add_flow("ip,actions=" + "ct(commit,exec(" * 5000 + ")" * 10000)
    with pytest.raises(FlowParseError, match="ct exec\\(\\) takes only set_field or load"):
        dp.add_flow("ip,actions=ct(commit,exec(ct(commit)))")
    assert not dp.dump_flows()


@pytest.mark.parametrize("port,message", [
    ("NORMAL", "OVS's reserved port NORMAL is not supported by dpu"),
    ("controller", "OVS's reserved port controller is not supported by dpu"),
    ("LOCAL", "OVS's reserved port LOCAL is not supported by dpu"),
    ("ALL", "the reserved port ALL is not an output port here: use the action all"),
    ("Flood", "the reserved port Flood is not an output port here: use the action flood"),
])
def test_output_to_a_reserved_port_is_refused_in_any_case(port, message):
    """OVS's reserved ports are keywords in any case: output:NORMAL is never a
    port named NORMAL (not even with create_ports), and no port takes such a name."""
    dp = Dataplane(ports=PORTS)
    with pytest.raises(FlowParseError, match=message):
        dp.add_flows([f"in_port=vm1,actions=output:{port}"], create_ports=True)
    assert not dp.dump_flows() and port not in dp.ports
    with pytest.raises(DpuError, match="reserved"):
        dp.add_port(port)
    dp.add_flow("in_port=vm1,actions=output:IN_PORT")
    assert [f.spec for f in dp.dump_flows()] == ["table=0,in_port=vm1,actions=in_port"]


def test_values_past_their_width_and_repeated_flags_are_refused():
    """A 128-bit value whose digits overflow is refused (it was kept modulo
    2**128: 33 f's became 128 one-bits); a flag named twice in ct_state or
    tcp_flags is refused, as OVS refuses it (+trk-trk)."""
    dp = Dataplane(ports=PORTS)
    for flow in ["ct_state=+trk,ct_label=0x" + "f" * 33 + ",actions=drop",
                 "ct_state=+trk,ct_label=0x2" + "f" * 32 + ",actions=drop",
                 "ct_state=+trk,ct_label=340282366920938463463374607431768211456,actions=drop"]:
        with pytest.raises(BadValueError, match="at most 128 bits"):
            dp.add_flow(flow)
    for flow in ["ct_state=+trk-trk,actions=drop", "tcp,tcp_flags=+syn+syn,actions=drop"]:
        with pytest.raises(BadValueError, match="given more than once"):
            dp.add_flow(flow)
    assert not dp.dump_flows()
    # a digit larger than a narrow field holds (its overflow check must not wrap)
    for flow, words in (("ip,nw_ecn=5,actions=drop", "at most 2 bits"),
                        ("ip,actions=load:8->NXM_NX_REG0[0..2]", "does not fit in 3 bits"),
                        ("ip,actions=load:0x1f->NXM_NX_REG0[0]", "does not fit in 1 bits")):
        with pytest.raises(BadValueError, match=words):
            dp.add_flow(flow)
    assert not dp.dump_flows()
    dp.add_flow("ct_state=+trk,ct_label=0x" + "f" * 32 + ",actions=drop")
    assert dp.dump_flows()[0].spec.endswith("ct_label=0x" + "f" * 32 + ",actions=drop")


def test_api_arguments_of_the_wrong_kind_are_refused():
    from dpu.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="not one string"):
        Dataplane(ports="vmx")  # not three ports v, m and x
    dp = Dataplane(ports=PORTS)
    with pytest.raises(InvalidArgumentError, match="not int"):
        dp.process(123, in_port="vm1")  # not 123 zero bytes
    for bad in (-1, float("nan"), True):
        with pytest.raises(InvalidArgumentError, match="warp takes seconds"):
            dp.warp(bad)
    import numpy as np

    assert dp.process(np.frombuffer(bytes(64), dtype=np.uint8), in_port="vm1") == []  # a buffer is a packet
    dp.warp(np.int64(1))  # numpy numbers are numbers
    assert dp.ct_config(max_connections=np.int64(1000))["max_connections"] == 1000
    with pytest.raises(InvalidArgumentError, match="named by a string"):
        dp.ct_config(timeouts={1: 30})
