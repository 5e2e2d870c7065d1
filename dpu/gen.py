"""dpu.gen: the traffic generator (``dpu gen``).

A scapy template is built once (padded to ``size`` with a Raw payload first, so
scapy fixes its lengths and checksums), dissected once with scapy to find the
offset of each header, and turned into a plan: which bytes vary per flow, over
what range, and which checksums those bytes touch. The Cython engine
(``dpu/_gen.pyx``) then stamps packets from the plan with no Python object per
packet, fixing IPv4 header and TCP/UDP/ICMPv6 checksums incrementally (RFC 1624).

Flows. ``flows=N``: packet i belongs to flow ``i % N``. Fields that tell flows
apart ("key" fields: ip.src/dst, ipv6.src/dst, l4.sport/dport for IP templates;
eth.src/dst and vlan.vid otherwise) are the digits of a mixed-radix number, the
first key field in ``vary`` changing fastest, so N flows are N distinct
5-tuples (MAC pairs for non-IP) whenever the ranges allow, and a ValueError
names the ranges when they do not. Other varied fields (eth.*, vlan.vid,
ip.ttl, ip.tos, ipv6.hlim in IP templates) cycle with the flow: value index
``flow % range size``. Without ``flows``, packet i is flow i: the same
values, never wrapping except where a range runs out. ``flows`` without
``vary`` varies the L4 source port over 1024-65535, then the IP source (counting
up from the template's) if more flows are needed; the IP source alone for IP
without TCP/UDP; the Ethernet source for non-IP.

Fields refer to the outermost header of their kind (the outer IP of a VXLAN
template); inner headers are copied unchanged, and the outer checksums stay
right because only outer bytes change.

Checksums: a UDP checksum of 0 in the template (no checksum) stays 0; a
computed UDP checksum of 0 is sent as 0xffff. Other protocols' checksums
(SCTP, inner headers) are copied unchanged, which is right because only the
outer fields above change.

``seed``: 0 gives each field's values in order from the start of its range;
any other seed permutes each field's values by a seeded bijection
((a*d + b) mod n), so flows stay distinct, reproducibly.

Templates: a scapy packet, a string scapy expression (evaluated by
:mod:`dpu.packet_expr`, with the names of ``scapy.all`` only: this is ``eval``,
give it trusted text only), or raw frame bytes. The frame must start with an
Ethernet header. Addresses scapy would take from the host (Ethernet
destination and source, IP/IPv6/ARP source) get the fixed defaults of
:mod:`dpu.packet_expr` when unset (ff:ff:ff:ff:ff:ff, 00:00:00:00:00:00,
0.0.0.0, ::), so building never sends an ARP or neighbour solicitation and
the same template gives the same bytes on every machine.

Ranges: a value, 'first-last' (ints, IPv4/IPv6/MAC addresses) or an address
prefix 'addr/len' (every address in it, network and broadcast included). A
range of more than 2**63 - 1 values uses its first 2**63 - 1.

Thread-safety: every call builds its own plan (with scapy, under the GIL); the
stamping and pcap loops release the GIL.
"""
from __future__ import annotations

import ipaddress
import math
import os
import random
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _gen, packet_expr
from .errors import InvalidArgumentError, from_native

__all__ = ["Packets", "generate", "generate_pcap", "read_pcap", "FIELDS"]

MAX_FRAME = 262144  # dpu::PcapWriter's snap length
_U64 = (1 << 64) - 1
_N_CAP = (1 << 63) - 1  # the engine keeps range sizes below 2**63

Template = Union[str, bytes, bytearray, memoryview, "scapy.packet.Packet"]  # noqa: F821


def _err(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(msg)


# --------------------------------------------------------------------------- fields

@dataclass(frozen=True)
class _FieldDef:
    layer: str  # eth, vlan, ip, ipv6, l4
    rel: int  # offset inside its header
    width: int  # bytes; 0 = the 12-bit VLAN id in the TCI
    kind: str  # mac, ipv4, ipv6, int
    bits: int


_FIELD_DEFS: Dict[str, _FieldDef] = {
    "eth.src": _FieldDef("eth", 6, 6, "mac", 48),
    "eth.dst": _FieldDef("eth", 0, 6, "mac", 48),
    "vlan.vid": _FieldDef("vlan", 0, 0, "int", 12),
    "ip.src": _FieldDef("ip", 12, 4, "ipv4", 32),
    "ip.dst": _FieldDef("ip", 16, 4, "ipv4", 32),
    "ip.ttl": _FieldDef("ip", 8, 1, "int", 8),
    "ip.tos": _FieldDef("ip", 1, 1, "int", 8),
    "ipv6.src": _FieldDef("ipv6", 8, 16, "ipv6", 128),
    "ipv6.dst": _FieldDef("ipv6", 24, 16, "ipv6", 128),
    "ipv6.hlim": _FieldDef("ipv6", 7, 1, "int", 8),
    "l4.sport": _FieldDef("l4", 0, 2, "int", 16),
    "l4.dport": _FieldDef("l4", 2, 2, "int", 16),
}

_ALIASES: Dict[str, str] = {name: name for name in _FIELD_DEFS}
_ALIASES.update({
    "ether.src": "eth.src", "ether.dst": "eth.dst",
    "vlan.id": "vlan.vid", "vlan": "vlan.vid", "dot1q.vlan": "vlan.vid", "dot1q.vid": "vlan.vid",
    "ipv4.src": "ip.src", "ipv4.dst": "ip.dst", "ipv4.ttl": "ip.ttl", "ipv4.tos": "ip.tos",
    "tcp.sport": "l4.sport", "tcp.dport": "l4.dport", "udp.sport": "l4.sport", "udp.dport": "l4.dport",
    # the names of the flow syntax (ovs-fields(7)), as in --flows files and dump-flows
    "dl_src": "eth.src", "dl_dst": "eth.dst", "eth_src": "eth.src", "eth_dst": "eth.dst",
    "dl_vlan": "vlan.vid", "vlan_vid": "vlan.vid",
    "nw_src": "ip.src", "nw_dst": "ip.dst", "ip_src": "ip.src", "ip_dst": "ip.dst", "nw_ttl": "ip.ttl",
    "ipv6_src": "ipv6.src", "ipv6_dst": "ipv6.dst",
    "tp_src": "l4.sport", "tp_dst": "l4.dport", "tcp_src": "l4.sport", "tcp_dst": "l4.dport",
    "udp_src": "l4.sport", "udp_dst": "l4.dport",
})

#: Field names accepted in ``vary``: dpu's (eth.src, ip.dst, l4.sport, ...), scapy-style
#: aliases (udp.sport, ...) and the flow syntax's (dl_src, nw_dst, tp_src, tcp_dst, ...).
FIELDS = tuple(sorted(_ALIASES))

_IP_KEYS = {"ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "l4.sport", "l4.dport"}
_L2_KEYS = {"eth.src", "eth.dst", "vlan.vid"}

_MAC_RE = re.compile(r"^[0-9a-fA-F]{1,2}(:[0-9a-fA-F]{1,2}){5}$")


def _parse_scalar(kind: str, text: str, where: str) -> int:
    t = text.strip()
    try:
        if kind == "mac":
            if not _MAC_RE.match(t):
                raise ValueError("not a MAC address like 02:00:00:00:00:01")
            return int("".join(p.zfill(2) for p in t.split(":")), 16)
        if kind == "ipv4":
            return int(ipaddress.IPv4Address(t))
        if kind == "ipv6":
            return int(ipaddress.IPv6Address(t))
        return int(t, 0)
    except ValueError as e:
        raise _err(f"{where}: bad value {t!r}: {e}") from None


def _parse_range(name: str, fd: _FieldDef, spec) -> Tuple[int, int]:
    """(first value, number of values) of a vary spec: a value, 'A-B', or an address prefix 'A/len'."""
    where = f"vary[{name!r}]"
    top = (1 << fd.bits) - 1
    if isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise _err(f"{where}: a range is a string like '1000-2000' or '10.0.0.0/24' (or an int), "
                   f"not {type(spec).__name__}")
    if isinstance(spec, int):
        lo, hi = spec, spec
    else:
        s = spec.strip()
        if not s:
            raise _err(f"{where}: empty range")
        if "/" in s:
            if fd.kind == "int":
                raise _err(f"{where}: bad range {s!r}: a /prefix is for addresses; use 'A-B'")
            addr, _, plen_s = s.partition("/")
            if not plen_s.strip().isdigit() or not 0 <= int(plen_s) <= fd.bits:
                raise _err(f"{where}: bad range {s!r}: prefix length must be 0..{fd.bits}")
            plen = int(plen_s)
            host_bits = fd.bits - plen
            lo = _parse_scalar(fd.kind, addr, where) >> host_bits << host_bits
            hi = lo + (1 << host_bits) - 1
        elif "-" in s:
            parts = s.split("-")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise _err(f"{where}: bad range {s!r}: expected 'first-last'")
            lo, hi = (_parse_scalar(fd.kind, p, where) for p in parts)
        else:
            lo = hi = _parse_scalar(fd.kind, s, where)
    if not 0 <= lo <= top or not 0 <= hi <= top:
        raise _err(f"{where}: {spec!r} is outside the field's range 0..{top}")
    if hi < lo:
        raise _err(f"{where}: bad range {spec!r}: last value is below the first")
    return lo, hi - lo + 1


# --------------------------------------------------------------------------- template

def _scapy():
    import scapy.all as S  # imported lazily: it takes a second

    return S


def _template_packet(template):
    S = _scapy()
    if isinstance(template, (bytes, bytearray, memoryview)):
        raw = bytes(template)
        if len(raw) < 14:
            raise _err(f"template: {len(raw)} bytes is shorter than an Ethernet header (14)")
        return S.Ether(raw), True
    if isinstance(template, str):
        return packet_expr.evaluate(template, "template"), False
    if isinstance(template, S.Packet):
        return packet_expr.offline_defaults(template.copy()), False
    raise TypeError(f"template must be a scapy packet, a scapy expression string or bytes, "
                    f"not {type(template).__name__}")


def _layers(pkt):
    S = _scapy()
    layer = pkt
    while layer is not None and not isinstance(layer, S.NoPayload):
        yield layer
        layer = layer.payload


def _largest_frame(pkt, total: int) -> Optional[Tuple[int, str]]:
    """The largest frame the template's 16-bit length fields can describe
    (IPv4 total length, IPv6 payload length, UDP length), and that field; None
    when it has none. A layer's offset: the frame's length less the layer's."""
    S = _scapy()
    best = None
    for layer in _layers(pkt):
        extra = {S.IP: 0, S.IPv6: 40, S.UDP: 0}.get(type(layer))
        if extra is None:
            continue
        top = total - len(bytes(layer)) + extra + 65535
        if best is None or top < best[0]:
            best = (top, {S.IP: "IPv4 total", S.IPv6: "IPv6 payload", S.UDP: "UDP"}[type(layer)])
    return best


def _build(template, size: Optional[int]) -> bytes:
    """The template's bytes, padded to `size` with a Raw payload built by scapy."""
    S = _scapy()
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise _err(f"size must be an int, not {type(size).__name__}")
        if size > MAX_FRAME:
            raise _err(f"size {size} is larger than the largest frame ({MAX_FRAME})")
    pkt, from_bytes = _template_packet(template)
    if from_bytes and (size is None or size == len(template)) and len(template) <= MAX_FRAME:
        return bytes(template)  # exactly as given
    if not isinstance(pkt, S.Ether):
        raise _err(f"template starts with {pkt.__class__.__name__}; it must start with Ether() "
                   "(frames are Ethernet)")
    if from_bytes and pkt.haslayer(S.Padding):  # captured frames carry trailing padding: size decides
        pkt[S.Padding].underlayer.remove_payload()
    try:
        built = bytes(pkt)
    except Exception as e:  # noqa: BLE001
        raise _err(f"template does not build: {type(e).__name__}: {e}") from None
    if size is None:
        if len(built) > MAX_FRAME:
            raise _err(f"template is {len(built)} bytes; frames are at most {MAX_FRAME}")
        return built
    if size < len(built):
        raise _err(f"size {size} is smaller than the template's headers ({len(built)} bytes)")
    if size == len(built):
        return built
    if from_bytes:  # let scapy recompute what the padding changes (a UDP checksum of 0 stays 0)
        for layer in _layers(pkt):
            if isinstance(layer, S.IP):
                layer.len = layer.chksum = None
            elif isinstance(layer, S.IPv6):
                layer.plen = None
            elif isinstance(layer, S.UDP):
                layer.len = None
                if layer.chksum != 0:
                    layer.chksum = None
            elif isinstance(layer, (S.TCP, S.ICMP)):
                layer.chksum = None
            elif "cksum" in layer.fields and layer.__class__.__name__.startswith("ICMPv6"):
                layer.cksum = None
    limit = _largest_frame(pkt, len(built))
    if limit is not None and size > limit[0]:
        raise _err(f"size {size} is larger than this template allows: its {limit[1]} length field holds at most "
                   f"65,535, so its frames are at most {limit[0]:,} bytes")
    try:
        padded = bytes(pkt / S.Raw(b"\x00" * (size - len(built))))
    except Exception as e:  # noqa: BLE001
        raise _err(f"could not pad the template to size {size}: {type(e).__name__}: {e}") from None
    if len(padded) != size:
        raise _err(f"could not pad the template to size {size} (got {len(padded)} bytes)")
    return padded


@dataclass
class _Layout:
    eth: int = 0
    vlan: Optional[int] = None
    ip: Optional[int] = None  # IPv4 header offset (outermost network header)
    ipv6: Optional[int] = None
    l4: Optional[int] = None  # TCP/UDP header offset, the network header's own payload
    l4_name: Optional[str] = None  # 'tcp', 'udp', 'icmpv6'
    l4_csum: Optional[int] = None  # offset of the L4 checksum, None when absent or a UDP 0
    ipv6_routing: bool = False  # a routing header: ipv6.dst is not the pseudo-header's


def _layout(built: bytes) -> _Layout:
    S = _scapy()
    pkt = S.Ether(built)
    lay = _Layout()
    off = 0
    seq = []
    for layer in _layers(pkt):
        seq.append((layer, off))
        cache = layer.raw_packet_cache
        if cache is None:
            break
        off += len(cache)
    for i, (layer, off) in enumerate(seq):
        if lay.vlan is None and isinstance(layer, S.Dot1Q):
            lay.vlan = off
        if isinstance(layer, (S.IP, S.IPv6)):
            if isinstance(layer, S.IP):
                lay.ip = off
            else:
                lay.ipv6 = off
            _find_l4(S, lay, seq[i + 1:])
            break
    return lay


def _find_l4(S, lay: _Layout, rest) -> None:
    ext = (S.IPv6ExtHdrHopByHop, S.IPv6ExtHdrDestOpt, S.IPv6ExtHdrRouting, S.IPv6ExtHdrFragment)
    for layer, off in rest:
        if lay.ipv6 is not None and isinstance(layer, ext):
            if isinstance(layer, S.IPv6ExtHdrRouting) or layer.__class__.__name__.startswith("IPv6ExtHdrSegment"):
                lay.ipv6_routing = True
            if isinstance(layer, S.IPv6ExtHdrFragment) and layer.offset != 0:
                return
            continue
        if type(layer) is S.UDP:
            lay.l4, lay.l4_name = off, "udp"
            lay.l4_csum = off + 6 if layer.chksum != 0 else None
        elif type(layer) is S.TCP:
            lay.l4, lay.l4_name = off, "tcp"
            lay.l4_csum = off + 16
        elif lay.ipv6 is not None and layer.__class__.__name__.startswith("ICMPv6") and "cksum" in layer.fields:
            lay.l4_name, lay.l4_csum = "icmpv6", off + 2
        return


# --------------------------------------------------------------------------- plan

@dataclass
class _Field:
    name: str  # canonical
    off: int
    width: int
    first: int
    n: int
    key: bool


def _plan_fields(vary: Dict[str, object], lay: _Layout) -> List[_Field]:
    out: List[_Field] = []
    seen: Dict[str, str] = {}
    is_ip = lay.ip is not None or lay.ipv6 is not None
    for given, spec in vary.items():
        if not isinstance(given, str):
            raise _err(f"vary: field names are strings, not {given!r}")
        name = _ALIASES.get(given.strip().lower())
        if name is None:
            raise _err(f"vary: unknown field {given!r}; known fields: {', '.join(FIELDS)}")
        if name in seen:
            raise _err(f"vary: {given!r} and {seen[name]!r} are the same field ({name})")
        seen[name] = given
        fd = _FIELD_DEFS[name]
        proto = re.split(r"[._]", given.strip().lower())[0]
        if fd.layer == "vlan":
            if lay.vlan is None:
                raise _err(f"vary[{given!r}]: the template has no Dot1Q (VLAN) header")
            base = lay.vlan
        elif fd.layer == "ip" or fd.layer == "ipv6":
            base = lay.ip if fd.layer == "ip" else lay.ipv6
            if base is None:
                other = "IPv6" if lay.ipv6 is not None else "no IP"
                raise _err(f"vary[{given!r}]: the template has no {'IPv4' if fd.layer == 'ip' else 'IPv6'} "
                           f"header (it has {other})")
            if name == "ipv6.dst" and lay.ipv6_routing:
                raise _err(f"vary[{given!r}]: not supported with an IPv6 routing header "
                           "(the L4 checksum uses the final destination)")
        elif fd.layer == "l4":
            if lay.l4 is None:
                raise _err(f"vary[{given!r}]: the template has no TCP or UDP header after its IP header")
            if proto in ("tcp", "udp") and proto != lay.l4_name:
                raise _err(f"vary[{given!r}]: the template's L4 header is {lay.l4_name.upper()}, not {proto.upper()}")
            base = lay.l4
        else:
            base = lay.eth
        first, n = _parse_range(given, fd, spec)
        key = name in (_IP_KEYS if is_ip else _L2_KEYS)
        out.append(_Field(name, base + fd.rel, fd.width, first, n, key))
    return out


def _default_vary(n_flows: int, lay: _Layout, built: bytes) -> Dict[str, str]:
    if lay.l4 is not None:
        ports = 65535 - 1024 + 1
        vary = {"l4.sport": "1024-65535"}
        if n_flows <= ports:
            return vary
        n_src = -(-n_flows // ports)
    else:
        vary, n_src = {}, n_flows
    if lay.ip is not None:
        name, src = "ip.src", int.from_bytes(built[lay.ip + 12:lay.ip + 16], "big")
        last = src + n_src - 1
        fmt = lambda v: str(ipaddress.IPv4Address(v))  # noqa: E731
        top = (1 << 32) - 1
    elif lay.ipv6 is not None:
        name, src = "ipv6.src", int.from_bytes(built[lay.ipv6 + 8:lay.ipv6 + 24], "big")
        last = src + n_src - 1
        fmt = lambda v: str(ipaddress.IPv6Address(v))  # noqa: E731
        top = (1 << 128) - 1
    else:
        name, src = "eth.src", int.from_bytes(built[6:12], "big")
        last = src + n_src - 1
        fmt = lambda v: ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))  # noqa: E731
        top = (1 << 48) - 1
    if last > top:
        raise _err(f"flows={n_flows}: counting {name} up from the template's {fmt(src)} runs past "
                   f"{fmt(top)}; give vary= explicitly")
    vary[name] = f"{fmt(src)}-{fmt(last)}"
    return vary


def _checksums(fields: List[_Field], lay: _Layout) -> List[Tuple[int, bool, List[int]]]:
    def words(f: _Field, region: int) -> set:
        w = 2 if f.width == 0 else f.width
        return {region + ((x - region) & ~1) for x in range(f.off, f.off + w)}

    out = []
    if lay.ip is not None:
        ws = set()
        for f in fields:
            if f.name in ("ip.src", "ip.dst", "ip.ttl", "ip.tos"):
                ws |= words(f, lay.ip)
        if ws:
            out.append((lay.ip + 10, False, sorted(ws)))
    if lay.l4_csum is not None:
        ws = set()
        net = lay.ip if lay.ip is not None else lay.ipv6
        for f in fields:
            if f.name in ("ip.src", "ip.dst", "ipv6.src", "ipv6.dst"):
                ws |= words(f, net)
            elif f.name in ("l4.sport", "l4.dport"):
                ws |= words(f, lay.l4)
        if ws:
            out.append((lay.l4_csum, lay.l4_name == "udp", sorted(ws)))
    return out


def _describe(fields: List[_Field]) -> str:
    return " x ".join(f"{f.name}: {f.n}" for f in fields)


def _stamper(template, flows, vary, size, seed) -> "_gen.Stamper":
    if flows is not None:
        if isinstance(flows, bool) or not isinstance(flows, int) or flows < 1:
            raise _err(f"flows must be a positive int, not {flows!r}")
    if vary is not None and not isinstance(vary, dict):
        raise _err(f"vary must be a dict of field name to range, not {type(vary).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _err(f"seed must be an int, not {seed!r}")
    built = _build(template, size)
    lay = _layout(built)
    if vary is None and flows is not None and flows > 1:
        vary = _default_vary(flows, lay, built)
    fields = _plan_fields(vary or {}, lay)
    if flows is not None and flows > 1:
        keys = [f for f in fields if f.key]
        if not keys:
            what = ("a 5-tuple field (ip.src, ip.dst, ipv6.src, ipv6.dst, l4.sport, l4.dport)"
                    if lay.ip is not None or lay.ipv6 is not None else "eth.src, eth.dst or vlan.vid")
            raise _err(f"flows={flows}: vary has no field that tells flows apart; vary {what}, "
                       "or leave vary out for the default")
        capacity = math.prod(f.n for f in keys)
        if capacity < flows:
            raise _err(f"flows={flows}: the varied ranges give only {capacity} distinct flows "
                       f"({_describe(keys)}); widen a range or add a field")
    rng = random.Random(seed) if seed else None
    plan = []
    for f in fields:
        n = min(f.n, _N_CAP)
        a, b = (1 if n > 1 else 0), 0
        if rng is not None and n > 1:
            a = rng.randrange(1, n)
            while math.gcd(a, n) != 1:
                a = rng.randrange(1, n)
            b = rng.randrange(n)
        plan.append((f.off, f.width, f.first, n, a, b, f.key))
    return _gen.Stamper(built, plan, _checksums(fields, lay), flows or 0)


def _check_counts(count, start_ns, interval_ns) -> None:
    for name, v in (("count", count), ("start_ns", start_ns), ("interval_ns", interval_ns)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U64:
            raise _err(f"{name} must be a non-negative int, not {v!r}")


# --------------------------------------------------------------------------- packets

class Packets:
    """A batch of packets in one contiguous buffer.

    ``data`` (uint8), ``offsets`` (uint64), ``lengths`` (uint32) and ``timestamps_ns``
    (uint64): packet i is ``data[offsets[i]:offsets[i] + lengths[i]]``.
    """

    __slots__ = ("data", "offsets", "lengths", "timestamps_ns")

    def __init__(self, data, offsets, lengths, timestamps_ns) -> None:
        self.data = np.ascontiguousarray(data, dtype=np.uint8)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        self.lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
        self.timestamps_ns = np.ascontiguousarray(timestamps_ns, dtype=np.uint64)
        if not len(self.offsets) == len(self.lengths) == len(self.timestamps_ns):
            raise _err("offsets, lengths and timestamps_ns must have the same length")

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Packets(self.data, self.offsets[i], self.lengths[i], self.timestamps_ns[i])
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"packet index out of range (0..{n - 1})")
        o = int(self.offsets[i])
        return self.data[o:o + int(self.lengths[i])].tobytes()

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"<Packets n={len(self)} bytes={int(self.lengths.sum())}>"

    def write_pcap(self, path: Union[str, os.PathLike]) -> int:
        """Write the packets, with their timestamps, to a classic nanosecond pcap; returns the count."""
        try:
            return _gen.write_pcap(path, self.data, self.offsets, self.lengths, self.timestamps_ns)
        except _gen.NativeError as e:
            raise _native_error(e) from None


def _native_error(e: "_gen.NativeError") -> Exception:
    # e.kind is the status code's name (errors.def: "IO", "PCAP", ...)
    return from_native(e.kind, e.message, file=e.file, record=e.record)


# --------------------------------------------------------------------------- API

def generate(
    template: Template,
    count: int,
    *,
    flows: Optional[int] = None,
    vary: Optional[Dict[str, Union[str, int]]] = None,
    size: Optional[int] = None,
    seed: int = 0,
    start_ns: int = 0,
    interval_ns: int = 1000,
) -> Packets:
    """Stamp `count` packets from `template` into memory; packet i has timestamp start_ns + i*interval_ns.

    See the module docstring for flows, vary, size and seed. Raises ValueError
    (dpu.errors.InvalidArgumentError) naming the problem for bad arguments.
    """
    _check_counts(count, start_ns, interval_ns)
    st = _stamper(template, flows, vary, size, seed)
    return Packets(*st.generate(count, start_ns, interval_ns))


def generate_pcap(
    path: Union[str, os.PathLike],
    template: Template,
    count: int,
    *,
    flows: Optional[int] = None,
    vary: Optional[Dict[str, Union[str, int]]] = None,
    size: Optional[int] = None,
    seed: int = 0,
    start_ns: int = 0,
    interval_ns: int = 1000,
    chunk_bytes: int = 4 << 20,
    progress=None,
) -> int:
    """Like generate(), but stream the packets to a pcap file in chunks of about `chunk_bytes`.

    Memory use does not grow with `count`. Returns the number of packets written.
    ``progress(bytes_written, bytes_total, packets_written)`` is called about
    five times a second while it writes (and once at the end).
    """
    _check_counts(count, start_ns, interval_ns)
    st = _stamper(template, flows, vary, size, seed)
    chunk = max(1, int(chunk_bytes) // st.length)
    try:
        if progress is None:
            return st.write_pcap(path, count, start_ns, interval_ns, chunk)
        return _with_progress(lambda: st.write_pcap(path, count, start_ns, interval_ns, chunk), path,
                              24 + count * (16 + st.length), 16 + st.length, progress)
    except _gen.NativeError as e:
        raise _native_error(e) from None


def _with_progress(write, path, total: int, per_packet: int, progress) -> int:
    """Runs ``write`` (which releases the GIL) on a thread and reports how far
    the file has grown until it returns."""
    import threading

    result: list = []

    def work() -> None:
        try:
            result.append((True, write()))
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            result.append((False, e))

    t = threading.Thread(target=work, name="dpu-gen", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
        try:
            done = min(os.path.getsize(path), total)
        except OSError:
            done = 0
        progress(done, total, max(0, done - 24) // per_packet)
    ok, value = result[0]
    if not ok:
        raise value
    progress(total, total, value)
    return value


def read_pcap(path: Union[str, os.PathLike], limit: Optional[int] = None) -> Packets:
    """Read a pcap/pcapng file (through the core's dpu::PcapReader) into a Packets batch."""
    try:
        return Packets(*_gen.read_pcap(path, -1 if limit is None else int(limit)))
    except _gen.NativeError as e:
        raise _native_error(e) from None
