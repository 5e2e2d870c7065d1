"""Named addresses, packets and small builders for the conntrack/NAT tests
(docs/conntrack.md), in the style of packets.py (STYLE.md #11).

The inside network is 10.0.1.0/24, the public (translated) addresses are in
203.0.113.0/24 (TEST-NET-3), the "internet" is 198.51.100.0/24 (TEST-NET-2)
and routers on the way are in 192.0.2.0/24 (TEST-NET-1).
"""
import struct

from scapy.all import ARP, ICMP, IP, TCP, UDP, Ether, IPv6, Raw  # noqa: F401

from .checksums import inet_checksum

MAC_IN, MAC_OUT = "02:00:00:00:00:aa", "02:00:00:00:00:bb"
E = Ether(src=MAC_IN, dst=MAC_OUT)

CLIENT = "10.0.1.11"       # an inside host
CLIENT2 = "10.0.1.12"      # another inside host
SERVER = "198.51.100.1"    # a host on the internet
SERVER2 = "198.51.100.2"   # another one
SERVER3 = "198.51.100.3"
PUBLIC = "203.0.113.10"    # the NAT's public address
PUBLIC2 = "203.0.113.20"   # another tenant's public address
ROUTER = "192.0.2.254"     # a router between the NAT and the server
CLIENT6, SERVER6 = "2001:db8::11", "2001:db8:1::1"

# A capture's clock (2023, ns): far ahead of the monotonic clock, so packet
# timestamps drive the conntrack clock (docs/conntrack.md "Timeouts and the clock").
T0 = 1_700_000_000 * 10**9
SEC = 10**9


def frame(pkt):
    """The packet as scapy builds it (lengths and checksums computed), parsed again."""
    return Ether(bytes(pkt))


def udp(src, sport, dst, dport, payload=b"q", **ip):
    return E / IP(src=src, dst=dst, **ip) / UDP(sport=sport, dport=dport) / Raw(payload)


def tcp(src, sport, dst, dport, flags, seq=0, ack=0, payload=b"", window=8192, options=(), **ip):
    pkt = E / IP(src=src, dst=dst, **ip) / TCP(sport=sport, dport=dport, flags=flags, seq=seq % 2**32,
                                               ack=ack % 2**32, window=window, options=list(options))
    return pkt / Raw(payload) if payload else pkt


def echo(src, dst, ident, seq=1, type=8, payload=b"ping"):
    return E / IP(src=src, dst=dst) / ICMP(type=type, id=ident, seq=seq) / Raw(payload)


def icmp_error(src, dst, type, code, quoted, cut=None, **icmp):
    """An ICMP error from `src` to `dst` quoting the IP packet `quoted` (scapy
    or bytes; built, so its checksums are right), cut to `cut` bytes if given
    (routers quote at least the IP header and 8 bytes, RFC 792)."""
    q = bytes(quoted[IP] if not isinstance(quoted, bytes) else quoted)
    if cut is not None:
        q = q[:cut]
    return E / IP(src=src, dst=dst) / ICMP(type=type, code=code, **icmp) / Raw(q)


def ip_bytes(pkt, **changes):
    """The IP packet of `pkt` with header fields changed and checksums recomputed."""
    ip = IP(bytes(pkt[IP]))
    for k, v in changes.items():
        setattr(ip, k, v)
    del ip.chksum
    for layer in (UDP, TCP, ICMP):
        if layer in ip and not (layer is UDP and ip[UDP].chksum == 0):
            del ip[layer].chksum
    return bytes(ip)


# The conversation most tests use: a DNS-like UDP query and its answer.
UDP_QUERY = udp(CLIENT, 5000, SERVER, 53, b"query")
UDP_ANSWER = udp(SERVER, 53, CLIENT, 5000, b"answer")


def _aton(a: str) -> bytes:
    return bytes(int(x) for x in a.split("."))


def fast_udp(src, sport, dst, dport, payload=b"q", ttl=64, ident=1):
    """Ether/IPv4/UDP bytes with correct checksums, without scapy (thousands of
    packets for the concurrency tests); equal to what scapy builds
    (test_fast_builder_matches_scapy)."""
    s, d = _aton(src), _aton(dst)
    ulen = 8 + len(payload)
    pseudo = s + d + struct.pack("!BBH", 0, 17, ulen)
    uh = struct.pack("!HHHH", sport, dport, ulen, 0)
    c = inet_checksum(pseudo + uh + payload) or 0xFFFF
    uh = struct.pack("!HHHH", sport, dport, ulen, c)
    iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, ident, 0, ttl, 17, 0, s, d)
    iph = iph[:10] + struct.pack("!H", inet_checksum(iph)) + iph[12:]
    eth = bytes.fromhex(MAC_OUT.replace(":", "")) + bytes.fromhex(MAC_IN.replace(":", "")) + b"\x08\x00"
    return eth + iph + uh + payload
