"""Named addresses and packets reused by tests and benchmarks (STYLE.md #11).

Addresses follow examples/topology.yaml: tenant blue (VNI 100) and red (VNI 200)
share 10.0.0.0/24 on purpose.
"""
from scapy.all import ARP, IP, UDP, TCP, Dot1Q, Ether, ICMP, IPv6, Raw  # noqa: F401
from scapy.layers.vxlan import VXLAN

# Underlay
VTEP_LOCAL = "192.0.2.1"
VTEP_BLUE = "192.0.2.2"
VTEP_RED = "192.0.2.3"
UPLINK_MAC = "02:00:00:00:00:01"
NEXTHOP_MAC = "02:00:00:00:00:02"
GW_MAC = "02:00:00:00:01:01"

# Tenant blue
VM1_MAC, VM1_IP = "02:00:00:00:01:11", "10.0.0.11"
VM2_MAC, VM2_IP = "02:00:00:00:01:12", "10.0.1.12"
BLUE_REMOTE_MAC, BLUE_REMOTE_IP = "02:00:00:00:02:21", "10.0.0.21"
BLUE_GW1, BLUE_GW2 = "10.0.0.1", "10.0.1.1"
BLUE_VNI = 100

# Tenant red
VM3_MAC, VM3_IP = "02:00:00:00:03:11", "10.0.0.11"
RED_REMOTE_MAC, RED_REMOTE_IP = "02:00:00:00:03:21", "10.0.0.21"
RED_VNI = 200

BROADCAST = "ff:ff:ff:ff:ff:ff"


def udp(src_mac, dst_mac, src_ip, dst_ip, sport=1234, dport=5678, ttl=64, payload=b"x" * 18):
    return Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, ttl=ttl) / UDP(sport=sport, dport=dport) / Raw(payload)


def arp_request(src_mac, src_ip, target_ip):
    return Ether(src=src_mac, dst=BROADCAST) / ARP(op=1, hwsrc=src_mac, psrc=src_ip, pdst=target_ip)


def vxlan(inner, vni, src_vtep, dst_vtep=VTEP_LOCAL, sport=49999, flags=0x08, udp_chksum=0):
    """An underlay VXLAN packet. flags=0x08 explicitly: scapy's default is VXLAN-GPE (docs/design.md, "Pitfalls")."""
    outer = (
        Ether(src=NEXTHOP_MAC, dst=UPLINK_MAC)
        / IP(src=src_vtep, dst=dst_vtep, flags="DF")
        / UDP(sport=sport, dport=4789, chksum=udp_chksum)
        / VXLAN(flags=flags, vni=vni)
        / inner
    )
    return outer


# Pipeline-test packets
PKT_UDP = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IP(src="10.1.0.1", dst="10.0.0.5") / UDP(sport=1000, dport=53) / Raw(b"q" * 22)
PKT_TCP = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IP(src="10.1.0.1", dst="10.0.0.5") / TCP(sport=40000, dport=80, flags="S")
PKT_ICMP = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IP(src="10.1.0.1", dst="10.0.0.5") / ICMP(type=8, id=7, seq=1)
PKT_V6 = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb") / IPv6(src="2001:db8::1", dst="2001:db8::5") / UDP(sport=1000, dport=53) / Raw(b"v6")
PKT_ARP = Ether(src="02:00:00:00:00:aa", dst=BROADCAST) / ARP(op=1, hwsrc="02:00:00:00:00:aa", psrc="10.1.0.1", pdst="10.0.0.5")


def five_tuple_hash(src_ip, dst_ip, proto, sport, dport):
    """README "Hashes", written out for IPv4."""
    import socket

    M = 0xFFFFFFFF
    a = int.from_bytes(socket.inet_aton(src_ip), "big")
    b = int.from_bytes(socket.inet_aton(dst_ip), "big")
    c = sport << 16 | dport
    x = (b * 0x1B873593) & M
    h = ((a * 0xCC9E2D51) ^ ((x << 16 | x >> 16) & M) ^ (c * 0x85EBCA6B) ^ (proto * 0xC2B2AE35) ^ 0x9E3779B9) & M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


# Internet gateway (examples/nat-gateway.yaml)
INET_MAC, INET_NEXTHOP_MAC = "02:00:00:00:00:31", "02:00:00:00:00:32"
BLUE_SNAT, BLUE_FLOATING, RED_SNAT = "203.0.113.10", "203.0.113.12", "203.0.113.20"
SERVER = "198.51.100.1"       # somewhere on the internet
OTHER_SERVER = "198.51.100.2"


def from_internet(src, dst, l4):
    """A packet arriving on the internet port from the next hop."""
    return Ether(src=INET_NEXTHOP_MAC, dst=INET_MAC) / IP(src=src, dst=dst) / l4


def from_vm(mac, ip_, dst, l4, ttl=64):
    """A packet a VM sends to the internet through its anycast gateway."""
    return Ether(src=mac, dst=GW_MAC) / IP(src=ip_, dst=dst, ttl=ttl) / l4
