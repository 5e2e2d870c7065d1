"""The differential tests' machinery: random rule sets and packets, and the
comparison of the native pipeline (dpu.Dataplane) with the reference model
(helpers/model.py).

Rule sets are ovs-ofctl text drawn from small value pools (so that rules and
packets meet); packets are bytes with mangled headers, truncations, fragments,
extension headers, VLAN and QinQ, ARP, LLC. ``build`` makes a fresh Dataplane and
Model from the same text, ``run_and_compare`` sends the same packets through both
and requires the same bytes on the same ports in the same order and the same
counters. Used by test_differential.py (the pipeline), test_ct_differential.py
(conntrack sequences) and test_ovs_compat.py (Open vSwitch as the oracle).
"""
from __future__ import annotations

import ipaddress
import logging
import os
from typing import List, Tuple

from hypothesis import HealthCheck, Phase
from hypothesis import note as _hnote
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.all import (  # noqa: E402
    ARP, ICMP, IP, LLC, SCTP, TCP, UDP, Dot1AD, Dot1Q, Dot3, Ether, ICMPv6DestUnreach, ICMPv6EchoReply,
    ICMPv6EchoRequest, IPOption_NOP, IPOption_RR, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, Raw,
)
from scapy.layers.ipsec import AH  # noqa: E402

from dpu import Dataplane  # noqa: E402
from .model import Model  # noqa: E402

PORTS = ["p1", "p2", "p3", "p4"]
TABLES = [0, 1, 2, 3]

SETTINGS = dict(
    deadline=None,
    # DPU_DIFF_NOSHRINK=1 reports the first failing example as found (faster while
    # investigating; shrunk examples are smaller but shrinking can take minutes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    + ([] if os.environ.get("DPU_DIFF_NOSHRINK") else [Phase.shrink]),
    # CI is deterministic; DPU_DIFF_RANDOM=1 explores new examples (for bug hunting).
    derandomize=not os.environ.get("DPU_DIFF_RANDOM"),
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)

# --------------------------------------------------------------------------------------
# Value pools (small, so that rules and packets meet)

MACS = ["02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03", "ff:ff:ff:ff:ff:ff",
        "01:00:5e:00:00:01"]
MAC_MASKS = ["ff:ff:ff:ff:ff:ff", "ff:ff:ff:ff:ff:00", "01:00:00:00:00:00", "fe:ff:ff:ff:ff:ff",
             "00:00:00:00:00:ff"]
IP4 = ["10.0.0.1", "10.0.0.2", "10.0.1.1", "192.168.1.1", "10.0.0.255"]
IP4_MASKS = ["", "/32", "/24", "/16", "/8", "/255.0.255.0", "/255.255.255.254", "/0.0.0.255", "/0"]
IP6 = ["2001:db8::1", "2001:db8::2", "2001:db8:1::1", "fe80::1"]
IP6_MASKS = ["", "/128", "/64", "/32", "/ffff:ffff::ffff", "/0:0:0:0:0:0:0:ff"]
TP = [53, 80, 443, 1024, 0, 8080]
TP_MASKS = [None, 0xFFFF, 0xFFF0, 0xFF00, 0x8000, 0x00FF]
TTLS = [0, 1, 2, 64, 255]
TOS = [0, 4, 0x10, 0xB8, 1, 3, 0xFE]
VIDS = [1, 5, 100]
PCPS = [0, 3, 7]
ICMP_TYPES = [0, 3, 8, 11]
ICMP6_TYPES = [1, 128, 129]
META = [0, 1, 5, 0xFF, 0x100]
REGV = [0, 1, 5, 0x10, 0xFFFF]
PRIORITIES = [0, 1, 10, 100, 100, 32768]
DROP_REASONS = ["policy", "spoofed", "isolation", "unroutable"]


def note(text: str) -> None:
    """hypothesis.note, also usable from the plain (non-hypothesis) tests."""
    try:
        _hnote(text)
    except InvalidArgument:
        pass


def _chance(draw, p: float) -> bool:
    """True with probability ``p``; hypothesis's simplest draw (0) gives False, so
    shrinking removes optional things instead of adding them."""
    return draw(st.integers(0, 999)) >= 1000 - round(p * 1000)


def _mac(draw):
    return draw(st.sampled_from(MACS))


def _h(v: int) -> str:
    return hex(v)


# --------------------------------------------------------------------------------------
# Rules


def _mint(name: str, v: int, m) -> str:
    return f"{name}={_h(v)}" if m is None else f"{name}={_h(v & m)}/{_h(m)}"


def _masked_ip(addr: str, suffix: str) -> str:
    """``addr`` with ``suffix`` (/prefix or /mask) applied: the core rejects a value
    with bits outside its mask (ovs-ofctl would clear them; see the report)."""
    if not suffix:
        return addr
    ip = ipaddress.ip_address(addr)
    width = ip.max_prefixlen
    m = suffix[1:]
    mask = (((1 << width) - 1) ^ ((1 << (width - int(m))) - 1)) if m.isdigit() else int(ipaddress.ip_address(m))
    return f"{type(ip)(int(ip) & mask)}{suffix}"


PROTO_CLASSES = ["any", "any", "ip", "tcp", "udp", "sctp", "icmp", "arp", "ipv6", "tcp6", "udp6", "sctp6",
                 "icmp6", "ethertype", "ipproto"]
V4 = {"ip", "tcp", "udp", "sctp", "icmp", "ipproto"}
V6 = {"ipv6", "tcp6", "udp6", "sctp6", "icmp6"}
L4 = {"tcp", "udp", "sctp", "tcp6", "udp6", "sctp6"}


@st.composite
def match_items(draw, cls: str) -> List[str]:
    items: List[str] = []
    if cls in ("ip", "tcp", "udp", "sctp", "icmp", "arp", "ipv6", "tcp6", "udp6", "sctp6", "icmp6"):
        items.append(cls)
    elif cls == "ethertype":
        items.append("dl_type=" + draw(st.sampled_from(["0x88b5", "0x0800", "0x86dd", "0x0806", "0x05ff", "0x8100"])))
    elif cls == "ipproto":
        items += ["ip", "nw_proto=" + str(draw(st.sampled_from([47, 99, 6, 17, 1])))]
    opt = lambda p=0.3: _chance(draw, p)  # noqa: E731
    if opt(0.25):
        items.append("in_port=" + draw(st.sampled_from(PORTS)))
    for f in ("dl_src", "dl_dst"):
        if opt(0.2):
            v = _mac(draw)
            if opt(0.5):
                m = draw(st.sampled_from(MAC_MASKS))
                vi = int(v.replace(":", ""), 16) & int(m.replace(":", ""), 16)
                v = ":".join(f"{b:02x}" for b in vi.to_bytes(6, "big")) + "/" + m
            items.append(f"{f}={v}")
    if opt(0.25):
        items.append(draw(st.sampled_from([
            "dl_vlan=0xffff", f"dl_vlan={draw(st.sampled_from(VIDS))}", f"dl_vlan_pcp={draw(st.sampled_from(PCPS))}",
            "vlan_tci=0x1000/0x1000", "vlan_tci=0", f"vlan_tci={0x1000 | draw(st.sampled_from(VIDS))}/0x1fff",
            "vlan_tci=0x6000/0xe000",
        ])))
    if opt(0.15):
        items.append(_mint("metadata", draw(st.sampled_from(META)), draw(st.sampled_from([None, 0xFF, 0xF0F]))))
    for _ in range(draw(st.integers(0, 2)) if opt(0.3) else 0):
        r = draw(st.integers(0, 7))
        if not any(i.startswith(f"reg{r}=") for i in items):
            items.append(_mint(f"reg{r}", draw(st.sampled_from(REGV)), draw(st.sampled_from([None, 0xF, 0xFF00]))))
    if cls in V4 or cls == "arp":
        for f in ("nw_src", "nw_dst") if cls != "arp" else ("arp_spa", "arp_tpa"):
            if opt(0.3):
                items.append(f"{f}={_masked_ip(draw(st.sampled_from(IP4)), draw(st.sampled_from(IP4_MASKS)))}")
    if cls in V6:
        for f in ("ipv6_src", "ipv6_dst"):
            if opt(0.3):
                items.append(f"{f}={_masked_ip(draw(st.sampled_from(IP6)), draw(st.sampled_from(IP6_MASKS)))}")
    if cls in V4 or cls in V6:
        if opt(0.15):
            items.append(draw(st.sampled_from([
                f"nw_tos={draw(st.sampled_from([0, 4, 0x10, 0xb8]))}", f"ip_dscp={draw(st.sampled_from([0, 1, 4, 46]))}",
                f"nw_ecn={draw(st.integers(0, 3))}"])))
        if opt(0.15):
            items.append(f"nw_ttl={draw(st.sampled_from(TTLS))}")
        if opt(0.2):
            # (a later fragment has no ports: L4 fields and writes need it not to be one)
            frags = ["no", "yes", "first", "not_later"] + ([] if cls in L4 else ["later"])
            items.append("nw_frag=" + draw(st.sampled_from(frags)))
    if cls in L4:
        pfx = draw(st.sampled_from(["tp", cls.rstrip("6")]))
        for f in ("src", "dst"):
            if opt(0.35):
                v = draw(st.sampled_from(TP))
                m = draw(st.sampled_from(TP_MASKS))
                items.append(f"{pfx}_{f}={v}" if m is None else f"{pfx}_{f}={_h(v & m)}/{_h(m)}")
        if cls.startswith("tcp") and opt(0.15):
            items.append("tcp_flags=" + draw(st.sampled_from(["+syn-ack", "+ack", "-syn", "0x002/0x012", "+fin"])))
    if cls == "icmp":
        if opt(0.4):
            items.append(f"icmp_type={draw(st.sampled_from(ICMP_TYPES))}")
        if opt(0.2):
            items.append(f"icmp_code={draw(st.sampled_from([0, 1]))}")
    if cls == "icmp6":
        if opt(0.4):
            items.append(f"icmpv6_type={draw(st.sampled_from(ICMP6_TYPES))}")
        if opt(0.2):
            items.append("icmpv6_code=0")
    if cls == "arp":
        if opt(0.3):
            items.append(f"arp_op={draw(st.sampled_from([1, 2]))}")
        for f in ("arp_sha", "arp_tha"):
            if opt(0.2):
                items.append(f"{f}={_mac(draw)}")
    return items


def _port(draw) -> str:
    p = draw(st.sampled_from(PORTS))
    return p if draw(st.booleans()) else str(PORTS.index(p) + 1)


@st.composite
def set_action(draw, cls: str, in_bucket: bool = False) -> str:
    """A header or metadata rewrite that the flow's match makes legal."""
    choices = ["mod_dl", "set_eth", "load_reg", "set_reg", "write_meta", "move_reg", "move_eth", "mod_nw",
               "mod_tos", "mod_tp", "vlan", "vlan", "dec_ttl", "note"]
    if not in_bucket:
        if cls in V4:
            choices += ["set_ip", "set_ip", "set_ttl", "set_dscp", "move_ip"]
        if cls in V6:
            choices += ["set_ip6", "set_ip6", "set_ttl", "set_dscp"]
        if cls in L4:
            choices += ["set_tp", "set_tp", "move_tp"]
        if cls == "arp":
            choices += ["set_arp", "set_arp"]
    c = draw(st.sampled_from(choices))
    r = lambda: draw(st.integers(0, 7))  # noqa: E731
    if c == "mod_dl":
        return f"mod_dl_{draw(st.sampled_from(['src', 'dst']))}:{_mac(draw)}"
    if c == "set_eth":
        v, m = _mac(draw), draw(st.sampled_from(MAC_MASKS + [None]))
        if m is None:
            return f"set_field:{v}->eth_{draw(st.sampled_from(['src', 'dst']))}"
        vi = int(v.replace(":", ""), 16) & int(m.replace(":", ""), 16)
        v = ":".join(f"{b:02x}" for b in vi.to_bytes(6, "big"))
        return f"set_field:{v}/{m}->eth_{draw(st.sampled_from(['src', 'dst']))}"
    if c == "load_reg":
        a = draw(st.integers(0, 24))
        b = draw(st.integers(a, 31))
        name = draw(st.sampled_from([f"NXM_NX_REG{r()}", f"reg{r()}", "OXM_OF_METADATA", "metadata"]))
        return f"load:{_h(draw(st.sampled_from(REGV)) & ((1 << (b - a + 1)) - 1))}->{name}[{a}..{b}]"
    if c == "set_reg":
        return f"set_field:{_h(draw(st.sampled_from(REGV)))}->reg{r()}"
    if c == "write_meta":
        return _mint("write_metadata", draw(st.sampled_from(META)), draw(st.sampled_from([None, 0xFF, 0xF0F0]))).replace("=", ":")
    if c == "move_reg":
        n = draw(st.integers(1, 16))
        a, b = draw(st.integers(0, 32 - n)), draw(st.integers(0, 32 - n))
        return f"move:NXM_NX_REG{r()}[{a}..{a + n - 1}]->NXM_NX_REG{r()}[{b}..{b + n - 1}]"
    if c == "move_eth":
        if draw(st.booleans()):
            return f"move:NXM_OF_ETH_SRC[0..15]->NXM_NX_REG{r()}[0..15]"
        return f"move:NXM_NX_REG{r()}[0..15]->NXM_OF_ETH_DST[0..15]"
    if c == "mod_nw":
        return f"mod_nw_{draw(st.sampled_from(['src', 'dst']))}:{draw(st.sampled_from(IP4))}"
    if c == "mod_tos":
        return f"mod_nw_tos:{draw(st.sampled_from([0, 4, 0x10, 0xb8, 0xfc]))}"
    if c == "mod_tp":
        return f"mod_tp_{draw(st.sampled_from(['src', 'dst']))}:{draw(st.sampled_from(TP))}"
    if c == "vlan":
        return draw(st.sampled_from([
            "push_vlan:0x8100", "push_vlan:0x88a8", "pop_vlan", "strip_vlan",
            f"mod_vlan_vid:{draw(st.sampled_from(VIDS))}", f"mod_vlan_pcp:{draw(st.sampled_from(PCPS))}"]))
    if c == "dec_ttl":
        return "dec_ttl"
    if c == "note":
        return "note:" + draw(st.sampled_from(["aa", "0102", "deadbeef"]))
    if c == "set_ip":
        f = draw(st.sampled_from(["ip_src", "ip_dst", "nw_src", "nw_dst"]))
        if draw(st.booleans()):
            return f"set_field:{draw(st.sampled_from(IP4))}->{f}"
        nm = {"ip_src": "NXM_OF_IP_SRC", "nw_src": "NXM_OF_IP_SRC"}.get(f, "NXM_OF_IP_DST")
        return f"load:{_h(draw(st.sampled_from([0x0a000001, 0x0a000102, 0xc0a80101])))}->{nm}[]"
    if c == "move_ip":
        if draw(st.booleans()):
            return f"move:NXM_OF_IP_SRC[]->NXM_NX_REG{r()}[]"
        return f"move:NXM_NX_REG{r()}[0..7]->NXM_OF_IP_DST[0..7]"
    if c == "set_ttl":
        return f"set_field:{draw(st.sampled_from([1, 2, 64]))}->nw_ttl"
    if c == "set_dscp":
        return f"set_field:{draw(st.sampled_from([0, 1, 46, 63]))}->ip_dscp"
    if c == "set_ip6":
        return f"set_field:{draw(st.sampled_from(IP6))}->ipv6_{draw(st.sampled_from(['src', 'dst']))}"
    if c == "set_tp":
        proto = cls.rstrip("6")
        f = draw(st.sampled_from(["src", "dst"]))
        if proto in ("tcp", "udp") and draw(st.booleans()):
            return f"load:{draw(st.sampled_from(TP))}->NXM_OF_{proto.upper()}_{f.upper()}[]"
        return f"set_field:{draw(st.sampled_from(TP))}->{proto}_{f}"
    if c == "move_tp":
        proto = cls.rstrip("6")
        if proto in ("tcp", "udp"):
            return f"move:NXM_NX_REG{r()}[0..15]->NXM_OF_{proto.upper()}_DST[]"
        return f"move:NXM_NX_REG{r()}[0..15]->NXM_NX_REG{r()}[16..31]"
    if c == "set_arp":
        f = draw(st.sampled_from(["arp_spa", "arp_tpa", "arp_sha", "arp_tha"]))
        v = draw(st.sampled_from(IP4)) if f in ("arp_spa", "arp_tpa") else _mac(draw)
        return f"set_field:{v}->{f}"
    raise AssertionError(c)


@st.composite
def action_list(draw, cls: str, table: int, groups: List[int], in_bucket: bool = False) -> str:
    if not in_bucket:
        special = draw(st.integers(0, 19))
        if special == 19:
            return "drop"
        if special == 18:
            return f"drop({draw(st.sampled_from(DROP_REASONS))})"
    acts: List[str] = []
    for _ in range(draw(st.integers(0 if in_bucket else 1, 5))):
        k = draw(st.integers(0, 9))
        if k <= 3:
            acts.append(draw(set_action(cls, in_bucket)))
        elif k <= 5:
            acts.append(draw(st.sampled_from(["output:", "output:", "output:", ""])) + _port(draw)
                        if draw(st.integers(0, 5)) else draw(st.sampled_from(["in_port", "flood", "all"])))
        elif k <= 7:
            later = [x for x in TABLES if x > table]
            t = draw(st.sampled_from(later)) if later and not _chance(draw, 0.12) else draw(st.sampled_from(TABLES))
            acts.append(draw(st.sampled_from([f"resubmit(,{t})", f"resubmit({draw(st.sampled_from(PORTS))},{t})",
                                              f"resubmit({draw(st.sampled_from(PORTS))},{t})",
                                              f"resubmit:{draw(st.sampled_from(PORTS))}"])))
        elif k == 8 and groups:
            acts.append(f"group:{draw(st.sampled_from(groups))}")
        else:
            acts.append("output:" + _port(draw))
    acts = [a for a in acts if a.startswith(("output:", "in_port", "flood", "all", "resubmit", "group", "mod_",
                                                  "set_field", "load", "move", "write_metadata", "push_vlan",
                                                  "pop_vlan", "strip_vlan", "dec_ttl", "note"))
            or a in PORTS or a.isdigit()]
    if _chance(draw, 0.5):
        # rewrites first, so that more of them are seen in the packets sent
        acts.sort(key=lambda a: not a.startswith(("mod_", "set_field", "load", "move", "dec_ttl", "push_vlan",
                                                  "pop_vlan", "strip_vlan")))
    if in_bucket:
        # resubmit:port needs the current table; keep buckets to explicit tables
        acts = [a for a in acts if not a.startswith("resubmit:")]
        return ",".join(acts) if acts else ""
    if table < TABLES[-1] and _chance(draw, 1 / 4):
        acts.append(f"goto_table:{draw(st.integers(table + 1, TABLES[-1]))}")
    return ",".join(acts) if acts else "drop"


@st.composite
def group_text(draw, gid: int) -> str:
    gtype = draw(st.sampled_from(["select", "select", "all", "indirect"]))
    if gtype == "indirect":
        n = 1
    elif gtype == "select":
        n = draw(st.integers(0, 3)) if _chance(draw, 1 / 8) else draw(st.integers(1, 3))
    else:
        n = draw(st.integers(1, 3))
    parts = [f"group_id={gid}", f"type={gtype}"]
    for _ in range(n):
        acts = draw(action_list("any", 0, [], in_bucket=True))
        if not acts:
            acts = "output:" + _port(draw)
        if gtype == "select":
            parts.append(f"bucket=weight:{draw(st.integers(1, 3))},actions={acts}")
        else:
            parts.append(f"bucket=actions={acts}" if draw(st.booleans()) else f"bucket={acts}")
    return ",".join(parts)


@st.composite
def rule_text(draw, cookie: int, groups: List[int]) -> str:
    table = draw(st.sampled_from(TABLES + [0, 0]))
    cls = draw(st.sampled_from(PROTO_CLASSES))
    items = [f"table={table}", f"priority={draw(st.sampled_from(PRIORITIES))}", f"cookie={_h(cookie)}"]
    items += draw(match_items(cls))
    return ",".join(items) + ",actions=" + draw(action_list(cls, table, groups))


@st.composite
def rule_sets(draw, max_rules: int = 12) -> Tuple[List[str], List[str]]:
    ngroups = draw(st.integers(0, 3))
    groups = [draw(group_text(g)) for g in range(1, ngroups + 1)]
    gids = list(range(1, ngroups + 1))
    n = draw(st.integers(1, max_rules))
    flows = [draw(rule_text(i + 1, gids)) for i in range(n)]
    # catch-all rules, so that most packets get somewhere
    for t in TABLES:
        if _chance(draw, 0.7 if t == 0 else 0.3):
            flows.append(f"table={t},priority=0,cookie={_h(500 + t)},actions=" + draw(action_list("any", t, gids)))
    # sometimes re-add a rule's match and priority with new actions (replacement)
    if flows and _chance(draw, 1 / 6):
        victim = draw(st.sampled_from(flows))
        head = victim.split(",actions=")[0].split(",")
        head = [h if not h.startswith("cookie=") else f"cookie={_h(1000 + n)}" for h in head]
        flows.append(",".join(head) + ",actions=output:" + _port(draw))
    return groups, flows


# --------------------------------------------------------------------------------------
# Packets


@st.composite
def l4_v4(draw, proto: str):
    pay = Raw(b"x" * draw(st.sampled_from([0, 4, 20])))
    sport, dport = draw(st.sampled_from(TP)), draw(st.sampled_from(TP))
    if proto == "tcp":
        opts = draw(st.sampled_from([[], [], [("MSS", 1460)], [("NOP", None), ("NOP", None), ("WScale", 7)]]))
        t = TCP(sport=sport, dport=dport, flags=draw(st.sampled_from(["S", "SA", "A", "F", "R", "PA"])), options=opts)
        if _chance(draw, 1 / 10):
            t.chksum = draw(st.integers(0, 0xFFFF))
        return t / pay
    if proto == "udp":
        u = UDP(sport=sport, dport=dport)
        if _chance(draw, 1 / 4):
            u.chksum = 0
        return u / pay
    if proto == "sctp":
        return SCTP(sport=sport, dport=dport) / pay
    if proto == "icmp":
        return ICMP(type=draw(st.sampled_from(ICMP_TYPES)), code=draw(st.sampled_from([0, 1]))) / pay
    return pay


@st.composite
def packet_bytes(draw, vlan_fixed=None) -> bytes:
    """A packet; ``vlan_fixed`` ("untagged" or a (vid, pcp, tpid) tag) forces its
    802.1Q state (see VLAN_ACTIONS)."""
    kind = draw(st.sampled_from(["tcp", "udp", "sctp", "icmp", "ipproto", "tcp", "udp",
                                 "tcp6", "udp6", "sctp6", "icmp6", "ip6proto",
                                 "arp", "arp", "ethertype", "llc", "qinq"]))
    eth = Ether(src=_mac(draw), dst=_mac(draw))
    vlan = None
    if _chance(draw, 1 / 4):
        vlan = (draw(st.sampled_from(VIDS + [0])), draw(st.sampled_from(PCPS)), draw(st.sampled_from([0x8100, 0x88a8])))
    if vlan_fixed is not None:
        vlan = None if vlan_fixed == "untagged" else vlan_fixed
        if kind in ("qinq", "llc"):
            kind = "udp"
    if kind in ("tcp", "udp", "sctp", "icmp", "ipproto"):
        ip = IP(src=draw(st.sampled_from(IP4)), dst=draw(st.sampled_from(IP4)), ttl=draw(st.sampled_from(TTLS)),
                tos=draw(st.sampled_from(TOS)))
        frag = draw(st.sampled_from(["none", "none", "none", "df", "first", "later", "last"]))
        if frag == "df":
            ip.flags = "DF"
        elif frag == "first":
            ip.flags = "MF"
        elif frag == "later":
            ip.flags, ip.frag = "MF", 3
        elif frag == "last":
            ip.frag = 5
        if _chance(draw, 1 / 6):
            ip.options = draw(st.sampled_from([[IPOption_NOP()] * 4, [IPOption_RR(routers=["10.0.0.9"])]]))
        if kind == "ipproto":
            ip.proto = draw(st.sampled_from([47, 99, 50]))
        l3 = ip / draw(l4_v4(kind))
        if _chance(draw, 1 / 13):
            l3.chksum = draw(st.integers(0, 0xFFFF))
    elif kind in ("tcp6", "udp6", "sctp6", "icmp6", "ip6proto"):
        ip6 = IPv6(src=draw(st.sampled_from(IP6)), dst=draw(st.sampled_from(IP6)), hlim=draw(st.sampled_from(TTLS)),
                   tc=draw(st.sampled_from(TOS)))
        l3 = ip6
        ext = draw(st.lists(st.sampled_from(["hbh", "dst", "rt", "frag0", "fragN", "atomic", "ah"]), max_size=2))
        for e in ext:
            l3 = l3 / {
                "hbh": IPv6ExtHdrHopByHop(),
                "dst": IPv6ExtHdrDestOpt(),
                "rt": IPv6ExtHdrRouting(addresses=[]),
                "frag0": IPv6ExtHdrFragment(offset=0, m=1, id=7),
                "fragN": IPv6ExtHdrFragment(offset=draw(st.sampled_from([1, 100])), m=draw(st.integers(0, 1)), id=7),
                "atomic": IPv6ExtHdrFragment(offset=0, m=0, id=7),
                "ah": AH(spi=1, seq=1, icv=b"\0" * 12, payloadlen=4),
            }[e]
        pay = Raw(b"y" * draw(st.sampled_from([0, 4, 20])))
        sport, dport = draw(st.sampled_from(TP)), draw(st.sampled_from(TP))
        if kind == "tcp6":
            l4 = TCP(sport=sport, dport=dport, flags=draw(st.sampled_from(["S", "SA", "A"])))
        elif kind == "udp6":
            l4 = UDP(sport=sport, dport=dport)
        elif kind == "sctp6":
            l4 = SCTP(sport=sport, dport=dport)
        elif kind == "icmp6":
            l4 = draw(st.sampled_from([ICMPv6EchoRequest(id=1, seq=2), ICMPv6EchoReply(), ICMPv6DestUnreach()]))
        else:
            l4 = None
        if l4 is None:
            # an unknown next header
            last = l3
            while last.payload:
                last = last.payload
            last.nh = 99
            l3 = l3 / pay
        else:
            l3 = l3 / l4 / pay
    elif kind == "arp":
        l3 = ARP(op=draw(st.sampled_from([1, 2, 3])), psrc=draw(st.sampled_from(IP4)), pdst=draw(st.sampled_from(IP4)),
                 hwsrc=_mac(draw), hwdst=draw(st.sampled_from(MACS + ["00:00:00:00:00:00"])))
    elif kind == "ethertype":
        etype = draw(st.sampled_from([0x88B5, 0x9000, 0x88CC]))
        l3 = Raw(b"z" * draw(st.sampled_from([0, 10, 46])))
    elif kind == "qinq":
        l3 = Dot1Q(vlan=draw(st.sampled_from(VIDS))) / IP(src=IP4[0], dst=IP4[1]) / UDP(sport=53, dport=80)
        vlan = (draw(st.sampled_from(VIDS)), 0, 0x88A8)
    if kind == "llc":
        pkt = Dot3(src=_mac(draw), dst=_mac(draw)) / LLC() / Raw(b"w" * draw(st.sampled_from([3, 40])))
    elif vlan is not None:
        tag = (Dot1Q if vlan[2] == 0x8100 else Dot1AD)(vlan=vlan[0], prio=vlan[1])
        if kind == "ethertype":
            tag.type = etype
        pkt = eth / tag / l3
    else:
        if kind == "ethertype":
            eth.type = etype
        pkt = eth / l3
    data = bytes(pkt)
    if _chance(draw, 1 / 10) and len(data) > 20:
        # a mangled header byte (IHL, lengths, offsets, next headers, TCP data offset, ...)
        pos = draw(st.integers(14 if vlan_fixed is None else 18, min(len(data), 80) - 1))
        val = draw(st.sampled_from([0, 1, 4, 5, 6, 0x40, 0x45, 0x4F, 0x60, 0xFF]))
        data = data[:pos] + bytes([val]) + data[pos + 1:]
    if _chance(draw, 1 / 8):
        data += b"\0" * draw(st.sampled_from([2, 6]))  # Ethernet padding after the IP datagram
    if _chance(draw, 1 / 6):
        # truncated capture (keeping a forced 802.1Q state whole)
        lo = 0 if vlan_fixed is None else min(14 if vlan_fixed == "untagged" else 18, len(data))
        data = data[: draw(st.integers(lo, len(data)))]
    return data


inputs = st.lists(st.tuples(st.sampled_from(PORTS), packet_bytes()), min_size=1, max_size=6)

# Known core bug (test_vlan_actions_megaflow_ignores_tci): the megaflow built for a
# rule with VLAN actions does not match on the packet's VLAN TCI, so a later packet
# with another TCI (or none) gets the first packet's VLAN rewrite. Until that is
# fixed, an example whose rules use VLAN actions sends packets that all have the
# same 802.1Q state; the actions themselves are still tested on tagged and untagged
# packets, and every other header still varies.
VLAN_ACTIONS = ("push_vlan", "pop_vlan", "strip_vlan", "mod_vlan_vid", "mod_vlan_pcp")


@st.composite
def inputs_for(draw, rules):
    groups, flows = rules
    if not any(a in text for text in groups + flows for a in VLAN_ACTIONS):
        return draw(inputs)
    texts = groups + flows
    if any(a in t for t in texts for a in ("pop_vlan", "strip_vlan")) and \
            any(a in t for t in texts for a in ("push_vlan", "mod_vlan_vid", "mod_vlan_pcp")):
        # Known core bug (test_push_after_popping_the_received_tag_uses_the_new_tpid): a tag
        # pushed after popping the received one gets the received TPID.
        vlan = "untagged"
    else:
        vlan = draw(st.sampled_from(["untagged", "untagged"] + [(v, p, t) for v in VIDS + [0] for p in PCPS
                                                                for t in (0x8100, 0x88A8)]))
    return draw(st.lists(st.tuples(st.sampled_from(PORTS), packet_bytes(vlan)), min_size=1, max_size=6))


# --------------------------------------------------------------------------------------
# Comparison


def _show(data: bytes) -> str:
    try:
        return Ether(data).show2(dump=True)
    except Exception as e:  # pragma: no cover - scapy may not dissect garbage
        return f"<scapy could not dissect: {e}> {data.hex()}"


def _describe(groups, flows, pkts) -> str:
    lines = ["groups:"] + [f"  {g}" for g in groups] + ["flows:"] + [f"  {f}" for f in flows]
    lines.append("packets:")
    for i, (p, d) in enumerate(pkts):
        lines.append(f"  [{i}] in_port={p} {d.hex()}")
    return "\n".join(lines)


def _per_port(outs):
    """Outputs grouped by (input index, port), each group in emission order
    (used only to line up the diff shown on a failure)."""
    d = {}
    for i, p, data in outs:
        d.setdefault((i, p), []).append(data)
    return d


def compare_outputs(got, exp, model: Model, pkts, context: str, strict_order: bool = True) -> None:
    g = [(o.index, o.port, o.data) for o in got]
    e = [(i, p, d) for p, d, i in exp]
    if g == e or (not strict_order and _per_port(g) == _per_port(e)):
        return
    if not strict_order:
        # present both in the model's order so that the diff below lines up
        order = {k: n for n, k in enumerate(dict.fromkeys((i, p) for i, p, _ in e))}
        g = sorted(g, key=lambda o: (o[0], order.get((o[0], o[1]), len(order))))
    msg = [context, "", "OUTPUTS DIFFER"]
    for idx, (inp, data) in enumerate(pkts):
        gi = [(p, d) for i, p, d in g if i == idx]
        ei = [(p, d) for i, p, d in e if i == idx]
        if gi == ei:
            continue
        msg.append(f"--- input [{idx}] from {inp} ({len(data)} bytes):")
        msg.append(_show(data))
        msg.append("model walk:\n  " + "\n  ".join(model.last_results[idx].log))
        msg.append(f"expected {[p for p, _ in ei]}, got {[p for p, _ in gi]}")
        for k in range(max(len(gi), len(ei))):
            ep = ei[k] if k < len(ei) else None
            gp = gi[k] if k < len(gi) else None
            if ep == gp:
                continue
            msg.append(f"  output #{k}: expected port {ep and ep[0]}, got port {gp and gp[0]}")
            if ep:
                msg.append("  EXPECTED " + ep[1].hex() + "\n" + _show(ep[1]))
            if gp:
                msg.append("  GOT      " + gp[1].hex() + "\n" + _show(gp[1]))
        break
    raise AssertionError("\n".join(msg))


def compare_counters(dp: Dataplane, model: Model, pkts, context: str) -> None:
    problems = []
    stats = dp.stats()
    for name in PORTS:
        g = stats["ports"][name]
        e = model.port_stats[name]
        for k in ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "dropped"):
            if g[k] != e[k]:
                problems.append(f"port {name} {k}: expected {e[k]}, got {g[k]}")
        gd = {r: n for r, n in g["drops"].items() if n}
        if gd != e["drops"]:
            problems.append(f"port {name} drops: expected {e['drops']}, got {gd}")
    gt = {t["table"]: (t["lookups"], t["matches"]) for t in stats["tables"] if t["lookups"]}
    et = {t: tuple(v) for t, v in model.table_stats.items() if v[0]}
    if gt != et:
        problems.append(f"tables (lookups, matches): expected {et}, got {gt}")
    ga = {t["table"]: t["active"] for t in stats["tables"] if t["active"]}
    ea = {t: len(rules) for t, rules in model.tables.items() if rules}
    if ga != ea:
        problems.append(f"tables (active flows): expected {ea}, got {ga}")
    gf = sorted((f.table, f.priority, f.cookie, f.n_packets, f.n_bytes) for f in dp.dump_flows())
    ef = sorted((f["table"], f["priority"], f["cookie"], f["n_packets"], f["n_bytes"]) for f in model.flow_stats())
    if gf != ef:
        problems.append("flows (table, priority, cookie, n_packets, n_bytes):\n  expected "
                        + str(ef) + "\n  got      " + str(gf))
    if problems:
        lines = [context, "", "COUNTERS DIFFER:"] + ["  " + p for p in problems]
        for idx, r in enumerate(model.last_results):
            inp, data = pkts[idx]
            try:
                tr = dp.trace(data, inp).drop_reason
            except Exception as ex:  # pragma: no cover
                tr = f"<trace failed: {ex}>"
            lines.append(f"  [{idx}] model drop reason {r.drop_reason}, core trace drop reason {tr};"
                         f" walk: {' | '.join(r.log)}")
        raise AssertionError("\n".join(lines))


def build(groups, flows) -> Tuple[Dataplane, Model]:
    dp = Dataplane(ports=PORTS)
    model = Model(PORTS)
    with dp.transaction() as t:
        for g in groups:
            t.add_group(g)
        t.add_flows(flows)
    for g in groups:
        model.add_group(g)
    model.add_flows(flows)
    return dp, model


def run_and_compare(dp, model, pkts, context, strict_order=True):
    got = dp.process(list(pkts))
    exp = model.process(list(pkts))
    compare_outputs(got, exp, model, pkts, context, strict_order)
    compare_counters(dp, model, pkts, context)
    return got
