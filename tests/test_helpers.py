"""The tests' own helpers are right: the checksum verifier passes what scapy builds and
catches every wrong checksum it claims to check; wait_for returns as soon as its
condition holds and, when it never does, fails naming what did not happen."""
import struct
import threading

import pytest
from scapy.all import ICMP, IP, TCP, UDP, Dot1AD, Dot1Q, Ether, ICMPv6EchoRequest, IPOption_RR, IPv6, Raw
from scapy.layers.inet6 import IPv6ExtHdrHopByHop

from helpers.checksums import assert_checksums, checksum_errors, inet_checksum, l4_checksum
from helpers.wait import WaitTimeout, wait_for

E = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
V4 = IP(src="10.0.0.1", dst="198.51.100.7")
V6 = IPv6(src="2001:db8::1", dst="2001:db8:1::7")

# (name, frame, what the verifier must check in it): scapy computes every checksum.
GOOD = [
    ("udp4", E / V4 / UDP(sport=5000, dport=53) / Raw(b"query"), ["IPv4 header", "UDP"]),
    ("tcp4", E / V4 / TCP(sport=40000, dport=80, flags="S") / Raw(b"x" * 33), ["IPv4 header", "TCP"]),
    ("icmp4", E / V4 / ICMP(type=8, id=7) / Raw(b"ping"), ["IPv4 header", "ICMP"]),
    ("options+vlan", E / Dot1Q(vlan=5) / IP(src="10.0.0.1", dst="10.0.0.2", options=[IPOption_RR()])
     / UDP(sport=1, dport=2) / Raw(b"odd"), ["IPv4 header", "UDP"]),
    ("qinq", E / Dot1AD(vlan=7) / Dot1Q(vlan=5) / V4 / TCP(sport=1, dport=2), ["IPv4 header", "TCP"]),
    ("udp6", E / V6 / UDP(sport=5000, dport=53) / Raw(b"q"), ["UDP"]),
    ("tcp6", E / V6 / TCP(sport=1, dport=443, flags="A"), ["TCP"]),
    ("icmp6", E / V6 / ICMPv6EchoRequest(id=3) / Raw(b"ping6"), ["ICMPv6"]),
    ("hop-by-hop", E / V6 / IPv6ExtHdrHopByHop() / UDP(sport=1, dport=2) / Raw(b"h"), ["UDP"]),
    ("icmp error", E / IP(src="192.0.2.254", dst="10.0.0.1") / ICMP(type=11, code=0)
     / IP(bytes(V4 / UDP(sport=5000, dport=53) / Raw(b"query"))), ["IPv4 header", "ICMP", "quoted IPv4 header"]),
    ("udp4 zero", E / V4 / UDP(sport=1, dport=2, chksum=0) / Raw(b"z"), ["IPv4 header", "UDP (zero: no checksum)"]),
    ("padded", bytes(E / V4 / UDP(sport=1, dport=2) / Raw(b"p")) + b"\0" * 8, ["IPv4 header", "UDP"]),
]


@pytest.mark.parametrize("name,pkt,checked", GOOD, ids=[g[0] for g in GOOD])
def test_what_scapy_builds_passes(name, pkt, checked):
    assert assert_checksums(bytes(pkt)) == checked


def _l4_at(frame: bytes, cls) -> int:
    """Offset of the checksum field of the first ``cls`` layer of the frame."""
    p = Ether(frame)
    off = len(frame) - len(bytes(p[cls]))
    return off + {TCP: 16, UDP: 6, ICMP: 2, ICMPv6EchoRequest: 2}[cls]


def _flip(frame: bytes, at: int) -> bytes:
    b = bytearray(frame)
    b[at] ^= 0x40
    return bytes(b)


def _bad_cases():
    udp4 = bytes(E / V4 / UDP(sport=5000, dport=53) / Raw(b"query"))
    tcp6 = bytes(E / V6 / TCP(sport=1, dport=443) / Raw(b"data"))
    icmp6 = bytes(E / V6 / ICMPv6EchoRequest(id=3))
    icmp4 = bytes(E / V4 / ICMP(type=8) / Raw(b"ping"))
    err = bytes(E / IP(src="192.0.2.254", dst="10.0.0.1") / ICMP(type=3, code=3)
                / IP(bytes(V4 / UDP(sport=5000, dport=53) / Raw(b"query"))))
    quoted = 14 + 20 + 8
    # a quoted header that lies, the outer ICMP checksum mended so that only the quote is wrong
    err_q = bytearray(_flip(err, quoted + 10))
    err_q[14 + 20 + 2:14 + 20 + 4] = b"\0\0"
    err_q[14 + 20 + 2:14 + 20 + 4] = struct.pack("!H", inet_checksum(bytes(err_q[14 + 20:])))
    u6z = bytes(E / V6 / UDP(sport=1, dport=2, chksum=0) / Raw(b"q"))
    return [
        ("IPv4 header", _flip(udp4, 14 + 10), {}, ["IPv4 header"]),
        ("IPv4 address", _flip(udp4, 14 + 12), {}, ["IPv4 header", "UDP"]),   # in both sums
        ("UDP", _flip(udp4, _l4_at(udp4, UDP)), {}, ["UDP"]),
        ("UDP payload", _flip(udp4, len(udp4) - 1), {}, ["UDP"]),
        ("TCP over IPv6", _flip(tcp6, _l4_at(tcp6, TCP)), {}, ["TCP"]),
        ("ICMPv6", _flip(icmp6, _l4_at(icmp6, ICMPv6EchoRequest)), {}, ["ICMPv6"]),
        ("ICMP", _flip(icmp4, _l4_at(icmp4, ICMP)), {}, ["ICMP"]),
        ("quoted header", bytes(err_q), {}, ["quoted IPv4 header"]),
        ("UDP zero over IPv6", u6z, {}, ["UDP (zero: no checksum)"]),
        ("UDP zero where one is due", bytes(E / V4 / UDP(sport=1, dport=2, chksum=0)), {"udp_zero": False},
         ["UDP (zero: no checksum)"]),
        ("UDP checksum where none is due", udp4, {"udp_zero": True}, ["UDP (expected zero)"]),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("name,frame,kw,bad", BAD, ids=[b[0] for b in BAD])
def test_a_wrong_checksum_is_caught_and_named(name, frame, kw, bad):
    assert checksum_errors(frame, **kw)[1] == bad
    with pytest.raises(AssertionError, match="wrong checksum: " + bad[0].replace("(", r"\(").replace(")", r"\)")):
        assert_checksums(frame, **kw)


def test_a_zero_udp_checksum_over_ipv6_may_be_allowed():
    (_, frame, _, _) = next(b for b in BAD if b[0] == "UDP zero over IPv6")
    assert checksum_errors(frame, udp6_zero_ok=True) == (["UDP (zero: no checksum)"], [])


def test_what_one_frame_cannot_show_is_not_claimed():
    frag = bytes(E / IP(src="10.0.0.1", dst="10.0.0.2", flags="MF") / UDP(sport=1, dport=2) / Raw(b"x" * 16))
    assert checksum_errors(frag) == (["IPv4 header"], [])      # the UDP sum covers the whole datagram
    cut = bytes(E / V4 / UDP(sport=1, dport=2) / Raw(b"x" * 40))[:14 + 20 + 10]
    assert checksum_errors(cut) == (["IPv4 header"], [])       # its total length is past the frame
    assert checksum_errors(bytes(Ether() / Raw(b"\x08\x06arp?"))) == ([], [])


def test_l4_checksum_writes_what_the_verifier_accepts():
    src, dst = bytes([10, 0, 0, 1]), bytes([198, 51, 100, 7])
    seg = struct.pack("!HHHH", 5000, 53, 13, 0) + b"query"
    c = l4_checksum(src, dst, 17, seg)
    seg = seg[:6] + struct.pack("!H", c) + seg[8:]
    assert l4_checksum(src, dst, 17, seg) == 0
    assert bytes(E / V4 / UDP(sport=5000, dport=53) / Raw(b"query"))[14 + 20:] == seg


def test_wait_for_returns_the_value_as_soon_as_it_holds():
    box = []
    t = threading.Timer(0.05, lambda: box.append("here"))
    t.start()
    try:
        assert wait_for(lambda: box and box[0], timeout=60, what="the timer") == "here"
    finally:
        t.cancel()


def test_wait_for_names_what_did_not_happen():
    calls = []
    with pytest.raises(WaitTimeout, match="waiting for the port to open"):
        wait_for(lambda: calls.append(1), timeout=0.1, what="the port to open")
    assert len(calls) >= 2   # it polled, and once more at the end
    assert issubclass(WaitTimeout, AssertionError)   # a failed test, not an error in it
