"""The conntrack and NAT part of the reference model (tests/model.py).

Written from docs/conntrack.md, the contract of dpu's conntrack, and -- where that
page is silent, as it says -- from Open vSwitch's documented userspace
conntrack (ovs-actions(7) "The ct action", ovs-fields(7) "Connection Tracking
Fields") and the TCP window tracking it names (Guido van Rooij's "Real Stateful
TCP Packet Filtering in IP Filter", as pf and OVS's conntrack-tcp implement
it). Never from native/src/conntrack.

Deliberately simple: one dict from (zone, tuple) to (connection, direction),
plain Python integers, expiry handled by purging at every clock step.

What the documentation leaves to the implementation (the SNAT port when the
internal one is taken, the address of a multi-address range, when a port is
released after its connection expired) raises :class:`Unpredictable`: the
differential tests then compare everything up to that packet and stop.

Readings of docs/conntrack.md are marked "READING:" next to the code.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .model import (  # noqa: F401  (shared with the pipeline model)
    ETH_IP, ETH_IPV6, FRAG_ANY, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, State, _be,
    _rewrite, csum_incremental, parse_packet,
)

M32 = 0xFFFFFFFF

# ct_state bits (ovs-fields(7))
CS_NEW, CS_EST, CS_REL, CS_RPL, CS_INV, CS_TRK, CS_SNAT, CS_DNAT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80
CT_STATE_FLAGS = {"new": CS_NEW, "est": CS_EST, "rel": CS_REL, "rpl": CS_RPL, "inv": CS_INV, "trk": CS_TRK,
                  "snat": CS_SNAT, "dnat": CS_DNAT}

CT_FIELDS = ("ct_state", "ct_zone", "ct_mark", "ct_label", "ct_nw_src", "ct_nw_dst", "ct_ipv6_src", "ct_ipv6_dst",
             "ct_nw_proto", "ct_tp_src", "ct_tp_dst")

# docs "Timeouts and the clock": defaults in seconds
DEFAULT_TIMEOUTS = {"tcp_established": 7440.0, "tcp_transitory": 240.0, "udp": 300.0, "icmp": 60.0}

# TCP peer states, in the order pf / OVS compare them (only the ones the docs name are reached)
TCPS_CLOSED, TCPS_SYN_SENT, TCPS_ESTABLISHED, TCPS_CLOSING, TCPS_FIN_WAIT_2, TCPS_TIME_WAIT = 0, 2, 4, 7, 9, 10
TCPS_NAME = {TCPS_CLOSED: "CLOSED", TCPS_SYN_SENT: "SYN_SENT", TCPS_ESTABLISHED: "ESTABLISHED",
             TCPS_CLOSING: "CLOSING", TCPS_FIN_WAIT_2: "FIN_WAIT_2", TCPS_TIME_WAIT: "TIME_WAIT"}
TH_FIN, TH_SYN, TH_RST, TH_PSH, TH_ACK, TH_URG = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
MAXACKWINDOW = 65535 + 1500  # docs: "65535 + 1500"
WSCALE_FLAG, WSCALE_MASK, TCP_MAX_WSCALE = 0x80, 0x0F, 14

# READING: "the other side has not answered yet or either side is past FIN_WAIT_2"
# (the loosened check) is taken as OVS/pf's `state >= FIN_WAIT_2`, the same bound as
# "a SYN once both sides are at FIN_WAIT_2 or later starts a new connection".
LOOSE_FROM_STATE = TCPS_FIN_WAIT_2

# ICMP (docs "Protocols", "ct_state bits")
ICMP4_QUERY_REPLY = {8: 0, 13: 14}  # echo, timestamp: request -> reply type
ICMP4_ERRORS = {3, 4, 5, 11, 12}  # unreachable, source quench, redirect, time exceeded, parameter problem
ICMP6_QUERY_REPLY = {128: 129}
ICMP6_ERRORS = {1, 2, 3, 4}

# README 2: "A packet makes at most 8 passes (the first, tunnel pops and conntrack
# recirculations); a ninth is dropped (recirc_limit)".
MAX_RECIRCULATIONS = 7


class Unpredictable(Exception):
    """The documentation does not determine what happens next (see the module doc)."""


class CtDrop(Exception):
    """docs: a ct(commit) that cannot create its connection drops the packet."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def seq_geq(a: int, b: int) -> bool:
    return ((a - b) & M32) < 0x80000000


def seq_gt(a: int, b: int) -> bool:
    return 0 < ((a - b) & M32) < 0x80000000


def s32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v & 0x80000000 else v


# --------------------------------------------------------------------------------------
# The ct action (parsed from the flow text)


@dataclass
class NatSpec:
    kind: Optional[str] = None  # None (a bare `nat`), "src" or "dst"
    addr_lo: int = 0
    addr_hi: int = 0
    port_lo: int = 0  # 0: no port range
    port_hi: int = 0
    flags: Tuple[str, ...] = ()

    def key(self) -> tuple:
        return (self.kind, self.addr_lo, self.addr_hi, self.port_lo, self.port_hi, self.flags)


@dataclass
class CtAction:
    commit: bool = False
    force: bool = False
    zone: int = 0
    zone_field: Optional[Tuple[str, int, int]] = None  # (field, ofs, nbits)
    table: Optional[int] = None
    nat: Optional[NatSpec] = None
    exec_: List[Tuple[str, int, int]] = field(default_factory=list)  # ("mark"|"label", value, mask)


def parse_ct_action(text: str, split_top, parse_subfield, parse_value) -> CtAction:
    """``ct(...)`` -> CtAction (docs "The ct action" syntax)."""
    inner = text[3:-1]
    act = CtAction()
    for it in split_top(inner):
        if it == "commit":
            act.commit = True
        elif it == "force":
            act.force = True
        elif it.startswith("zone="):
            v = it[5:]
            if v[:1].isdigit():
                act.zone = int(v, 0)
            else:
                act.zone_field = parse_subfield(v)
        elif it.startswith("table="):
            act.table = int(it[6:], 0)
        elif it == "nat":
            act.nat = NatSpec()
        elif it.startswith("nat(") and it.endswith(")"):
            act.nat = parse_nat(it[4:-1], split_top)
        elif it.startswith("exec(") and it.endswith(")"):
            for e in split_top(it[5:-1]):
                name, _, arg = e.partition(":")
                val, dst = arg.split("->")
                if name == "set_field":
                    target = {"ct_mark": "mark", "ct_label": "label"}[dst]
                    v, m = parse_value(val, "int", 32 if target == "mark" else 128)
                    act.exec_.append((target, v, m))
                elif name == "load":
                    fname, _, rng = dst.partition("[")
                    target = {"NXM_NX_CT_MARK": "mark", "NXM_NX_CT_LABEL": "label"}[fname]
                    width = 32 if target == "mark" else 128
                    rng = rng.rstrip("]")
                    if rng == "":
                        a, n = 0, width
                    elif ".." in rng:
                        lo, hi = (int(x) for x in rng.split(".."))
                        a, n = lo, hi - lo + 1
                    else:
                        a, n = int(rng), 1
                    v = int(val, 0) & ((1 << n) - 1)
                    act.exec_.append((target, v << a, ((1 << n) - 1) << a))
                else:
                    raise ValueError(f"unknown exec action {e!r}")
        else:
            raise ValueError(f"unknown ct argument {it!r}")
    return act


def parse_nat(text: str, split_top) -> NatSpec:
    spec = NatSpec()
    flags = []
    for it in split_top(text):
        if it in ("random", "hash", "persistent"):
            flags.append(it)
            continue
        kind, _, rng = it.partition("=")
        if kind not in ("src", "dst"):
            raise ValueError(f"bad nat argument {it!r}")
        spec.kind = kind
        if not rng:
            continue
        addrs, _, ports = rng.partition(":")
        lo, _, hi = addrs.partition("-")
        spec.addr_lo = int(ipaddress.IPv4Address(lo))
        spec.addr_hi = int(ipaddress.IPv4Address(hi)) if hi else spec.addr_lo
        if ports:
            plo, _, phi = ports.partition("-")
            spec.port_lo = int(plo)
            spec.port_hi = int(phi) if phi else spec.port_lo
    spec.flags = tuple(sorted(flags))
    return spec


# --------------------------------------------------------------------------------------
# What conntrack reads from a packet


@dataclass(frozen=True)
class Tuple5:
    """A direction of a connection. TCP/UDP: ports; ICMP queries: sport = dport = the
    identifier, itype/icode the message type and code (docs: "keyed by the identifier;
    the reply type is the reply direction")."""
    family: int  # 4 or 6
    proto: int
    src: int
    dst: int
    sport: int
    dport: int
    itype: int = 0
    icode: int = 0

    def reverse(self) -> "Tuple5":
        it = self.itype
        if self.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
            table = ICMP4_QUERY_REPLY if self.proto == IPPROTO_ICMP else ICMP6_QUERY_REPLY
            back = {v: k for k, v in table.items()}
            it = table.get(self.itype, back.get(self.itype, self.itype))
        return Tuple5(self.family, self.proto, self.dst, self.src, self.dport, self.sport, it, self.icode)


@dataclass
class Pkt:
    """A packet as conntrack sees it (offsets into State.data)."""
    tuple: Tuple5
    kind: str  # "tcp" | "udp" | "query" | "error"
    l3: int
    l4: int
    l4end: int
    ip_end: int
    # TCP
    seq: int = 0
    ack: int = 0
    flags: int = 0
    win: int = 0
    payload: int = 0
    wscale: int = 0  # tcp_get_wscale(): WSCALE_FLAG | value, or 0
    # ICMP errors: the quoted packet's tuple and where it is
    inner: Optional[Tuple5] = None
    inner_l3: int = 0
    inner_l4: int = 0
    inner_ihl: int = 0


def _ip_info(st: State):
    """(family, proto, src, dst, l3, l4, l4end, ip_end) or None when conntrack cannot follow
    the IP layer (docs "inv": not IP, a fragment, an IP header cut short)."""
    key = st.key
    if st.l3kind == "ipv4" and key["dl_type"] == ETH_IP:
        if key["nw_frag"]:
            return None
        d = st.data
        ip_end = st.l3 + _be(d[st.l3 + 2:st.l3 + 4])
        return 4, key["nw_proto"], key["nw_src"], key["nw_dst"], st.l4, st.l4end, ip_end
    if st.l3kind == "ipv6" and key["dl_type"] == ETH_IPV6:
        if key["nw_frag"] or st.l4 is None:
            return None
        d = st.data
        ip_end = st.l3 + 40 + _be(d[st.l3 + 4:st.l3 + 6])
        return 6, key["nw_proto"], key["ipv6_src"], key["ipv6_dst"], st.l4, st.l4end, ip_end
    return None


def tcp_get_wscale(d: bytearray, l4: int, doff: int) -> int:
    """The window scale option of a TCP header (pf / OVS tcp_get_wscale)."""
    ln = doff * 4 - 20
    p = l4 + 20
    wscale = 0
    while ln >= 3:
        kind = d[p]
        if kind == 0:
            return wscale
        if kind == 1:
            p += 1
            ln -= 1
            continue
        if kind == 3:
            wscale = min(d[p + 2], TCP_MAX_WSCALE) | WSCALE_FLAG
        optlen = max(d[p + 1], 2)
        ln -= optlen
        p += optlen
    return wscale


def extract(data: bytes, in_port: int) -> Optional[Pkt]:
    """The packet as conntrack reads it, or None for `+inv` (docs "ct_state bits", inv)."""
    st = parse_packet(bytes(data), in_port)
    info = _ip_info(st)
    if info is None:
        return None
    family, proto, src, dst, l4, l4end, ip_end = info
    d = st.data
    size = l4end - l4
    if proto == IPPROTO_TCP:
        if st.l4kind != "tcp":
            return None
        doff = d[l4 + 12] >> 4
        if l4 + doff * 4 > l4end:
            return None  # READING: options cut short are a TCP header cut short
        t = Tuple5(family, proto, src, dst, _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4]))
        return Pkt(t, "tcp", st.l3, l4, l4end, ip_end, seq=_be(d[l4 + 4:l4 + 8]), ack=_be(d[l4 + 8:l4 + 12]),
                   flags=_be(d[l4 + 12:l4 + 14]) & 0x0FFF, win=_be(d[l4 + 14:l4 + 16]),
                   payload=max(0, l4end - l4 - doff * 4), wscale=tcp_get_wscale(d, l4, doff))
    if proto == IPPROTO_UDP:
        if st.l4kind != "udp":
            return None
        t = Tuple5(family, proto, src, dst, _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4]))
        return Pkt(t, "udp", st.l3, l4, l4end, ip_end)
    if (proto == IPPROTO_ICMP and family == 4) or (proto == IPPROTO_ICMPV6 and family == 6):
        # READING: an ICMP header is 8 bytes (type, code, checksum and the identifier of
        # queries / the unused word of errors); shorter is "cut short".
        if size < 8:
            return None
        itype, icode = d[l4], d[l4 + 1]
        queries = ICMP4_QUERY_REPLY if family == 4 else ICMP6_QUERY_REPLY
        errors = ICMP4_ERRORS if family == 4 else ICMP6_ERRORS
        if itype in queries or itype in queries.values():
            ident = _be(d[l4 + 4:l4 + 6])
            return Pkt(Tuple5(family, proto, src, dst, ident, ident, itype, icode), "query", st.l3, l4, l4end, ip_end)
        if itype in errors:
            inner = _extract_quoted(d, l4 + 8, l4end, family)
            if inner is None:
                return None
            t, il3, il4, ihl = inner
            own = Tuple5(family, proto, src, dst, 0, 0, itype, icode)
            return Pkt(own, "error", st.l3, l4, l4end, ip_end, inner=t, inner_l3=il3, inner_l4=il4, inner_ihl=ihl)
        return None
    return None


def _extract_quoted(d: bytearray, off: int, end: int, family: int):
    """The tuple of the packet an ICMP error quotes: an IP header of the error's family,
    not a later fragment, and 8 bytes of TCP/UDP/ICMP-query header (RFC 792's "64 bits
    of the original datagram"). READING: less than that is "cut short" (+inv)."""
    if family == 4:
        if end - off < 20 or d[off] >> 4 != 4:
            return None
        ihl = (d[off] & 0x0F) * 4
        if ihl < 20 or end - off < ihl:
            return None
        if _be(d[off + 6:off + 8]) & 0x1FFF:
            return None  # a later fragment quotes no L4 header
        proto = d[off + 9]
        src, dst = _be(d[off + 12:off + 16]), _be(d[off + 16:off + 20])
        l4 = off + ihl
    else:
        if end - off < 40 or d[off] >> 4 != 6:
            return None
        ihl = 40
        proto = d[off + 6]
        src, dst = _be(d[off + 8:off + 24]), _be(d[off + 24:off + 40])
        l4 = off + 40
    if end - l4 < 8:
        return None
    if proto in (IPPROTO_TCP, IPPROTO_UDP):
        t = Tuple5(family, proto, src, dst, _be(d[l4:l4 + 2]), _be(d[l4 + 2:l4 + 4]))
    elif (proto == IPPROTO_ICMP and family == 4) or (proto == IPPROTO_ICMPV6 and family == 6):
        queries = ICMP4_QUERY_REPLY if family == 4 else ICMP6_QUERY_REPLY
        itype = d[l4]
        if not (itype in queries or itype in queries.values()):
            return None  # an error quoting an error (or anything but a query) follows nothing
        ident = _be(d[l4 + 4:l4 + 6])
        t = Tuple5(family, proto, src, dst, ident, ident, itype, d[l4 + 1])
    else:
        return None
    return t, off, l4, ihl


# --------------------------------------------------------------------------------------
# Connections


@dataclass
class Peer:
    seqlo: int = 0
    seqhi: int = 0
    max_win: int = 0
    wscale: int = 0
    state: int = TCPS_CLOSED


@dataclass
class Mapping:
    """An endpoint-independent SNAT mapping (docs "NAT")."""
    key: tuple  # (zone, proto, internal addr, internal port/id, range key)
    pub_addr: int
    pub_port: int
    proto: int
    refs: int = 0
    stale: bool = False  # its connections expired; when its port is released is not known


@dataclass
class Conn:
    zone: int
    orig: Tuple5
    reply: Tuple5
    nat: Optional[str] = None  # "snat" | "dnat"
    mapping: Optional[Mapping] = None
    mark: int = 0
    label: int = 0
    expiry: int = 0  # ns
    reply_seen: bool = False  # UDP / ICMP: the reply direction has been seen
    peers: Optional[List[Peer]] = None  # TCP: [original side, reply side]
    seqno: int = 0


@dataclass
class CtResult:
    state: int
    zone: int
    mark: int = 0
    label: int = 0
    orig: Optional[Tuple5] = None  # for the ct_nw_*/ct_tp_* fields; None: zero

    def key_fields(self) -> Dict[str, int]:
        k = {f: 0 for f in CT_FIELDS}
        k["ct_state"], k["ct_zone"], k["ct_mark"], k["ct_label"] = self.state, self.zone, self.mark, self.label
        o = self.orig
        if o is not None:
            if o.family == 4:
                k["ct_nw_src"], k["ct_nw_dst"] = o.src, o.dst
            else:
                k["ct_ipv6_src"], k["ct_ipv6_dst"] = o.src, o.dst
            k["ct_nw_proto"] = o.proto
            if o.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
                # docs: "ICMP: type and code in ct_tp_src/ct_tp_dst"
                k["ct_tp_src"], k["ct_tp_dst"] = o.itype, o.icode
            else:
                k["ct_tp_src"], k["ct_tp_dst"] = o.sport, o.dport
        return k



def _slide(src: Peer, dst: Peer, win: int, sws: int, end: int, ack: int) -> None:
    """An accepted segment moves the window: the sender's largest window and highest
    sequence sent, and how far the receiver may now send."""
    if src.max_win < win:
        src.max_win = win
    if seq_gt(end, src.seqlo):
        src.seqlo = end
    if seq_geq((ack + (win << sws)) & M32, dst.seqhi):
        dst.seqhi = (ack + max(win << sws, 1)) & M32


class Conntrack:
    def __init__(self) -> None:
        self.table: Dict[Tuple[int, Tuple5], Tuple[Conn, bool]] = {}  # -> (conn, is reply tuple)
        self.conns: List[Conn] = []
        self.mappings: Dict[tuple, Mapping] = {}
        self.stale: List[Mapping] = []
        self.clock = 0  # ns; docs: "the newest time seen"
        self.timeouts = dict(DEFAULT_TIMEOUTS)
        self.max_connections: Optional[int] = None
        self.zone_limits: Dict[int, int] = {}
        self.zone_eif: Dict[int, bool] = {}
        self.seq = 0

    # ---------------------------------------------------------------- clock and expiry
    def advance(self, ts_ns: int) -> None:
        """docs: the conntrack clock is the newest time seen; a connection past its expiry
        is gone for every lookup at once.

        READING: "past its expiry" is `expiry <= clock`; a packet older than the clock
        does not move it back, and a packet accepted sets its connection to expire one
        timeout after the clock (which is the packet's time unless it is older)."""
        self.clock = max(self.clock, ts_ns)
        for c in [c for c in self.conns if c.expiry <= self.clock]:
            self._remove(c, expired=True)

    def _timeout(self, name: str) -> int:
        return round(self.timeouts[name] * 1e9)

    def _refresh(self, c: Conn, cls: str) -> None:
        c.expiry = self.clock + self._timeout(cls)

    def _remove(self, c: Conn, expired: bool = False) -> None:
        self.conns.remove(c)
        for t in (c.orig, c.reply):
            if self.table.get((c.zone, t), (None,))[0] is c:
                del self.table[(c.zone, t)]
        m = c.mapping
        if m is not None:
            m.refs -= 1
            if m.refs == 0:
                del self.mappings[m.key]
                if expired:
                    # READING (docs "Timeouts": "its NAT port [is] released by the owning
                    # worker's timer wheel in bounded slices between batches"): when the
                    # port of an expired connection's mapping becomes free again is not
                    # specified; until then choices that depend on it are Unpredictable.
                    m.stale = True
                    self.stale.append(m)

    # ---------------------------------------------------------------- the ct action
    def execute(self, st: State, act: CtAction, zone: int, in_port: int) -> CtResult:
        """Runs conntrack (and NAT) on ``st`` (its bytes change when translated)."""
        res, _, _, _ = self._execute(st, act, zone, in_port)
        return res

    def _execute(self, st: State, act: CtAction, zone: int, in_port: int):
        """The full path: -> (result, the packet's connection or None, reply direction, packet)."""
        p = extract(st.data, in_port)
        if p is None:
            return CtResult(CS_TRK | CS_INV, zone), None, False, None
        # docs: a packet that an earlier ct of the same zone translated (ct_state has
        # snat or dnat, ct_zone is this zone) is looked up by the reverse of its
        # translated tuple, finds the connection that translated it and is not
        # translated again; its snat/dnat bits stay. READING: "its ct_state" is what that
        # earlier ct gave the packet, also when the ct had no table (the pipeline's view is
        # cleared then, the packet's own state is not: State.ct_dp); the direction found
        # is turned round again (the packet still travels the way it did), and the packet
        # is otherwise tracked as usual (state, timeout).
        dp_state, dp_zone = st.ct_dp
        natted = dp_state & (CS_SNAT | CS_DNAT) if dp_zone == zone else 0
        if p.kind == "error":
            res, conn, reply = self._related(st, p, act, zone, natted)
            return res, conn, reply, p
        if natted:
            hit = self.table.get((zone, p.tuple.reverse()))
            if hit:
                hit = (hit[0], not hit[1])
        else:
            hit = self.table.get((zone, p.tuple))
        conn, reply = (hit if hit else (None, False))
        if conn is not None and act.force and act.commit and reply:
            # docs: force: a packet of a connection's reply direction deletes it and
            # commits a new one in its own direction
            self._remove(conn)
            conn, reply = None, False
        if conn is not None:
            if p.kind == "tcp":
                r = self._tcp_update(conn, reply, p)
                if r == "invalid":
                    # docs: "+inv and changes nothing"; READING: no mark/label, no tuple
                    return CtResult(CS_TRK | CS_INV, zone), None, False, p
                if r == "restart":
                    # docs: "a SYN once both sides are at FIN_WAIT_2 or later starts a new
                    # connection on the same tuple". READING: the old connection goes
                    # (whether or not this ct commits), and the SYN is handled as a packet
                    # with no connection.
                    self._remove(conn)
                    conn, reply = None, False
                else:
                    state = CS_NEW if r == "valid_new" else CS_EST
            else:
                if reply:
                    conn.reply_seen = True
                    state = CS_EST
                else:
                    state = CS_EST if conn.reply_seen else CS_NEW
                self._refresh(conn, "udp" if p.kind == "udp" else "icmp")
        if conn is not None:
            if reply:
                state |= CS_RPL
            if act.commit:
                self._exec(conn, act)
            if natted:
                state |= natted
            elif act.nat is not None and conn.nat is not None and p.tuple.family == 4:
                state |= self._translate(st, p, conn, reply)
            return CtResult(CS_TRK | state, zone, conn.mark, conn.label, conn.orig), conn, reply, p
        # no connection
        if not self._may_start(p):
            return CtResult(CS_TRK | CS_INV, zone), None, False, p
        if self.zone_eif.get(zone) and act.nat is not None and p.tuple.family == 4:
            m = self._eif_mapping(zone, p.tuple)
            if m is not None:
                res, conn = self._eif_create(st, p, act, zone, m)
                return res, conn, False, p
        if not act.commit:
            return CtResult(CS_TRK | CS_NEW, zone, 0, 0, p.tuple), None, False, p
        conn, bits = self._commit(st, p, act, zone)
        return CtResult(CS_TRK | CS_NEW | bits, zone, conn.mark, conn.label, conn.orig), conn, False, p

    def _may_start(self, p: Pkt) -> bool:
        if p.kind == "udp":
            return True
        if p.kind == "tcp":
            # docs: only a SYN without ACK starts a connection (and not one with flags no
            # stack sends)
            return (p.flags & (TH_SYN | TH_ACK)) == TH_SYN and not _tcp_bad_flags(p.flags)
        # ICMP: only queries start one; a reply with no connection is +inv
        table = ICMP4_QUERY_REPLY if p.tuple.proto == IPPROTO_ICMP else ICMP6_QUERY_REPLY
        return p.tuple.itype in table

    def _exec(self, conn: Conn, act: CtAction) -> None:
        for target, v, m in act.exec_:
            if target == "mark":
                conn.mark = (conn.mark & ~m & M32) | (v & m)
            else:
                conn.label = (conn.label & ~m & ((1 << 128) - 1)) | (v & m)

    def _live_count(self, zone: Optional[int] = None) -> int:
        return sum(1 for c in self.conns if zone is None or c.zone == zone)

    def _commit(self, st: State, p: Pkt, act: CtAction, zone: int) -> Tuple[Conn, int]:
        # READING: the zone's quota is checked before the dataplane's limit; expired
        # connections do not count (docs: released "right before refusing it").
        limit = self.zone_limits.get(zone, 0)
        if limit and self._live_count(zone) >= limit:
            self.release_expired()
            raise CtDrop("ct_quota")
        if self.max_connections is not None and self._live_count() >= self.max_connections:
            self.release_expired()
            raise CtDrop("ct_table_full")
        orig = p.tuple
        reply = orig.reverse()
        nat, mapping, bits = None, None, 0
        spec = act.nat
        if spec is not None and spec.kind is not None and orig.family == 4 and spec.addr_lo:
            icmp = orig.proto == IPPROTO_ICMP
            if spec.kind == "src":
                mapping = self._snat_mapping(zone, orig, spec)
                pub_addr, pub_port = mapping.pub_addr, mapping.pub_port
                # the reply comes back to the public endpoint (ICMP: the public identifier)
                reply = Tuple5(4, orig.proto, orig.dst, pub_addr, pub_port if icmp else orig.dport, pub_port,
                               reply.itype, reply.icode)
                nat = "snat"
            else:
                addr, port = self._dnat_target(orig, spec)
                if icmp:
                    port = orig.sport  # READING: DNAT of an ICMP query keeps its identifier
                reply = Tuple5(4, orig.proto, addr, orig.src, port, orig.sport, reply.itype, reply.icode)
                nat = "dnat"
        # docs: nat_collision: the translated reply tuple already belongs to another
        # connection. READING: checked for every commit (without NAT the reply tuple is
        # the reversed one, which can still be another connection's tuple).
        if (zone, reply) in self.table:
            if mapping is not None and mapping.refs == 0:
                self._drop_unused_mapping(mapping)
            raise CtDrop("nat_collision")
        self.seq += 1
        conn = Conn(zone, orig, reply, nat=nat, mapping=mapping, seqno=self.seq)
        if mapping is not None:
            mapping.refs += 1
        self._enter(conn, p)
        self._exec(conn, act)
        if nat is not None and act.nat is not None:
            bits = self._translate(st, p, conn, False)
        return conn, bits

    def _enter(self, conn: Conn, p) -> None:
        """A new connection's first timeout, and both its directions in the table."""
        if p.kind == "tcp":
            conn.peers = self._tcp_new(p)
            self._refresh(conn, "tcp_transitory")
        else:
            self._refresh(conn, "udp" if p.kind == "udp" else "icmp")
        self.conns.append(conn)
        self.table[(conn.zone, conn.orig)] = (conn, False)
        self.table[(conn.zone, conn.reply)] = (conn, True)

    def _drop_unused_mapping(self, m: Mapping) -> None:
        self.mappings.pop(m.key, None)

    # ---------------------------------------------------------------- NAT choices
    def _snat_mapping(self, zone: int, orig: Tuple5, spec: NatSpec) -> Mapping:
        """docs "NAT". READING: "a bitmap of the address's ports" is per public address and
        protocol, across zones."""
        iport = orig.sport  # ICMP: the identifier
        mkey = (zone, orig.proto, orig.src, iport, spec.key())
        m = self.mappings.get(mkey)
        if m is not None:
            return m  # docs: every later connection from that endpoint reuses it
        n = spec.addr_hi - spec.addr_lo + 1
        if n != 1:
            # docs: A + hash(internal address, zone) mod n -- the hash is not given
            raise Unpredictable("SNAT address from a multi-address range (undocumented hash)")
        addr = spec.addr_lo
        if spec.port_lo:
            lo, hi = spec.port_lo, spec.port_hi
        elif orig.proto == IPPROTO_ICMP:
            lo, hi = 1, 65535
        else:
            lo, hi = 1024, 65535
        keep_ok = (spec.port_lo == 0 or lo <= iport <= hi) and "random" not in spec.flags
        for attempt in (0, 1):
            live = {m.pub_port for m in self.mappings.values() if m.pub_addr == addr and m.proto == orig.proto}
            stale = {m.pub_port for m in self.stale if m.pub_addr == addr and m.proto == orig.proto
                     and m.key[:4] != mkey[:4]}
            if keep_ok and iport not in live and iport not in stale:
                # READING: a port held only by this very endpoint's expired mapping is its
                # own again (the mapping reused, or released and free: the same port).
                return self._new_mapping(mkey, addr, iport, orig.proto)
            held = {q for q in live | stale if lo <= q <= hi}
            nfree = hi - lo + 1 - len(held)
            if nfree > 1 or (nfree == 1 and keep_ok and iport in stale):
                # "else a free one in lo-hi": which one is not specified (nor whether the
                # internal port's expired holder has been released yet)
                raise Unpredictable("SNAT port search (start not specified)")
            if nfree == 1:
                return self._new_mapping(mkey, addr, next(q for q in range(lo, hi + 1) if q not in held),
                                         orig.proto)
            if not stale or attempt:
                raise CtDrop("nat_no_port")
            # docs: expired connections' ports are released "right before it would refuse
            # a commit for ... a port"
            self.stale = [m for m in self.stale if not (m.pub_addr == addr and m.proto == orig.proto)]
        raise AssertionError("unreachable")

    def _new_mapping(self, mkey: tuple, addr: int, port: int, proto: int) -> Mapping:
        m = Mapping(mkey, addr, port, proto)
        self.mappings[mkey] = m
        # a stale mapping of this endpoint is superseded
        self.stale = [s for s in self.stale if not (s.key == mkey)]
        return m

    def _dnat_target(self, orig: Tuple5, spec: NatSpec) -> Tuple[int, int]:
        if spec.addr_hi != spec.addr_lo:
            raise Unpredictable("DNAT address from a multi-address range (undocumented hash)")
        port = orig.dport
        if spec.port_lo and not spec.port_lo <= port <= spec.port_hi:
            if spec.port_lo != spec.port_hi:
                raise Unpredictable("DNAT port from a range by an undocumented hash")
            port = spec.port_lo
        return spec.addr_lo, port

    # ---------------------------------------------------------------- endpoint-independent filtering
    def _eif_mapping(self, zone: int, t: Tuple5) -> Optional[Mapping]:
        for m in self.mappings.values():
            if m.key[0] == zone and m.proto == t.proto and m.pub_addr == t.dst and m.pub_port == t.dport:
                return m
        return None

    def _eif_create(self, st: State, p: Pkt, act: CtAction, zone: int, m: Mapping) -> CtResult:
        """docs "Filtering": a ct(...,nat) of a packet to a mapped public endpoint that
        matches no connection creates one, destination-NATed to the internal endpoint.
        READING: it is created whether or not the ct commits (the docs say "creates
        one"), and takes a share of the mapping."""
        orig = p.tuple
        _, _, iaddr, iport, _ = m.key
        reply = Tuple5(4, orig.proto, iaddr, orig.src, iport, orig.sport, 0, 0)
        if (zone, reply) in self.table:
            raise CtDrop("nat_collision")
        self.seq += 1
        conn = Conn(zone, orig, reply, nat="dnat", mapping=m, seqno=self.seq)
        m.refs += 1
        self._enter(conn, p)
        if act.commit:
            self._exec(conn, act)
        bits = self._translate(st, p, conn, False)
        return CtResult(CS_TRK | CS_NEW | bits, zone, conn.mark, conn.label, conn.orig), conn

    # ---------------------------------------------------------------- translation
    def _rewrites(self, conn: Conn, reply: bool):
        """What a packet of this direction has rewritten: (field, old, new) for the
        address ("src"/"dst") and the port / identifier, and the ct_state bit."""
        o, r = conn.orig, conn.reply
        icmp = o.proto == IPPROTO_ICMP
        if conn.nat == "snat":
            # original: source (internal -> public); reply: destination (public -> internal)
            if not reply:
                return ("src", o.src, r.dst), ("sport", o.sport, r.dport), CS_SNAT, icmp
            return ("dst", r.dst, o.src), ("dport", r.dport, o.sport), CS_DNAT, icmp
        # dnat: original: destination (public -> internal); reply: source (back)
        if not reply:
            return ("dst", o.dst, r.src), ("dport", o.dport, r.sport), CS_DNAT, icmp
        return ("src", r.src, o.dst), ("sport", r.sport, o.dport), CS_SNAT, icmp

    def _translate(self, st: State, p: Pkt, conn: Conn, reply: bool) -> int:
        """Rewrites a packet of ``conn`` travelling in direction ``reply``; returns the
        ct_state NAT bit. READING: the bit is set when this ct translates the packet's
        connection in that direction, even if the bytes happen to stay the same."""
        (af, aold, anew), (pf, pold, pnew), bit, icmp = self._rewrites(conn, reply)
        d = st.data
        l3, l4 = p.l3, p.l4
        ipcs = [(l3 + 10, False)]
        if p.kind == "tcp":
            l4cs = [(l4 + 16, False)]
        elif p.kind == "udp":
            l4cs = [(l4 + 6, True)]
        else:
            l4cs = []
        off = l3 + (12 if af == "src" else 16)
        _rewrite(st, off, anew.to_bytes(4, "big"), ipcs + l4cs)
        if p.kind in ("tcp", "udp"):
            _rewrite(st, l4 + (0 if pf == "sport" else 2), pnew.to_bytes(2, "big"), l4cs)
        else:
            # ICMP query: the identifier (both "ports" are the identifier)
            _rewrite(st, l4 + 4, pnew.to_bytes(2, "big"), [(l4 + 2, False)])
        return bit

    def _related(self, st: State, p: Pkt, act: CtAction, zone: int, natted: int):
        # READING: "whose quoted packet belongs to a connection": the quote is the packet
        # as the error's sender saw it, i.e. after this conntrack translated it, travelling
        # against the error; so the quote is reversed and looked up as a packet of the
        # error's own direction (as OVS's userspace conntrack does). A quote of the
        # untranslated form of a translated connection's packet belongs to nothing.
        # docs: the error must also be addressed to the quoted packet's sender.
        if p.tuple.dst != p.inner.src:
            return CtResult(CS_TRK | CS_INV, zone), None, False
        if natted:
            # translated by an earlier ct of this zone: the quote is back in its sender's form
            hit = self.table.get((zone, p.inner))
            if hit:
                hit = (hit[0], not hit[1])
        else:
            hit = self.table.get((zone, p.inner.reverse()))
        if hit is None:
            return CtResult(CS_TRK | CS_INV, zone), None, False  # docs: an error that quotes no connection
        conn, reply = hit  # the direction the error travels
        quoted_reply = not reply
        state = CS_TRK | CS_REL | (CS_RPL if reply else 0)
        # READING: exec (with commit) sets the mark/label of the connection an error is
        # related to, as it does for any packet of an existing connection (docs: "on a
        # new connection or an existing one"); errors never create connections.
        if act.commit:
            self._exec(conn, act)
        if natted:
            state |= natted
        elif act.nat is not None and conn.nat is not None and p.tuple.family == 4:
            state |= self._translate_error(st, p, conn, reply, quoted_reply)
        # docs: "ICMP errors never end or refresh a connection"
        return CtResult(state, zone, conn.mark, conn.label, conn.orig), conn, reply

    def _translate_error(self, st: State, p: Pkt, conn: Conn, reply: bool, quoted_reply: bool) -> int:
        """docs "NAT": an ICMP error is translated as a packet of its direction (its
        destination, and its source when the translated endpoint sent it), and the
        packet it quotes back to what that packet's sender sent (RFC 5508)."""
        d = st.data
        l3, l4 = p.l3, p.l4
        (af, aold, anew), _, bit, _ = self._rewrites(conn, reply)
        # the outer header
        off = l3 + (12 if af == "src" else 16)
        cur = _be(d[off:off + 4])
        if af == "dst" or cur == aold:
            _rewrite(st, off, anew.to_bytes(4, "big"), [(l3 + 10, False)])
        # the quoted packet: undo the translation of its own direction
        (qf, qold, qnew), (qpf, qpold, qpnew), _, icmp = self._rewrites(conn, quoted_reply)
        end = p.l4end
        icmp_start = l4
        before = bytes(d[icmp_start:end])
        il3, il4 = p.inner_l3, p.inner_l4
        inner_ip_cs = [(il3 + 10, False)]
        proto = p.inner.proto
        if proto == IPPROTO_TCP:
            inner_l4cs = [(il4 + 16, False)] if end - il4 >= 18 else []
        elif proto == IPPROTO_UDP:
            inner_l4cs = [(il4 + 6, True)] if end - il4 >= 8 else []
        else:
            inner_l4cs = []
        aoff = il3 + (12 if qf == "src" else 16)
        # the quoted packet carries the translated value (qnew): put back qold
        _rewrite_raw(st, aoff, qold.to_bytes(4, "big"), inner_ip_cs + inner_l4cs)
        if proto in (IPPROTO_TCP, IPPROTO_UDP):
            _rewrite_raw(st, il4 + (0 if qpf == "sport" else 2), qpold.to_bytes(2, "big"), inner_l4cs)
        else:
            _rewrite_raw(st, il4 + 4, qpold.to_bytes(2, "big"), [(il4 + 2, False)])
        after = bytes(d[icmp_start:end])
        if before != after:
            # the ICMP checksum over all of it (incrementally, over the changed words)
            hc = _be(d[l4 + 2:l4 + 4])
            ob, nb = before, after
            if len(ob) % 2:
                ob, nb = ob + b"\0", nb + b"\0"
            nc = csum_incremental(hc, ob, nb)
            d[l4 + 2:l4 + 4] = nc.to_bytes(2, "big")
        return bit

    # ---------------------------------------------------------------- TCP
    def _tcp_new(self, p: Pkt) -> List[Peer]:
        """pf / OVS: the first SYN sets the original side (the docs: SYN_SENT)."""
        src, dst = Peer(), Peer()
        src.seqlo = p.seq
        src.seqhi = (p.seq + p.payload + 1 + (1 if p.flags & TH_SYN else 0) + (1 if p.flags & TH_FIN else 0)) & M32
        src.wscale = p.wscale
        # READING: docs "max_win the largest window advertised (unscaled)": window fields
        # as carried, except that a SYN's window (a real size: SYNs are never scaled) is
        # divided by the SYN's scale, rounding up, as pf / OVS do, so that max_win << scale
        # stays the window
        src.max_win = max(p.win, 1)
        if src.wscale & WSCALE_MASK:
            src.max_win = -(-src.max_win // (1 << (src.wscale & WSCALE_MASK)))
        dst.seqhi = 1
        dst.max_win = 1
        src.state = TCPS_SYN_SENT
        dst.state = TCPS_CLOSED
        return [src, dst]

    def _tcp_update(self, conn: Conn, reply: bool, p: Pkt) -> str:
        """docs "Protocols", TCP: the window rules. Returns "valid", "valid_new",
        "invalid" or "restart"."""
        src = conn.peers[1 if reply else 0]
        dst = conn.peers[0 if reply else 1]
        flags = p.flags
        if _tcp_bad_flags(flags):
            return "invalid"
        if (flags & (TH_SYN | TH_ACK)) == TH_SYN:
            if dst.state >= TCPS_FIN_WAIT_2 and src.state >= TCPS_FIN_WAIT_2:
                return "restart"
            if src.state <= TCPS_SYN_SENT:
                # docs: +new: "a TCP SYN retransmitted before the SYN-ACK"
                src.state = TCPS_SYN_SENT
                self._refresh(conn, "tcp_transitory")
                return "valid_new"
        sws = dws = 0
        # docs: "window scale sws/dws once both SYNs carried the option". READING: not for
        # SYN segments, whose window is never scaled (RFC 7323; pf / OVS)
        if src.wscale & WSCALE_FLAG and dst.wscale & WSCALE_FLAG and not flags & TH_SYN:
            sws = src.wscale & WSCALE_MASK
            dws = dst.wscale & WSCALE_MASK
        win = p.win
        seq = orig_seq = p.seq
        ack = p.ack
        check_ackskew = True
        if src.state < TCPS_SYN_SENT:
            # the first packet from this side. READING: the docs do not describe how a
            # side's first packet initialises its window (seqlo, seqhi, max_win); this is
            # pf's / OVS's, including OVS's relaxation: when it (re)opens the window, its
            # acknowledgement skew is not checked (a connection picked up mid-way).
            end = seq + p.payload
            if flags & TH_SYN:
                end += 1
                if dst.wscale & WSCALE_FLAG:
                    # pf / OVS: with both SYNs scaled this SYN's window is divided by its
                    # scale (rounding up) and the shifts apply to it; otherwise the other
                    # side's SYN window is shifted back to its real size. READING: max_win is
                    # a window, not a 16-bit register as in pf / OVS (where 65535 with scale
                    # 7 comes back as 0)
                    src.wscale = p.wscale
                    if src.wscale & WSCALE_FLAG:
                        sws = src.wscale & WSCALE_MASK
                        win = -(-win // (1 << sws))
                        dws = dst.wscale & WSCALE_MASK
                    else:
                        dst.max_win = dst.max_win << (dst.wscale & WSCALE_MASK)
                        dst.wscale = 0
            if flags & TH_FIN:
                end += 1
            end &= M32
            src.seqlo = seq
            src.state = TCPS_SYN_SENT
            if src.seqhi == 1 or seq_geq(end + max(1, dst.max_win << dws), src.seqhi):
                src.seqhi = (end + max(1, dst.max_win << dws)) & M32
                check_ackskew = False
            if win > src.max_win:
                src.max_win = win
        else:
            end = (seq + p.payload + (1 if flags & TH_SYN else 0) + (1 if flags & TH_FIN else 0)) & M32
        if not flags & TH_ACK:
            ack = dst.seqlo  # docs: "checked as if it acknowledged seqlo[d]"
        if seq == end:
            seq = end = src.seqlo  # docs: no payload, SYN or FIN: seq = end = seqlo[s]
        ackskew = s32(dst.seqlo - ack) if check_ackskew else 0
        in_window = (seq_geq(src.seqhi, end)
                     and seq_geq(seq, (src.seqlo - (dst.max_win << dws)) & M32)
                     and -MAXACKWINDOW <= ackskew <= (MAXACKWINDOW << sws)
                     and (not flags & TH_RST or orig_seq == src.seqlo or orig_seq == (src.seqlo + 1) & M32
                          or (orig_seq + 1) & M32 == src.seqlo))
        if in_window:
            _slide(src, dst, win, sws, end, ack)
            if flags & TH_SYN and src.state < TCPS_SYN_SENT:
                src.state = TCPS_SYN_SENT
            if flags & TH_FIN and src.state < TCPS_CLOSING:
                src.state = TCPS_CLOSING
            if flags & TH_ACK:
                if dst.state == TCPS_SYN_SENT:
                    dst.state = TCPS_ESTABLISHED
                elif dst.state == TCPS_CLOSING:
                    dst.state = TCPS_FIN_WAIT_2
            if flags & TH_RST:
                src.state = dst.state = TCPS_TIME_WAIT
            if src.state == TCPS_ESTABLISHED and dst.state == TCPS_ESTABLISHED:
                self._refresh(conn, "tcp_established")
            else:
                self._refresh(conn, "tcp_transitory")
            return "valid"
        if ((dst.state < TCPS_SYN_SENT or dst.state >= LOOSE_FROM_STATE or src.state >= LOOSE_FROM_STATE)
                and seq_geq((src.seqhi + MAXACKWINDOW) & M32, end)
                and seq_geq(seq, (src.seqlo - MAXACKWINDOW) & M32)):
            # docs: accepted, but the connection's timeout is not refreshed
            _slide(src, dst, win, sws, end, ack)
            if flags & TH_FIN and src.state < TCPS_CLOSING:
                src.state = TCPS_CLOSING
            if flags & TH_RST:
                src.state = dst.state = TCPS_TIME_WAIT
            return "valid"
        return "invalid"

    def release_expired(self) -> None:
        """docs: what expired is released (its NAT port too) right before a commit is
        refused for a quota, the limit or a port, and before a dump or a counter read."""
        self.stale = []

    # ---------------------------------------------------------------- dumps
    def dump(self, zone: Optional[int] = None) -> List[str]:
        """docs "Dumps": sorted by zone, protocol and tuple."""
        self.release_expired()
        conns = [c for c in self.conns if zone is None or c.zone == zone]
        conns.sort(key=lambda c: (c.zone, c.orig.proto, c.orig.family, c.orig.src, c.orig.dst, c.orig.sport,
                                  c.orig.dport, c.orig.itype, c.orig.icode))
        return [render(c) for c in conns]


def _tcp_bad_flags(flags: int) -> bool:
    """docs: "TCP flags no stack sends (SYN with RST or FIN, a segment without ACK that
    is neither SYN nor RST)". READING: exactly these (OVS also refuses FIN, PSH or URG
    without ACK; the docs' list is taken as complete)."""
    if flags & TH_SYN:
        return bool(flags & (TH_RST | TH_FIN))
    return not flags & (TH_ACK | TH_RST)


def _rewrite_raw(st: State, off: int, new: bytes, csums) -> None:
    """_rewrite for bytes inside an ICMP payload: same incremental updates."""
    _rewrite(st, off, new, csums)


def _addr(family: int, v: int) -> str:
    return str(ipaddress.IPv4Address(v) if family == 4 else ipaddress.IPv6Address(v))


def _side(t: Tuple5) -> str:
    s = f"src={_addr(t.family, t.src)},dst={_addr(t.family, t.dst)}"
    if t.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
        return s + f",id={t.sport},type={t.itype},code={t.icode}"
    return s + f",sport={t.sport},dport={t.dport}"


PROTO_NAMES = {IPPROTO_TCP: "tcp", IPPROTO_UDP: "udp", IPPROTO_ICMP: "icmp",
               IPPROTO_ICMPV6: "icmpv6"}  # READING: OVS's name for ICMPv6 (the docs show none)


def render(c: Conn) -> str:
    """docs "Dumps": the shape of ovs-appctl dpctl/dump-conntrack; zone= left out for
    zone 0, mark= when 0, labels= when 0. READING: mark in decimal, labels in hex, as
    OVS prints them; TCP: the later side's state, FIN_WAIT_2 shown as TIME_WAIT."""
    s = f"{PROTO_NAMES[c.orig.proto]},orig=({_side(c.orig)}),reply=({_side(c.reply)})"
    if c.zone:
        s += f",zone={c.zone}"
    if c.mark:
        s += f",mark={c.mark}"
    if c.label:
        s += f",labels={c.label:#x}"
    if c.peers is not None:
        st = max(c.peers[0].state, c.peers[1].state)
        if st == TCPS_FIN_WAIT_2:
            st = TCPS_TIME_WAIT
        s += f",protoinfo=(state={TCPS_NAME[st]})"
    return s
