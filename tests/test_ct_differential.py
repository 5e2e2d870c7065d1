"""Differential tests of conntrack and NAT: rule sets with ct(...) and stateful
packet sequences through the native pipeline and the reference model
(tests/helpers/model.py with tests/helpers/ct_model.py); the generators and comparisons
of the stateless pipeline are shared with test_differential.py (tests/helpers/differential.py).
"""
from __future__ import annotations

import logging
import os
import time
from typing import List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.all import (  # noqa: E402
    ARP, ICMP, IP, SCTP, TCP, UDP, Dot1Q, Ether, ICMPv6DestUnreach, ICMPv6EchoReply, ICMPv6EchoRequest, IPv6, Raw,
)

from dpu import Dataplane  # noqa: E402
from helpers.model import Model  # noqa: E402
from helpers.differential import (  # noqa: E402
    PORTS, SETTINGS, TABLES, _chance, _h, build, compare_counters, compare_outputs, note,
)

# ======================================================================================
# Conntrack and NAT (docs/conntrack.md): rule sets with ct(...) and stateful packet
# sequences, through the core and the model (tests/helpers/ct_model.py), one packet per
# process() call with its timestamp (the conntrack clock). After every packet: the same
# outputs; after the sequence: the same rule/table/port counters and the same
# connection table (dp.conntrack() lines against the model's rendering of its own).
#
# What docs/conntrack.md leaves to the implementation (the port a SNAT takes when the
# internal one is not free, the address of a multi-address range, when an expired
# mapping's port is released) makes the model raise Unpredictable: the sequence is
# compared up to that packet and ends there. The generator keeps such cases rare
# (internal ports are unique per client, ranges mostly single-address).
#
# DPU_DIFF_CT_EXAMPLES=N runs N random sequences (default 300); DPU_DIFF_RANDOM=1 and
# DPU_DIFF_NOSHRINK=1 work as above.

import copy  # noqa: E402
import dataclasses  # noqa: E402

from scapy.all import ICMPv6PacketTooBig, ICMPv6TimeExceeded  # noqa: E402

from helpers.checksums import assert_checksums  # noqa: E402
from helpers.ct_model import Unpredictable  # noqa: E402

CT_DROPS = ("ct_quota", "ct_table_full", "nat_no_port", "nat_collision")
CT_EXAMPLES = int(os.environ.get("DPU_DIFF_CT_EXAMPLES", "300"))

INSIDE = ["10.0.1.1", "10.0.1.2"]
OUTSIDE = ["198.51.100.1", "198.51.100.2"]
SNAT_IP = "203.0.113.10"
SNAT_IP2 = "203.0.113.20"  # used with a single public port
VIP = "203.0.113.80"
BACKEND = "10.0.2.5"
BACKEND_PORT = 8080
ROUTER_OUT = "198.51.100.254"
ROUTER_IN = "10.0.1.254"
INSIDE6 = ["2001:db8:1::1", "2001:db8:1::2"]
OUTSIDE6 = ["2001:db8:2::1"]
SERVER_PORTS = [53, 80, 443]
MAC_IN, MAC_OUT = "02:00:00:00:01:01", "02:00:00:00:02:02"
# docs: the conntrack clock runs with the monotonic clock and jumps ahead to packet
# timestamps, so the core's clock is a little (the test's own run time) ahead of the
# timestamps: timeouts end in .5 and the steps between packets are whole seconds (or a
# few ms), so that no packet comes within ~0.45 s of a connection's expiry.
CT_TIMEOUTS = {"udp": 30.5, "icmp": 20.5, "tcp_transitory": 40.5, "tcp_established": 90.5}
CLOCK_SLACK = 0.25  # seconds: how far the core's expires_in may be from the model's (its clock is stopped)
# seconds between two packets: mostly none or small; sometimes across a timeout
CT_STEPS = [0] * 8 + [0.001] * 2 + [1] * 6 + [3] * 3 + [20, 21, 30, 31, 40, 41, 61, 90, 91, 200]
T0 = 1_000 * 10**9
MARKS = [1, 5, 0xFF, 0x80000000]
LABELS = [1, 0x10, 1 << 64, (1 << 127) | 3]
CT_STATE_MATCHES = ["+trk+new", "+trk+est", "+trk+rel", "+trk+inv", "+trk+est+rpl", "+trk+est-rpl", "+trk+new-rpl",
                    "+trk-new-inv", "+trk+snat", "+trk+dnat", "+trk", "-trk", "+trk-inv", "+trk+rel+rpl",
                    "0x22/0x22", "+trk+new+snat", "+trk+est+dnat"]
CT_NATS = ["nat", "nat", f"nat(src={SNAT_IP})", f"nat(src={SNAT_IP})", f"nat(dst={BACKEND}:{BACKEND_PORT})",
           f"nat(dst={BACKEND})", f"nat(src={SNAT_IP},persistent)", f"nat(src={SNAT_IP}-{SNAT_IP}:1024-65535)",
           f"nat(src={SNAT_IP2}:2000)", f"nat(dst={BACKEND}:{BACKEND_PORT}-{BACKEND_PORT})"]


def _ct_exec(draw) -> str:
    out = []
    for _ in range(draw(st.integers(1, 2))):
        k = draw(st.integers(0, 3))
        if k == 0:
            out.append(f"set_field:{_h(draw(st.sampled_from(MARKS)))}->ct_mark")
        elif k == 1:
            m = draw(st.sampled_from([None, 0xFF, 0xF0]))
            v = draw(st.sampled_from(MARKS))
            out.append(f"set_field:{_h(v)}->ct_mark" if m is None else f"set_field:{_h(v & m)}/{_h(m)}->ct_mark")
        elif k == 2:
            v = draw(st.sampled_from(LABELS))
            m = draw(st.sampled_from([None, (1 << 128) - 1, 0xFF, 1 << 64 | 0xF0]))
            out.append(f"set_field:{_h(v)}->ct_label" if m is None else f"set_field:{_h(v & m)}/{_h(m)}->ct_label")
        else:
            a = draw(st.integers(0, 28))
            b = draw(st.integers(a, min(31, a + 7)))
            out.append(f"load:{_h(draw(st.integers(0, (1 << (b - a + 1)) - 1)))}->NXM_NX_CT_MARK[{a}..{b}]")
    return "exec(" + ",".join(out) + ")"


@st.composite
def ct_action_text(draw, table: int, commit=None, allow_table=True) -> str:
    parts = []
    if commit is None:
        commit = draw(st.booleans())
    if commit:
        parts.append("commit")
        if _chance(draw, 0.08):
            parts.append("force")
    z = draw(st.integers(0, 9))
    if z >= 8:
        parts.append("zone=NXM_NX_REG0[0..15]")
    elif z >= 6:
        parts.append("zone=5")
    later = [x for x in TABLES if x > table]
    if allow_table and later and _chance(draw, 0.5):
        parts.append(f"table={draw(st.sampled_from(later))}")
    if _chance(draw, 0.55):
        parts.append(draw(st.sampled_from(CT_NATS)))
    if commit and _chance(draw, 0.3):
        parts.append(_ct_exec(draw))
    return "ct(" + ",".join(parts) + ")"


def _ct_match_items(draw) -> List[str]:
    items: List[str] = []
    cls = draw(st.sampled_from(["", "", "ip", "tcp", "udp", "icmp", "ipv6", "tcp6", "icmp6"]))
    if cls:
        items.append(cls)
    if _chance(draw, 0.4):
        items.append("in_port=" + draw(st.sampled_from(["p1", "p2"])))
    state = draw(st.sampled_from(CT_STATE_MATCHES)) if _chance(draw, 0.8) else None
    if state:
        items.append("ct_state=" + state)
    if state in ("+trk+new", "+trk+est", "+trk-inv", "+trk+est+rpl", "+trk+est-rpl") and _chance(draw, 0.35):
        k = draw(st.integers(0, 4))
        if k == 0 and cls not in ("ipv6", "tcp6", "icmp6"):
            items.append(f"ct_nw_src={draw(st.sampled_from(INSIDE + OUTSIDE))}")
        elif k == 1 and cls not in ("ipv6", "tcp6", "icmp6"):
            items.append(f"ct_nw_dst={draw(st.sampled_from(OUTSIDE + [VIP]))}")
        elif k == 2:
            items.append(f"ct_nw_proto={draw(st.sampled_from([1, 6, 17, 58]))}")
        elif k == 3:
            items.append(f"ct_tp_dst={draw(st.sampled_from(SERVER_PORTS + [0]))}")
        else:
            items.append(f"ct_tp_src={draw(st.sampled_from([8, 13, 128, 0]))}")
    if _chance(draw, 0.12):
        items.append(f"ct_zone={draw(st.sampled_from([0, 5, 7]))}")
    if _chance(draw, 0.15):
        v = draw(st.sampled_from([0] + MARKS))
        items.append(f"ct_mark={_h(v)}" if _chance(draw, 0.5) else f"ct_mark={_h(v & 0xFF)}/0xff")
    if _chance(draw, 0.08):
        items.append(f"ct_label={_h(draw(st.sampled_from([0] + LABELS)) & 0xFF)}/0xff")
    if _chance(draw, 0.1):
        items.append(f"reg0={draw(st.sampled_from([0, 7]))}")
    return items


@st.composite
def ct_actions(draw, table: int) -> str:
    if _chance(draw, 0.06):
        return draw(st.sampled_from(["drop", "drop(policy)"]))
    acts: List[str] = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(0, 11))
        if k <= 3:
            acts.append(draw(ct_action_text(table)))
        elif k <= 6:
            acts.append(draw(st.sampled_from(["output:p1", "output:p2", "output:p3", "output:p4", "in_port"])))
        elif k == 7:
            acts.append("ct_clear")
        elif k == 8:
            acts.append(draw(st.sampled_from(["load:0x7->NXM_NX_REG0[]", "load:0x5->NXM_NX_REG1[0..7]",
                                              "set_field:0x2->metadata", "mod_dl_src:02:00:00:00:00:09"])))
        elif k == 9 and table < TABLES[-1]:
            acts.append(f"resubmit(,{draw(st.integers(table + 1, TABLES[-1]))})")
        else:
            acts.append("output:" + draw(st.sampled_from(["p1", "p2"])))
    if table < TABLES[-1] and _chance(draw, 0.15):
        acts.append(f"goto_table:{draw(st.integers(table + 1, TABLES[-1]))}")
    return ",".join(acts)


@st.composite
def ct_rule_sets(draw) -> List[str]:
    """A conntrack pipeline skeleton with random parameters (so that connections really
    form, in both directions, through NAT), then random rules with ct matches and actions."""
    flows: List[str] = []
    cookie = iter(range(1, 1000))

    def add(text: str) -> None:
        flows.append(f"cookie={_h(next(cookie))}," + text)

    if _chance(draw, 0.85):
        zone = draw(st.sampled_from(["", "", ",zone=5", ",zone=NXM_NX_REG0[0..15]"]))
        pre = "load:0x7->NXM_NX_REG0[]," if "REG0" in zone else ""
        first = draw(st.sampled_from(["ct(table=1{z},nat)", "ct(table=1{z},nat)", "ct(table=1{z})",
                                      "ct(table=1{z},nat),output:p3"])).format(z=zone)
        add(f"table=0,priority=10,ct_state=-trk,ip,actions={pre}{first}")
        if _chance(draw, 0.6):
            add(f"table=0,priority=10,ct_state=-trk,ipv6,actions={pre}ct(table=1{zone})")
        nat = draw(st.sampled_from(["", f",nat(src={SNAT_IP})", f",nat(src={SNAT_IP})", f",nat(dst={BACKEND})",
                                    f",nat(dst={BACKEND}:{BACKEND_PORT})", ",nat"]))
        ex = "," + _ct_exec(draw) if _chance(draw, 0.3) else ""
        how = draw(st.integers(0, 2))
        if how == 0:
            add(f"table=1,priority=10,in_port=p1,ct_state=+trk+new,actions=ct(commit{zone}{nat}{ex}),output:p2")
        elif how == 1:
            add(f"table=1,priority=10,in_port=p1,ct_state=+trk+new,actions=ct(commit{zone}{nat}{ex},table=2)")
            add("table=2,priority=10,in_port=p1,ct_state=+trk+new,actions=output:p2")
            add("table=2,priority=5,actions=output:p4")
        else:
            add(f"table=1,priority=10,in_port=p1,ct_state=+trk+new,actions=ct(commit{zone}{nat}{ex}),"
                f"ct(table=2{zone}),output:p2")
            add("table=2,priority=10,ct_state=+trk+est,actions=output:p3")
        if _chance(draw, 0.4):
            # the outside may open connections too (then the inside's replies are +rpl)
            add(f"table=1,priority=9,in_port=p2,ct_state=+trk+new,actions=ct(commit{zone}),output:p1")
        add("table=1,priority=10,in_port=p1,ct_state=+trk+est,actions=output:p2")
        add("table=1,priority=10,in_port=p2,ct_state=+trk+est,actions=output:p1")
        add("table=1,priority=10,ct_state=+trk+rel,actions=" + draw(st.sampled_from(["in_port", "output:p3",
                                                                                       "output:p1,output:p2"])))
        add("table=1,priority=10,ct_state=+trk+inv,actions=" + draw(st.sampled_from(["drop(policy)", "output:p4"])))
        if _chance(draw, 0.3):
            add(f"table=1,priority=20,ct_state=+trk+est,ct_mark={_h(draw(st.sampled_from(MARKS)))},"
                "actions=output:p4")
        add("table=1,priority=0,actions=" + draw(st.sampled_from(["drop", "output:p3", "drop(policy)"])))
    for _ in range(draw(st.integers(0, 3)) if flows else draw(st.integers(2, 6))):
        table = draw(st.sampled_from(TABLES))
        # mostly below the skeleton's rules (priority 10), so that connections still form
        prio = draw(st.sampled_from([5, 5, 5, 15, 30])) if flows else draw(st.sampled_from([5, 15, 30, 100]))
        items = [f"table={table}", f"priority={prio}"]
        items += _ct_match_items(draw)
        add(",".join(items) + ",actions=" + draw(ct_actions(table)))
    if _chance(draw, 0.5):
        add("table=0,priority=0,actions=" + draw(ct_actions(0)))
    return flows


# ---- stateful packet sequences ------------------------------------------------------


@dataclasses.dataclass
class CtFlow:
    proto: str  # tcp udp icmp tcp6 udp6 icmp6
    client: str
    cport: int  # ICMP: the identifier
    server: str  # where the client sends (an outside host, or the VIP)
    sport: int  # ICMP: the request type (8 echo, 13 timestamp; 128 for ICMPv6)
    isn: List[int] = dataclasses.field(default_factory=lambda: [0, 0])
    nxt: List[int] = dataclasses.field(default_factory=lambda: [0, 0])
    sent: List[bool] = dataclasses.field(default_factory=lambda: [False, False])
    wscale: List[int] = dataclasses.field(default_factory=lambda: [-1, -1])
    reply_view: Optional[tuple] = None  # (src, sport, dst) the flow's replies mostly use
    phase: int = 0  # TCP: where the flow is in TCP_SCRIPT


def _l3(flow: CtFlow, src: str, dst: str):
    return IPv6(src=src, dst=dst) if flow.proto.endswith("6") else IP(src=src, dst=dst)


@st.composite
def ct_flows(draw) -> List[CtFlow]:
    flows: List[CtFlow] = []
    next_port = iter(range(40000, 41000, 7))
    for _ in range(draw(st.integers(1, 3))):
        proto = draw(st.sampled_from(["tcp", "tcp", "tcp", "udp", "udp", "icmp", "tcp6", "udp6", "icmp6"]))
        v6 = proto.endswith("6")
        same = [f for f in flows if f.proto.endswith("6") == v6 and f.proto.rstrip("6") == proto.rstrip("6")]
        if same and _chance(draw, 0.25):
            # the same internal endpoint towards another server (endpoint-independent mapping)
            base = draw(st.sampled_from(same))
            client, cport = base.client, base.cport
        else:
            client = draw(st.sampled_from(INSIDE6 if v6 else INSIDE))
            cport = next(next_port)
        if v6:
            server = OUTSIDE6[0]
        else:
            server = draw(st.sampled_from(OUTSIDE + [VIP]))
        if proto.startswith("icmp"):
            sport = 128 if v6 else draw(st.sampled_from([8, 8, 13]))
        else:
            sport = draw(st.sampled_from(SERVER_PORTS))
        f = CtFlow(proto, client, cport, server, sport)
        f.isn = [draw(st.sampled_from([1000, 0xFFFFFF00, 7 << 28])), draw(st.sampled_from([5000, 0x7FFFFFF0]))]
        f.nxt = list(f.isn)
        flows.append(f)
    return flows


# a TCP conversation: (direction, flags); data ("PA") may repeat; the flow follows it
# most of the time, and otherwise sends something random
TCP_SCRIPT = [(0, "S"), (1, "SA"), (0, "A"), (0, "PA"), (1, "PA"), (1, "A"), (0, "FA"), (1, "A"), (1, "FA"), (0, "A")]
TCP_FLAGS_ORIG = ["S", "A", "PA", "PA", "FA", "R", "RA", "S"]
TCP_FLAGS_REPLY = ["SA", "A", "PA", "PA", "FA", "R", "RA", "SA"]
TCP_FLAGS_ODD = ["", "F", "P", "SF", "SR", "SP", "U", "FPU", "RP", "S"]


def _tcp_packet(draw, f: CtFlow, d: int, src, dst, sport, dport, flags=None):
    other = 1 - d
    if flags is not None:
        pass
    elif not f.sent[d]:
        flags = ("S" if d == 0 else "SA") if _chance(draw, 0.85) else draw(st.sampled_from(
            TCP_FLAGS_ORIG if d == 0 else TCP_FLAGS_REPLY))
    elif _chance(draw, 0.06):
        flags = draw(st.sampled_from(TCP_FLAGS_ODD))
    else:
        flags = draw(st.sampled_from(TCP_FLAGS_ORIG if d == 0 else TCP_FLAGS_REPLY))
    pay = b""
    if "P" in flags or (flags == "A" and _chance(draw, 0.3)):
        pay = b"d" * draw(st.sampled_from([1, 10, 100, 1000]))
    opts = []
    if "S" in flags:
        seq = f.isn[d]
        if f.wscale[d] < 0:
            f.wscale[d] = draw(st.sampled_from([0, 0, 2, 7, 14]))
        if f.wscale[d]:
            opts = [("NOP", None), ("WScale", f.wscale[d])]
    else:
        seq = f.nxt[d]
    ack = f.nxt[other] if f.sent[other] else 0
    if _chance(draw, 0.1):
        seq = draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, (seq + 70000) & 0xFFFFFFFF,
                                    (seq - 70000) & 0xFFFFFFFF, (seq + 1) & 0xFFFFFFFF, (seq - 1) & 0xFFFFFFFF]))
    if _chance(draw, 0.08):
        ack = draw(st.sampled_from([0, (ack + 100000) & 0xFFFFFFFF, (ack - 100000) & 0xFFFFFFFF, 12345]))
    win = draw(st.sampled_from([8192, 65535, 512, 0, 29200]))
    t = TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack if "A" in flags else
            (ack if _chance(draw, 0.1) else 0), window=win, options=opts)
    end = (seq + len(pay) + ("S" in flags) + ("F" in flags)) & 0xFFFFFFFF
    if (end - f.nxt[d]) & 0xFFFFFFFF < 0x80000000:
        f.nxt[d] = end
    f.sent[d] = True
    return _l3(f, src, dst) / t / Raw(pay)


def _endpoints(draw, f: CtFlow, d: int, nat: str):
    """(src, dst, sport, dport) of a packet of ``f`` in direction ``d``: the original
    direction as the client sends it; replies as the server would send them through
    whatever NAT the rules may set up (raw reverse, to the SNAT address, from the backend),
    mostly the one the rules (``nat``: their text) do set up."""
    if d == 0:
        return f.client, f.server, f.cport, f.sport
    if f.reply_view is None or _chance(draw, 0.1):
        view = _reply_view(draw, f, nat)
        if f.reply_view is None:
            f.reply_view = view
    else:
        view = f.reply_view
    src, sport, dst = view
    return src, dst, sport, f.cport


def _reply_view(draw, f: CtFlow, nat: str):
    src, sport = f.server, f.sport
    if not f.proto.endswith("6") and _chance(draw, 0.8 if "nat(dst=" in nat else 0.1 if f.server == VIP else 0):
        src = BACKEND
        if f.proto == "icmp":
            pass
        elif f"{BACKEND}:{BACKEND_PORT}" in nat:
            sport = BACKEND_PORT if _chance(draw, 0.85) else f.sport
        else:
            sport = f.sport if _chance(draw, 0.85) else BACKEND_PORT
    dst = f.client
    if not f.proto.endswith("6") and _chance(draw, 0.8 if "nat(src=" in nat else 0.2):
        dst = SNAT_IP
    return src, sport, dst


@st.composite
def ct_packet(draw, flows: List[CtFlow], history: list, nat: str = ""):
    """(in_port, scapy packet, description)."""
    k = draw(st.integers(0, 99))
    if k < 7 and history:
        return _icmp_error(draw, history)
    if k < 10:
        return _noise(draw, flows)
    f = draw(st.sampled_from(flows))
    d = 0 if (not f.sent[0] or _chance(draw, 0.5)) else 1
    if not f.sent[0] and _chance(draw, 0.1):
        d = 1
    flags = None
    proto = f.proto.rstrip("6")
    if proto == "tcp" and f.phase < len(TCP_SCRIPT) and _chance(draw, 0.8):
        d, flags = TCP_SCRIPT[f.phase]
        if flags == "PA" and _chance(draw, 0.4):
            pass  # more data in the same phase
        else:
            f.phase += 1
    src, dst, sport, dport = _endpoints(draw, f, d, nat)
    if proto == "tcp":
        l3 = _tcp_packet(draw, f, d, src, dst, sport, dport, flags)
    elif proto == "udp":
        u = UDP(sport=sport, dport=dport)
        if not f.proto.endswith("6") and _chance(draw, 0.15):
            u.chksum = 0
        l3 = _l3(f, src, dst) / u / Raw(b"u" * draw(st.sampled_from([0, 8, 33])))
        f.sent[d] = True
    elif f.proto == "icmp":
        req = f.sport
        typ = req if d == 0 else {8: 0, 13: 14}[req]
        if _chance(draw, 0.08):
            typ = draw(st.sampled_from([0, 8, 14, 9, 17]))
        l3 = IP(src=src, dst=dst) / ICMP(type=typ, id=f.cport, seq=draw(st.integers(1, 3))) / Raw(b"p" * 8)
        f.sent[d] = True
    else:
        l3 = (IPv6(src=src, dst=dst) / (ICMPv6EchoRequest(id=f.cport, seq=1) if d == 0 else
                                        ICMPv6EchoReply(id=f.cport, seq=1)) / Raw(b"p" * 8))
        f.sent[d] = True
    history.append((d, l3))
    eth = Ether(src=MAC_IN, dst=MAC_OUT) if d == 0 else Ether(src=MAC_OUT, dst=MAC_IN)
    if _chance(draw, 0.05):
        eth = eth / Dot1Q(vlan=5)
    l4 = l3.payload
    extra = f" {l4.sprintf('%TCP.flags%')} seq={l4.seq} ack={l4.ack}" if isinstance(l4, TCP) else ""
    return ("p1" if d == 0 else "p2"), eth / l3, f"{f.proto} dir={d} {src}:{sport}>{dst}:{dport}{extra}"


def _quote_views(draw, d: int, l3):
    """The packet ``l3`` (sent in direction d) as the far side may have seen it."""
    q = l3.copy()
    v6 = isinstance(q, IPv6)
    if v6:
        return q
    ip = q
    l4 = ip.payload
    if d == 0:
        c = draw(st.integers(0, 2))
        if c == 1:
            ip.src = SNAT_IP
        elif c == 2 and ip.dst == VIP:
            ip.dst = BACKEND
            if isinstance(l4, (TCP, UDP)) and _chance(draw, 0.7):
                l4.dport = BACKEND_PORT
    else:
        c = draw(st.integers(0, 2))
        if c >= 1 and ip.dst == SNAT_IP:
            ip.dst = INSIDE[0] if _chance(draw, 0.5) else INSIDE[1]
        if c >= 1 and ip.src == BACKEND:
            ip.src = VIP
            if isinstance(l4, (TCP, UDP)) and l4.sport == BACKEND_PORT:
                l4.sport = draw(st.sampled_from(SERVER_PORTS))
    del ip.chksum
    if isinstance(l4, (TCP, UDP, ICMP)):
        if not (isinstance(l4, UDP) and l4.chksum == 0):
            del l4.chksum
    return q


def _icmp_error(draw, history):
    d, l3 = draw(st.sampled_from(history))
    q = _quote_views(draw, d, l3)
    qb = bytes(q)
    if _chance(draw, 0.6):
        qb = qb[: (40 if isinstance(q, IPv6) else q.ihl * 4 if q.ihl else 20) + 8]
    elif _chance(draw, 0.2):
        qb = qb[: (40 if isinstance(q, IPv6) else 20) + draw(st.sampled_from([4, 12, 17, 18]))]
    # the error goes back towards the quoted packet's source, from a router or its destination
    to = q.src
    if isinstance(q, IPv6):
        frm = draw(st.sampled_from([q.dst, "2001:db8:2::fe"]))
        err = draw(st.sampled_from([ICMPv6DestUnreach(code=4), ICMPv6TimeExceeded(), ICMPv6PacketTooBig(mtu=1280)]))
        pkt = IPv6(src=frm, dst=to) / err / Raw(qb)
    else:
        frm = draw(st.sampled_from([q.dst, ROUTER_OUT, ROUTER_IN]))
        typ, code = draw(st.sampled_from([(3, 3), (3, 1), (3, 4), (11, 0), (12, 0), (4, 0), (5, 1)]))
        pkt = IP(src=frm, dst=to) / ICMP(type=typ, code=code) / Raw(qb)
    # from the inside when it goes to an outside host or the VIP, else from the outside
    inside = to in OUTSIDE + OUTSIDE6 + [VIP]
    eth = Ether(src=MAC_IN, dst=MAC_OUT) if inside else Ether(src=MAC_OUT, dst=MAC_IN)
    return ("p1" if inside else "p2"), eth / pkt, f"icmp error quoting dir={d}"


def _noise(draw, flows):
    f = draw(st.sampled_from(flows))
    k = draw(st.integers(0, 5))
    eth = Ether(src=MAC_IN, dst=MAC_OUT)
    if k == 0:
        pkt = eth / IP(src=f.client if ":" not in f.client else INSIDE[0], dst=OUTSIDE[0], flags="MF") / UDP(
            sport=f.cport, dport=53) / Raw(b"f" * 16)
    elif k == 1:
        pkt = eth / IP(src=INSIDE[0], dst=OUTSIDE[0]) / SCTP(sport=1, dport=2)
    elif k == 2:
        pkt = eth / IP(src=INSIDE[0], dst=OUTSIDE[0], proto=47) / Raw(b"g" * 8)
    elif k == 3:
        pkt = eth / ARP(psrc=INSIDE[0], pdst=OUTSIDE[0])
    elif k == 4:
        pkt = eth / IP(src=INSIDE[0], dst=OUTSIDE[0]) / ICMP(type=9)
    else:
        data = bytes(eth / IP(src=INSIDE[0], dst=OUTSIDE[0]) / TCP(sport=f.cport, dport=80, flags="S"))
        return "p1", data[: draw(st.sampled_from([14 + 20 + 4, 14 + 20 + 19, 14 + 10]))], "truncated"
    return "p1", pkt, "noise"


@st.composite
def ct_sequences(draw, rules: List[str] = (), max_len: int = 20):
    flows = draw(ct_flows())
    nat = " ".join(rules)
    history: list = []
    seq = []
    t = T0
    for _ in range(draw(st.integers(1, max_len))):
        port, pkt, what = draw(ct_packet(flows, history, nat))
        t += round(draw(st.sampled_from(CT_STEPS)) * 1e9)
        seq.append((port, bytes(pkt), t, what))
    return seq


# ---- running and comparing -------------------------------------------------------------


def ct_build(flows, timeouts=None, zones=None, max_connections=None) -> Tuple[Dataplane, Model]:
    dp, model = build([], flows)
    dp.stop_clock()  # the model knows packet time only: no wall time may pass in between
    if timeouts or max_connections is not None:
        dp.ct_config(timeouts=timeouts, max_connections=max_connections)
        model.ct_config(timeouts=timeouts, max_connections=max_connections)
    if zones:
        with dp.transaction() as t:
            t.set_ct_zones(zones)
        model.set_ct_zones(zones)
    return dp, model


def _ct_describe(flows, seq, extra: str = "") -> str:
    lines = ["flows:"] + [f"  {f}" for f in flows] + ["packets (in_port, t, what):"]
    for i, (p, d, t, what) in enumerate(seq):
        lines.append(f"  [{i}] {p} t={(t - T0) / 1e9:.9f}s {what} {d.hex()}")
    return "\n".join(lines + ([extra] if extra else []))


def ct_compare_table(dp, model, context: str) -> None:
    got = [str(c) for c in dp.conntrack()]
    exp = model.ct_dump()
    if sorted(got) != sorted(exp):
        raise AssertionError(f"{context}\n\nCONNECTION TABLES DIFFER\n  expected:\n    " + "\n    ".join(exp)
                             + "\n  got:\n    " + "\n    ".join(got))
    # READING: "sorted by zone, protocol and tuple" leaves IPv4 against IPv6 open: the
    # order is compared within each address family
    for v6 in (False, True):
        fam = lambda lines: [x for x in lines if (":" in x.split("src=")[1].split(",")[0]) == v6]  # noqa: E731
        assert fam(got) == fam(exp), f"{context}\n\nCONNECTION TABLE ORDER DIFFERS\n  expected {exp}\n  got {got}"
    # expires_in: what the model says is left of each connection's timeout (the core's
    # clock is ahead by the real time the test took since the last timestamp jump)
    gexp = {str(c): c.expires_in for c in dp.conntrack()}
    from helpers.ct_model import render
    eexp = {render(c): (c.expiry - model.conntrack.clock) / 1e9 for c in model.conntrack.conns}
    bad = {k: (eexp[k], gexp[k]) for k in eexp if abs(eexp[k] - gexp[k]) > CLOCK_SLACK}
    assert not bad, f"{context}\n\nEXPIRY DIFFERS (expected, got)\n  {bad}"


def run_ct_sequence(dp, model, seq, context: str, collect: Optional[list] = None) -> int:
    """Feeds ``seq`` one process() call per packet; returns how many packets were compared
    (all, unless the model hit something the documentation leaves open: then the packets
    before it, the counters and the connection table as they were then)."""
    pkts: List[Tuple[str, bytes]] = []
    results: list = []
    n = 0
    for i, (port, data, t, what) in enumerate(seq):
        batch = [(port, data)]
        model.last_results = []
        snapshot = copy.deepcopy(model.__dict__)
        try:
            exp = model.process(batch, timestamps=[t] * len(batch))
        except Unpredictable as e:
            note(f"stopping at packet [{i}]: {e}")
            model.__dict__ = snapshot
            break
        got = ct_check_batch(dp, model, batch, [t] * len(batch), exp, pkts, results,
                             context + f"\n(after packet [{i}])")
        if collect is not None:
            collect.append(got)
        n += 1
    model.last_results = results
    ct_compare_counters(dp, model, pkts, context)
    ct_compare_table(dp, model, context)
    return n


def ct_check_batch(dp, model, batch, ts, exp, pkts: list, results: list, context: str) -> list:
    """Runs ``batch`` through the core and compares its outputs with ``exp``, what the
    model gave for it; appends the batch to ``pkts`` and the model's results to
    ``results`` (the history later comparisons index into). Returns the core's outputs."""
    got = dp.process(batch, timestamps=ts)
    base = len(pkts)
    pkts.extend(batch)
    results.extend(model.last_results)
    model.last_results = results
    exp = [(p, d, base + j) for p, d, j in exp]
    got = [dataclasses.replace(o, index=base + o.index) for o in got]
    compare_outputs(got, exp, model, pkts, context)
    return got


def ct_compare_counters(dp, model, pkts, context: str) -> None:
    """compare_counters, after the expiries the core's counter read performs."""
    try:
        compare_counters(dp, model, pkts, context)
    finally:
        model.conntrack.release_expired()  # the core did, for the counter read


@settings(max_examples=CT_EXAMPLES, **SETTINGS)
@given(flows=ct_rule_sets(), data=st.data())
def test_ct_random_rules_and_sequences(flows, data):
    seq = data.draw(ct_sequences(flows), label="seq")
    dp, model = ct_build(flows, timeouts=CT_TIMEOUTS)
    run_ct_sequence(dp, model, seq, _ct_describe(flows, seq))


# ---- hand-written conntrack sequences --------------------------------------------------

C1, C2, S1, S2 = INSIDE[0], INSIDE[1], OUTSIDE[0], OUTSIDE[1]


def _eth(inside: bool = True):
    return Ether(src=MAC_IN, dst=MAC_OUT) if inside else Ether(src=MAC_OUT, dst=MAC_IN)


def ct_run(flows, steps, *, timeouts=None, zones=None, max_connections=None, check_table=True):
    """``steps``: (seconds after T0, in_port, packet). Runs the core and the model one
    process() call per packet and compares everything run_ct_sequence compares; every
    step must be predictable. Returns (dp, model, the core's outputs per step)."""
    dp, model = ct_build(flows, timeouts=timeouts or CT_TIMEOUTS, zones=zones, max_connections=max_connections)
    seq = [(port, bytes(pkt), T0 + round(t * 1e9), f"step {i}") for i, (t, port, pkt) in enumerate(steps)]
    outs: list = []
    n = run_ct_sequence(dp, model, seq, _ct_describe(flows, seq), collect=outs)
    assert n == len(seq), "the model found a step the documentation leaves open"
    return dp, model, [[(o.port, o.data) for o in step] for step in outs]


SNAT_FLOWS = [
    "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100,nat)",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100,nat(src=203.0.113.10)),output:p2",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+est,actions=output:p2",
    "table=1,priority=10,in_port=p2,ip,ct_state=+trk+est+rpl,actions=output:p1",
    "table=1,priority=10,ip,ct_state=+trk+rel,actions=output:p3",
    "table=1,priority=0,actions=drop(policy)",
]


def test_ct_snat_both_directions():
    """docs "NAT": source NAT keeps the internal port, the reply is translated back, the
    same internal endpoint keeps its mapping towards another server, an unsolicited
    packet to the public endpoint is not let in, a zero UDP checksum stays zero."""
    out_udp = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53) / Raw(b"query")
    back_udp = _eth(False) / IP(src=S1, dst=SNAT_IP) / UDP(sport=53, dport=40000) / Raw(b"answer")
    other = _eth() / IP(src=C1, dst=S2) / UDP(sport=40000, dport=53, chksum=0) / Raw(b"q2")
    back_other = _eth(False) / IP(src=S2, dst=SNAT_IP) / UDP(sport=53, dport=40000, chksum=0) / Raw(b"a2")
    stranger = _eth(False) / IP(src="198.51.100.77", dst=SNAT_IP) / UDP(sport=53, dport=40000) / Raw(b"x")
    syn = _eth() / IP(src=C2, dst=S1) / TCP(sport=40100, dport=80, flags="S", seq=1000)
    synack = _eth(False) / IP(src=S1, dst=SNAT_IP) / TCP(sport=80, dport=40100, flags="SA", seq=5000, ack=1001)
    ping = _eth() / IP(src=C2, dst=S2) / ICMP(type=8, id=40200, seq=1) / Raw(b"ping")
    pong = _eth(False) / IP(src=S2, dst=SNAT_IP) / ICMP(type=0, id=40200, seq=1) / Raw(b"ping")
    steps = [(0, "p1", out_udp), (1, "p2", back_udp), (2, "p1", other), (2, "p2", back_other), (3, "p2", stranger),
             (4, "p1", syn), (4, "p2", synack), (5, "p1", ping), (5, "p2", pong)]
    dp, model, outs = ct_run(SNAT_FLOWS, steps)
    got = [[(p, Ether(d)) for p, d in o] for o in outs]
    assert got[0][0][0] == "p2" and got[0][0][1][IP].src == SNAT_IP and got[0][0][1][UDP].sport == 40000
    assert got[1][0][0] == "p1" and got[1][0][1][IP].dst == C1 and got[1][0][1][UDP].dport == 40000
    assert got[2][0][1][IP].src == SNAT_IP and got[2][0][1][UDP].sport == 40000 and got[2][0][1][UDP].chksum == 0
    assert got[3][0][1][IP].dst == C1 and got[3][0][1][UDP].chksum == 0
    assert outs[4] == []
    assert got[6][0][1][IP].dst == C2 and got[8][0][1][IP].dst == C2 and got[8][0][1][ICMP].id == 40200
    for o in outs:
        for _, d in o:
            assert_checksums(d)
    assert [str(c) for c in dp.conntrack(zone=100)] == [
        "icmp,orig=(src=10.0.1.2,dst=198.51.100.2,id=40200,type=8,code=0),"
        "reply=(src=198.51.100.2,dst=203.0.113.10,id=40200,type=0,code=0),zone=100",
        "tcp,orig=(src=10.0.1.2,dst=198.51.100.1,sport=40100,dport=80),"
        "reply=(src=198.51.100.1,dst=203.0.113.10,sport=80,dport=40100),zone=100,protoinfo=(state=ESTABLISHED)",
        "udp,orig=(src=10.0.1.1,dst=198.51.100.1,sport=40000,dport=53),"
        "reply=(src=198.51.100.1,dst=203.0.113.10,sport=53,dport=40000),zone=100",
        "udp,orig=(src=10.0.1.1,dst=198.51.100.2,sport=40000,dport=53),"
        "reply=(src=198.51.100.2,dst=203.0.113.10,sport=53,dport=40000),zone=100",
    ]
    assert {k: v for k, v in dp.stats()["ports"]["p2"]["drops"].items() if v} == {"policy": 1}


TCP_FLOWS = [
    "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=7)",
    "table=1,priority=10,in_port=p1,tcp,ct_state=+trk+new,actions=ct(commit,zone=7),output:p2",
    "table=1,priority=10,in_port=p1,ct_state=+trk+est,actions=output:p2",
    "table=1,priority=10,in_port=p2,ct_state=+trk+est,actions=output:p1",
    "table=1,priority=0,actions=drop(policy)",
]


def _tcp(client: bool, flags: str, seq: int, ack: int = 0, data: bytes = b"", **kw):
    if client:
        return _eth() / IP(src=C1, dst=S1) / TCP(sport=40000, dport=80, flags=flags, seq=seq, ack=ack, **kw) / Raw(data)
    return _eth(False) / IP(src=S1, dst=C1) / TCP(sport=80, dport=40000, flags=flags, seq=seq, ack=ack, **kw) / Raw(data)


def test_ct_tcp_open_close_to_time_wait():
    """docs "Protocols", TCP: states through a whole session, the established and the
    transitory timeouts, an out-of-window segment +inv, a SYN after both sides closed
    starts a new connection on the same tuple."""
    ws = [("NOP", None), ("WScale", 7)]
    steps = [
        (0, "p1", _tcp(True, "S", 1000, window=64240, options=ws)),
        (0.001, "p2", _tcp(False, "SA", 5000, 1001, window=65160, options=ws)),
        (0.002, "p1", _tcp(True, "A", 1001, 5001, window=502)),
        (1, "p1", _tcp(True, "PA", 1001, 5001, b"GET / HTTP/1.0\r\n\r\n", window=502)),
        (1, "p2", _tcp(False, "PA", 5001, 1019, b"x" * 1000, window=509)),
        (2, "p1", _tcp(True, "A", 1019, 6001, window=501)),
        # far outside the window: +inv, dropped, nothing changes
        (2, "p2", _tcp(False, "PA", 5001 + 10_000_000, 1019, b"y" * 10, window=509)),
        (3, "p1", _tcp(True, "FA", 1019, 6001, window=501)),
        (3, "p2", _tcp(False, "A", 6001, 1020, window=509)),
        (4, "p2", _tcp(False, "FA", 6001, 1020, window=509)),
        (4, "p1", _tcp(True, "A", 1020, 6002, window=501)),
    ]
    dp, model, outs = ct_run(TCP_FLOWS, steps[:6])
    (c,) = dp.conntrack()
    assert c.state == "ESTABLISHED" and abs(c.expires_in - CT_TIMEOUTS["tcp_established"]) < CLOCK_SLACK + 1
    dp, model, outs = ct_run(TCP_FLOWS, steps)
    assert [len(o) for o in outs] == [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    assert dp.stats()["ports"]["p2"]["drops"].get("policy") == 1
    (c,) = dp.conntrack(zone=7)
    assert str(c) == ("tcp,orig=(src=10.0.1.1,dst=198.51.100.1,sport=40000,dport=80),"
                      "reply=(src=198.51.100.1,dst=10.0.1.1,sport=80,dport=40000),zone=7,protoinfo=(state=TIME_WAIT)")
    assert abs(c.expires_in - CT_TIMEOUTS["tcp_transitory"]) < CLOCK_SLACK + 1
    # a new SYN on the closed tuple starts a new connection
    dp2, model2, outs2 = ct_run(TCP_FLOWS, steps + [(5, "p1", _tcp(True, "S", 90000))])
    assert outs2[-1] and [x.state for x in dp2.conntrack()] == ["SYN_SENT"]


@pytest.mark.parametrize("single_port", [False, True])
def test_ct_icmp_error_translation(single_port):
    """docs "NAT": an ICMP error is translated as a packet of its direction and the packet
    it quotes back to what its sender sent -- addresses, port, quoted IP and UDP
    checksums, ICMP checksum (RFC 5508); both directions; with the port kept and with the
    port changed (a single-port range)."""
    nat = "nat(src=203.0.113.10:2000)" if single_port else "nat(src=203.0.113.10)"
    flows = [f.replace("nat(src=203.0.113.10)", nat) for f in SNAT_FLOWS]
    pub_port = 2000 if single_port else 40000
    out_udp = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53) / Raw(b"query!")
    # as the server side saw it: translated
    seen = IP(src=SNAT_IP, dst=S1) / UDP(sport=pub_port, dport=53) / Raw(b"query!")
    unreach = _eth(False) / IP(src=ROUTER_OUT, dst=SNAT_IP) / ICMP(type=3, code=3) / Raw(bytes(seen))
    from_server = _eth(False) / IP(src=S1, dst=SNAT_IP) / ICMP(type=11, code=0) / Raw(bytes(seen)[:28])
    reply_seen = IP(src=S1, dst=C1) / UDP(sport=53, dport=40000) / Raw(b"answer")
    back = _eth(False) / IP(src=S1, dst=SNAT_IP) / UDP(sport=53, dport=pub_port) / Raw(b"answer")
    from_client = _eth() / IP(src=C1, dst=S1) / ICMP(type=3, code=3) / Raw(bytes(reply_seen))
    from_router_in = _eth() / IP(src=ROUTER_IN, dst=S1) / ICMP(type=3, code=1) / Raw(bytes(reply_seen))
    steps = [(0, "p1", out_udp), (1, "p2", unreach), (1, "p2", from_server), (2, "p2", back),
             (3, "p1", from_client), (3, "p1", from_router_in)]
    dp, model, outs = ct_run(flows, steps)
    e = Ether(outs[1][0][1])
    assert outs[1][0][0] == "p3" and e[IP].dst == C1 and e[IP].src == ROUTER_OUT
    from scapy.layers.inet import IPerror, UDPerror
    assert e[IPerror].src == C1 and e[UDPerror].sport == 40000
    e = Ether(outs[4][0][1])
    assert e[IP].src == SNAT_IP and e[IPerror].dst == SNAT_IP and e[UDPerror].dport == pub_port
    e = Ether(outs[5][0][1])
    assert e[IP].src == ROUTER_IN and e[IPerror].dst == SNAT_IP  # docs: source only when the endpoint sent it
    for o in outs:
        for _, d in o:
            assert_checksums(d)
    full = Ether(outs[1][0][1])[IPerror]
    inner = IP(bytes(full))
    del inner[UDP].chksum
    assert Ether(outs[1][0][1])[UDPerror].chksum == IP(bytes(inner))[UDP].chksum  # the quote holds it whole


def test_ct_icmp_error_must_go_to_the_quoted_sender():
    """docs "rel": an error addressed to anyone but the quoted packet's sender is +inv."""
    out_udp = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53) / Raw(b"q")
    seen = IP(src=SNAT_IP, dst=S1) / UDP(sport=40000, dport=53) / Raw(b"q")
    good = _eth(False) / IP(src=ROUTER_OUT, dst=SNAT_IP) / ICMP(type=3, code=3) / Raw(bytes(seen))
    bad = _eth(False) / IP(src=ROUTER_OUT, dst="203.0.113.99") / ICMP(type=3, code=3) / Raw(bytes(seen))
    dp, model, outs = ct_run(SNAT_FLOWS, [(0, "p1", out_udp), (1, "p2", bad), (1, "p2", good)])
    assert outs[1] == [] and outs[2][0][0] == "p3"


def test_ct_dnat_and_its_replies():
    """docs "Destination NAT": a single address and port; replies from the backend get the
    public source back; the backend's port is not the client's business."""
    flows = [
        "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,nat)",
        f"table=1,priority=10,in_port=p2,tcp,ct_state=+trk+new,nw_dst={VIP},tp_dst=80,"
        f"actions=ct(commit,nat(dst={BACKEND}:{BACKEND_PORT})),output:p1",
        "table=1,priority=10,in_port=p2,ct_state=+trk+est,actions=output:p1",
        "table=1,priority=10,in_port=p1,ct_state=+trk+est+rpl+snat,actions=output:p2",
        "table=1,priority=0,actions=drop(policy)",
    ]
    syn = _eth(False) / IP(src=S1, dst=VIP) / TCP(sport=33000, dport=80, flags="S", seq=7)
    synack = _eth() / IP(src=BACKEND, dst=S1) / TCP(sport=BACKEND_PORT, dport=33000, flags="SA", seq=900, ack=8)
    ack = _eth(False) / IP(src=S1, dst=VIP) / TCP(sport=33000, dport=80, flags="A", seq=8, ack=901)
    dp, model, outs = ct_run(flows, [(0, "p2", syn), (0, "p1", synack), (1, "p2", ack)])
    e0, e1 = Ether(outs[0][0][1]), Ether(outs[1][0][1])
    assert (e0[IP].dst, e0[TCP].dport) == (BACKEND, BACKEND_PORT)
    assert (e1[IP].src, e1[TCP].sport) == (VIP, 80)
    assert [str(c) for c in dp.conntrack()] == [
        "tcp,orig=(src=198.51.100.1,dst=203.0.113.80,sport=33000,dport=80),"
        "reply=(src=10.0.2.5,dst=198.51.100.1,sport=8080,dport=33000),protoinfo=(state=ESTABLISHED)"]


@pytest.mark.parametrize("proto", ["udp", "icmp"])
def test_ct_udp_icmp_new_until_reply_and_expiry(proto):
    """docs: UDP and ICMP packets of the original direction are +new until a reply; a
    connection idle for its timeout is gone (timeouts end in .5: see CT_TIMEOUTS)."""
    flows = ["table=0,priority=10,ip,ct_state=-trk,actions=ct(commit,table=1)",
             "table=1,ct_state=+trk+new,actions=output:p3", "table=1,ct_state=+trk+est-rpl,actions=output:p4",
             "table=1,ct_state=+trk+est+rpl,actions=output:p1", "table=1,ct_state=+trk+inv,actions=drop(policy)"]
    if proto == "udp":
        fwd = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)
        rev = _eth(False) / IP(src=S1, dst=C1) / UDP(sport=53, dport=40000)
    else:
        fwd = _eth() / IP(src=C1, dst=S1) / ICMP(type=8, id=9)
        rev = _eth(False) / IP(src=S1, dst=C1) / ICMP(type=0, id=9)
    timeout = CT_TIMEOUTS[proto]
    t = timeout - 0.5
    steps = [(0, "p1", fwd), (1, "p1", fwd), (2, "p2", rev), (3, "p1", fwd), (3 + t, "p1", fwd),
             (3 + t + timeout + 0.5, "p2", rev)]
    dp, model, outs = ct_run(flows, steps)
    ports = [[p for p, _ in o] for o in outs]
    # reply after expiry: a new connection (UDP) or +inv (an echo reply with no connection)
    assert ports == [["p3"], ["p3"], ["p1"], ["p4"], ["p4"], ["p3"] if proto == "udp" else []]


def test_ct_quotas_and_limits():
    """docs: ct_quota (the zone is at its limit), ct_table_full (the dataplane's limit);
    nothing else is disturbed."""
    flows = ["table=0,priority=10,udp,in_port=p1,actions=ct(commit,zone=NXM_NX_REG0[0..15]),output:p2",
             "table=0,priority=20,udp,in_port=p1,nw_src=10.0.1.2,actions=load:0x6->NXM_NX_REG0[],"
             "ct(commit,zone=NXM_NX_REG0[0..15]),output:p2"]
    pk = [_eth() / IP(src=C1, dst=S1) / UDP(sport=40000 + i, dport=53) for i in range(4)]
    other = [_eth() / IP(src=C2, dst=S1) / UDP(sport=40000 + i, dport=53) for i in range(2)]
    steps = [(0, "p1", pk[0]), (0, "p1", pk[1]), (0, "p1", pk[2]), (0, "p1", pk[0]),
             (1, "p1", other[0]), (1, "p1", other[1])]
    dp, model, outs = ct_run(flows, steps, zones=[(0, 2, False)], max_connections=3)
    assert [len(o) for o in outs] == [1, 1, 0, 1, 1, 0]
    assert {k: v for k, v in dp.stats()["ports"]["p1"]["drops"].items() if v} == {"ct_quota": 1, "ct_table_full": 1}
    # expired connections free their slots
    dp, model, outs = ct_run(flows, steps + [(40, "p1", pk[2])], zones=[(0, 2, False)], max_connections=3)
    assert outs[-1]


def test_ct_nat_no_port_and_release_after_expiry():
    """docs: a single public port: the second internal endpoint finds none (nat_no_port);
    after the first connection expired its port is released before a commit is refused."""
    flows = ["table=0,priority=10,udp,in_port=p1,actions=ct(commit,nat(src=203.0.113.20:2000)),output:p2"]
    a = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)
    b = _eth() / IP(src=C2, dst=S1) / UDP(sport=40001, dport=53)
    dp, model, outs = ct_run(flows, [(0, "p1", a), (1, "p1", b), (1, "p1", a), (40, "p1", b)])
    assert [len(o) for o in outs] == [1, 0, 1, 1]
    assert Ether(outs[3][0][1])[UDP].sport == 2000
    assert {k: v for k, v in dp.stats()["ports"]["p1"]["drops"].items() if v} == {"nat_no_port": 1}


def test_ct_nat_collision():
    """docs: nat_collision: the translated reply tuple already belongs to another
    connection (two public addresses sent to one backend from the same client port)."""
    flows = ["table=0,priority=10,tcp,in_port=p2,actions=ct(commit,nat(dst=10.0.2.5:8080)),output:p1"]
    s1 = _eth(False) / IP(src=S1, dst="203.0.113.80") / TCP(sport=33000, dport=80, flags="S")
    s2 = _eth(False) / IP(src=S1, dst="203.0.113.81") / TCP(sport=33000, dport=80, flags="S")
    dp, model, outs = ct_run(flows, [(0, "p2", s1), (0, "p2", s2)])
    assert [len(o) for o in outs] == [1, 0]
    assert {k: v for k, v in dp.stats()["ports"]["p2"]["drops"].items() if v} == {"nat_collision": 1}


def test_ct_force_recommits_in_the_other_direction():
    """docs "force": a packet of a connection's reply direction deletes it and commits a
    new one in its own direction."""
    flows = ["table=0,priority=10,udp,in_port=p2,actions=ct(commit),output:p1",
             "table=0,priority=10,udp,in_port=p1,actions=ct(commit,force,table=1)",
             "table=1,ct_state=+trk+new,actions=output:p3", "table=1,ct_state=+trk+est,actions=output:p4"]
    inbound = _eth(False) / IP(src=S1, dst=C1) / UDP(sport=53, dport=40000)
    outbound = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)
    dp, model, outs = ct_run(flows, [(0, "p2", inbound), (1, "p1", outbound), (2, "p1", outbound)])
    assert [[p for p, _ in o] for o in outs] == [["p1"], ["p3"], ["p3"]]
    assert [c.orig["src"] for c in dp.conntrack()] == [C1]


def test_ct_exec_mark_label_and_recirculation():
    """docs "exec", "table=T": the copy sees the mark and label just set (masked writes),
    its frozen registers, metadata and in_port (its own: resubmit(p3,1) changes in_port for
    that lookup only); the original goes on untracked (ct_state=-trk), outputs first;
    copies after the pass, in order."""
    flows = [
        "table=0,priority=10,udp,actions=load:0x5->NXM_NX_REG3[],write_metadata:0x77,resubmit(p3,1),"
        "load:0x6->NXM_NX_REG3[],ct(table=3),output:p1",
        "table=1,udp,actions=ct(commit,table=2,exec(set_field:0xab/0xff->ct_mark,load:0x3->NXM_NX_CT_MARK[12..15],"
        "set_field:0x12/0xff->ct_label,set_field:0x1000000000000000000000000000000/0xf000000000000000000000000000000"
        "->ct_label)),resubmit(,4)",
        "table=2,in_port=p2,reg3=5,metadata=0x77,ct_mark=0x30ab,ct_state=+trk+new,"
        "ct_label=0x1000000000000000000000000000012,actions=in_port",
        "table=2,priority=0,actions=drop(policy)",
        "table=3,in_port=p2,reg3=6,ct_state=+trk+new,ct_mark=0x30ab,actions=output:p3",
        "table=4,ct_state=-trk,actions=output:p4",
    ]
    pkt = _eth(False) / IP(src=S1, dst=C1) / UDP(sport=53, dport=40000)
    dp, model, outs = ct_run(flows, [(0, "p2", pkt)])
    # the pass itself (p4 inside the resubmit, p1 after the fork), then the copies in order
    assert [p for p, _ in outs[0]] == ["p4", "p1", "p2", "p3"]
    assert [(c.mark, c.label) for c in dp.conntrack()] == [(0x30AB, 0x1000000000000000000000000000012)]


def test_ct_recirculation_limit():
    """README 2: at most 8 passes; the ninth is dropped (recirc_limit)."""
    pkt = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)
    for n in (7, 8):
        flows = [f"table={t},actions=ct(table={t + 1})" for t in range(n)] + [f"table={n},actions=output:p2"]
        dp, model, outs = ct_run(flows, [(0, "p1", pkt)])
        assert bool(outs[0]) == (n == 7)


def test_ct_ipv6_tracked_never_translated():
    """docs: on IPv6 packets the connection is tracked and never translated."""
    flows = ["table=0,priority=10,ipv6,ct_state=-trk,actions=ct(table=1,nat)",
             "table=1,in_port=p1,ct_state=+trk+new,actions=ct(commit,nat(src=203.0.113.10)),output:p2",
             "table=1,in_port=p2,ct_state=+trk+est+rpl-snat-dnat,actions=output:p1"]
    a = _eth() / IPv6(src=INSIDE6[0], dst=OUTSIDE6[0]) / ICMPv6EchoRequest(id=5)
    b = _eth(False) / IPv6(src=OUTSIDE6[0], dst=INSIDE6[0]) / ICMPv6EchoReply(id=5)
    c = _eth() / IPv6(src=INSIDE6[0], dst=OUTSIDE6[0]) / UDP(sport=5000, dport=53)
    err = _eth(False) / IPv6(src="2001:db8:2::fe", dst=INSIDE6[0]) / ICMPv6DestUnreach() / Raw(bytes(c[IPv6])[:48])
    dp, model, outs = ct_run(flows + ["table=1,ct_state=+trk+rel,actions=output:p3"],
                             [(0, "p1", a), (0, "p2", b), (1, "p1", c), (1, "p2", err)])
    assert outs[0][0][1] == bytes(a) and outs[1][0][1] == bytes(b) and outs[3][0][0] == "p3"
    assert str(dp.conntrack()[0]).startswith("udp,orig=(src=2001:db8:1::1") or \
        any(str(x).startswith("icmpv6,orig=(src=2001:db8:1::1,dst=2001:db8:2::1,id=5,type=128,code=0)")
            for x in dp.conntrack())


def test_ct_snat_multi_address_pool_is_paired():
    """docs: for a range A-B an internal address always gets the same public address,
    whatever the protocol (the hash itself is not documented, so only properties)."""
    flows = ["table=0,priority=10,ip,in_port=p1,actions=ct(commit,nat(src=203.0.113.100-203.0.113.103)),output:p2"]
    dp = Dataplane(ports=PORTS)
    dp.add_flows(flows)
    pool = {f"203.0.113.{i}" for i in range(100, 104)}
    seen = {}
    for i, client in enumerate(["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5"]):
        for k, l4 in enumerate([UDP(sport=41000 + i, dport=53), TCP(sport=42000 + i, dport=80, flags="S"),
                                ICMP(type=8, id=43000 + i)]):
            (o,) = dp.process([("p1", bytes(_eth() / IP(src=client, dst=S1) / l4))], timestamps=[T0])
            e = Ether(o.data)
            assert e[IP].src in pool
            seen.setdefault(client, set()).add(e[IP].src)
            assert_checksums(o.data)
    assert all(len(v) == 1 for v in seen.values()), seen


def test_ct_endpoint_independent_filtering():
    """docs "Filtering": in a zone with endpoint-independent filtering, any remote may
    reach a mapped public endpoint: +new+trk+dnat, translated to the internal endpoint."""
    flows = [
        "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=9,nat)",
        "table=1,in_port=p1,ct_state=+trk+new,actions=ct(commit,zone=9,nat(src=203.0.113.10)),output:p2",
        "table=1,in_port=p2,ct_state=+trk+new+dnat,actions=output:p1",
        "table=1,in_port=p2,ct_state=+trk+est,actions=output:p1",
        "table=1,priority=0,actions=drop(policy)",
    ]
    out = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=3478)
    stranger = _eth(False) / IP(src="198.51.100.77", dst=SNAT_IP) / UDP(sport=9999, dport=40000)
    for eif in (False, True):
        dp, model, outs = ct_run(flows, [(0, "p1", out), (1, "p2", stranger), (2, "p2", stranger)],
                                 zones=[(9, 0, eif)])
        if eif:
            e = Ether(outs[1][0][1])
            assert (e[IP].dst, e[UDP].dport) == (C1, 40000) and outs[2]
        else:
            assert outs[1] == [] and outs[2] == []


def test_ct_icmp_error_state_does_not_stick_to_its_batch_slot():
    """Regression (a core bug found by the random sequences): once a worker had tracked an
    ICMP error, the packet in the same position of its later batches was classified with
    the error's state (+inv, or +rel for packets of the quoted connection)."""
    flows = ["table=0,priority=10,ip,actions=ct(table=1)", "table=1,ct_state=+trk+inv,actions=output:p4",
             "table=1,ct_state=+trk+new,actions=output:p3"]
    quoted = IP(src=C2, dst=S2) / UDP(sport=40000, dport=80) / Raw(b"x" * 8)
    err = _eth(False) / IP(src=ROUTER_IN, dst=C2) / ICMP(type=3, code=3) / Raw(bytes(quoted)[:28])
    udp = _eth(False) / IP(src=S2, dst=SNAT_IP) / UDP(sport=80, dport=40000) / Raw(b"y" * 8)
    dp, model, outs = ct_run(flows, [(0, "p2", err), (1, "p2", udp), (2, "p2", udp)])
    assert [[p for p, _ in o] for o in outs] == [["p4"], ["p3"], ["p3"]]


# ---- core bugs the model found (smallest reproductions, now fixed) -------------------


@pytest.mark.parametrize("actions", ["ct(),drop(policy)", "ct(),resubmit(,1)", "resubmit(,1),ct()"])
def test_ct_drop_reason_survives_ct_without_table(actions):
    """README 8/9: drop(reason) records its reason, a miss records table_miss; a ct in the
    same walk changes nothing about that."""
    dp = Dataplane(ports=PORTS)
    dp.add_flows([f"table=0,actions={actions}"])
    dp.process([("p1", bytes(_eth() / IP(src=C1, dst=S1) / UDP()))], timestamps=[T0])
    expected = "policy" if "drop(policy)" in actions else "table_miss"
    assert {k: v for k, v in dp.stats()["ports"]["p1"]["drops"].items() if v} == {expected: 1}


def test_ct_clock_counts_packets_that_skip_conntrack():
    """docs "Timeouts and the clock": the clock jumps ahead whenever a batch's newest
    timestamp is later, and never goes back. A UDP connection made at t=0 (timeout 30.5 s)
    is gone once an ARP at t=60 moved the clock, even for a packet stamped t=10."""
    flows = ["table=0,ip,actions=ct(commit,table=1)", "table=1,ct_state=+trk+new,actions=output:p3",
             "table=1,ct_state=+trk+est,actions=output:p4", "table=0,arp,actions=output:p2"]
    dp, model = ct_build(flows, timeouts=CT_TIMEOUTS)
    dp.process([("p1", bytes(_eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)))], timestamps=[T0])
    dp.process([("p1", bytes(_eth() / ARP()))], timestamps=[T0 + 60 * 10**9])
    out = dp.process([("p2", bytes(_eth(False) / IP(src=S1, dst=C1) / UDP(sport=53, dport=40000)))],
                     timestamps=[T0 + 10 * 10**9])
    assert [o.port for o in out] == ["p3"]  # +new: the connection expired at t=30.5


RESUME_FLOWS = [
    "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100,nat)",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100,nat(src=203.0.113.10)),output:p2",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+est,ct_mark=0,actions=ct(commit,zone=100,exec(set_field:7->ct_mark)),output:p2",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+est,ct_mark=7,actions=mod_dl_dst:02:00:00:00:00:77,output:p2",
    "table=1,priority=10,in_port=p2,ip,ct_state=+trk+est+rpl,actions=output:p1",
    "table=1,priority=0,actions=drop(policy)",
]


def _snat_tcp(client: bool, flags: str, seq: int, ack: int = 0, data: bytes = b""):
    if client:
        return _eth() / IP(src=C1, dst=S1) / TCP(sport=40000, dport=80, flags=flags, seq=seq, ack=ack) / Raw(data)
    return _eth(False) / IP(src=S1, dst=SNAT_IP) / TCP(sport=80, dport=40000, flags=flags, seq=seq, ack=ack) / Raw(data)


def test_ct_resume_after_conntrack_matches_the_model():
    """The worker's cache of the pass after conntrack (docs/design.md, "Resuming after
    conntrack") answers packets of established connections without a second lookup, and
    changes nothing of what they get: the model agrees on every output, counter and
    connection through a session whose mark changes on the way (the cached state no
    longer matches), both directions resumed, a segment out of the window (+inv on a
    cached connection), an idle time past the established timeout (the cached connection
    is gone) and a new connection on the same tuple."""
    steps = [(0, "p1", _snat_tcp(True, "S", 1000)), (0, "p2", _snat_tcp(False, "SA", 5000, 1001)),
             (0, "p1", _snat_tcp(True, "A", 1001, 5001))]
    seq_c, seq_s = 1001, 5001
    for i in range(6):  # data both ways: the mark is set by the first, then the cache answers
        steps.append((1 + i, "p1", _snat_tcp(True, "PA", seq_c, seq_s, b"c" * 10)))
        seq_c += 10
        steps.append((1 + i, "p2", _snat_tcp(False, "PA", seq_s, seq_c, b"s" * 20)))
        seq_s += 20
    steps.append((8, "p1", _snat_tcp(True, "PA", seq_c + 500000, seq_s, b"c" * 10)))  # out of the window
    steps.append((9, "p1", _snat_tcp(True, "PA", seq_c, seq_s, b"c" * 10)))
    steps.append((200, "p1", _snat_tcp(True, "PA", seq_c + 10, seq_s, b"c" * 10)))  # expired: +inv
    steps.append((201, "p1", _snat_tcp(True, "S", 9000)))
    steps.append((201, "p2", _snat_tcp(False, "SA", 7000, 9001)))
    steps.append((202, "p1", _snat_tcp(True, "PA", 9001, 7001, b"c" * 10)))
    steps.append((203, "p1", _snat_tcp(True, "PA", 9011, 7001, b"c" * 10)))

    def run(resume_possible: bool):
        dp, model = ct_build(RESUME_FLOWS, timeouts=CT_TIMEOUTS)
        if resume_possible:
            dp._core.set_emc_insert_inv_prob(1)  # every megaflow hit enters the EMC
        seq = [(port, bytes(pkt), T0 + round(t * 1e9), f"step {i}") for i, (t, port, pkt) in enumerate(steps)]
        outs: list = []
        assert run_ct_sequence(dp, model, seq, _ct_describe(RESUME_FLOWS, seq), collect=outs) == len(seq)
        return dp.stats()["workers_total"], [[(o.port, o.data) for o in step] for step in outs]

    with_cache, outs = run(True)
    without, outs_without = run(False)
    assert outs == outs_without
    # client data 2..6 (mark 7 from the second on, resumed from the third) and server data 2..6,
    # and the last segment of the new connection
    assert with_cache["ct_resumed"] >= 8, with_cache
    # Without the EMC, the pass after conntrack tries the megaflow that followed the same ct
    # megaflow last time: every established packet after the first of each kind, when its key
    # still matches (not after the mark changed, nor for the new connection's first packets).
    assert without["ct_resumed"] == 0 and without["ct_hinted"] >= 8, without
    assert with_cache["passes"] == without["passes"] and with_cache["recirculations"] == without["recirculations"]
    assert Ether(outs[2 * 5 + 3][0][1]).dst == "02:00:00:00:00:77"  # the cached megaflow's actions ran


def test_ct_resume_not_cached_when_the_next_pass_recirculates():
    """A next pass whose actions make passes of their own (a second ct) is not cached: a
    resumed packet's later passes would not count towards the recirculation limit, and
    their conntrack decisions would move ahead of the batch's other packets."""
    flows = ["table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100)",
             "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100),output:p2",
             "table=1,priority=10,ip,ct_state=+trk+est,actions=ct(table=2,zone=200)",
             "table=2,priority=10,in_port=p1,ip,actions=output:p2",
             "table=2,priority=10,in_port=p2,ip,actions=output:p1"]
    dp, model = ct_build(flows, timeouts=CT_TIMEOUTS)
    dp._core.set_emc_insert_inv_prob(1)
    steps = [(0, "p1", _tcp(True, "S", 1000)), (0, "p2", _tcp(False, "SA", 5000, 1001))]
    steps += [(1 + i, "p1", _tcp(True, "PA", 1001 + 10 * i, 5001, b"c" * 10)) for i in range(5)]
    seq = [(port, bytes(pkt), T0 + round(t * 1e9), f"step {i}") for i, (t, port, pkt) in enumerate(steps)]
    assert run_ct_sequence(dp, model, seq, _ct_describe(flows, seq)) == len(seq)
    st = dp.stats()["workers_total"]
    assert st["ct_resumed"] == 0 and st["ct_packets"] > len(seq)


CARRY_FLOWS = [
    "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100,nat)",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100,nat(src=203.0.113.10)),output:p2",
    "table=1,priority=10,in_port=p1,udp,ct_state=+trk+est,actions=ct(zone=100,table=2)",
    "table=1,priority=10,in_port=p1,tcp,ct_state=+trk+est,actions=mod_tp_src:40001,ct(zone=100,table=2)",
    "table=1,priority=10,in_port=p2,ip,ct_state=+trk+est+rpl,actions=output:p1",
    "table=1,priority=0,actions=drop(policy)",
    "table=2,priority=10,in_port=p1,ip,ct_state=+trk+est,actions=output:p2",
    "table=2,priority=0,actions=drop(policy)",
]


def test_ct_carried_connection_matches_the_model():
    """A second ct of the same zone starts from the connection the first one found
    (Packet::ct_conn, as OVS keeps it in the packet's metadata) instead of a table lookup,
    and decides exactly what the lookup would: the model agrees on every output, counter
    and connection through a one-way UDP flow (+new again, a commit on the connection the
    first ct found, the packet already translated), its reply, an established packet, and
    a TCP segment whose source port is rewritten between the two cts (its tuple is no
    longer the connection's: the stage looks it up instead)."""
    def udp_out():
        return _eth() / IP(src=C1, dst=S1) / UDP(sport=5000, dport=53) / Raw(b"q")

    steps = [(0, "p1", udp_out()), (0.1, "p1", udp_out()),
             (0.2, "p2", _eth(False) / IP(src=S1, dst=SNAT_IP) / UDP(sport=53, dport=5000) / Raw(b"a")),
             (0.3, "p1", udp_out()), (0.4, "p1", udp_out()),
             (1, "p1", _snat_tcp(True, "S", 1000)), (1.1, "p2", _snat_tcp(False, "SA", 5000, 1001)),
             (1.2, "p1", _snat_tcp(True, "A", 1001, 5001)), (1.3, "p1", _snat_tcp(True, "PA", 1001, 5001, b"c"))]
    dp, _, outs = ct_run(CARRY_FLOWS, steps)
    st = dp.stats()["workers_total"]
    # the second UDP packet's commit, and the two established ones' second ct
    assert st["ct_carried"] >= 3, st
    assert [o[0] for o in outs[1]] == ["p2"] and [o[0] for o in outs[3]] == ["p2"]
    assert IP(outs[3][0][1][14:]).src == SNAT_IP


def test_ct_resume_never_uses_a_flushed_connection():
    """A connection flushed (or expired, or replaced) while a worker still caches it is
    not used: the next segment finds no connection (+inv, dropped), and the cache is not
    consulted again for a connection that is gone."""
    dp, _ = ct_build(RESUME_FLOWS, timeouts=CT_TIMEOUTS)
    dp._core.set_emc_insert_inv_prob(1)

    def send(port, pkt, t):
        return [o.port for o in dp.process([(port, bytes(pkt))], timestamps=[T0 + round(t * 1e9)])]

    assert send("p1", _snat_tcp(True, "S", 1000), 0) == ["p2"]
    assert send("p2", _snat_tcp(False, "SA", 5000, 1001), 0) == ["p1"]
    seq_c = 1001
    for i in range(4):
        assert send("p1", _snat_tcp(True, "PA", seq_c, 5001, b"c" * 10), 1 + i) == ["p2"]
        seq_c += 10
    resumed = dp.stats()["workers_total"]["ct_resumed"]
    assert resumed >= 2
    assert dp.ct_flush() == 1
    drops_before = dp.stats()["ports"]["p1"]["drops"].get("policy", 0)
    assert send("p1", _snat_tcp(True, "PA", seq_c, 5001, b"c" * 10), 6) == []
    st = dp.stats()
    assert st["workers_total"]["ct_resumed"] == resumed
    assert st["ports"]["p1"]["drops"]["policy"] == drops_before + 1


# A source-NAT gateway whose client side (p1) and server side (p2) both take the
# pass after conntrack from the worker's resume cache.
SNAT_GATEWAY_FLOWS = [
    "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100,nat)",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100,nat(src=203.0.113.10)),output:p2",
    "table=1,priority=10,in_port=p1,ip,ct_state=+trk+est,actions=output:p2",
    "table=1,priority=10,in_port=p2,ip,ct_state=+trk+est+rpl,actions=output:p1",
    "table=1,priority=0,actions=drop(policy)",
]


@pytest.mark.parametrize("what, setter, match", [
    ("mark", "set_field:7->ct_mark", "ct_mark=7"),
    ("label", "set_field:0x10->ct_label", "ct_label=0x10/0x10"),
])
def test_ct_resume_follows_a_mark_or_label_changed_while_cached(what, setter, match):
    """A reply's commit changes the connection's mark (or label) while a worker caches
    the client's next pass, with no table change to flush the caches: the client's next
    packet must take the pass its new mark selects. The cache trusts a connection whose
    life count (conn.h) is unchanged, so a mark change that did not add to it would
    resume the old pass (the original destination MAC), as seen with that step removed;
    a label is also compared against the cached one."""
    flows = SNAT_GATEWAY_FLOWS + [
        f"table=1,priority=20,in_port=p1,ip,ct_state=+trk+est,{match},actions=mod_dl_dst:02:00:00:00:00:77,output:p2",
        f"table=1,priority=20,in_port=p2,ip,nw_tos=4,ct_state=+trk+est+rpl,actions=ct(commit,zone=100,exec({setter})),output:p1",
    ]
    dp, _ = ct_build(flows, timeouts=CT_TIMEOUTS)
    dp._core.set_emc_insert_inv_prob(1)
    query = _eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53) / Raw(b"q")

    def reply(tos=0):
        return _eth(False) / IP(src=S1, dst=SNAT_IP, tos=tos) / UDP(sport=53, dport=40000) / Raw(b"r")

    def send(port, pkt, t):
        return [(o.port, Ether(o.data).dst) for o in dp.process([(port, bytes(pkt))], timestamps=[T0 + round(t * 1e9)])]

    assert send("p1", query, 0) == [("p2", MAC_OUT)]
    assert send("p2", reply(), 0.1) == [("p1", MAC_IN)]
    for i in range(3):  # the second is cached, the third resumed
        assert send("p1", query, 1 + i) == [("p2", MAC_OUT)]
    resumed = dp.stats()["workers_total"]["ct_resumed"]
    assert resumed >= 1
    assert send("p2", reply(tos=4), 5) == [("p1", MAC_IN)]  # commits the new {what}
    entry, = dp.conntrack()
    assert (entry.mark == 7) if what == "mark" else (entry.label == 0x10)
    assert send("p1", query, 6) == [("p2", "02:00:00:00:00:77")]
    assert send("p1", query, 7) == [("p2", "02:00:00:00:00:77")]
    assert dp.stats()["workers_total"]["ct_resumed"] == resumed + 1  # the new pass cached in its turn


def test_ct_resume_checks_the_echo_identifier_the_key_does_not_name():
    """Two pings from one host to one server with different identifiers have the same
    flow key (ICMP's is its type and code), so they share an EMC entry and its cached
    connection: the second identifier's request must still open a connection of its own,
    translated with its own identifier, not resume the first's."""
    dp, _ = ct_build(SNAT_GATEWAY_FLOWS, timeouts=CT_TIMEOUTS)
    dp._core.set_emc_insert_inv_prob(1)

    def ping(ident, seq):
        return _eth() / IP(src=C1, dst=S1) / ICMP(type=8, id=ident, seq=seq)

    def send(port, pkt, t):
        return [(o.port, ICMP(o.data[34:]).id) for o in dp.process([(port, bytes(pkt))], timestamps=[T0 + round(t * 1e9)])]

    assert send("p1", ping(1, 1), 0) == [("p2", 1)]
    assert send("p2", _eth(False) / IP(src=S1, dst=SNAT_IP) / ICMP(type=0, id=1, seq=1), 0.1) == [("p1", 1)]
    for i in range(3):
        assert send("p1", ping(1, 2 + i), 1 + i) == [("p2", 1)]
    assert dp.stats()["workers_total"]["ct_resumed"] >= 1
    assert send("p1", ping(2, 1), 5) == [("p2", 2)]
    assert sorted(str(c).split("id=")[1].split(",")[0] for c in dp.conntrack()) == ["1", "2"]


def test_ct_resume_never_uses_a_replaced_translation():
    """A worker caches a connection by its memory; when that memory holds a new
    connection with the same original tuple but another translation, the cached pass
    (whose key has the old translated port) is not used. The first connection leaves
    from another port than its own 40000 (held by another zone's connection to the same
    server), both expire, and the second leaves from 40000, which table 1 sends to p2:
    a packet resumed from the old cache would go to p4 (seen with the check removed)."""
    flows = [
        "table=0,priority=10,in_port=p3,ip,ct_state=-trk,actions=ct(table=1,zone=200,nat)",
        "table=0,priority=10,ip,ct_state=-trk,actions=ct(table=1,zone=100,nat)",
        "table=1,priority=10,in_port=p3,ip,ct_state=+trk+new,actions=ct(commit,zone=200,nat(src=203.0.113.10)),output:p2",
        "table=1,priority=10,in_port=p1,ip,ct_state=+trk+new,actions=ct(commit,zone=100,nat(src=203.0.113.10)),output:p2",
        "table=1,priority=20,in_port=p1,tcp,tp_src=40000,ct_state=+trk+est,actions=output:p2",
        "table=1,priority=10,in_port=p1,tcp,ct_state=+trk+est,actions=output:p4",
        "table=1,priority=10,in_port=p2,ip,ct_state=+trk+est+rpl,actions=output:p1",
        "table=1,priority=0,actions=drop(policy)",
    ]
    dp, _ = ct_build(flows, timeouts=CT_TIMEOUTS)
    dp._core.set_emc_insert_inv_prob(1)

    def send(port, pkt, t):
        return [(o.port, TCP(o.data[34:]).sport) for o in dp.process([(port, bytes(pkt))], timestamps=[T0 + round(t * 1e9)])]

    def server(dport, flags):
        return _eth(False) / IP(src=S1, dst=SNAT_IP) / TCP(sport=80, dport=dport, flags=flags, seq=5000, ack=1001)

    def data(t):
        return send("p1", _snat_tcp(True, "PA", 1001, 5001, b"c" * 10), t)

    assert send("p3", _eth() / IP(src=C2, dst=S1) / TCP(sport=40000, dport=80, flags="S"), 0) == [("p2", 40000)]
    (_, port1), = send("p1", _snat_tcp(True, "S", 1000), 0.1)
    assert port1 != 40000 and send("p2", server(port1, "SA"), 0.2) == [("p1", 80)]
    assert [data(1 + i) for i in range(4)] == [[("p4", port1)]] * 4
    assert dp.stats()["workers_total"]["ct_resumed"] >= 2
    # Past both connections' timeouts: expired, their memory freed (a few stages later).
    for i in range(4):
        assert send("p2", server(33333, "A"), 100 + i / 10) == []
    assert dp.conntrack() == []
    assert send("p1", _snat_tcp(True, "S", 1000), 101) == [("p2", 40000)]
    assert send("p2", server(40000, "SA"), 101.1) == [("p1", 80)]
    resumed = dp.stats()["workers_total"]["ct_resumed"]
    assert data(102) == [("p2", 40000)]
    assert dp.stats()["workers_total"]["ct_resumed"] == resumed
    assert data(103) == [("p2", 40000)]  # resumed: the new connection is cached in its turn
    assert dp.stats()["workers_total"]["ct_resumed"] == resumed + 1


def test_stopped_clock_moves_only_with_packets_and_warp():
    """Dataplane.stop_clock (ovs-appctl time/stop): wall time does not age a connection;
    packet timestamps and warp() do; once restarted, time goes on from where it stood."""
    dp, _ = ct_build(["table=0,ip,actions=ct(commit,table=1)", "table=1,actions=output:p2"], timeouts=CT_TIMEOUTS)
    dp.process([("p1", bytes(_eth() / IP(src=C1, dst=S1) / UDP(sport=40000, dport=53)))], timestamps=[T0])
    first = dp.conntrack()[0].expires_in
    time.sleep(0.3)  # not a wait for anything: wall time passes, and the stopped clock must not age it
    assert dp.conntrack()[0].expires_in == pytest.approx(first, abs=1e-6)
    dp.warp(10)
    assert dp.conntrack()[0].expires_in == pytest.approx(first - 10, abs=1e-6)
    t0 = time.monotonic()
    dp.stop_clock(False)
    time.sleep(0.3)  # the restarted clock runs
    left = dp.conntrack()[0].expires_in
    ran = time.monotonic() - t0
    # It goes on from where it stood: aged by about the time it has run since (at least 0.25 s
    # of the 0.3 slept), never by the time it stood still before (the first 0.3 s and more), not
    # a fixed bound that a loaded machine could pass.
    assert first - 10 - ran - 1e-3 <= left < first - 10 - 0.25   # 1 ms: rounding of expires_in


def test_ct_responder_first_segment_not_a_syn_ack():
    """docs "Protocols": a SYN's max_win is kept divided by its own scale (as pf and
    Open vSwitch). A responder whose first segment is data (seq 5000, 100 bytes) rather
    than the SYN-ACK opens its window with that max_win unshifted: the SYN offered 8192
    with scale 7, so a SYN-ACK retransmitted afterwards at seq 5000 lies 100 bytes below
    seqlo - 64 and is +inv. (Found by the random sequences: the core kept the SYN's window
    in bytes here and let it through.)"""
    flows = ["table=0,ipv6,ct_state=-trk,actions=ct(table=1)",
             "table=1,in_port=p1,ct_state=+trk+new,actions=ct(commit),output:p2",
             "table=1,in_port=p2,ct_state=+trk+est,actions=output:p1",
             "table=1,ct_state=+trk+inv,actions=drop(policy)"]
    c, s = INSIDE6[0], OUTSIDE6[0]
    syn = _eth() / IPv6(src=c, dst=s) / TCP(sport=40000, dport=53, flags="S", seq=1000, window=8192,
                                            options=[("NOP", None), ("WScale", 7)])
    data = _eth(False) / IPv6(src=s, dst=c) / TCP(sport=53, dport=40000, flags="PA", seq=5000, ack=1001) / Raw(b"d" * 100)
    synack = _eth(False) / IPv6(src=s, dst=c) / TCP(sport=53, dport=40000, flags="SA", seq=5000, ack=1001)
    dp, model, outs = ct_run(flows, [(0, "p1", syn), (0, "p2", data), (0, "p2", synack)])
    assert [[p for p, _ in o] for o in outs] == [["p2"], ["p1"], []]


@pytest.mark.parametrize("agreed", [False, True])
def test_ct_window_of_the_syn_is_not_scaled(agreed):
    """docs "Protocols": scaling applies once both SYNs carried the option; max_win is the
    largest window advertised. A SYN with window 512 and scale 2, answered with or without
    the option: the server may send 512 bytes; 600 is out of the window (+inv). (The core
    lets it send 2048.)"""
    flows = ["table=0,ip,actions=ct(commit,table=1)", "table=1,ct_state=+trk+inv,actions=output:p4",
             "table=1,ct_state=+trk-inv,actions=output:p3"]
    sa_opts = [("NOP", None), ("WScale", 1)] if agreed else []
    steps = [(0, "p1", _tcp(True, "S", 1000, window=512, options=[("NOP", None), ("WScale", 2)])),
             (0, "p2", _tcp(False, "SA", 5000, 1001, window=8192, options=sa_opts)),
             (1, "p2", _tcp(False, "PA", 5001, 1001, b"x" * 600, window=8192))]
    dp, model, outs = ct_run(flows, steps)
    assert outs[2][0][0] == "p4"


def test_ct_large_batches_match_the_model():
    """Batches of hundreds of tracked packets (a burst holds one input port's packets),
    as traffic arrives in live mode and replay:
    the conntrack stage runs several times within a pass (every 128 packets) and runs the
    next pass itself for packets whose megaflow after the ct is known (ct_continue); every
    output, counter and connection must still be what the model says, in batch order (a
    flow's ACK and its first data segment share a batch)."""
    dp, model = ct_build(SNAT_FLOWS, timeouts=CT_TIMEOUTS)
    n = 160

    def c2s(i, flags, seq, ack=0, data=b""):
        return _eth() / IP(src=C1, dst=S1) / TCP(sport=40000 + i, dport=80, flags=flags, seq=seq, ack=ack) / Raw(data)

    def s2c(i, flags, seq, ack, data=b""):
        return _eth(False) / IP(src=S1, dst=SNAT_IP) / TCP(sport=80, dport=40000 + i, flags=flags, seq=seq,
                                                          ack=ack) / Raw(data)

    batches = [
        [("p1", c2s(i, "S", 1000)) for i in range(n)],
        [("p2", s2c(i, "SA", 5000, 1001)) for i in range(n)],
        [pkt for i in range(n) for pkt in (("p1", c2s(i, "A", 1001, 5001)),
                                            ("p1", c2s(i, "PA", 1001, 5001, b"c" * 10)))],
        [("p2", s2c(i, "PA", 5001, 1011, b"s" * 20)) for i in range(n)],
        [("p1", c2s(i, "PA", 1011, 5021, b"c" * 10)) for i in range(n)],
    ]
    pkts: list = []
    results: list = []
    for k, batch in enumerate(batches):
        batch = [(port, bytes(p)) for port, p in batch]
        t = [T0 + k * 10**9] * len(batch)
        model.last_results = []
        exp = model.process(batch, timestamps=t)
        got = ct_check_batch(dp, model, batch, t, exp, pkts, results, f"batch {k} of {len(batch)} packets")
        if k >= 2:
            assert len(got) == len(batch)  # every established packet went through
    ct_compare_counters(dp, model, pkts, "large batches")
    ct_compare_table(dp, model, "large batches")
    st = dp.stats()["workers_total"]
    assert st["batches"] <= 10 and st["ct_hinted"] > 0, st
