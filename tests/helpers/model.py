"""An independent reference model of the dpu flow pipeline.

Written from the contract in README.md ("Flow syntax and semantics", "Where dpu
differs from Open vSwitch", "Hashes", "Counters") and Open vSwitch's documented
semantics (ovs-fields(7), ovs-actions(7), ovs-ofctl(8)) -- not from the C++ core.
It is deliberately simple and slow: a packet is a bytearray plus a dict "key"
(the fields the pipeline matches on), and every action edits both.

It understands the subset of ovs-ofctl flow syntax that the differential tests
generate (tests/test_differential.py); the flow *text* is the interface between
the generator, the core and this model.

Where the README leaves a choice open, the reading taken is written next to the
code as "READING:" so that a disagreement with the core is easy to judge.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# --------------------------------------------------------------------------------------
# Constants from the README

MAX_RESUBMIT_DEPTH = 64
MAX_RESUBMITS = 4096

ETH_IP, ETH_IPV6, ETH_ARP, ETH_RARP = 0x0800, 0x86DD, 0x0806, 0x8035
VLAN_TPIDS = (0x8100, 0x88A8)
DL_TYPE_NONE = 0x05FF  # 802.3 length frames
VLAN_CFI = 0x1000  # "tag present" bit of vlan_tci in the key

IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP, IPPROTO_ICMPV6 = 1, 6, 17, 132, 58
IPV6_EXT_GENERIC = (0, 43, 60)  # hop-by-hop, routing, destination options
IPV6_FRAGMENT, IPV6_AH = 44, 51

FRAG_ANY, FRAG_LATER = 1, 2

KEY_WIDTH: Dict[str, int] = {
    "in_port": 32,
    "metadata": 64,
    **{f"reg{i}": 32 for i in range(8)},
    "dl_src": 48,
    "dl_dst": 48,
    "dl_type": 16,
    "vlan_tci": 16,
    "nw_src": 32,  # IPv4 source, or ARP SPA
    "nw_dst": 32,  # IPv4 destination, or ARP TPA
    "ipv6_src": 128,
    "ipv6_dst": 128,
    "nw_proto": 8,  # IP protocol, or the ARP opcode
    "nw_tos": 8,  # the whole ToS / traffic-class byte (DSCP << 2 | ECN)
    "nw_ttl": 8,
    "nw_frag": 2,
    "tp_src": 16,  # TCP/UDP/SCTP only
    "tp_dst": 16,
    "tcp_flags": 12,
    "icmp_type": 8,
    "icmp_code": 8,
    "icmpv6_type": 8,
    "icmpv6_code": 8,
    "arp_sha": 48,
    "arp_tha": 48,
    # docs/conntrack.md "What a packet knows after ct" (0 before any ct: -trk)
    "ct_state": 8,
    "ct_zone": 16,
    "ct_mark": 32,
    "ct_label": 128,
    "ct_nw_src": 32,
    "ct_nw_dst": 32,
    "ct_ipv6_src": 128,
    "ct_ipv6_dst": 128,
    "ct_nw_proto": 8,
    "ct_tp_src": 16,
    "ct_tp_dst": 16,
}


def _full(width: int) -> int:
    return (1 << width) - 1


# --------------------------------------------------------------------------------------
# Value syntax


def parse_mac(s: str) -> int:
    parts = s.split(":")
    if len(parts) != 6:
        raise ValueError(f"bad MAC {s!r}")
    return int("".join(p.zfill(2) for p in parts), 16)


def fmt_mac(v: int) -> str:
    return ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))


def parse_ipv4(s: str) -> int:
    return int(ipaddress.IPv4Address(s))


def parse_ipv6(s: str) -> int:
    return int(ipaddress.IPv6Address(s))


def parse_value(text: str, kind: str, width: int) -> Tuple[int, int]:
    """(value, mask) of a match value ``v[/m]``; addresses also take ``/prefix``."""
    full = _full(width)
    if "/" in text:
        vs, ms = text.split("/", 1)
    else:
        vs, ms = text, None
    if kind == "mac":
        v = parse_mac(vs)
        m = full if ms is None else parse_mac(ms)
    elif kind in ("ipv4", "ipv6"):
        conv = parse_ipv4 if kind == "ipv4" else parse_ipv6
        v = conv(vs)
        if ms is None:
            m = full
        elif ms.isdigit():
            plen = int(ms)
            m = (full << (width - plen)) & full
        else:
            m = conv(ms)
    else:
        v = int(vs, 0)
        m = full if ms is None else int(ms, 0)
    return v & m, m


# --------------------------------------------------------------------------------------
# Match fields (ovs-fields(7) names -> key field)

# name -> (key field, value kind)
SIMPLE_MATCH = {
    "dl_src": ("dl_src", "mac"),
    "eth_src": ("dl_src", "mac"),
    "dl_dst": ("dl_dst", "mac"),
    "eth_dst": ("dl_dst", "mac"),
    "dl_type": ("dl_type", "int"),
    "eth_type": ("dl_type", "int"),
    "vlan_tci": ("vlan_tci", "int"),
    "nw_src": ("nw_src", "ipv4"),
    "ip_src": ("nw_src", "ipv4"),
    "nw_dst": ("nw_dst", "ipv4"),
    "ip_dst": ("nw_dst", "ipv4"),
    "arp_spa": ("nw_src", "ipv4"),
    "arp_tpa": ("nw_dst", "ipv4"),
    "nw_proto": ("nw_proto", "int"),
    "ip_proto": ("nw_proto", "int"),
    "arp_op": ("nw_proto", "int"),
    "nw_ttl": ("nw_ttl", "int"),
    "tp_src": ("tp_src", "int"),
    "tp_dst": ("tp_dst", "int"),
    "tcp_src": ("tp_src", "int"),
    "tcp_dst": ("tp_dst", "int"),
    "udp_src": ("tp_src", "int"),
    "udp_dst": ("tp_dst", "int"),
    "sctp_src": ("tp_src", "int"),
    "sctp_dst": ("tp_dst", "int"),
    "ipv6_src": ("ipv6_src", "ipv6"),
    "ipv6_dst": ("ipv6_dst", "ipv6"),
    "icmp_type": ("icmp_type", "int"),
    "icmp_code": ("icmp_code", "int"),
    "icmpv6_type": ("icmpv6_type", "int"),
    "icmpv6_code": ("icmpv6_code", "int"),
    "arp_sha": ("arp_sha", "mac"),
    "arp_tha": ("arp_tha", "mac"),
    "metadata": ("metadata", "int"),
    **{f"reg{i}": (f"reg{i}", "int") for i in range(8)},
    "ct_zone": ("ct_zone", "int"),
    "ct_mark": ("ct_mark", "int"),
    "ct_label": ("ct_label", "int"),
    "ct_nw_src": ("ct_nw_src", "ipv4"),
    "ct_nw_dst": ("ct_nw_dst", "ipv4"),
    "ct_ipv6_src": ("ct_ipv6_src", "ipv6"),
    "ct_ipv6_dst": ("ct_ipv6_dst", "ipv6"),
    "ct_nw_proto": ("ct_nw_proto", "int"),
    "ct_tp_src": ("ct_tp_src", "int"),
    "ct_tp_dst": ("ct_tp_dst", "int"),
}

SHORTHANDS = {
    "ip": {"dl_type": ETH_IP},
    "ipv6": {"dl_type": ETH_IPV6},
    "arp": {"dl_type": ETH_ARP},
    "tcp": {"dl_type": ETH_IP, "nw_proto": IPPROTO_TCP},
    "udp": {"dl_type": ETH_IP, "nw_proto": IPPROTO_UDP},
    "sctp": {"dl_type": ETH_IP, "nw_proto": IPPROTO_SCTP},
    "icmp": {"dl_type": ETH_IP, "nw_proto": IPPROTO_ICMP},
    "tcp6": {"dl_type": ETH_IPV6, "nw_proto": IPPROTO_TCP},
    "udp6": {"dl_type": ETH_IPV6, "nw_proto": IPPROTO_UDP},
    "sctp6": {"dl_type": ETH_IPV6, "nw_proto": IPPROTO_SCTP},
    "icmp6": {"dl_type": ETH_IPV6, "nw_proto": IPPROTO_ICMPV6},
}

TCP_FLAG_BITS = {"fin": 0x001, "syn": 0x002, "rst": 0x004, "psh": 0x008, "ack": 0x010, "urg": 0x020,
                 "ece": 0x040, "cwr": 0x080, "ns": 0x100}

NW_FRAG = {
    "no": (0, FRAG_ANY),
    "yes": (FRAG_ANY, FRAG_ANY),
    "first": (FRAG_ANY, FRAG_ANY | FRAG_LATER),
    "later": (FRAG_ANY | FRAG_LATER, FRAG_ANY | FRAG_LATER),
    "not_later": (0, FRAG_LATER),
}

# Fields that set_field / load / move may name (value kind, key field, width).
SET_TARGETS = {
    "eth_src": ("mac", "dl_src"),
    "dl_src": ("mac", "dl_src"),
    "eth_dst": ("mac", "dl_dst"),
    "dl_dst": ("mac", "dl_dst"),
    "ip_src": ("ipv4", "nw_src"),
    "nw_src": ("ipv4", "nw_src"),
    "ip_dst": ("ipv4", "nw_dst"),
    "nw_dst": ("ipv4", "nw_dst"),
    "ipv6_src": ("ipv6", "ipv6_src"),
    "ipv6_dst": ("ipv6", "ipv6_dst"),
    "tcp_src": ("int", "tp_src"),
    "tcp_dst": ("int", "tp_dst"),
    "udp_src": ("int", "tp_src"),
    "udp_dst": ("int", "tp_dst"),
    "sctp_src": ("int", "tp_src"),
    "sctp_dst": ("int", "tp_dst"),
    "tp_src": ("int", "tp_src"),
    "tp_dst": ("int", "tp_dst"),
    "arp_spa": ("ipv4", "arp_spa"),
    "arp_tpa": ("ipv4", "arp_tpa"),
    "arp_sha": ("mac", "arp_sha"),
    "arp_tha": ("mac", "arp_tha"),
    "nw_ttl": ("int", "nw_ttl"),
    "ip_dscp": ("int", "ip_dscp"),
    "arp_op": ("int", "arp_op"),
    "metadata": ("int", "metadata"),
    **{f"reg{i}": ("int", f"reg{i}") for i in range(8)},
}
# NXM/OXM names usable in load/move
NXM_NAMES = {
    "NXM_OF_ETH_SRC": "dl_src",
    "NXM_OF_ETH_DST": "dl_dst",
    "NXM_OF_IP_SRC": "nw_src",
    "NXM_OF_IP_DST": "nw_dst",
    "NXM_OF_TCP_SRC": "tp_src",
    "NXM_OF_TCP_DST": "tp_dst",
    "NXM_OF_UDP_SRC": "tp_src",
    "NXM_OF_UDP_DST": "tp_dst",
    "NXM_NX_IPV6_SRC": "ipv6_src",
    "NXM_NX_IPV6_DST": "ipv6_dst",
    "NXM_NX_ARP_SHA": "arp_sha",
    "NXM_NX_ARP_THA": "arp_tha",
    "NXM_OF_ARP_SPA": "arp_spa",
    "NXM_OF_ARP_TPA": "arp_tpa",
    "OXM_OF_METADATA": "metadata",
    "metadata": "metadata",
    **{f"NXM_NX_REG{i}": f"reg{i}" for i in range(8)},
    **{f"reg{i}": f"reg{i}" for i in range(8)},
    "eth_src": "dl_src",
    "eth_dst": "dl_dst",
    "ip_src": "nw_src",
    "ip_dst": "nw_dst",
    "tcp_src": "tp_src",
    "tcp_dst": "tp_dst",
    "udp_src": "tp_src",
    "udp_dst": "tp_dst",
    "ipv6_src": "ipv6_src",
    "ipv6_dst": "ipv6_dst",
}
# width of a writable field (by internal name)
FIELD_WIDTH = dict(KEY_WIDTH)
FIELD_WIDTH.update({"arp_spa": 32, "arp_tpa": 32, "ip_dscp": 6, "arp_op": 8})

DROP_REASONS = (
    "table_miss", "action_drop", "no_output", "ttl_exceeded", "resubmit_limit", "recirc_limit",
    "oversize", "no_buffer", "group_empty", "mtu", "vxlan_truncated", "vxlan_bad_flags",
    "vxlan_bad_checksum", "unknown_vni", "unknown_vtep", "spoofed", "isolation", "inner_vlan",
    "unroutable", "underlay", "policy",
)


# --------------------------------------------------------------------------------------
# Flow text parsing


def split_top(text: str, seps: str = ",") -> List[str]:
    """Splits at separators outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch in seps and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _flag_tokens(v: str) -> List[Tuple[str, str]]:
    """``+a-b+c`` -> [("+", "a"), ("-", "b"), ("+", "c")]."""
    out, sign, tok = [], None, ""
    for ch in v + "+":
        if ch in "+-":
            if sign is not None:
                out.append((sign, tok))
            sign, tok = ch, ""
        else:
            tok += ch
    return out


def parse_subfield(text: str) -> Tuple[str, int, int]:
    """``NAME[a..b]`` / ``NAME[]`` / ``NAME[a]`` / ``NAME`` -> (internal field, ofs, nbits)."""
    if "[" in text:
        name, rng = text[:-1].split("[", 1)
    else:
        name, rng = text, ""
    f = NXM_NAMES.get(name)
    if f is None:
        if name in SET_TARGETS:
            f = SET_TARGETS[name][1]
        else:
            raise ValueError(f"unknown field {name!r}")
    width = FIELD_WIDTH[f]
    if rng == "":
        return f, 0, width
    if ".." in rng:
        a, b = (int(x) for x in rng.split(".."))
    else:
        a = b = int(rng)
    return f, a, b - a + 1


class Model:
    """The reference pipeline: ports, tables, groups and counters."""

    def __init__(self, ports: List[str]) -> None:
        self.port_no: Dict[str, int] = {name: i + 1 for i, name in enumerate(ports)}
        self.port_name: Dict[int, str] = {i + 1: name for i, name in enumerate(ports)}
        self.tables: Dict[int, List[Rule]] = {}
        self.groups: Dict[int, Group] = {}
        self.frags = "normal"  # Dataplane.set_frags: "normal" or "nx-match"
        self.seq = 0
        self.table_stats: Dict[int, List[int]] = {}  # table -> [lookups, matches]
        self.port_stats: Dict[str, dict] = {
            n: {"rx_packets": 0, "rx_bytes": 0, "tx_packets": 0, "tx_bytes": 0, "dropped": 0, "drops": {}}
            for n in ports
        }
        from .ct_model import Conntrack
        self.conntrack = Conntrack()

    # ---------------------------------------------------------------- conntrack configuration
    def ct_config(self, timeouts: Optional[Dict[str, float]] = None, max_connections: Optional[int] = None) -> None:
        if timeouts:
            self.conntrack.timeouts.update(timeouts)
        if max_connections is not None:
            self.conntrack.max_connections = max_connections

    def set_ct_zones(self, zones: List[Tuple[int, int, bool]]) -> None:
        """(zone, connection limit or 0, endpoint-independent filtering)."""
        self.conntrack.zone_limits = {z: lim for z, lim, _ in zones if lim}
        self.conntrack.zone_eif = {z: bool(e) for z, _, e in zones}

    def ct_dump(self, zone: Optional[int] = None) -> List[str]:
        return self.conntrack.dump(zone)

    # ---------------------------------------------------------------- configuration
    def port(self, text: str) -> int:
        text = text.strip().strip('"')
        if text in self.port_no:
            return self.port_no[text]
        return int(text, 0)

    def parse_match(self, items: List[str]) -> Tuple[dict, Dict[str, Tuple[int, int]]]:
        """Flow properties and the normalised match {key field: (value, mask)}."""
        props = {"table": 0, "priority": 32768, "cookie": 0}
        match: Dict[str, Tuple[int, int]] = {}

        def add(f: str, v: int, m: int) -> None:
            ov, om = match.get(f, (0, 0))
            match[f] = ((ov & ~m) | (v & m), om | m)

        for it in items:
            if "=" not in it:
                if it not in SHORTHANDS:
                    raise ValueError(f"unknown shorthand {it!r}")
                for f, v in SHORTHANDS[it].items():
                    add(f, v, _full(KEY_WIDTH[f]))
                continue
            k, v = it.split("=", 1)
            if k in ("table", "priority"):
                props[k] = int(v, 0)
            elif k == "cookie":
                props[k] = int(v.split("/")[0], 0)
            elif k == "in_port":
                add("in_port", self.port(v), _full(32))
            elif k == "dl_vlan":
                n = int(v, 0)
                if n == 0xFFFF:
                    add("vlan_tci", 0, 0xFFFF)
                else:
                    add("vlan_tci", VLAN_CFI | n, VLAN_CFI | 0x0FFF)
            elif k == "dl_vlan_pcp":
                add("vlan_tci", VLAN_CFI | (int(v, 0) << 13), VLAN_CFI | 0xE000)
            elif k in ("nw_tos",):
                add("nw_tos", int(v, 0) & 0xFC, 0xFC)
            elif k == "ip_dscp":
                add("nw_tos", (int(v, 0) << 2) & 0xFC, 0xFC)
            elif k in ("nw_ecn", "ip_ecn"):
                add("nw_tos", int(v, 0) & 3, 3)
            elif k == "nw_frag":
                fv, fm = NW_FRAG[v]
                add("nw_frag", fv, fm)
            elif k == "ct_state":
                if v[0] in "+-":
                    from .ct_model import CT_STATE_FLAGS
                    val = mask = 0
                    for sign, name in _flag_tokens(v):
                        bit = CT_STATE_FLAGS[name]
                        mask |= bit
                        if sign == "+":
                            val |= bit
                    add("ct_state", val, mask)
                else:
                    val, mask = parse_value(v, "int", 8)
                    add("ct_state", val, mask)
            elif k == "tcp_flags":
                if v[0] in "+-":
                    val = mask = 0
                    tok = ""
                    sign = None
                    for ch in v + "+":
                        if ch in "+-":
                            if sign is not None:
                                bit = TCP_FLAG_BITS[tok]
                                mask |= bit
                                if sign == "+":
                                    val |= bit
                            sign, tok = ch, ""
                        else:
                            tok += ch
                    add("tcp_flags", val, mask)
                else:
                    val, mask = parse_value(v, "int", 12)
                    add("tcp_flags", val, mask)
            elif k in SIMPLE_MATCH:
                f, kind = SIMPLE_MATCH[k]
                val, mask = parse_value(v, kind, KEY_WIDTH[f])
                add(f, val, mask)
            else:
                raise ValueError(f"unknown match field {k!r}")
        match = {f: (v & m, m) for f, (v, m) in match.items() if m}
        return props, match

    def parse_actions(self, text: str) -> List[tuple]:
        acts: List[tuple] = []
        for a in split_top(text):
            acts.append(self.parse_action(a))
        # `drop` alone means the empty list
        return [a for a in acts if a[0] != "drop"]

    def parse_action(self, a: str) -> tuple:
        if a == "drop":
            return ("drop",)
        if a.startswith("ct(") and a.endswith(")"):
            from .ct_model import parse_ct_action
            return ("ct", parse_ct_action(a, split_top, parse_subfield, parse_value))
        if a == "ct_clear":
            return ("ct_clear",)
        if a.startswith("drop(") and a.endswith(")"):
            return ("drop_reason", a[5:-1])
        if a in ("in_port", "flood", "all", "dec_ttl"):
            return (a,)
        if a in ("pop_vlan", "strip_vlan"):
            return ("pop_vlan",)
        if a.startswith("resubmit(") and a.endswith(")"):
            port, _, table = a[len("resubmit("):-1].partition(",")
            return ("resubmit", self.port(port) if port.strip() else None,
                    int(table, 0) if table.strip() else None)
        name, sep, arg = a.partition(":")
        if not sep:
            # a bare port
            return ("output", self.port(a))
        if name == "output":
            return ("output", self.port(arg))
        if name == "resubmit":
            return ("resubmit", self.port(arg), None)
        if name == "goto_table":
            return ("goto", int(arg, 0))
        if name == "group":
            return ("group", int(arg, 0))
        if name == "note":
            return ("note",)
        if name == "push_vlan":
            return ("push_vlan", int(arg, 0))
        if name == "mod_vlan_vid":
            return ("mod_vlan_vid", int(arg, 0))
        if name == "mod_vlan_pcp":
            return ("mod_vlan_pcp", int(arg, 0))
        if name == "write_metadata":
            v, m = parse_value(arg, "int", 64)
            return ("set", "metadata", v, m)
        if name in ("mod_dl_src", "mod_dl_dst"):
            return ("set", "dl_" + name[-3:], parse_mac(arg), _full(48))
        if name in ("mod_nw_src", "mod_nw_dst"):
            return ("set", "nw_" + name[-3:], parse_ipv4(arg), _full(32))
        if name == "mod_nw_tos":
            return ("set", "nw_tos", int(arg, 0) & 0xFC, 0xFC)
        if name == "mod_nw_ttl":
            return ("set", "nw_ttl", int(arg, 0) & 0xFF, 0xFF)
        if name == "mod_nw_ecn":
            return ("set", "nw_tos", int(arg, 0) & 3, 3)
        if name in ("mod_tp_src", "mod_tp_dst"):
            return ("set", "tp_" + name[-3:], int(arg, 0), 0xFFFF)
        if name == "set_field":
            val, dst = arg.split("->")
            kind, f = SET_TARGETS[dst]
            if f == "ip_dscp":
                v, m = parse_value(val, "int", 6)
                return ("set", "nw_tos", (v << 2) & 0xFC, (m << 2) & 0xFC)
            v, m = parse_value(val, kind, FIELD_WIDTH[f])
            return ("set", f, v, m)
        if name == "load":
            val, dst = arg.split("->")
            f, ofs, nbits = parse_subfield(dst)
            v = int(val, 0) & _full(nbits)
            if f == "ip_dscp":
                return ("set", "nw_tos", (v << ofs) << 2 & 0xFC, (_full(nbits) << ofs) << 2 & 0xFC)
            return ("set", f, v << ofs, _full(nbits) << ofs)
        if name == "move":
            src, dst = arg.split("->")
            sf, so, sn = parse_subfield(src)
            df, do, dn = parse_subfield(dst)
            if sn != dn:
                raise ValueError("move widths differ")
            return ("move", sf, so, df, do, sn)
        raise ValueError(f"unknown action {a!r}")

    def parse_flow(self, text: str) -> "Rule":
        head, sep, acts = text.partition("actions=")
        if not sep:
            raise ValueError("no actions=")
        items = split_top(head.replace(" ", ","))
        props, match = self.parse_match(items)
        return Rule(props["table"], props["priority"], props["cookie"], match, self.parse_actions(acts), text)

    def add_flows(self, texts: List[str]) -> None:
        for t in texts:
            r = self.parse_flow(t)
            tbl = self.tables.setdefault(r.table, [])
            for old in tbl:
                if old.priority == r.priority and old.match == r.match:
                    # README: replaces actions and cookie, keeps counters and place
                    old.actions, old.cookie, old.text = r.actions, r.cookie, r.text
                    break
            else:
                self.seq += 1
                r.seq = self.seq
                tbl.append(r)

    def del_flows(self, text: str = "", strict: bool = False) -> int:
        items = split_top(text.replace(" ", ","))
        has_table = any(i.startswith("table=") for i in items)
        has_prio = any(i.startswith("priority=") for i in items)
        props, match = self.parse_match(items)
        n = 0
        for t, rules in self.tables.items():
            if has_table and t != props["table"]:
                continue
            keep = []
            for r in rules:
                if strict:
                    hit = r.match == match and (r.priority == props["priority"] or not has_prio)
                else:
                    hit = all(
                        f in r.match and (r.match[f][1] & m) == m and (r.match[f][0] & m) == v
                        for f, (v, m) in match.items()
                    )
                if hit:
                    n += 1
                else:
                    keep.append(r)
            self.tables[t] = keep
        return n

    def add_group(self, text: str) -> None:
        items = text.split(",bucket=")
        head = split_top(items[0])
        gid, gtype = None, None
        for it in head:
            k, _, v = it.partition("=")
            if k == "group_id":
                gid = int(v, 0)
            elif k == "type":
                gtype = v
        buckets = []
        for b in items[1:]:
            weight = 1
            acts_text = b
            if b.startswith("weight:"):
                w, _, rest = b.partition(",")
                weight = int(w.split(":")[1], 0)
                acts_text = rest
            if acts_text.startswith("actions="):
                acts_text = acts_text[len("actions="):]
            buckets.append((weight, self.parse_actions(acts_text)))
        self.groups[gid] = Group(gid, gtype, buckets)

    # ---------------------------------------------------------------- packets
    def process(self, packets: List[Tuple[str, bytes]], timestamps: Optional[List[int]] = None
                ) -> List[Tuple[str, bytes, int]]:
        """READING (docs/conntrack.md is silent on the order in which the packets of one
        batch meet conntrack): packets are processed one after the other, each with all
        its recirculations; the differential tests give stateful sequences one packet
        per process() call, which makes the question moot."""
        out: List[Tuple[str, bytes, int]] = []
        self.last_results = []
        for idx, (pname, data) in enumerate(packets):
            if timestamps is not None:
                self.conntrack.advance(timestamps[idx])
            res = self.process_one(pname, data)
            self.last_results.append(res)
            for port, pkt in res.outputs:
                out.append((port, pkt, idx))
        return out

    def process_one(self, pname: str, data: bytes) -> "Result":
        ps = self.port_stats[pname]
        ps["rx_packets"] += 1
        ps["rx_bytes"] += len(data)
        st = parse_packet(data, self.port_no[pname])
        ctx = Ctx(self)
        ctx.rx_len = len(data)
        ctx.in_port = self.port_no[pname]
        try:
            try:
                ctx.lookup(st, 0)
            except Stop:
                pass
            # docs/conntrack.md "table=T": each copy sent to conntrack is looked up again,
            # starting in table T. READING: after the pass that sent it (its outputs come
            # after those of the pass that forked it), copies in the order they were sent,
            # breadth first (a copy's own copies after the copies already waiting).
            while ctx.recirc:
                ctx.recirculate(ctx.recirc.pop(0))
        except ResubmitLimit:
            ctx.outputs = []
            ctx.reason = "resubmit_limit"
        outputs = [(self.port_name[p], d) for p, d in ctx.outputs]
        for port, d in outputs:
            self.port_stats[port]["tx_packets"] += 1
            self.port_stats[port]["tx_bytes"] += len(d)
        if not outputs:
            ps["dropped"] += 1
            ps["drops"][ctx.reason] = ps["drops"].get(ctx.reason, 0) + 1
        return Result(outputs, None if outputs else ctx.reason, ctx.log, ctx.limit_in_bucket, ctx.plain_ct_in_pass)

    # ---------------------------------------------------------------- counters
    def flow_stats(self) -> List[dict]:
        out = []
        for t, rules in sorted(self.tables.items()):
            for r in rules:
                out.append({"table": t, "priority": r.priority, "cookie": r.cookie,
                            "n_packets": r.n_packets, "n_bytes": r.n_bytes, "n_bytes_rx": r.n_bytes_rx,
                            "text": r.text})
        return out


@dataclass
class Rule:
    table: int
    priority: int
    cookie: int
    match: Dict[str, Tuple[int, int]]
    actions: List[tuple]
    text: str
    seq: int = 0
    n_packets: int = 0
    n_bytes: int = 0
    n_bytes_rx: int = 0

    def matches(self, key: Dict[str, int]) -> bool:
        return all((key[f] & m) == v for f, (v, m) in self.match.items())


@dataclass
class Group:
    gid: int
    gtype: str
    buckets: List[Tuple[int, List[tuple]]]


@dataclass
class Result:
    outputs: List[Tuple[str, bytes]]
    drop_reason: Optional[str]
    log: List[str]
    limit_in_bucket: bool = False
    plain_ct_in_last_pass: bool = False


class Stop(Exception):
    """drop(reason) or dec_ttl on TTL <= 1: all processing of the packet stops."""


class ResubmitLimit(Exception):
    pass


# --------------------------------------------------------------------------------------
# Packet state: bytes + key + where the headers are


@dataclass
class State:
    data: bytearray
    key: Dict[str, int]
    eth: bool = False  # a complete Ethernet header
    tags: int = 0  # VLAN tags on the wire in front of the ethertype the key saw
    l3: Optional[int] = None  # offset of the L3 header
    l3kind: Optional[str] = None  # "ipv4" | "ipv6" | "arp" when that header is complete
    l4: Optional[int] = None
    l4kind: Optional[str] = None  # "tcp" | "udp" | "sctp" | "icmp" | "icmpv6" when complete
    l4end: int = 0  # end of the L4 region: min(IP datagram end, captured bytes)
    # (ct_state, ct_zone) the last ct gave this very packet, which the pipeline's view
    # (key) no longer shows after a ct without table (docs/conntrack.md: a packet that an
    # earlier ct of the same zone translated ...); cleared by ct_clear
    ct_dp: Tuple[int, int] = (0, 0)

    def copy(self) -> "State":
        return State(bytearray(self.data), dict(self.key), self.eth, self.tags, self.l3, self.l3kind,
                     self.l4, self.l4kind, self.l4end, self.ct_dp)


def _be(b: bytes) -> int:
    return int.from_bytes(b, "big")


def parse_packet(data: bytes, in_port: int) -> State:
    """The flow key as README "Parsing" describes it (Open vSwitch 3.1's rules): a
    header that does not pass leaves its fields and everything after it zero."""
    key = {f: 0 for f in KEY_WIDTH}
    key["in_port"] = in_port
    st = State(bytearray(data), key)
    n = len(data)
    if n < 14:
        return st
    st.eth = True
    key["dl_dst"] = _be(data[0:6])
    key["dl_src"] = _be(data[6:12])
    et = _be(data[12:14])
    off = 14
    if et in VLAN_TPIDS and n >= 18:
        # (a tag cut short is not parsed: dl_type is the TPID, as in OVS)
        key["vlan_tci"] = _be(data[14:16]) | VLAN_CFI
        et = _be(data[16:18])
        off = 18
        st.tags = 1
    if et < 0x600:
        # an 802.3 length; LLC/SNAP with OUI 0 carries an Ethertype
        if n - off >= 8 and data[off:off + 6] == b"\xaa\xaa\x03\x00\x00\x00":
            et = _be(data[off + 6:off + 8])
            off += 8
            if et < 0x600:
                et = DL_TYPE_NONE
        else:
            et = DL_TYPE_NONE
    key["dl_type"] = et
    if et == ETH_IP:
        _parse_ipv4(st, off)
    elif et == ETH_IPV6:
        _parse_ipv6(st, off)
    elif et in (ETH_ARP, ETH_RARP):
        _parse_arp(st, off)
    return st


def _parse_ipv4(st: State, off: int) -> None:
    """README "Parsing": 20 bytes, IHL >= 5 with its options present, a total length
    that covers the header and fits in the frame; the version is not checked."""
    d, key, n = st.data, st.key, len(st.data)
    if n - off < 20:
        return
    ihl = (d[off] & 0x0F) * 4
    tot = _be(d[off + 2:off + 4])
    if ihl < 20 or n - off < ihl or tot > n - off or tot < ihl:
        return
    key["nw_tos"] = d[off + 1]
    frag = _be(d[off + 6:off + 8])
    key["nw_ttl"] = d[off + 8]
    proto = key["nw_proto"] = d[off + 9]
    key["nw_src"] = _be(d[off + 12:off + 16])
    key["nw_dst"] = _be(d[off + 16:off + 20])
    if frag & 0x3FFF:  # MF or an offset
        key["nw_frag"] = FRAG_ANY | (FRAG_LATER if frag & 0x1FFF else 0)
    if proto == 0:
        return  # README: no L3 write happens to a packet whose nw_proto is 0
    st.l3, st.l3kind = off, "ipv4"
    if key["nw_frag"] & FRAG_LATER:
        return
    _parse_l4(st, proto, off + ihl, off + tot)


def _parse_ipv6(st: State, off: int) -> None:
    """README "Parsing": 40 bytes and a payload length that fits; extension headers
    need 8 bytes and their length; a cut one leaves only the addresses."""
    d, key, n = st.data, st.key, len(st.data)
    if n - off < 40:
        return
    plen = _be(d[off + 4:off + 6])
    if plen > n - off - 40:
        return
    key["ipv6_src"] = _be(d[off + 8:off + 24])
    key["ipv6_dst"] = _be(d[off + 24:off + 40])
    end = off + 40 + plen
    nh = d[off + 6]
    p = off + 40
    frag = 0
    while nh in IPV6_EXT_GENERIC or nh in (IPV6_AH, IPV6_FRAGMENT):
        if end - p < 8:
            return
        if nh == IPV6_FRAGMENT:
            offlg = _be(d[p + 2:p + 4])
            nh = d[p]
            p += 8
            if offlg:
                frag = FRAG_ANY
                if offlg & 0xFFF8:
                    frag |= FRAG_LATER
                    nh = IPV6_FRAGMENT  # a later fragment reports the fragment header
                    break
            continue
        hlen = (d[p + 1] + 1) * 8 if nh != IPV6_AH else (d[p + 1] + 2) * 4
        if end - p < hlen:
            return
        nh = d[p]
        p += hlen
    key["nw_tos"] = ((d[off] & 0x0F) << 4) | (d[off + 1] >> 4)
    key["nw_ttl"] = d[off + 7]
    key["nw_proto"] = nh
    key["nw_frag"] = frag
    st.l3, st.l3kind = off, "ipv6"
    if not frag & FRAG_LATER:
        _parse_l4(st, nh, p, end)


def _parse_l4(st: State, proto: int, l4: int, end: int) -> None:
    """The L4 region is [l4, end) (the datagram, not Ethernet padding); ICMP and
    ICMPv6 are read whatever the IP version (as OVS), though only the matching
    family's icmp fields exist in the key."""
    d, key = st.data, st.key
    size = end - l4
    st.l4, st.l4end = l4, end
    v6 = key["dl_type"] == ETH_IPV6
    if proto == IPPROTO_TCP:
        if size >= 20 and 5 <= (d[l4 + 12] >> 4) and (d[l4 + 12] >> 4) * 4 <= size:
            key["tp_src"], key["tp_dst"] = _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4])
            key["tcp_flags"] = _be(d[l4 + 12:l4 + 14]) & 0x0FFF
            st.l4kind = "tcp"
    elif proto == IPPROTO_UDP:
        if size >= 8:
            key["tp_src"], key["tp_dst"] = _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4])
            st.l4kind = "udp"
    elif proto == IPPROTO_SCTP:
        if size >= 12:
            key["tp_src"], key["tp_dst"] = _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4])
            st.l4kind = "sctp"
    elif proto == IPPROTO_ICMP and not v6:
        if size >= 4:
            key["icmp_type"], key["icmp_code"] = d[l4], d[l4 + 1]
            st.l4kind = "icmp"
    elif proto == IPPROTO_ICMPV6 and v6:
        if size >= 8:
            key["icmpv6_type"], key["icmpv6_code"] = d[l4], d[l4 + 1]
            st.l4kind = "icmpv6"


def _parse_arp(st: State, off: int) -> None:
    d, key, n = st.data, st.key, len(st.data)
    if n - off < 28:
        return
    if _be(d[off:off + 2]) != 1 or _be(d[off + 2:off + 4]) != ETH_IP or d[off + 4] != 6 or d[off + 5] != 4:
        return
    st.l3, st.l3kind = off, "arp"
    op = _be(d[off + 6:off + 8])
    key["nw_proto"] = op if op <= 0xFF else 0
    key["arp_sha"] = _be(d[off + 8:off + 14])
    key["nw_src"] = _be(d[off + 14:off + 18])
    key["arp_tha"] = _be(d[off + 18:off + 24])
    key["nw_dst"] = _be(d[off + 24:off + 28])


# --------------------------------------------------------------------------------------
# Checksums


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def csum_incremental(hc: int, old: bytes, new: bytes) -> int:
    """RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m') over the 16-bit words changed."""
    s = (~hc) & 0xFFFF
    for i in range(0, len(old), 2):
        s += (~_be(old[i:i + 2])) & 0xFFFF
        s += _be(new[i:i + 2])
    return (~_fold(s)) & 0xFFFF


def _crc32c_table() -> List[int]:
    tbl = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        tbl.append(c)
    return tbl


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _rewrite(st: State, off: int, new: bytes, csums: List[Tuple[int, bool]]) -> None:
    """Writes ``new`` at ``off`` and updates each checksum (offset, is_udp) incrementally
    over the even-aligned words covering the change."""
    d = st.data
    a = off & ~1
    b = off + len(new)
    b += b & 1
    old_words = bytes(d[a:b])
    d[off:off + len(new)] = new
    new_words = bytes(d[a:b])
    if old_words == new_words:
        return
    for coff, is_udp in csums:
        hc = _be(d[coff:coff + 2])
        if is_udp and hc == 0:
            continue  # a zero UDP checksum stays zero
        nc = csum_incremental(hc, old_words, new_words)
        if is_udp and nc == 0:
            nc = 0xFFFF
        d[coff:coff + 2] = nc.to_bytes(2, "big")


def _pseudo_csums(st: State, proto: int) -> List[Tuple[int, bool]]:
    """README 10: the L4 checksum an address change updates (it covers the
    pseudo-header): chosen by the protocol and the size of the L4 region, as OVS
    does, whether or not the L4 header itself parsed; none in a later fragment."""
    if st.l4 is None:
        return []
    size = st.l4end - st.l4
    if proto == IPPROTO_TCP and size >= 20:
        return [(st.l4 + 16, False)]
    if proto == IPPROTO_UDP and size >= 8:
        return [(st.l4 + 6, True)]
    if proto == IPPROTO_ICMPV6 and size >= 4 and st.key["dl_type"] == ETH_IPV6:
        return [(st.l4 + 2, False)]
    return []


def _ipv6_csum_proto(st: State) -> int:
    """README 10: which protocol's checksum an IPv6 address change updates, read
    from the extension headers on the wire: none (0) behind a routing header with
    segments left (the checksum covers the final destination), in a fragment other
    than a first one (offset 0 with M set), or when the headers do not fit."""
    if st.l4 is None:
        return 0
    d = st.data
    p, stop, nh, recalc = st.l3 + 40, st.l4, d[st.l3 + 6], True
    while nh in IPV6_EXT_GENERIC or nh in (IPV6_AH, IPV6_FRAGMENT):
        if stop - p < 8:
            return 0
        if nh == IPV6_AH:
            hlen = (d[p + 1] + 2) * 4
        elif nh == IPV6_FRAGMENT:
            offlg = _be(d[p + 2:p + 4])
            recalc = not offlg & 0xFFF8 and bool(offlg & 1)
            hlen = 8
        else:
            if nh == 43 and d[p + 3] > 0:
                return 0
            hlen = (d[p + 1] + 1) * 8
        nh = d[p]
        if stop - p < hlen:
            return 0
        p += hlen
    return nh if recalc else 0


def _port_csums(st: State) -> List[Tuple[int, bool]]:
    """The checksum a port change updates (the L4 header parsed whole)."""
    if st.l4kind == "tcp":
        return [(st.l4 + 16, False)]
    if st.l4kind == "udp":
        return [(st.l4 + 6, True)]
    return []


# --------------------------------------------------------------------------------------
# Header rewrites (README 4, 5, 9)


def set_field(st: State, f: str, v: int, m: int) -> None:
    """Sets a field in the key and, where the packet has the bytes, on the wire.

    READING (README 4 "set actions on headers the packet does not have are
    skipped"): whether the packet "has" a header is decided by the key, as in OVS,
    where set actions act on the flow: IPv4 fields need dl_type 0x0800, IPv6
    fields 0x86dd, ARP fields 0x0806, L4 ports TCP/UDP/SCTP and not a later
    fragment. The bytes are rewritten only when the header was captured whole
    (README "Parsing"); a header cut short still changes the key for later matches.
    """
    key = st.key
    d = st.data
    dt = key["dl_type"]

    def upd(kf: str) -> int:
        new = (key[kf] & ~m) | (v & m)
        key[kf] = new
        return new

    if f == "metadata" or f.startswith("reg"):
        upd(f)
        return
    if f in ("dl_src", "dl_dst"):
        new = upd(f)
        if st.eth:
            off = 6 if f == "dl_src" else 0
            d[off:off + 6] = new.to_bytes(6, "big")
        return
    if f in ("nw_src", "nw_dst"):
        if dt != ETH_IP:
            return  # README 4: IPv4 only
        new = upd(f)
        if st.l3kind == "ipv4":
            off = st.l3 + (12 if f == "nw_src" else 16)
            csums = [(st.l3 + 10, False)] + _pseudo_csums(st, d[st.l3 + 9])
            _rewrite(st, off, new.to_bytes(4, "big"), csums)
        return
    if f in ("ipv6_src", "ipv6_dst"):
        if dt != ETH_IPV6:
            return
        new = upd(f)
        if st.l3kind == "ipv6":
            off = st.l3 + (8 if f == "ipv6_src" else 24)
            _rewrite(st, off, new.to_bytes(16, "big"), _pseudo_csums(st, _ipv6_csum_proto(st)))
        return
    if f in ("tp_src", "tp_dst"):
        if dt not in (ETH_IP, ETH_IPV6) or key["nw_proto"] not in (IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP) \
                or key["nw_frag"] & FRAG_LATER:
            return
        new = upd(f)
        if st.l4kind not in ("tcp", "udp", "sctp"):
            return
        off = st.l4 + (0 if f == "tp_src" else 2)
        if st.l4kind == "sctp":
            # README 10: SCTP's CRC32c (over the SCTP packet: the datagram's L4 bytes,
            # not Ethernet padding) changes by the difference between the correct CRCs
            # before and after, so a wrong one stays wrong (as OVS).
            def crc() -> int:
                return crc32c(bytes(d[st.l4:st.l4 + 8]) + b"\0\0\0\0" + bytes(d[st.l4 + 12:st.l4end]))
            stored = struct.unpack("<I", d[st.l4 + 8:st.l4 + 12])[0]
            before = crc()
            d[off:off + 2] = new.to_bytes(2, "big")
            d[st.l4 + 8:st.l4 + 12] = struct.pack("<I", stored ^ before ^ crc())
        else:
            _rewrite(st, off, new.to_bytes(2, "big"), _port_csums(st))
        return
    if f in ("arp_spa", "arp_tpa", "arp_sha", "arp_tha", "arp_op"):
        if dt not in (ETH_ARP, ETH_RARP):
            return
        kf = {"arp_spa": "nw_src", "arp_tpa": "nw_dst", "arp_op": "nw_proto"}.get(f, f)
        new = upd(kf)
        # READING (README "Parsing", as OVS): an ARP header is written only while the
        # opcode the key holds is not 0; the opcode field is its low byte.
        if st.l3kind == "arp" and key["nw_proto"]:
            width = FIELD_WIDTH[f] // 8
            off = st.l3 + {"arp_sha": 8, "arp_spa": 14, "arp_tha": 18, "arp_tpa": 24, "arp_op": 7}[f]
            d[off:off + width] = new.to_bytes(width, "big")
        return
    if f in ("nw_ttl", "nw_tos"):
        if dt not in (ETH_IP, ETH_IPV6):
            return
        new = upd(f)
        if st.l3kind == "ipv4":
            off = st.l3 + (8 if f == "nw_ttl" else 1)
            _rewrite(st, off, bytes([new]), [(st.l3 + 10, False)])
        elif st.l3kind == "ipv6":
            if f == "nw_ttl":
                d[st.l3 + 7] = new
            else:
                d[st.l3] = (d[st.l3] & 0xF0) | (new >> 4)
                d[st.l3 + 1] = ((new & 0x0F) << 4) | (d[st.l3 + 1] & 0x0F)
        return
    raise ValueError(f"model cannot set {f}")


def read_field(st: State, f: str) -> int:
    if f == "arp_spa":
        return st.key["nw_src"]
    if f == "arp_tpa":
        return st.key["nw_dst"]
    if f == "arp_op":
        return st.key["nw_proto"]
    return st.key[f]


def move_prereqs_ok(st: State, f: str) -> bool:
    """ovs-actions(7) "move": both fields' prerequisites must hold for the packet, or
    the move does nothing (ports: TCP, UDP or SCTP, not a later fragment)."""
    key = st.key
    dt = key["dl_type"]
    if f in ("tp_src", "tp_dst"):
        return dt in (ETH_IP, ETH_IPV6) and key["nw_proto"] in (IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP) \
            and not key["nw_frag"] & FRAG_LATER
    if f in ("nw_src", "nw_dst"):
        return dt == ETH_IP  # in an action, IPv4's addresses (arp_spa/arp_tpa are ARP's)
    if f in ("ipv6_src", "ipv6_dst"):
        return dt == ETH_IPV6
    if f in ("arp_spa", "arp_tpa", "arp_sha", "arp_tha", "arp_op"):
        return dt in (ETH_ARP, ETH_RARP)
    return True


def push_vlan(st: State, tpid: int, tci: int) -> None:
    """Inserts a tag (TPID, TCI without the CFI/present bit) after the MAC addresses."""
    d = st.data
    d[12:12] = tpid.to_bytes(2, "big") + (tci & ~VLAN_CFI & 0xFFFF).to_bytes(2, "big")
    st.tags += 1
    if st.l3 is not None:
        st.l3 += 4
    if st.l4 is not None:
        st.l4 += 4
        st.l4end += 4
    st.key["vlan_tci"] = tci | VLAN_CFI


def pop_vlan(st: State) -> None:
    d = st.data
    if st.tags == 0:
        return
    del d[12:16]
    st.tags -= 1
    if st.l3 is not None:
        st.l3 -= 4
    if st.l4 is not None:
        st.l4 -= 4
        st.l4end -= 4
    # READING: the key holds one tag; with another tag left on the wire
    # the key shows that one (as OVS's two-tag key would).
    if st.tags:
        st.key["vlan_tci"] = _be(d[14:16]) | VLAN_CFI
    else:
        st.key["vlan_tci"] = 0


def set_vlan_tci(st: State, tci: int) -> None:
    """Rewrites the outer tag's TCI (present bit stripped on the wire)."""
    st.data[14:16] = (tci & ~VLAN_CFI & 0xFFFF).to_bytes(2, "big")
    st.key["vlan_tci"] = tci | VLAN_CFI


# --------------------------------------------------------------------------------------
# The 5-tuple hash (README "Hashes")


def five_tuple_hash(key: Dict[str, int]) -> int:
    M = 0xFFFFFFFF
    dt = key["dl_type"]
    if dt in (ETH_IP, ETH_IPV6):
        if dt == ETH_IP:
            a, b = key["nw_src"], key["nw_dst"]
        else:
            a = b = 0
            for k in range(4):
                a ^= (key["ipv6_src"] >> (32 * k)) & M
                b ^= (key["ipv6_dst"] >> (32 * k)) & M
        c = 0
        if key["nw_proto"] in (IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP) and not key["nw_frag"] & FRAG_LATER:
            c = key["tp_src"] << 16 | key["tp_dst"]
        d = key["nw_proto"]
    else:
        s, t = key["dl_src"].to_bytes(6, "big"), key["dl_dst"].to_bytes(6, "big")
        a = int.from_bytes(s[0:4], "big")
        b = int.from_bytes(s[4:6] + t[0:2], "big")
        c = int.from_bytes(t[2:6], "big")
        d = dt
    x = (b * 0x1B873593) & M
    h = ((a * 0xCC9E2D51) ^ ((x << 16 | x >> 16) & M) ^ (c * 0x85EBCA6B) ^ (d * 0xC2B2AE35) ^ 0x9E3779B9) & M
    # MurmurHash3's finaliser
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


# --------------------------------------------------------------------------------------
# The pipeline walk


class Ctx:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.outputs: List[Tuple[int, bytes]] = []
        self.reason = "no_output"
        self.depth = 0
        self.resubmits = 0
        self.in_bucket = 0
        self.limit_in_bucket = False  # the resubmit limit was hit inside a group bucket
        self.log: List[str] = []
        self.recirc: List[tuple] = []  # copies waiting for their pass after conntrack
        self.recirc_depth = 0  # how many recirculations led to the current pass
        self.in_port = 0
        self.plain_ct_in_pass = False  # a ct without table ran in the current pass (for a known core bug)

    # ---------------------------------------------------------------- conntrack
    def ct(self, st: State, act) -> None:
        """docs/conntrack.md "The ct action"."""
        from .ct_model import CT_FIELDS, MAX_RECIRCULATIONS, CtDrop
        if act.zone_field is not None:
            f, ofs, nbits = act.zone_field
            zone = (read_field(st, f) >> ofs) & _full(nbits)
        else:
            zone = act.zone
        # table=T: a copy goes to conntrack (when ct is the last action "the packet itself
        # goes", which is the same thing when nothing follows). READING: when the ct(table=T)
        # is the last action of a rule reached by resubmit, the caller's later actions go
        # on with the pipeline's own, untracked and untranslated, view -- as after a fork.
        # Without table the packet itself is tracked and translated: its bytes change, but
        # READING: its key does not (docs: "only the reinjected copy (table=T) sees the
        # result"), so later matches and rewrites see the untranslated fields. READING: a
        # later ct of the same zone still knows that this one translated it (State.ct_dp).
        work = st.copy() if act.table is not None else st
        # READING: after a fork the original's view is untracked, but the ct (which ran on
        # the copy) did not change what earlier cts left on the packet itself (State.ct_dp)
        try:
            res = self.model.conntrack.execute(work, act, zone, self.in_port)
        except CtDrop as e:
            # docs: "drops the packet", counted under the reason. READING: without table
            # that is the packet itself: like drop(reason), it ends this pass (copies already
            # sent to conntrack go on). With table=T it is the copy: the original goes on,
            # and the copy's drop takes its place among the copies waiting for a pass (so it
            # is the last reason recorded if nothing comes after it).
            self.log.append(f"  ct: {e.reason}")
            if act.table is not None:
                self.recirc.append(("dropped", e.reason))
                for f in CT_FIELDS:
                    st.key[f] = 0
                return
            self.reason = e.reason
            raise Stop()
        self.log.append(f"  ct(zone={zone}): state={res.state:#x} mark={res.mark:#x}")
        work.ct_dp = (res.state, zone)
        if act.table is None:
            self.plain_ct_in_pass = True
        if act.table is not None:
            if self.recirc_depth >= MAX_RECIRCULATIONS:
                self.reason = "recirc_limit"
                self.log.append("  recirc_limit")
            else:
                # docs: registers, metadata and in_port (as a resubmit may have set it)
                frozen = {f: st.key[f] for f in ("in_port", "metadata") + tuple(f"reg{i}" for i in range(8))}
                self.recirc.append((bytes(work.data), frozen, res.key_fields(), act.table, self.recirc_depth + 1))
        for f in CT_FIELDS:
            st.key[f] = 0

    def recirculate(self, item: tuple) -> None:
        if item[0] == "dropped":
            self.reason = item[1]
            self.plain_ct_in_pass = False
            return
        data, frozen, ctf, table, depth = item
        # READING: the reinjected copy is parsed again from its (translated) bytes;
        # registers, metadata and in_port are those frozen at the ct.
        st = parse_packet(data, frozen["in_port"])
        st.key.update(frozen)
        st.key.update(ctf)
        st.ct_dp = (ctf["ct_state"], ctf["ct_zone"])
        self.rx_len = len(data)
        self.recirc_depth = depth
        self.depth = 0
        self.resubmits = 0  # READING: each pass is a translation of its own (as in OVS)
        # READING (README 8 "the last reason recorded", written before recirculation; "a
        # miss ended the walk"): each pass is a walk of its own that starts with nothing
        # recorded; a packet that is sent nowhere is counted under the reason of its last
        # pass.
        self.reason = "no_output"
        self.plain_ct_in_pass = False
        self.log.append(f"recirculation {depth} -> table {table} ({len(data)} bytes)")
        try:
            self.lookup(st, table)
        except Stop:
            pass

    def check_limits(self) -> None:
        """README 2 (as OVS): before every resubmit, goto_table and group, at most 64
        levels of nesting and 4096 rules reached by resubmit or goto_table."""
        if self.depth >= MAX_RESUBMIT_DEPTH or self.resubmits >= MAX_RESUBMITS:
            self.log.append("  resubmit limit" + (" (inside a group bucket)" if self.in_bucket else ""))
            self.limit_in_bucket = self.in_bucket > 0
            raise ResubmitLimit()

    def lookup(self, st: State, table: int, in_port: Optional[int] = None, counted: bool = False) -> None:
        """README 1 and 2: the best rule of ``table`` for the key, with ``in_port``
        (a resubmit's) in place of the packet's for the lookup only; for an IP
        fragment the L4 ports (ICMP type and code) read as 0 (frag mode normal)."""
        m = self.model
        ts = m.table_stats.setdefault(table, [0, 0])
        ts[0] += 1
        key = st.key
        frag = key["nw_frag"] & FRAG_ANY and m.frags == "normal"
        if in_port is not None or frag:
            key = dict(key)
            if in_port is not None:
                key["in_port"] = in_port
            if frag:
                for f in ("tp_src", "tp_dst", "icmp_type", "icmp_code", "icmpv6_type", "icmpv6_code"):
                    key[f] = 0
        best: Optional[Rule] = None
        for r in m.tables.get(table, []):
            if r.matches(key) and (best is None or r.priority > best.priority
                                   or (r.priority == best.priority and r.seq < best.seq)):
                best = r
        if best is None:
            self.log.append(f"table {table}: miss")
            self.reason = "table_miss"
            return
        if counted:
            self.resubmits += 1
        ts[1] += 1
        best.n_packets += 1
        best.n_bytes += self.rx_len  # README: the packet's size when its lookup began (as OVS)
        best.n_bytes_rx += self.rx_len
        self.log.append(f"table {table}: {best.text}")
        if not best.actions:
            self.reason = "action_drop"
            return
        self.execute(st, best.actions, table)

    def output(self, st: State, port: int) -> None:
        self.outputs.append((port, bytes(st.data)))

    def execute(self, st: State, actions: List[tuple], table: int) -> None:
        m = self.model
        for a in actions:
            op = a[0]
            if op == "ct":
                self.ct(st, a[1])
                continue
            if op == "ct_clear":
                for f in ("ct_state", "ct_zone", "ct_mark", "ct_label", "ct_nw_src", "ct_nw_dst", "ct_ipv6_src",
                          "ct_ipv6_dst", "ct_nw_proto", "ct_tp_src", "ct_tp_dst"):
                    st.key[f] = 0
                st.ct_dp = (0, 0)
                continue
            if op == "output":
                if a[1] != st.key["in_port"] and a[1] in m.port_name:
                    self.output(st, a[1])
            elif op == "in_port":
                self.output(st, st.key["in_port"])
            elif op in ("flood", "all"):
                for p in sorted(m.port_name):
                    if p != st.key["in_port"]:
                        self.output(st, p)
            elif op == "drop_reason":
                self.reason = a[1]
                self.log.append(f"  drop({a[1]})")
                raise Stop()
            elif op == "dec_ttl":
                # README 3: an IPv4/IPv6 packet is one whose dl_type says so (as in OVS); a
                # malformed header reads TTL 0. TTL 0/1 ends this action list only.
                if st.key["dl_type"] in (ETH_IP, ETH_IPV6):
                    ttl = st.key["nw_ttl"]
                    if ttl <= 1:
                        self.reason = "ttl_exceeded"
                        self.log.append("  dec_ttl: ttl exceeded, the action list ends")
                        return
                    set_field(st, "nw_ttl", ttl - 1, 0xFF)
            elif op == "set":
                set_field(st, a[1], a[2], a[3])
            elif op == "move":
                _, sf, so, df, do, n = a
                if move_prereqs_ok(st, sf) and move_prereqs_ok(st, df):
                    v = (read_field(st, sf) >> so) & _full(n)
                    set_field(st, df, v << do, _full(n) << do)
            elif op == "push_vlan":
                if st.eth:
                    # README 5: the new outer tag has VID 0 and PCP 0, tagged or not (as OVS)
                    push_vlan(st, a[1], 0)
            elif op == "pop_vlan":
                pop_vlan(st)
            elif op == "mod_vlan_vid":
                if st.eth:
                    if not st.tags:
                        push_vlan(st, 0x8100, 0)
                    set_vlan_tci(st, (st.key["vlan_tci"] & ~0x0FFF) | (a[1] & 0x0FFF))
            elif op == "mod_vlan_pcp":
                if st.eth:
                    if not st.tags:
                        push_vlan(st, 0x8100, 0)
                    set_vlan_tci(st, (st.key["vlan_tci"] & ~0xE000) | ((a[1] & 7) << 13))
            elif op == "note":
                pass
            elif op == "goto":
                self.check_limits()
                self.lookup(st, a[1], counted=True)
            elif op == "resubmit":
                # README 2: the port is the lookup's input port only; a resubmit to the
                # same or an earlier table nests one level deeper
                port, t = a[1], a[2]
                self.check_limits()
                tbl = table if t is None else t
                deepens = 1 if tbl <= table else 0
                self.depth += deepens
                try:
                    self.lookup(st, tbl, in_port=port, counted=True)
                finally:
                    self.depth -= deepens
            elif op == "group":
                self.check_limits()
                self.group(st, a[1], table)
            else:
                raise ValueError(f"model cannot run {a}")

    def group(self, st: State, gid: int, table: int) -> None:
        g = self.model.groups[gid]
        if g.gtype == "select":
            if not g.buckets:
                self.reason = "group_empty"
                return
            total = sum(w for w, _ in g.buckets)
            h = five_tuple_hash(st.key) % total
            for w, acts in g.buckets:
                if h < w:
                    chosen = [acts]
                    break
                h -= w
        else:
            chosen = [acts for _, acts in g.buckets]
        # READING: a group is a level of nesting for the resubmit depth limit, as in OVS
        # ("actions that count against the recursion limit include resubmit ... group");
        # the limit is enforced when a resubmit is reached (README: "64 nested resubmits").
        self.depth += 1
        self.in_bucket += 1
        try:
            for acts in chosen:
                clone = st.copy()
                try:
                    self.execute(clone, acts, table)
                except Stop:
                    # READING: drop(reason) / dec_ttl inside a bucket end that bucket only
                    # (the bucket runs on a copy; OVS: an error or `exit` in a bucket
                    # terminates only that bucket). The reason stays recorded.
                    pass
        finally:
            self.depth -= 1
            self.in_bucket -= 1
