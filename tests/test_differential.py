"""Differential tests: random rule sets and random packets through the native
pipeline (dpu.Dataplane) and the independent reference model (tests/helpers/model.py).

Every example runs on a fresh Dataplane and a fresh Model and requires:
  * byte-identical outputs, on the same ports, in the same order;
  * the same drop counters (per port, by reason) for the packets that produced nothing;
  * the same per-rule n_packets/n_bytes, per-table lookups/matches, per-port rx/tx/dropped.

The generator draws values from small pools so that rules really match. Flow text
is the interface: the generator writes ovs-ofctl text, the core and the model each
parse it.
"""
from __future__ import annotations

import logging
import os
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.all import ARP, IP, SCTP, TCP, UDP, Dot1AD, Dot1Q, Ether, IPv6, Raw  # noqa: E402

from helpers.differential import (  # noqa: E402
    IP4, IP6, MACS, SETTINGS, TABLES, VLAN_ACTIONS, _describe, build, compare_counters, inputs_for, rule_sets,
    run_and_compare,
)

# --------------------------------------------------------------------------------------
# Tests


EXAMPLES = int(os.environ.get("DPU_DIFF_EXAMPLES", "400"))


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(rules=rule_sets(), data=st.data())
def test_random_rules_and_packets(rules, data):
    pkts = data.draw(inputs_for(rules), label="pkts")
    groups, flows = rules
    dp, model = build(groups, flows)
    run_and_compare(dp, model, pkts, _describe(groups, flows, pkts))


@settings(max_examples=max(1, EXAMPLES // 4), **SETTINGS)
@given(rules=rule_sets(), data=st.data())
def test_second_pass_hits_caches_and_agrees(rules, data):
    pkts = data.draw(inputs_for(rules), label="pkts")
    groups, flows = rules
    dp, model = build(groups, flows)
    ctx = _describe(groups, flows, pkts)
    first = run_and_compare(dp, model, pkts, ctx + "\n(first pass)")
    second = run_and_compare(dp, model, pkts, ctx + "\n(second pass, caches warm)")
    assert [(o.index, o.port, o.data) for o in first] == [(o.index, o.port, o.data) for o in second]


def _replacements(data, flows, cookie: str, fourth: str) -> List[str]:
    """One to three of `flows` again with new actions (one of five, `fourth`
    among them) and cookies: the same match and priority."""
    return [v.split(",actions=")[0].replace("cookie=0x", f"cookie={cookie}") + ",actions="
            + data.draw(st.sampled_from(["output:p2", "mod_dl_dst:02:00:00:00:00:09,output:p3", "drop", fourth,
                                         "in_port"]))
            for v in data.draw(st.lists(st.sampled_from(flows), min_size=1, max_size=3, unique=True))]


@settings(max_examples=max(1, EXAMPLES // 4), **SETTINGS)
@given(rules=rule_sets(), more=rule_sets(max_rules=4),
       change=st.sampled_from(["del_table", "del_all", "add", "del_strict", "replace", "del_match"]),
       data=st.data())
def test_rule_changes_take_effect_immediately(rules, more, change, data):
    if any(a in f for f in more[1] for a in VLAN_ACTIONS):
        more = (more[0], [f for f in more[1] if not any(a in f for a in VLAN_ACTIONS)])
    pkts = data.draw(inputs_for(rules), label="pkts")
    groups, flows = rules
    dp, model = build(groups, flows)
    ctx = _describe(groups, flows, pkts)
    run_and_compare(dp, model, pkts, ctx + "\n(before the change)")
    if change == "del_table":
        t = data.draw(st.sampled_from(TABLES))
        what = f"del_flows('table={t}')"
        assert dp.del_flows(f"table={t}") == model.del_flows(f"table={t}")
    elif change == "del_match":
        spec = data.draw(st.sampled_from(["ip", "tcp", "udp6", "arp", "in_port=p1", "dl_type=0x0806",
                                          "table=1,udp", "table=0,in_port=p2", "ipv6", "icmp"]))
        what = f"del_flows({spec!r})"
        assert dp.del_flows(spec) == model.del_flows(spec)
    elif change == "del_all":
        what = "del_flows('')"
        assert dp.del_flows("") == model.del_flows("")
    elif change == "del_strict":
        victim = data.draw(st.sampled_from(flows))
        spec = ",".join(i for i in victim.split(",actions=")[0].split(",") if not i.startswith("cookie="))
        what = f"del_flows({spec!r}, strict=True)"
        assert dp.del_flows(spec, strict=True) == model.del_flows(spec, strict=True)
    else:
        # new flows that only use groups that exist; new cookies
        extra = [f.replace("cookie=0x", "cookie=0x10") for f in more[1] if "group:" not in f]
        if change == "replace":
            # the same match and priority as existing flows, new actions and cookies
            extra = _replacements(data, flows, "0x20", "drop(policy)")
        what = f"add_flows({extra})"
        dp.add_flows(extra)
        model.add_flows(extra)
    run_and_compare(dp, model, pkts, ctx + f"\n(after {what})")


@settings(max_examples=max(1, EXAMPLES // 6), **SETTINGS)
@given(rules=rule_sets(), rounds=st.lists(st.tuples(rule_sets(max_rules=3), st.integers(0, 3)), min_size=2,
                                          max_size=5), data=st.data())
def test_many_changes_on_warm_caches(rules, rounds, data):
    """Changes without a flush (docs/design.md, "Changes without stopping the
    world"): one dataplane keeps its caches across several rounds of changes,
    each round's packets compared with the model, which has no caches. A
    megaflow kept after a change that could affect it shows as a difference."""
    pkts = data.draw(inputs_for(rules), label="pkts")
    groups, flows = rules
    dp, model = build(groups, flows)
    ctx = _describe(groups, flows, pkts)
    run_and_compare(dp, model, pkts, ctx + "\n(before the changes)")
    live = list(flows)
    for n, ((_, more), kind) in enumerate(rounds):
        extra = [f.replace("cookie=0x", f"cookie=0x{n + 3}0") for f in more
                 if "group:" not in f and not any(a in f for a in VLAN_ACTIONS)]
        if kind == 0 or not live:  # new rules
            what = f"add_flows({extra})"
            dp.add_flows(extra)
            model.add_flows(extra)
            live += extra
        elif kind == 1:  # one rule deleted (strict)
            victim = data.draw(st.sampled_from(live))
            spec = ",".join(i for i in victim.split(",actions=")[0].split(",") if not i.startswith("cookie="))
            what = f"del_flows({spec!r}, strict=True)"
            assert dp.del_flows(spec, strict=True) == model.del_flows(spec, strict=True)
        elif kind == 2:  # rules replaced: same match and priority, new actions
            extra = _replacements(data, live, f"0x{n + 5}0", "resubmit(,2)")
            what = f"add_flows({extra})"
            dp.add_flows(extra)
            model.add_flows(extra)
        else:  # deleted and added again in one transaction
            what = "del_flows('') + add_flows(the same) in one transaction"
            with dp.transaction() as t:
                t.del_flows("")
                t.add_flows(live)
            model.del_flows("")
            model.add_flows(live)
        run_and_compare(dp, model, pkts, ctx + f"\n(after round {n}: {what})")


# ---- deterministic corner cases ---------------------------------------------------------


def _udp(ttl=64) -> bytes:
    return bytes(Ether(src=MACS[0], dst=MACS[1]) / IP(src=IP4[0], dst=IP4[1], ttl=ttl) / UDP(sport=53, dport=80)
                 / Raw(b"q" * 8))


@pytest.mark.parametrize("levels", [63, 64, 65])
def test_resubmit_depth_limit(levels):
    """README 2: at most 64 nested resubmits (to the same or an earlier table); beyond,
    resubmit_limit and no output."""
    flows = [f"table=0,reg0={n},actions=output:p2,load:{n + 1}->NXM_NX_REG0[],resubmit(,0)" for n in range(levels)]
    flows.append(f"table=0,reg0={levels},actions=output:p3")
    groups: List[str] = []
    dp, model = build(groups, flows)
    pkts = [("p1", _udp())]
    run_and_compare(dp, model, pkts, _describe(groups, flows, pkts))


@pytest.mark.parametrize("self_loop", [True, False])
def test_resubmit_loop(self_loop):
    """A resubmit loop is cut by the depth limit; what was output before is discarded."""
    flows = ["table=0,actions=output:p2,resubmit(,1)",
             "table=1,actions=output:p3,resubmit(,1)" if self_loop else "table=1,actions=resubmit(,0)"]
    dp, model = build([], flows)
    pkts = [("p1", _udp())]
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_resubmit_total_limit():
    """README 2: 4096 resubmits in total."""
    # 1 + 16 + 16*16 + 16*16*16 = 4369 resubmits, depth 3
    flows = ["table=0,actions=" + ",".join(["resubmit(,1)"] * 16),
             "table=1,actions=" + ",".join(["resubmit(,2)"] * 16),
             "table=2,actions=" + ",".join(["resubmit(,3)"] * 16),
             "table=3,actions=output:p2"]
    dp, model = build([], flows)
    pkts = [("p1", _udp())]
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))
    # 16 * 16 * 15 + ... stays under the limit
    flows2 = ["table=0,actions=" + ",".join(["resubmit(,1)"] * 15),
              "table=1,actions=" + ",".join(["resubmit(,2)"] * 16),
              "table=2,actions=" + ",".join(["resubmit(,3)"] * 16),
              "table=3,actions=note:00"]
    dp, model = build([], flows2)
    run_and_compare(dp, model, pkts, _describe([], flows2, pkts))


def test_goto_table_adds_no_depth_but_counts():
    """README 2 (as OVS): goto_table and resubmits to later tables add no depth; the rules
    goto_table reaches count toward the 4096 total."""
    deep = [f"table={t},actions=resubmit(,{t + 1})" for t in range(64)]
    deep += ["table=64,actions=goto_table:65", "table=65,actions=output:p3"]
    wide = ["table=0,actions=" + ",".join(["resubmit(,1)"] * 15),
            "table=1,actions=" + ",".join(["resubmit(,2)"] * 16),
            "table=2,actions=" + ",".join(["resubmit(,3)"] * 15),  # 3855 resubmits, 3600 gotos
            "table=3,actions=goto_table:4", "table=4,priority=9,actions=output:p2"]
    pkts = [("p1", _udp())]
    for flows in (deep, wide):
        dp, model = build([], flows)
        run_and_compare(dp, model, pkts, _describe([], flows, pkts))


@pytest.mark.parametrize("ttl", [0, 1, 2])
def test_dec_ttl_boundary(ttl):
    flows = ["table=0,ip,actions=output:p3,dec_ttl,output:p2"]
    dp, model = build([], flows)
    pkts = [("p1", _udp(ttl))]
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_select_group_spreads_by_hash():
    groups = ["group_id=1,type=select,bucket=weight:2,actions=output:p2,bucket=weight:1,actions=output:p3,"
              "bucket=weight:3,actions=output:p4"]
    flows = ["table=0,actions=group:1"]
    pkts = [("p1", bytes(Ether(src=MACS[0], dst=MACS[1]) / IP(src=f"10.0.{i}.1", dst=IP4[1])
                         / UDP(sport=1000 + i, dport=80))) for i in range(40)]
    dp, model = build(groups, flows)
    run_and_compare(dp, model, pkts, _describe(groups, flows, pkts))


def test_outputs_in_input_order():
    flows = ["in_port=p1,actions=output:p2,output:p3", "in_port=p2,actions=output:p3,output:p1"]
    pkts = [("p1", _udp()), ("p2", _udp()), ("p1", _udp())]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts), strict_order=True)


def test_resubmit_limit_inside_group_bucket():
    groups = ["group_id=1,type=all,bucket=actions=resubmit(,1)"]
    flows = ["table=0,actions=resubmit(,1)", "table=1,actions=group:1,resubmit(,2)", "table=2,actions=drop(policy)"]
    pkts = [("p1", _udp())]
    dp, model = build(groups, flows)
    got = dp.process(list(pkts))
    model.process(list(pkts))
    assert got == []
    compare_counters(dp, model, pkts, _describe(groups, flows, pkts))


def test_drop_reason_inside_group_bucket_ends_the_bucket_only():
    """README 8 vs 6: drop(reason) and dec_ttl inside a bucket end that bucket (its copy),
    as an error inside a bucket does in OVS; the pipeline goes on after the group."""
    groups = ["group_id=1,type=all,bucket=actions=output:p3,resubmit(,1),output:p4,bucket=actions=dec_ttl,output:p4"]
    flows = ["table=0,actions=group:1,output:p2", "table=1,actions=drop(policy)"]
    pkts = [("p1", _udp(ttl=1)), ("p1", _udp(ttl=5))]
    dp, model = build(groups, flows)
    run_and_compare(dp, model, pkts, _describe(groups, flows, pkts))


@pytest.mark.parametrize("padding", [0, 6])
@pytest.mark.parametrize("ipv6", [False, True])
def test_sctp_crc_ignores_ethernet_padding(padding, ipv6):
    l3 = IPv6(src=IP6[0], dst=IP6[1]) if ipv6 else IP(src=IP4[0], dst=IP4[1])
    data = bytes(Ether(src=MACS[0], dst=MACS[1]) / l3 / SCTP(sport=80, dport=53) / Raw(b"y" * 20)) + b"\0" * padding
    flows = ["sctp,actions=mod_tp_src:1024,output:p2", "sctp6,actions=mod_tp_src:1024,output:p2"]
    pkts = [("p1", data)]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_group_loop_does_not_crash(run_python):
    run_python(
        "from dpu import Dataplane\n"
        "dp = Dataplane(ports=['p1', 'p2'])\n"
        "try:\n"
        "    dp.add_group('group_id=1,type=all,bucket=actions=group:1')\n"
        "    dp.add_flow('actions=group:1')\n"
        "except Exception as e:\n"
        "    print('rejected', e); raise SystemExit(0)\n"
        "out = dp.process([bytes(60)], in_port='p1')\n"
        "print('processed', out, dp.stats()['ports']['p1']['drops'])\n"
    )


@pytest.mark.parametrize("action", ["push_vlan:0x8100", "mod_vlan_vid:7"])
def test_rule_bytes_count_the_packet_as_its_lookup_began(action):
    """README "Counters": n_bytes count the packet's size when its lookup began (as OVS
    counts at the datapath), not after push_vlan grew it."""
    flows = [f"table=0,actions={action},resubmit(,1)", "table=1,cookie=0x1,actions=output:p2"]
    pkts = [("p1", _udp())]
    dp, model = build([], flows)
    dp.process(list(pkts))
    model.process(list(pkts))
    got = {f.cookie: f.n_bytes for f in dp.dump_flows()}
    exp = {f["cookie"]: f["n_bytes"] for f in model.flow_stats()}
    assert got == exp


@pytest.mark.parametrize("action", ["mod_vlan_vid:1", "mod_vlan_pcp:2", "push_vlan:0x8100", "pop_vlan"])
def test_vlan_actions_megaflow_ignores_tci(action):
    untagged = _udp()
    tagged = bytes(Ether(src=MACS[0], dst=MACS[1]) / Dot1Q(vlan=5, prio=3) / IP(src=IP4[0], dst=IP4[1])
                   / UDP(sport=53, dport=80) / Raw(b"q" * 8))
    flows = [f"actions={action},output:p2"]
    pkts = [("p1", untagged), ("p1", tagged)]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_udp_checksum_that_comes_to_zero_is_sent_as_ffff():
    """README 9: a rewritten UDP checksum that comes to 0 is sent as 0xffff."""
    from helpers.model import csum_incremental

    base = Ether(src=MACS[0], dst=MACS[1]) / IP(src=IP4[0], dst=IP4[1]) / UDP(sport=53, dport=80) / Raw(b"q" * 8)
    data = bytes(base)
    csum = int.from_bytes(data[40:42], "big")
    port = next(p for p in range(65536)
                if csum_incremental(csum, (53).to_bytes(2, "big"), p.to_bytes(2, "big")) == 0)
    flows = [f"udp,actions=mod_tp_src:{port},output:p2"]
    pkts = [("p1", data)]
    dp, model = build([], flows)
    got = run_and_compare(dp, model, pkts, _describe([], flows, pkts))
    assert got[0].data[40:42] == b"\xff\xff"


def test_select_group_hash_ipv6_and_non_ip():
    groups = ["group_id=1,type=select,bucket=weight:1,actions=output:p2,bucket=weight:1,actions=output:p3,"
              "bucket=weight:2,actions=output:p4"]
    flows = ["table=0,actions=mod_tp_src:7,group:1"]
    pkts = []
    for i in range(16):
        pkts.append(("p1", bytes(Ether(src=MACS[0], dst=MACS[1]) / IPv6(src=f"2001:db8::{i + 1:x}", dst=IP6[1])
                                 / TCP(sport=1000 + i, dport=80))))
        pkts.append(("p1", bytes(Ether(src=f"02:00:00:00:01:{i:02x}", dst=MACS[1]) / ARP(op=1, psrc=IP4[0]))))
        pkts.append(("p1", bytes(Ether(src=MACS[0], dst=MACS[1]) / IP(src=f"10.0.{i}.1", dst=IP4[1], frag=3, proto=6)
                                 / Raw(b"r" * 16))))
    dp, model = build(groups, flows)
    run_and_compare(dp, model, pkts, _describe(groups, flows, pkts))


def test_flood_and_all_skip_the_current_in_port():
    flows = ["table=0,in_port=p1,actions=flood,resubmit(p3,1),all", "table=1,actions=flood,in_port,output:p3,output:p1"]
    pkts = [("p1", _udp()), ("p2", _udp())]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_replacing_a_flow_keeps_its_counters_and_place():
    flows = ["table=0,priority=5,cookie=0x1,ip,actions=output:p2", "table=0,priority=5,cookie=0x2,udp,actions=output:p3"]
    pkts = [("p1", _udp())]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))
    again = ["table=0,priority=5,cookie=0x3,ip,actions=output:p4"]
    dp.add_flows(again)
    model.add_flows(again)
    run_and_compare(dp, model, pkts, _describe([], flows + again, pkts))


@pytest.mark.parametrize("first_byte", [0x05, 0x65, 0x45])
def test_ip_version_is_not_checked(first_byte):
    """README "Parsing" (as OVS): an IPv4 header's version nibble is not checked; an IHL
    below 5 leaves dl_type 0x0800 with no IPv4 fields (counted rx_malformed)."""
    data = bytearray(_udp())
    data[14] = first_byte
    flows = ["udp,actions=output:p2", "priority=0,actions=output:p3"]
    pkts = [("p1", bytes(data))]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


@pytest.mark.parametrize("received,actions", [
    (0x88A8, "pop_vlan,push_vlan:0x8100"), (0x8100, "pop_vlan,push_vlan:0x88a8"),
    (0x88A8, "pop_vlan,mod_vlan_vid:7")])
def test_push_after_popping_the_received_tag_uses_the_new_tpid(received, actions):
    tag = (Dot1Q if received == 0x8100 else Dot1AD)(vlan=100)
    data = bytes(Ether(src=MACS[0], dst=MACS[1]) / tag / IP(src=IP4[0], dst=IP4[1]) / UDP(sport=53, dport=80))
    flows = [f"actions={actions},output:p2"]
    pkts = [("p1", data)]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))


def test_pop_after_push_on_tagged_packet_shows_the_remaining_tag():
    data = bytes(Ether(src=MACS[0], dst=MACS[1]) / Dot1Q(vlan=6, prio=2) / IP(src=IP4[0], dst=IP4[1])
                 / UDP(sport=53, dport=80))
    flows = ["table=0,actions=push_vlan:0x88a8,pop_vlan,resubmit(,1)", "table=1,dl_vlan=6,actions=output:p2",
             "table=1,priority=0,actions=output:p3"]
    pkts = [("p1", data)]
    dp, model = build([], flows)
    run_and_compare(dp, model, pkts, _describe([], flows, pkts))
