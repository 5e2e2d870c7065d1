"""The tests' one checksum verifier, and the Internet checksum it is built on.

``inet_checksum`` is RFC 1071's ones'-complement sum, complemented: what an IPv4
header, TCP, UDP, ICMP or ICMPv6 carries; over data that holds a right checksum it
is 0. Builders use it to write checksums, models to judge them.

``checksum_errors(frame)`` walks an Ethernet frame (802.1Q/802.1ad tags, IPv4 or
IPv6, TCP, UDP, ICMP, ICMPv6, and the IPv4 header an ICMP error quotes) and returns
``(checked, bad)``: the names of the checksums it verified and of those that were
wrong. It computes every sum itself from the bytes (no scapy), so it does not share
a mistake with scapy or with the dataplane. ``assert_checksums`` fails naming the
wrong ones and shows the packet. Where a checksum cannot be verified from one frame
it is not counted as checked: the L4 checksum of an IPv4 or IPv6 fragment (it covers
the whole datagram), what follows an IPv6 extension header this does not walk, and a
quoted header cut short. tests/test_layout.py shows that it catches each wrong one.

UDP: a zero checksum over IPv4 means "none" (RFC 768); over IPv6 it is wrong
(RFC 8200), unless ``udp6_zero_ok`` (a tunnel may send one, RFC 6935). ``udp_zero``
says what the caller expects of IPv4 UDP: None, either; True, no checksum (0);
False, a computed one (a sum that comes to 0 is sent as 0xffff).
"""
from __future__ import annotations

import struct
from typing import List, Optional, Tuple

ETH_VLAN_TPIDS = (0x8100, 0x88A8)
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMPV6 = 1, 6, 17, 58
_IPV6_EXT = (0, 43, 60)           # hop-by-hop, routing, destination options: walked
_ICMP_ERRORS = (3, 4, 5, 11, 12)  # types that quote the offending packet
_L4_CSUM_AT = {IPPROTO_TCP: 16, IPPROTO_UDP: 6, IPPROTO_ICMPV6: 2, IPPROTO_ICMP: 2}
_L4_NAME = {IPPROTO_TCP: "TCP", IPPROTO_UDP: "UDP", IPPROTO_ICMPV6: "ICMPv6", IPPROTO_ICMP: "ICMP"}


def fold(s: int) -> int:
    """A sum of 16-bit words folded to 16 bits, end-around carry added back."""
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def ones_sum(data: bytes, start: int = 0) -> int:
    """The ones'-complement sum of ``data`` as 16-bit big-endian words (an odd
    last byte padded with zero), added to ``start``, folded to 16 bits."""
    if len(data) % 2:
        data = bytes(data) + b"\x00"
    return fold(start + sum(struct.unpack(f"!{len(data) // 2}H", data)))


def inet_checksum(data: bytes, start: int = 0) -> int:
    """RFC 1071: the complement of ones_sum; 0 over data holding a right checksum."""
    return ~ones_sum(data, start) & 0xFFFF


def pseudo_header(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    """The IPv4 (4-byte addresses) or IPv6 (16-byte) pseudo-header of an L4 checksum."""
    if len(src) == 4:
        return src + dst + struct.pack("!BBH", 0, proto, length)
    return src + dst + struct.pack("!IxxxB", length, proto)


def l4_checksum(src: bytes, dst: bytes, proto: int, segment: bytes) -> int:
    """The TCP/UDP/ICMPv6 checksum of ``segment`` between src and dst: the value to write
    when its checksum field is zero, and 0 when the field holds a right one."""
    return inet_checksum(segment, ones_sum(pseudo_header(src, dst, proto, len(segment))))


def checksum_errors(frame: bytes, udp_zero: Optional[bool] = None,
                    udp6_zero_ok: bool = False) -> Tuple[List[str], List[str]]:
    """(checked, bad): the checksums of ``frame`` verified, and those found wrong."""
    checked: List[str] = []
    bad: List[str] = []

    def verify(name: str, ok: bool) -> None:
        checked.append(name)
        if not ok:
            bad.append(name)

    f = bytes(frame)
    if len(f) < 14:
        return checked, bad
    off, etype = 14, struct.unpack_from("!H", f, 12)[0]
    while etype in ETH_VLAN_TPIDS and len(f) >= off + 4:
        etype = struct.unpack_from("!H", f, off + 2)[0]
        off += 4
    if etype == ETH_IPV4:
        _ipv4(f[off:], "", verify, udp_zero, udp6_zero_ok)
    elif etype == ETH_IPV6:
        _ipv6(f[off:], verify, udp6_zero_ok)
    return checked, bad


def _ipv4(ip: bytes, prefix: str, verify, udp_zero, udp6_zero_ok) -> None:
    if len(ip) < 20 or ip[0] >> 4 != 4:
        return
    ihl = (ip[0] & 15) * 4
    total = struct.unpack_from("!H", ip, 2)[0]
    if ihl < 20 or len(ip) < ihl:
        return
    verify(prefix + "IPv4 header", inet_checksum(ip[:ihl]) == 0)
    if prefix:                                   # a quoted header: its payload is cut
        return
    frag = struct.unpack_from("!H", ip, 6)[0]
    if frag & 0x3FFF or total < ihl or total > len(ip):   # a fragment (MF or offset), or cut short
        return
    proto, seg = ip[9], ip[ihl:total]
    if proto == IPPROTO_ICMP:
        if len(seg) >= 4:
            verify("ICMP", inet_checksum(seg) == 0)
            if seg[0] in _ICMP_ERRORS and len(seg) >= 8:
                _ipv4(seg[8:], "quoted ", verify, udp_zero, udp6_zero_ok)
        return
    _l4(proto, seg, ip[12:16], ip[16:20], verify, udp_zero, False)


def _ipv6(ip: bytes, verify, udp6_zero_ok) -> None:
    if len(ip) < 40 or ip[0] >> 4 != 6:
        return
    plen = struct.unpack_from("!H", ip, 4)[0]
    if 40 + plen > len(ip):
        return
    nh, off = ip[6], 40
    while nh in _IPV6_EXT:
        if off + 8 > 40 + plen or (nh == 43 and ip[off + 3]):  # segments left: the pseudo-header's dst is another
            return
        nh, off = ip[off], off + (ip[off + 1] + 1) * 8
    if nh not in (IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMPV6):
        return
    _l4(nh, ip[off:40 + plen], ip[8:24], ip[24:40], verify, None, not udp6_zero_ok)


def _l4(proto: int, seg: bytes, src: bytes, dst: bytes, verify, udp_zero, zero_is_wrong: bool) -> None:
    at = _L4_CSUM_AT.get(proto)
    if at is None or len(seg) < at + 2:
        return
    name = _L4_NAME[proto]
    field = struct.unpack_from("!H", seg, at)[0]
    if proto == IPPROTO_UDP:
        if field == 0:
            verify("UDP (zero: no checksum)", not zero_is_wrong and udp_zero is not False)
            return
        if udp_zero is True:
            verify("UDP (expected zero)", False)
            return
    verify(name, inet_checksum(seg, ones_sum(pseudo_header(src, dst, proto, len(seg)))) == 0)


def assert_checksums(frame: bytes, udp_zero: Optional[bool] = None, udp6_zero_ok: bool = False) -> List[str]:
    """Fails naming every wrong checksum of ``frame`` (with the packet shown); returns
    the names of those verified, so that a caller can say which it expects."""
    checked, bad = checksum_errors(frame, udp_zero, udp6_zero_ok)
    if bad:
        from scapy.all import Ether
        raise AssertionError(f"wrong checksum: {', '.join(bad)} (verified: {', '.join(checked)})\n"
                             + Ether(bytes(frame)).show2(dump=True))
    return checked
