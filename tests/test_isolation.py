"""Tenant isolation, proved adversarially (issue: per-tenant isolation).

Hypothesis generates hostile traffic from every local port and from the uplink,
against examples/topology.yaml and against random multi-tenant topologies that
overlap on purpose (the same subnets, IPs and MACs in several tenants, shared
gateway MACs, VTEPs shared between tenants). Every batch is checked twice:

1. **Isolation invariants**, stated on their own so a failure says what leaked:
   each input belongs to at most one tenant (a local port's tenant; for uplink
   VXLAN the tenant whose VNI it carries, and only if the outer source is a VTEP
   the topology names for that tenant); a local output goes to a port of that
   tenant; an uplink output is well-formed VXLAN with that tenant's VNI towards
   one of that tenant's VTEPs, and never answers traffic that came from the
   uplink (split horizon) except the ARP reply for our own VTEP address; ARP
   replies the dataplane makes reveal only that tenant's gateway/endpoint MACs;
   per-tenant counters never count a packet for a tenant it does not belong to.
2. **An exact model** of the compiled pipeline (dpu/topology/compiler.py, tables
   0/10/20/30), written from the README, the compiler and the documented
   parser/tunnel contracts (parse.h, vxlan.cc): the expected outputs (bytes;
   VXLAN as outer VTEP + VNI + inner bytes) and the drop reason of every input,
   and from them every port and tenant counter. Hostile traffic from one tenant
   must not change what any tenant's legitimate traffic does (the batches
   interleave "canary" packets and are run twice, so the second run goes
   through the caches the first one filled).

The model also pins underlay hygiene that is not an isolation matter
(Model._uplink, after native/src/tunnel_term.h and vxlan.cc): VXLAN is taken
only when addressed to the VTEP's MAC and address, untagged, not a fragment,
to the VXLAN port; lengths that disagree (UDP length past the frame, outer IPv4
or IPv6 length shorter than the UDP datagram) are vxlan_truncated, a wrong outer
IPv4 header checksum or a wrong non-zero UDP checksum vxlan_bad_checksum.
Anything else on the uplink is underlay (or an ARP for the VTEP, answered).

Frames are built as raw bytes (scapy is too slow for hundreds of thousands of
frames); the regression table at the end uses tests/packets.py's scapy builders.
"""
from __future__ import annotations

import collections
import ipaddress
import os
import struct

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scapy.all import ARP, IP, UDP, Dot1Q, Ether, IPv6
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from dpu.topology import load_topology
from helpers.checksums import assert_checksums, fold, inet_checksum, l4_checksum
from helpers.packets import (
    BLUE_GW1, BLUE_GW2, BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, BROADCAST, GW_MAC, NEXTHOP_MAC, RED_REMOTE_IP,
    RED_REMOTE_MAC, RED_VNI, UPLINK_MAC, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VM3_IP, VM3_MAC, VTEP_BLUE, VTEP_LOCAL,
    VTEP_RED, arp_request, udp, vxlan,
)

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
CAPACITY = 10240 - 128  # README: frames up to 10,112 bytes (jumbo frames); longer ones are "oversize"

# Deterministic and CI-reproducible: no example database, derandomized, no deadline.
FUZZ = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

ETH_IP, ETH_IP6, ETH_ARP, ETH_VLAN, ETH_QINQ = 0x0800, 0x86DD, 0x0806, 0x8100, 0x88A8
BCAST = b"\xff" * 6
ZERO6 = b"\x00" * 6


# ---- raw frames ------------------------------------------------------------------------

def mac(s):
    return bytes.fromhex(s.replace(":", ""))


def ipb(s):
    a = ipaddress.ip_address(str(s))
    return a.packed


def eth(dst, src, etype, payload=b"", tags=()):
    h = dst + src
    for tpid, tci in tags:
        h += struct.pack("!HH", tpid, tci)
    return h + struct.pack("!H", etype) + payload


def ipv4(src, dst, proto, payload, ttl=64, frag=0x4000, opts=b"", tot=None, ver=4, ihl=None, good_csum=True, tos=0):
    ihl = (20 + len(opts)) // 4 if ihl is None else ihl
    tot = 20 + len(opts) + len(payload) if tot is None else tot
    h = struct.pack("!BBHHHBBH4s4s", (ver << 4) | ihl, tos, tot & 0xFFFF, 0x1234, frag, ttl, proto, 0, src, dst) + opts
    c = inet_checksum(h) if good_csum else 0xBEEF
    return h[:10] + struct.pack("!H", c) + h[12:] + payload


def ipv6(src, dst, nh, payload, hlim=64, plen=None):
    plen = len(payload) if plen is None else plen
    return struct.pack("!IHBB16s16s", 6 << 28, plen & 0xFFFF, nh, hlim, src, dst) + payload


def udp_seg(sport, dport, payload, length=None):
    length = 8 + len(payload) if length is None else length
    return struct.pack("!HHHH", sport, dport, length & 0xFFFF, 0) + payload


def with_udp_csum(seg, src, dst, how):
    """how: 'zero' (none), 'good', or 'bad' (non-zero and wrong)."""
    if how == "zero" or len(seg) < 8:
        return seg
    c = l4_checksum(src, dst, 17, seg)
    if how == "good":
        c = c or 0xFFFF
    else:
        c = (c + 0x1111) & 0xFFFF or 0x1111
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def tcp_seg(sport, dport, flags=0x02, doff=5):
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, doff << 4, flags, 8192, 0, 0)


def arp_body(op, sha, spa, tha, tpa, htype=1, ptype=ETH_IP, hlen=6, plen=4):
    return struct.pack("!HHBBH", htype, ptype, hlen, plen, op) + sha + spa + tha + tpa


def vxlan_hdr(flags, vni, rsv1=0, rsv2=0):
    return struct.pack("!B3sI", flags, rsv1.to_bytes(3, "big"), ((vni & 0xFFFFFF) << 8) | (rsv2 & 0xFF))


# ---- the model -----------------------------------------------------------------------------

class Key:
    """The fields the compiled pipeline matches on, parsed as README "Parsing" says."""

    def __init__(self, f):
        n = len(f)
        self.vlan = False
        self.dl_type = 0
        self.l3 = None          # offset of a parsed IPv4/IPv6/ARP header
        self.ip_ok = False      # IPv4 header fields set (nw_src/nw_dst/proto/ttl)
        self.nw_src = self.nw_dst = b"\x00" * 4
        self.nw_proto = self.nw_ttl = 0
        self.frag = self.later = False
        self.l4 = None          # offset of a parsed L4 header
        self.tp_src = self.tp_dst = 0
        self.ip6_src = self.ip6_dst = b"\x00" * 16
        self.arp_ok = False
        self.arp_op = 0
        self.sha = self.tha = ZERO6
        self.dl_dst = f[0:6] if n >= 14 else ZERO6
        self.dl_src = f[6:12] if n >= 14 else ZERO6
        if n < 14:
            return
        t = struct.unpack("!H", f[12:14])[0]
        off = 14
        if t in (ETH_VLAN, ETH_QINQ):
            if n < 18:
                self.dl_type = t
                return
            self.vlan = True
            t = struct.unpack("!H", f[16:18])[0]
            off = 18
        if t < 0x600:
            t = 0x05FF
        self.dl_type = t
        if t == ETH_IP:
            self._ipv4(f, off, n)
        elif t == ETH_IP6:
            self._ipv6(f, off, n)
        elif t == ETH_ARP and n >= off + 28:
            htype, ptype, hlen, plen, op = struct.unpack("!HHBBH", f[off:off + 8])
            if (htype, ptype, hlen, plen) == (1, ETH_IP, 6, 4):
                self.arp_ok, self.l3 = True, off
                self.arp_op = op if op <= 0xFF else 0
                self.sha, self.nw_src = f[off + 8:off + 14], f[off + 14:off + 18]
                self.tha, self.nw_dst = f[off + 18:off + 24], f[off + 24:off + 28]

    def _ipv4(self, f, off, n):
        """README "Parsing" (Open vSwitch's rules): the header, its options and the total
        length must fit the frame, else no IPv4 field is set; the version is not checked."""
        if n < off + 20:
            return
        ihl = (f[off] & 15) * 4
        tot = struct.unpack("!H", f[off + 2:off + 4])[0]
        if ihl < 20 or n < off + ihl or tot > n - off or tot < ihl:
            return
        self.ip_ok, self.l3 = True, off
        self.nw_src, self.nw_dst = f[off + 12:off + 16], f[off + 16:off + 20]
        self.nw_ttl, self.nw_proto = f[off + 8], f[off + 9]
        fr = struct.unpack("!H", f[off + 6:off + 8])[0]
        self.frag, self.later = bool(fr & 0x3FFF), bool(fr & 0x1FFF)
        if not self.later:
            self._l4(f, off + ihl, tot - ihl)

    def _ipv6(self, f, off, n):
        """README "Parsing": a payload length past the frame leaves no IPv6 field; an
        extension header that does not fit (8 bytes, then its length) only the addresses;
        a later fragment reports nw_proto 44; offset 0 with M clear is no fragment."""
        if n < off + 40:
            return
        plen = struct.unpack("!H", f[off + 4:off + 6])[0]
        if plen > n - off - 40:
            return
        self.ip6_src, self.ip6_dst = f[off + 8:off + 24], f[off + 24:off + 40]
        avail = plen
        pos, nh = off + 40, f[off + 6]
        while nh in (0, 43, 60, 44, 51):
            if avail < 8:
                return
            if nh == 44:
                fo = struct.unpack("!H", f[pos + 2:pos + 4])[0]
                nh, pos, avail = f[pos], pos + 8, avail - 8
                if fo:
                    self.frag, self.later = True, bool(fo & 0xFFF8)
                    if self.later:
                        nh = 44
                        break
                continue
            ln = (f[pos + 1] + 2) * 4 if nh == 51 else (f[pos + 1] + 1) * 8
            if avail < ln:
                return
            nh, pos, avail = f[pos], pos + ln, avail - ln
        self.l3 = off
        self.nw_ttl = f[off + 7]
        self.nw_proto = nh
        if not self.later:
            self._l4(f, pos, avail, v6=True)

    def _l4(self, f, pos, avail, v6=False):
        p = self.nw_proto
        need = {6: 20, 17: 8, 132: 12, 1: 4, 58: 8}.get(p)
        if need is None or avail < need or ((p == 58) != v6 and p in (1, 58)):
            return
        if p == 6 and not 20 <= (f[pos + 12] >> 4) * 4 <= avail:
            return
        self.l4 = pos
        if p in (1, 58):
            self.tp_src, self.tp_dst = f[pos], f[pos + 1]
        else:
            self.tp_src, self.tp_dst = struct.unpack("!HH", f[pos:pos + 4])


class Exp:
    """What the model expects for one input."""

    def __init__(self):
        self.tenant = None      # the tenant the input legitimately belongs to
        self.counted = None     # the tenant its counters may go to (README: the VNI's, even when refused)
        self.outs = []          # ("port", name, bytes) | ("vxlan", vtep bytes, vni, inner bytes)
        self.reason = None      # drop reason when nothing is output
        self.too_big = []       # local-input copies too big for the underlay (ICMP may come back)
        self.inner = None       # decapsulated frame (uplink VXLAN)
        self.vtep_arp = False   # ARP request for our own VTEP address


class Model:
    def __init__(self, topo):
        t = load_topology(topo)
        self.t = t
        u = t.uplink
        self.up = u.port
        self.v6 = u.ipv6
        self.my_ip = u.ip.packed
        self.up_mac, self.nh_mac = mac(u.mac), mac(u.nexthop_mac)
        self.vxlan_port, self.mtu, self.strict = u.vxlan_port, u.mtu, u.strict_vxlan
        self.port_tenant, self.port_ep = {}, {}
        self.vni_tenant = {}
        self.tenants = t.tenants
        self.all_macs, self.local_macs = set(), set()
        self.per = {}
        for tn, tt in t.tenants.items():
            self.vni_tenant[tt.vni] = tn
            d = collections.namedtuple("T", "vni gw ports remote vteps flood answers routes gws")(
                tt.vni,
                mac(tt.gateway_mac),
                {p: (mac(e.mac), e.ip.packed) for p, e in tt.ports.items()},
                {mac(e.mac): e.vtep.packed for e in tt.remote},
                {v.packed for v in tt.vteps},
                [v.packed for v in tt.flood],
                {},
                {},
                {gw.packed for _, gw in tt.subnets},
            )
            for _, gw in tt.subnets:
                d.answers[gw.packed] = d.gw
            for e in list(tt.ports.values()) + tt.remote:
                d.answers[e.ip.packed] = mac(e.mac)
                d.routes[e.ip.packed] = mac(e.mac)
            for p, e in tt.ports.items():
                self.port_tenant[p] = tn
                self.port_ep[p] = (mac(e.mac), e.ip.packed)
                self.local_macs.add(mac(e.mac))
                self.all_macs.add(mac(e.mac))
            for e in tt.remote:
                self.all_macs.add(mac(e.mac))
            self.per[tn] = d
        self.local_ports = list(self.port_tenant)

    # -- per input ------------------------------------------------------------------------
    def expect(self, port, f):
        e = Exp()
        if len(f) > CAPACITY:
            e.reason = "oversize"
            if port != self.up:
                e.tenant = self.port_tenant[port]
            return e
        if port == self.up:
            self._uplink(f, e)
        else:
            e.tenant = e.counted = self.port_tenant[port]
            self._local(port, f, e)
        if not e.outs and e.reason is None:
            e.reason = "mtu" if e.too_big else "no_output"
        return e

    def _local(self, port, f, e):
        tn = e.tenant
        T = self.per[tn]
        my_mac, my_ip = self.port_ep[port]
        k = Key(f)
        # table 0: the port's own MAC, untagged, with its own IPv4/ARP sender (or a DHCP/ARP probe)
        accepted = own = False
        if len(f) >= 14 and k.dl_src == my_mac and not k.vlan and k.dl_type != ETH_VLAN and k.dl_type != ETH_QINQ:
            own = True
            if k.dl_type == ETH_IP and k.ip_ok:
                accepted = k.nw_src == my_ip or (
                    k.nw_src == b"\0\0\0\0" and k.nw_dst == b"\xff\xff\xff\xff" and k.nw_proto == 17
                    and k.l4 is not None and not k.frag and (k.tp_src, k.tp_dst) == (68, 67))
                # (a fragment's ports read as 0 when matching: README, frag mode "normal")
            elif k.dl_type == ETH_ARP and k.arp_ok:
                accepted = k.sha == my_mac and k.nw_src in (my_ip, b"\0\0\0\0")
        if not accepted:  # IPv6 from its own MAC: not carried, and not spoofing either
            e.reason = "ipv6_unsupported" if own and k.dl_type == ETH_IP6 else "spoofed"
            return
        # table 10: ARP about the port's own address is flooded (probe, gratuitous) ...
        if k.arp_ok and k.nw_dst == my_ip:
            return self._l2(port, f, k.dl_dst, T, e)
        if k.arp_ok and k.arp_op == 1 and k.nw_dst in T.answers:   # ... other requests answered in the tenant
            m = T.answers[k.nw_dst]
            o = k.l3
            r = bytearray(f)
            r[0:6] = f[6:12]
            r[6:12] = m
            r[o + 6:o + 8] = b"\x00\x02"
            r[o + 18:o + 24] = f[o + 8:o + 14]
            r[o + 24:o + 28] = f[o + 14:o + 18]
            r[o + 8:o + 14] = m
            r[o + 14:o + 18] = k.nw_dst
            e.outs.append(("port", port, bytes(r)))
            return
        if k.dl_dst == T.gw and self._gateway_echo(port, f, k, T, e):
            return
        if k.dl_dst == T.gw:   # routed by the anycast gateway to the tenant's endpoints, else unroutable
            if k.dl_type == ETH_IP and k.ip_ok and k.nw_dst in T.routes:
                if k.nw_ttl <= 1:
                    e.reason = "ttl_exceeded"
                    return
                r = bytearray(f)
                r[0:6] = T.routes[k.nw_dst]
                r[6:12] = T.gw
                if k.nw_proto == 0:  # README "Parsing": no L3 write when nw_proto is 0
                    return self._l2(port, bytes(r), bytes(r[0:6]), T, e)
                o = k.l3
                old = struct.unpack("!H", f[o + 8:o + 10])[0]
                r[o + 8] -= 1
                new = struct.unpack("!H", bytes(r[o + 8:o + 10]))[0]
                hc = struct.unpack("!H", f[o + 10:o + 12])[0]   # RFC 1624 eqn. 3
                hc = (~fold((~hc & 0xFFFF) + (~old & 0xFFFF) + new)) & 0xFFFF
                r[o + 10:o + 12] = struct.pack("!H", hc)
                return self._l2(port, bytes(r), bytes(r[0:6]), T, e)
            e.reason = "unroutable"
            return
        self._l2(port, f, k.dl_dst, T, e)

    def _gateway_echo(self, port, f, k, T, e):
        """Table 10: an ICMP echo request (not a fragment) to one of the tenant's gateway
        addresses comes back out its port as the reply: MACs and addresses swapped, TTL 64,
        type 0; the IPv4 checksum updated word by word (TTL, then the addresses) and the
        ICMP one for its first word, each step RFC 1624 eqn. 3 as the datapath does it
        (an ICMP checksum of 0 sent as 0xffff)."""
        if not (k.dl_type == ETH_IP and k.ip_ok and k.nw_proto == 1 and not k.frag and k.l4 is not None
                and (k.tp_src, k.tp_dst) == (8, 0) and k.nw_dst in T.gws):
            return False
        o, l4 = k.l3, k.l4
        r = bytearray(f)
        r[0:6], r[6:12] = f[6:12], T.gw
        r[o + 8] = 64
        r[o + 12:o + 16], r[o + 16:o + 20] = f[o + 16:o + 20], f[o + 12:o + 16]
        r[l4] = 0

        def step(csum_at, word_at):
            old, new = (struct.unpack("!H", bytes(x[word_at:word_at + 2]))[0] for x in (f, r))
            hc = struct.unpack("!H", bytes(r[csum_at:csum_at + 2]))[0]
            r[csum_at:csum_at + 2] = struct.pack("!H", (~fold((~hc & 0xFFFF) + (~old & 0xFFFF) + new)) & 0xFFFF)

        for w in (8, 12, 14, 16, 18):
            step(o + 10, o + w)
        step(l4 + 2, l4)
        if r[l4 + 2:l4 + 4] == b"\0\0":  # as 0xffff (right for a message of zeros too: execute.h)
            r[l4 + 2:l4 + 4] = b"\xff\xff"
        e.outs.append(("port", port, bytes(r)))
        return True

    def _l2(self, port, f, dst, T, e):
        """Table 20: the tenant's own MACs, then other tenants' MACs (isolation), then flooding."""
        for p, (m, _) in T.ports.items():
            if m == dst:
                if p != port:
                    e.outs.append(("port", p, f))
                return
        if dst in T.remote:
            return self._encap(f, T.remote[dst], T, e)
        if dst in self.all_macs:
            e.reason = "isolation"
            return
        for p in T.ports:
            if p != port:
                e.outs.append(("port", p, f))
        for v in T.flood:
            self._encap(f, v, T, e)

    def _encap(self, f, vtep, T, e):
        if (40 if self.v6 else 20) + 16 + len(f) > self.mtu:
            e.too_big.append(f)
        else:
            e.outs.append(("vxlan", vtep, T.vni, f))

    def _uplink(self, f, e):
        """VXLAN for us is popped (UDP length, checksum, I flag), then table 0 accepts a VNI only
        from its VTEPs, untagged, and table 30 delivers to the tenant's local ports only."""
        k = Key(f)
        n = len(f)
        fam_ok = k.dl_type == (ETH_IP6 if self.v6 else ETH_IP)
        dst = k.ip6_dst if self.v6 else k.nw_dst
        src = k.ip6_src if self.v6 else k.nw_src
        if not (fam_ok and k.dl_dst == self.up_mac and not k.vlan and k.l3 is not None and (self.v6 or k.ip_ok)
                and dst == self.my_ip and k.nw_proto == 17 and not k.frag and k.l4 is not None
                and k.tp_dst == self.vxlan_port):
            if (not self.v6 and k.arp_ok and k.arp_op == 1 and k.nw_dst == self.my_ip):
                o = k.l3
                r = bytearray(f)
                r[0:6] = f[6:12]
                r[6:12] = self.up_mac
                r[o + 6:o + 8] = b"\x00\x02"
                r[o + 18:o + 24] = f[o + 8:o + 14]
                r[o + 24:o + 28] = f[o + 14:o + 18]
                r[o + 8:o + 14] = self.up_mac
                r[o + 14:o + 18] = self.my_ip
                e.outs.append(("port", self.up, bytes(r)))
                e.vtep_arp = True
                return
            e.reason = "underlay"
            return
        l4 = k.l4
        avail = n - l4
        ulen = struct.unpack("!H", f[l4 + 4:l4 + 6])[0] if avail >= 6 else 0
        if avail < 16 or ulen < 16 or ulen > avail or ulen - 16 < 14:
            e.reason = "vxlan_truncated"
            return
        ip = k.l3
        if self.v6:
            if struct.unpack("!H", f[ip + 4:ip + 6])[0] < ulen + (l4 - ip - 40):
                e.reason = "vxlan_truncated"
                return
        else:
            ihl = (f[ip] & 15) * 4
            if struct.unpack("!H", f[ip + 2:ip + 4])[0] < ihl + ulen:
                e.reason = "vxlan_truncated"
                return
            if inet_checksum(f[ip:ip + ihl]) != 0:
                e.reason = "vxlan_bad_checksum"
                return
        c = struct.unpack("!H", f[l4 + 6:l4 + 8])[0]
        if c != 0:
            ip = k.l3
            s, d = (f[ip + 8:ip + 24], f[ip + 24:ip + 40]) if self.v6 else (f[ip + 12:ip + 16], f[ip + 16:ip + 20])
            if l4_checksum(bytes(s), bytes(d), 17, f[l4:l4 + ulen]) != 0:
                e.reason = "vxlan_bad_checksum"
                return
        vx = f[l4 + 8:l4 + 16]
        if not vx[0] & 0x08 or (self.strict and (vx[0] & ~0x08 or any(vx[1:4]) or vx[7])):
            e.reason = "vxlan_bad_flags"
            return
        vni = int.from_bytes(vx[4:7], "big")
        inner = f[l4 + 16:l4 + ulen]
        e.inner = inner
        tn = self.vni_tenant.get(vni)
        if tn is None:
            e.reason = "unknown_vni"
            return
        T = self.per[tn]
        if src not in T.vteps:
            e.reason = "unknown_vtep"  # forged: charged to no tenant
            return
        e.counted = tn
        e.tenant = tn
        if len(inner) >= 18 and inner[12:14] in (b"\x81\x00", b"\x88\xa8"):
            e.reason = "inner_vlan"
            return
        d = inner[0:6]
        for p, (m, _) in T.ports.items():
            if m == d:
                e.outs.append(("port", p, inner))
                return
        if d == T.gw:
            e.reason = "unroutable"
            return
        if d in self.local_macs:
            e.reason = "isolation"
            return
        for p in T.ports:
            e.outs.append(("port", p, inner))


# ---- checking a batch ------------------------------------------------------------------------

def parse_vxlan_out(m, data):
    """A frame the dataplane sent on the uplink, checked for well-formed VXLAN:
    returns (outer dst, vni, inner) or raises AssertionError."""
    assert len(data) >= 14 and data[0:6] == m.nh_mac and data[6:12] == m.up_mac, "outer Ethernet"
    t = struct.unpack("!H", data[12:14])[0]
    if m.v6:
        assert t == ETH_IP6 and len(data) >= 14 + 40 + 16
        ip = data[14:54]
        assert ip[0] >> 4 == 6 and ip[6] == 17 and ip[8:24] == m.my_ip, "outer IPv6"
        assert struct.unpack("!H", ip[4:6])[0] == len(data) - 54
        dst, l4 = ip[24:40], 54
        assert "UDP" in assert_checksums(data), "IPv6 outer UDP checksum (not zero, and right)"
    else:
        assert t == ETH_IP and len(data) >= 14 + 20 + 16
        ip = data[14:34]
        assert ip[0] == 0x45 and ip[9] == 17 and ip[12:16] == m.my_ip, "outer IPv4"
        assert struct.unpack("!H", ip[2:4])[0] == len(data) - 14, "outer IPv4 length"
        assert "IPv4 header" in assert_checksums(data, udp_zero=True), "outer IPv4 checksum"
        assert struct.unpack("!H", ip[6:8])[0] == 0x4000, "DF, not a fragment"
        dst, l4 = ip[16:20], 34
        assert data[l4 + 6:l4 + 8] == b"\0\0", "UDP checksum 0 over IPv4"
    sport, dport, ulen = struct.unpack("!HHH", data[l4:l4 + 6])
    assert dport == m.vxlan_port and ulen == len(data) - l4, "UDP header"
    lo, hi = m.t.uplink.src_port_range
    assert lo <= sport <= hi, "UDP source port in range"
    vx = data[l4 + 8:l4 + 16]
    assert vx[0] == 0x08 and vx[1:4] == b"\0\0\0" and vx[7] == 0, f"VXLAN flags/reserved {vx.hex()}"
    return dst, int.from_bytes(vx[4:7], "big"), data[l4 + 16:]


def is_too_big(data):
    k = Key(data)
    if k.dl_type == ETH_IP and k.ip_ok:
        return k.nw_proto == 1 and (k.tp_src, k.tp_dst) == (3, 4)
    return k.dl_type == ETH_IP6 and k.nw_proto == 58 and k.tp_src == 2


def ctr_delta(after, before):
    out = {}
    for k, v in after.items():
        if isinstance(v, list):
            continue
        if isinstance(v, dict):
            out[k] = ctr_delta(v, before.get(k, {}) if isinstance(before, dict) else {})
        else:
            out[k] = v - (before.get(k, 0) if isinstance(before, dict) else 0)
    return out


def run_and_check(dp, m, inputs, before=None):
    """Processes `inputs` [(port, frame)] in one call and checks invariants, then the model."""
    before = before if before is not None else dp.stats()
    outs = dp.process(list(inputs))
    after = dp.stats()
    by = collections.defaultdict(list)
    for o in outs:
        by[o.index].append(o)
    exps = [m.expect(p, f) for p, f in inputs]

    # 1. isolation invariants
    for i, ((port, f), e) in enumerate(zip(inputs, exps)):
        where = f"input {i} on {port}: {f.hex()}"
        for o in by[i]:
            what = f"{where}\n  -> {o.port}: {o.data.hex()}"
            if o.port == m.up:
                if port == m.up:   # split horizon: only the VTEP's own ARP reply goes back
                    k, ko = Key(f), Key(o.data)
                    assert not m.v6 and k.arp_ok and k.arp_op == 1 and k.nw_dst == m.my_ip, "ISOLATION: uplink->uplink " + what
                    assert ko.arp_ok and ko.arp_op == 2 and ko.sha == m.up_mac and ko.nw_src == m.my_ip, what
                    assert ko.dl_dst == k.dl_src and ko.tha == k.sha and ko.nw_dst == k.nw_src, what
                    continue
                assert e.tenant is not None, "ISOLATION: uplink output for an input of no tenant " + what
                T = m.per[e.tenant]
                try:
                    dst, vni, inner = parse_vxlan_out(m, o.data)
                except AssertionError as x:
                    raise AssertionError(f"malformed VXLAN ({x}): {what}") from None
                assert vni == T.vni, f"ISOLATION: VNI {vni} is not tenant {e.tenant}'s {T.vni}: " + what
                assert dst in T.vteps, f"ISOLATION: VTEP {dst.hex()} is not one of tenant {e.tenant}'s: " + what
            else:
                assert e.tenant is not None, "ISOLATION: local output for an input of no tenant " + what
                assert m.port_tenant[o.port] == e.tenant, \
                    f"ISOLATION: {o.port} belongs to {m.port_tenant[o.port]}, input to {e.tenant}: " + what
                ko = Key(o.data)
                if port != m.up and o.port == port and ko.arp_ok and ko.arp_op == 2:
                    T = m.per[e.tenant]
                    assert T.answers.get(ko.nw_src) == ko.sha == o.data[6:12], \
                        f"ISOLATION: ARP reply reveals {ko.sha.hex()} for {ko.nw_src.hex()}: " + what

    # 2. the exact model
    counted = []
    for i, ((port, f), e) in enumerate(zip(inputs, exps)):
        got, icmp = [], []
        for o in by[i]:
            if o.port == m.up and port != m.up:
                got.append(("vxlan",) + parse_vxlan_out(m, o.data))
            elif o.port == port and port != m.up and is_too_big(o.data) and e.too_big:
                icmp.append(o)
            else:
                got.append(("port", o.port, o.data))
        assert sorted(got) == sorted(e.outs), (
            f"input {i} on {port}: {f.hex()}\n  expected {fmt(e.outs)}\n  got      {fmt(got)}")
        assert len(icmp) <= len(e.too_big)
        for o in icmp:
            k, ko = Key(f), Key(o.data)
            assert (ko.dl_dst, ko.dl_src) == (k.dl_src, k.dl_dst)
        counted.append(bool(got))

    # counters: every input is accounted for, in its port and (only) its tenant
    d = ctr_delta(after, before)
    ports = collections.defaultdict(lambda: {"rx": 0, "rx_bytes": 0, "tx": 0, "drops": collections.Counter()})
    tenants = collections.defaultdict(lambda: {"rx": 0, "rx_bytes": 0, "tx": 0, "tx_bytes": 0,
                                               "drops": collections.Counter()})
    for (port, f), e, c in zip(inputs, exps, counted):
        ports[port]["rx"] += 1
        ports[port]["rx_bytes"] += len(f)
        if not c:
            ports[port]["drops"][e.reason] += 1
        if e.counted is not None and e.reason != "oversize":
            tenants[e.counted]["rx"] += 1
            tenants[e.counted]["rx_bytes"] += len(f) if port != m.up else len(e.inner)
            if not c:
                tenants[e.counted]["drops"][e.reason] += 1
    for o in outs:
        ports[o.port]["tx"] += 1
    for i, e in enumerate(exps):
        if e.counted is not None:
            sent = [o for o in by[i] if not (o.port == inputs[i][0] and is_too_big(o.data) and e.too_big)]
            tenants[e.counted]["tx"] += len(sent)
            tenants[e.counted]["tx_bytes"] += sum(len(o.data) for o in sent)
    for name in set(m.local_ports) | {m.up}:
        pd, want = d["ports"].get(name, {}), ports[name]
        got = (pd.get("rx_packets", 0), pd.get("rx_bytes", 0), pd.get("tx_packets", 0), pd.get("dropped", 0),
               {k: v for k, v in pd.get("drops", {}).items() if v})
        exp = (want["rx"], want["rx_bytes"], want["tx"], sum(want["drops"].values()), dict(want["drops"]))
        assert got == exp, f"port {name} counters (rx, rx_bytes, tx, dropped, drops): got {got}, expected {exp}"
    for tn in m.tenants:
        td, want = d["tenants"][tn], tenants[tn]
        got = (td["rx_packets"], td["rx_bytes"], td["tx_packets"], td["tx_bytes"], td["dropped"],
               {k: v for k, v in td["drops"].items() if v})
        exp = (want["rx"], want["rx_bytes"], want["tx"], want["tx_bytes"], sum(want["drops"].values()), dict(want["drops"]))
        assert got == exp, f"tenant {tn} counters (rx, rx_bytes, tx, tx_bytes, dropped, drops): got {got}, expected {exp}"
    return outs


def fmt(outs):
    r = []
    for o in sorted(outs):
        if o[0] == "vxlan":
            r.append(f"vxlan(vtep={ipaddress.ip_address(o[1])}, vni={o[2]}, {o[3].hex()})")
        else:
            r.append(f"{o[1]}:{o[2].hex()}")
    return "[" + ", ".join(r) + "]"


# ---- hostile traffic ---------------------------------------------------------------------------

MAC_EXTRA = [BCAST, mac("01:00:5e:00:00:fb"), mac("33:33:00:00:00:01"), ZERO6, mac("02:de:ad:be:ef:01"),
             mac("01:80:c2:00:00:00")]
IP_EXTRA = ["0.0.0.0", "255.255.255.255", "10.0.0.255", "10.0.0.99", "127.0.0.1", "224.0.0.251", "169.254.1.1"]


def uniq(xs):
    return list(dict.fromkeys(xs))


class Pools:
    """Addresses worth forging: every tenant's, ours, and a few nobody's."""

    def __init__(self, m):
        t = m.t
        macs, ips, vteps = [], [], []
        for tt in t.tenants.values():
            macs.append(mac(tt.gateway_mac))
            ips += [gw.packed for _, gw in tt.subnets]
            ips += [n.broadcast_address.packed for n, _ in tt.subnets]
            for e in list(tt.ports.values()) + tt.remote:
                macs.append(mac(e.mac))
                ips.append(e.ip.packed)
            vteps += [v.packed for v in tt.vteps]
        self.macs = uniq(macs + [m.up_mac, m.nh_mac] + MAC_EXTRA)
        self.ips = uniq(ips + [ipb(a) for a in IP_EXTRA] + ([] if m.v6 else [m.my_ip] + vteps))
        vnis = [tt.vni for tt in t.tenants.values()]
        self.vnis = uniq(vnis + [0, 1, 99, 0xFFFFFF] + [v ^ 0x010000 for v in vnis] + [v + 1 for v in vnis])
        other = [ipb("192.0.2.99"), ipb("192.0.2.2")] if m.v6 else [ipb("2001:db8::99"), ipb("2001:db8::2")]
        self.vteps = uniq(vteps + [m.my_ip, ipb("2001:db8::99" if m.v6 else "192.0.2.99")])
        self.vteps_other_family = other
        self.endpoints = [(mac(e.mac), e.ip.packed) for tt in t.tenants.values() for e in list(tt.ports.values()) + tt.remote]
        self.endpoints = self.endpoints or [(mac("02:00:00:00:09:09"), ipb("10.0.0.9"))]


def often(draw, own, pool, p=0.7):
    """`own` most of the time (to get past anti-spoofing and reach the later tables), else a forgery."""
    if draw(st.integers(0, 99)) < p * 100:
        return own
    return draw(st.sampled_from(pool))


def tag_and_cut(draw, f, vlan_one_in=10, cut_one_in=8):
    if len(f) >= 14 and draw(st.integers(0, vlan_one_in - 1)) == 0:
        tpid = draw(st.sampled_from([ETH_VLAN, ETH_QINQ]))
        f = f[:12] + struct.pack("!HH", tpid, draw(st.sampled_from([0, 5, 0x0FFF, 0xE064]))) + f[12:]
    if draw(st.integers(0, cut_one_in - 1)) == 0:
        f = f[:draw(st.integers(0, len(f)))]
    return f


PAYLOAD_SIZES = [0, 1, 8, 18, 46, 1400, 1410, 1420, 1428, 1450, 1472, 1480, 1850, 1877, 1878, 1879,
                 1900, 8950, 9174, 10070, 10080]


@st.composite
def inner_frames(draw, m, pools, port=None, depth=0):
    """A frame as a VM would send it (port given: that port's addresses are likely) or as
    it would arrive inside VXLAN (port None: some tenant's endpoint is likely)."""
    own_mac, own_ip = m.port_ep[port] if port else draw(st.sampled_from(pools.endpoints))
    src_mac = often(draw, own_mac, pools.macs, 0.8)
    src_ip = often(draw, own_ip, pools.ips, 0.8)
    if port:   # the sender's own gateway, neighbours and routes are the interesting destinations
        T = m.per[m.port_tenant[port]]
        near_macs = [T.gw, T.gw] + [x for x, _ in T.ports.values()] + list(T.remote)
        near_ips = list(T.routes) + list(T.answers)
    else:
        near_macs, near_ips = sorted(m.local_macs) or pools.macs, pools.ips
    dst_mac = often(draw, draw(st.sampled_from(near_macs)), pools.macs, 0.5)
    dst_ip = often(draw, draw(st.sampled_from(near_ips)) if near_ips else own_ip, pools.ips, 0.5)
    kind = draw(st.sampled_from(["ip"] * 4 + ["arp"] * 3 + ["dhcp", "ipv6", "nested", "ethertype", "llc", "garbage"]))
    if kind == "ip":
        proto = draw(st.sampled_from([17, 17, 6, 1, 47]))
        size = draw(st.sampled_from(PAYLOAD_SIZES[:5] * 3 + PAYLOAD_SIZES))
        if proto == 17:
            dport = draw(st.sampled_from([53, 4789, 67, 68, 8472, 9]))
            seg = with_udp_csum(udp_seg(draw(st.sampled_from([1234, 68, 4789])), dport, b"u" * size), src_ip, dst_ip,
                                draw(st.sampled_from(["zero", "good"])))
        elif proto == 6:
            seg = tcp_seg(40000, 80) + b"t" * size
        elif proto == 1:
            body = struct.pack("!BBHHH", draw(st.sampled_from([8, 0, 3])), 0, 0, 7, 1) + b"i" * size
            seg = body[:2] + struct.pack("!H", inet_checksum(body)) + body[4:]
        else:
            seg = b"g" * size
        ip = ipv4(src_ip, dst_ip, proto, seg, ttl=draw(st.sampled_from([64, 64, 1, 0, 2, 255])),
                  frag=draw(st.sampled_from([0x4000, 0x4000, 0, 0x2000, 0x0010])),
                  opts=draw(st.sampled_from([b""] * 5 + [b"\x01\x01\x01\x00"])))
        f = eth(dst_mac, src_mac, ETH_IP, ip)
    elif kind == "arp":
        op = draw(st.sampled_from([1, 1, 2, 2, 3, 0x0101]))
        sha = often(draw, own_mac, pools.macs)
        spa = draw(st.sampled_from([src_ip, own_ip, b"\0\0\0\0"]))
        tpa = draw(st.sampled_from(pools.ips + [spa, own_ip]))       # spa: gratuitous
        tha = draw(st.sampled_from([ZERO6, BCAST, dst_mac]))
        shape = draw(st.sampled_from([(1, ETH_IP, 6, 4)] * 8 + [(6, ETH_IP, 6, 4), (1, ETH_IP6, 6, 4), (1, ETH_IP, 6, 16)]))
        body = arp_body(op, sha, spa, tha, tpa, *shape)
        f = eth(draw(st.sampled_from([BCAST, BCAST, dst_mac])), src_mac, ETH_ARP, body + b"\0" * draw(st.sampled_from([0, 18])))
    elif kind == "dhcp":
        seg = udp_seg(68, draw(st.sampled_from([67, 67, 68])), b"d" * 30)
        ip = ipv4(draw(st.sampled_from([b"\0\0\0\0", src_ip])), draw(st.sampled_from([b"\xff" * 4, dst_ip])), 17, seg, frag=0)
        f = eth(draw(st.sampled_from([BCAST, dst_mac])), src_mac, ETH_IP, ip)
    elif kind == "ipv6":
        f = eth(dst_mac, src_mac, ETH_IP6, ipv6(ipb("fe80::1"), ipb("ff02::1"), 17, udp_seg(546, 547, b"6" * 8)))
    elif kind == "nested" and depth < 2:
        inner = draw(inner_frames(m, pools, None, depth + 1))
        vx = vxlan_hdr(draw(st.sampled_from([0x08, 0x08, 0x0C, 0x00])), draw(st.sampled_from(pools.vnis))) + inner
        dst = draw(st.sampled_from([m.my_ip] + pools.ips)) if not m.v6 else draw(st.sampled_from(pools.ips))
        f = eth(dst_mac, src_mac, ETH_IP, ipv4(src_ip, dst, 17, udp_seg(49152, 4789, vx)))
    elif kind == "ethertype":
        f = eth(dst_mac, src_mac, draw(st.sampled_from([0x88CC, 0x8035, 0x9000, ETH_IP, ETH_IP6, ETH_ARP, ETH_VLAN])),
                draw(st.binary(max_size=40)))
    elif kind == "llc":
        body = draw(st.binary(min_size=3, max_size=60))
        f = eth(dst_mac, src_mac, len(body), body)
    else:
        f = draw(st.binary(max_size=80))
    return tag_and_cut(draw, f)


@st.composite
def uplink_frames(draw, m, pools):
    kind = draw(st.sampled_from(["vxlan"] * 12 + ["arp", "arp", "udp", "garbage"]))
    if kind == "vxlan":
        inner = draw(inner_frames(m, pools, None, 1))
        T = draw(st.sampled_from(list(m.per.values())))
        vni = T.vni if draw(st.integers(0, 9)) < 6 else draw(st.sampled_from(pools.vnis))
        vx = vxlan_hdr(draw(st.sampled_from([0x08] * 8 + [0x00, 0x0C, 0x88, 0xFF, 0x80])), vni,
                       draw(st.sampled_from([0] * 6 + [1, 0xABCDEF])), draw(st.sampled_from([0] * 6 + [0xCD])))
        v6 = m.v6 if draw(st.integers(0, 14)) else not m.v6
        same = v6 == m.v6
        src = draw(st.sampled_from(sorted(T.vteps) if T.vteps and draw(st.integers(0, 9)) < 6 and same
                                   else pools.vteps if same else pools.vteps_other_family))
        dst = (m.my_ip if draw(st.integers(0, 7)) else draw(st.sampled_from(pools.vteps))) if same \
            else draw(st.sampled_from(pools.vteps_other_family))
        dport = draw(st.sampled_from([m.vxlan_port] * 14 + [4789, 8472, 4790]))
        seg = udp_seg(draw(st.sampled_from([49999, 4789, 0])), dport, vx + inner,
                      length=None if draw(st.integers(0, 11)) else 8 + len(vx) + len(inner) + draw(st.sampled_from([-30, -1, 1, 100])))
        seg = with_udp_csum(seg, src, dst, draw(st.sampled_from(["zero", "zero", "good", "bad"])))
        if v6:
            nh, ext = 17, b""
            if draw(st.integers(0, 9)) == 0:   # a hop-by-hop or fragment header before UDP
                nh, ext = draw(st.sampled_from([(0, b"\x11\x00" + b"\x00" * 6), (44, b"\x11\x00\x00\x00\x00\x00\x00\x01")]))
            ip, et = ipv6(src, dst, nh, ext + seg), ETH_IP6
        else:
            ip = ipv4(src, dst, 17, seg, frag=draw(st.sampled_from([0x4000] * 14 + [0, 0x2000, 0x0008])),
                      opts=draw(st.sampled_from([b""] * 9 + [b"\x01\x01\x01\x00"])),
                      good_csum=bool(draw(st.integers(0, 9))))
            et = ETH_IP
        f = eth(draw(st.sampled_from([m.up_mac] * 6 + [BCAST, mac("02:00:00:00:77:77")])), m.nh_mac, et, ip)
        return tag_and_cut(draw, f, vlan_one_in=12, cut_one_in=10)
    if kind == "arp":
        sha = draw(st.sampled_from([m.nh_mac] + pools.macs))
        spa = draw(st.sampled_from(pools.ips + [ipb("192.0.2.2")]))
        tpa = m.my_ip if draw(st.booleans()) and not m.v6 else draw(st.sampled_from(pools.ips))
        body = arp_body(draw(st.sampled_from([1, 1, 2, 0x0101])), sha, spa, ZERO6, tpa)
        f = eth(draw(st.sampled_from([BCAST, m.up_mac])), sha, ETH_ARP, body)
        return tag_and_cut(draw, f, vlan_one_in=8, cut_one_in=10)
    if kind == "udp":
        src = draw(st.sampled_from(pools.vteps))
        if m.v6:
            ip = ipv6(src, m.my_ip, 17, udp_seg(1, draw(st.sampled_from([53, 4790])), b"x" * 20))
            return eth(m.up_mac, m.nh_mac, ETH_IP6, ip)
        return eth(m.up_mac, m.nh_mac, ETH_IP, ipv4(src, m.my_ip, draw(st.sampled_from([17, 6, 47])),
                                                   udp_seg(1, draw(st.sampled_from([53, 4790])), b"x" * 20)))
    return draw(st.binary(max_size=120))


def fabric(m, vtep, vni, inner, csum="zero"):
    seg = with_udp_csum(udp_seg(50000, m.vxlan_port, vxlan_hdr(0x08, vni) + inner), vtep, m.my_ip,
                        "good" if m.v6 else csum)
    ip = ipv6(vtep, m.my_ip, 17, seg) if m.v6 else ipv4(vtep, m.my_ip, 17, seg)
    return eth(m.up_mac, m.nh_mac, ETH_IP6 if m.v6 else ETH_IP, ip)


def seeds(m):
    """Legitimate traffic of every kind the topology allows: the starting points of mutants
    (a frame one byte away from a legitimate one is the best probe of a too-wide cache entry)."""
    out = []
    for tn, T in m.per.items():
        ports = list(T.ports.items())
        for a, (am, ai) in ports:
            for b, (bm, bi) in ports:
                if a != b:
                    out.append((a, eth(bm, am, ETH_IP, ipv4(ai, bi, 17, udp_seg(7000, 7001, b"seed")))))
            for rm, vt in list(T.remote.items())[:2]:
                out.append((a, eth(rm, am, ETH_IP, ipv4(ai, ipb("10.0.0.21"), 6, tcp_seg(1, 2)))))
            for ip, dm in list(T.routes.items())[:3]:
                out.append((a, eth(T.gw, am, ETH_IP, ipv4(ai, ip, 1, b"\x08\x00\xf7\xff" + b"\0" * 4, ttl=2))))
            for gw in sorted(T.gws):  # ping the gateway (the checksum: a right one)
                out.append((a, eth(T.gw, am, ETH_IP, ipv4(ai, gw, 1, b"\x08\x00\xf7\xfe" + b"\0\x01\0\0", ttl=1))))
            out.append((a, eth(mac("33:33:00:00:00:02"), am, ETH_IP6,   # its first breath: a router solicitation
                               ipv6(ipb("fe80::1"), ipb("ff02::2"), 58, b"\x85\x00\x7b\x38" + b"\0" * 4, hlim=255))))
            for ip in list(T.answers)[:3]:
                out.append((a, eth(BCAST, am, ETH_ARP, arp_body(1, am, ai, ZERO6, ip))))
            out.append((a, eth(BCAST, am, ETH_ARP, arp_body(1, am, b"\0" * 4, ZERO6, ai))))       # probe
            out.append((a, eth(BCAST, am, ETH_ARP, arp_body(2, am, ai, BCAST, ai))))             # gratuitous
            out.append((a, eth(BCAST, am, ETH_IP, ipv4(b"\0" * 4, b"\xff" * 4, 17, udp_seg(68, 67, b"dhcp"), frag=0))))
            out.append((a, eth(BCAST, am, ETH_IP, ipv4(ai, ipb("10.0.0.255"), 17, udp_seg(9, 9, b"bcast")))))
        for v in sorted(T.vteps)[:2]:
            for b, (bm, bi) in ports[:2]:
                out.append((m.up, fabric(m, v, T.vni, eth(bm, mac("02:00:00:00:0c:0c"), ETH_IP,
                                                           ipv4(ipb("10.0.0.222"), bi, 17, udp_seg(1, 2, b"c"))), "good")))
            out.append((m.up, fabric(m, v, T.vni, eth(BCAST, mac("02:00:00:00:0c:0c"), ETH_ARP,
                                                       arp_body(1, mac("02:00:00:00:0c:0c"), ipb("10.0.0.222"), ZERO6, ipb("10.0.0.1"))))))
    if not m.v6:
        out.append((m.up, eth(BCAST, m.nh_mac, ETH_ARP, arp_body(1, m.nh_mac, ipb("192.0.2.254"), ZERO6, m.my_ip))))
    return out


@st.composite
def mutants(draw, seeds_):
    port, f = draw(st.sampled_from(seeds_))
    f = bytearray(f)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(f) - 1))
        if draw(st.booleans()):
            f[i] ^= 1 << draw(st.integers(0, 7))
        else:
            f[i] = draw(st.sampled_from([0, 1, 2, 0x08, 0x40, 0x81, 0xFF]))
    return port, bytes(f)


@st.composite
def hostile_batches(draw, m, min_size=20, max_size=80):
    pools = Pools(m)
    seeds_ = seeds(m)
    ports = m.local_ports + [m.up]
    out = []
    for _ in range(draw(st.integers(min_size, max_size))):
        if seeds_ and draw(st.integers(0, 3)) == 0:
            out.append(draw(mutants(seeds_)) if draw(st.integers(0, 3)) else draw(st.sampled_from(seeds_)))
            continue
        port = draw(st.sampled_from(ports + [m.up] * max(1, len(ports) // 2)))
        f = draw(uplink_frames(m, pools)) if port == m.up else draw(inner_frames(m, pools, port))
        out.append((port, f))
    return out


def canaries(m):
    """Legitimate traffic of every tenant, interleaved with the hostile batch: hostile
    traffic must not change what happens to it (cache poisoning, shared state)."""
    out = []
    for tn, T in m.per.items():
        ports = list(T.ports.items())
        for (a, (am, ai)), (b, (bm, bi)) in zip(ports, ports[1:]):
            out.append((a, eth(bm, am, ETH_IP, ipv4(ai, bi, 17, udp_seg(7000, 7001, b"canary")))))
        for a, (am, ai) in ports[:1]:
            out.append((a, eth(BCAST, am, ETH_ARP, arp_body(1, am, ai, ZERO6, next(iter(T.answers))))))
            for v in sorted(T.vteps)[:1]:
                for _, (bm, bi) in ports[:2]:
                    inner = eth(bm, mac("02:00:00:00:0c:0c"), ETH_IP, ipv4(ipb("10.0.0.222"), bi, 17, udp_seg(1, 2, b"c")))
                    seg = udp_seg(50000, m.vxlan_port, vxlan_hdr(0x08, T.vni) + inner)
                    ip = ipv6(v, m.my_ip, 17, with_udp_csum(seg, v, m.my_ip, "good")) if m.v6 else ipv4(v, m.my_ip, 17, seg)
                    out.append((m.up, eth(m.up_mac, m.nh_mac, ETH_IP6 if m.v6 else ETH_IP, ip)))
    return out


def check_twice(dp, m, batch):
    """The batch with canaries around it, twice: the second run hits the caches the first filled."""
    c = canaries(m)
    inputs = c + batch + c
    first = run_and_check(dp, m, inputs)
    second = run_and_check(dp, m, inputs)
    assert [(o.port, o.data, o.index) for o in first] == [(o.port, o.data, o.index) for o in second]


# ---- random topologies ------------------------------------------------------------------------------

MAC_POOL = ["02:00:00:00:01:01", "02:00:00:00:01:11", "02:00:00:00:01:12", "02:00:00:00:03:11",
            "02:00:00:00:02:21", "02:00:00:00:03:21", "02:00:00:00:00:01", "02:00:00:00:00:02", "0a:00:00:00:00:01"]
SUBNET_POOL = [("10.0.0.0/24", "10.0.0.1"), ("10.0.1.0/24", "10.0.1.1"), ("10.0.0.0/23", "10.0.1.254"),
               ("10.9.9.0/30", "10.9.9.1"), ("172.16.0.0/24", "172.16.0.254"), ("10.8.8.0/31", "10.8.8.0")]
VNI_POOL = [100, 200, 1, 4095, 4096, 0xFFFFFF, 0x010064, 0x640000]
VTEPS4 = ["192.0.2.2", "192.0.2.3", "192.0.2.4", "198.51.100.7"]
VTEPS6 = ["2001:db8::2", "2001:db8::3", "2001:db8::4", "2001:db8:1::2"]


def hosts(net, gw):
    n = ipaddress.ip_network(net)
    out = []
    for off in (1, 2, 11, 12, 21, 254):
        if off < n.num_addresses:
            a = n.network_address + off
            if str(a) != gw and (n.prefixlen > 30 or a != n.broadcast_address):
                out.append(str(a))
    return out


@st.composite
def topologies(draw):
    v6 = draw(st.integers(0, 2)) == 0
    vteps = VTEPS6 if v6 else VTEPS4
    uplink = {"port": "p0", "ip": "2001:db8::1" if v6 else "192.0.2.1", "mac": "02:00:00:00:00:01",
              "nexthop_mac": "02:00:00:00:00:02",
              "mtu": draw(st.sampled_from([1500, 1500, 9216] + ([1280] if v6 else [576]))),
              "vxlan_port": draw(st.sampled_from([4789, 4789, 4789, 8472])),
              "strict_vxlan": draw(st.integers(0, 3)) == 0}
    if draw(st.integers(0, 4)) == 0:
        uplink["src_port_range"] = [5000, 5003]
    n = draw(st.integers(2, 5))
    vnis = draw(st.lists(st.sampled_from(VNI_POOL), min_size=n, max_size=n, unique=True))
    tenants, port_no = {}, 0
    for i in range(n):
        order = draw(st.permutations(SUBNET_POOL))
        subnets = []
        for net, gw in order[:draw(st.integers(1, 2))]:
            if not any(ipaddress.ip_network(net).overlaps(ipaddress.ip_network(s["cidr"])) for s in subnets):
                subnets.append({"cidr": net, "gateway": gw})
        gw_mac = draw(st.sampled_from(MAC_POOL))
        ips = uniq(h for s in subnets for h in hosts(s["cidr"], s["gateway"]))
        macs = [x for x in MAC_POOL if x != gw_mac]
        k = draw(st.integers(1 if i == 0 else 0, min(5, len(ips))))
        ep_ips = draw(st.lists(st.sampled_from(ips), min_size=k, max_size=k, unique=True)) if k else []
        ep_macs = draw(st.lists(st.sampled_from(macs), min_size=k, max_size=k, unique=True)) if k else []
        n_local = draw(st.integers(1 if i == 0 else 0, min(3, k)))
        ports, remote = {}, []
        for j, (a, b) in enumerate(zip(ep_ips, ep_macs)):
            if j < n_local:
                port_no += 1
                ports[f"vm{port_no}"] = {"mac": b, "ip": a}
            else:
                remote.append({"vtep": draw(st.sampled_from(vteps)), "mac": b, "ip": a})
        flood = draw(st.lists(st.sampled_from(vteps), max_size=2, unique=True))
        tenants[f"t{i}"] = {"vni": vnis[i], "gateway_mac": gw_mac, "subnets": subnets, "ports": ports,
                            "remote": remote, "flood": flood}
    return {"uplink": uplink, "tenants": tenants}


# ---- the tests --------------------------------------------------------------------------------------

EXAMPLE = Model(TOPO)


@settings(max_examples=60, **FUZZ)
@given(st.data())
def test_example_topology_hostile_traffic(data):
    batch = data.draw(hostile_batches(EXAMPLE, 40, 120))
    check_twice(Dataplane.from_topology(TOPO), EXAMPLE, batch)


@settings(max_examples=120, **FUZZ)
@given(st.data())
def test_random_topologies_hostile_traffic(data):
    topo = data.draw(topologies())
    m = Model(topo)
    assume(m.local_ports)
    batch = data.draw(hostile_batches(m, 20, 80))
    check_twice(Dataplane.from_topology(topo), m, batch)


@settings(max_examples=40, **FUZZ)
@given(st.data())
def test_reload_moves_ports_between_tenants_without_leaking(data):
    """A reload may hand a port, a VNI, a MAC or a VTEP to another tenant: nothing cached
    from before may keep sending traffic the old way."""
    a = data.draw(topologies())
    b = data.draw(topologies())
    ma, mb = Model(a), Model(b)
    dp = Dataplane.from_topology(a)
    check_twice(dp, ma, data.draw(hostile_batches(ma, 20, 60)))
    dp.load_topology(b)
    check_twice(dp, mb, data.draw(hostile_batches(mb, 20, 60)))


@settings(max_examples=40, **FUZZ)
@given(st.data())
def test_fast_tunnel_termination_matches_the_plain_path(data):
    """STYLE.md #8: the worker pops VXLAN for our VTEPs right after parsing; the plain
    path is a megaflow whose only action is TNL_POP. Both must agree with the model
    and with each other, byte for byte and counter for counter."""
    topo = data.draw(topologies())
    m = Model(topo)
    assume(m.local_ports)
    batch = canaries(m) + data.draw(hostile_batches(m, 20, 80))
    fast = Dataplane.from_topology(topo)
    plain = Dataplane.from_topology(topo)
    plain._core.set_fast_tunnel(False)
    a = run_and_check(fast, m, batch)
    b = run_and_check(plain, m, batch)
    assert [(o.port, o.data, o.index) for o in a] == [(o.port, o.data, o.index) for o in b]
    sa, sb = fast.stats(), plain.stats()
    assert sa["ports"] == sb["ports"] and sa["tenants"] == sb["tenants"] and sa["tables"] == sb["tables"]
    assert sb["workers_total"]["tunnel_pops"] == 0
    assert sa["workers_total"]["recirculations"] == sb["workers_total"]["recirculations"]


def test_fast_tunnel_raw_shape_and_its_fallbacks():
    """The fast path recognises the usual outer header from the frame bytes (IPv4, 20-byte
    header, total length = frame, no fragment); every other shape takes the parsed path
    (where a total length past the frame is no IPv4 header at all: README "Parsing").
    Each variant must come out exactly as on the plain path, and only the usual shape
    may be counted as a fast pop on the first pass."""
    m = EXAMPLE
    T = next(t for t in m.per.values() if t.vteps and t.ports)
    vtep = sorted(T.vteps)[0]
    (pm, pi) = next(iter(T.ports.values()))
    inner = eth(pm, mac("02:00:00:00:0c:0c"), ETH_IP, ipv4(ipb("10.0.0.222"), pi, 17, udp_seg(1, 2, b"raw")))
    seg = udp_seg(50000, m.vxlan_port, vxlan_hdr(0x08, T.vni) + inner)
    assert not m.v6

    def frame(ip, pad=b""):
        return eth(m.up_mac, m.nh_mac, ETH_IP, ip) + pad

    variants = {
        "usual": frame(ipv4(vtep, m.my_ip, 17, seg)),
        "options": frame(ipv4(vtep, m.my_ip, 17, seg, opts=b"\x01\x01\x01\x00")),
        "trailer": frame(ipv4(vtep, m.my_ip, 17, seg), pad=b"\0" * 6),
        "long total": frame(ipv4(vtep, m.my_ip, 17, seg, tot=20 + len(seg) + 4)),
        "fragment": frame(ipv4(vtep, m.my_ip, 17, seg, frag=0x2000)),
        "bad checksum": frame(ipv4(vtep, m.my_ip, 17, seg, good_csum=False)),
        "other address": frame(ipv4(vtep, ipb("192.0.2.250"), 17, seg)),
    }
    for name, f in variants.items():
        fast = Dataplane.from_topology(TOPO)
        plain = Dataplane.from_topology(TOPO)
        plain._core.set_fast_tunnel(False)
        a = run_and_check(fast, m, [(m.up, f)])
        b = run_and_check(plain, m, [(m.up, f)])
        assert [(o.port, o.data) for o in a] == [(o.port, o.data) for o in b], name
        sa, sb = fast.stats(), plain.stats()
        assert sa["ports"] == sb["ports"] and sa["tenants"] == sb["tenants"], name
        if name == "usual":
            assert [o.port for o in a] == [next(p for p, v in T.ports.items() if v == (pm, pi))]
        if name in ("usual", "options", "trailer"):
            assert sa["workers_total"]["tunnel_pops"] == 1, name
        else:
            assert sa["workers_total"]["tunnel_pops"] == 0 and not a, name


# ---- one explicit case per attack (fixture table: description, port, packet, verdict) ----------------

def _nested(inner_vni, inner_dst_mac, outer_vni=BLUE_VNI, outer_vtep=VTEP_BLUE):
    """VXLAN inside VXLAN: blue's VTEP wraps a second VXLAN packet aimed at red."""
    innermost = udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP)
    middle = (Ether(src=NEXTHOP_MAC, dst=inner_dst_mac) / IP(src=VTEP_RED, dst=VTEP_LOCAL)
              / UDP(sport=1, dport=4789, chksum=0) / VXLAN(flags=0x08, vni=inner_vni) / innermost)
    return vxlan(middle, outer_vni, outer_vtep)


def _cut_vxlan(n):
    """The VXLAN packet cut to n bytes, its outer IPv4 total length (and checksum) cut
    with it: a total length past the frame would be no IPv4 header at all (README
    "Parsing"), so the cut is the UDP/VXLAN layer's to find."""
    f = bytearray(bytes(vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), BLUE_VNI, VTEP_BLUE))[:n])
    f[16:18] = (n - 14).to_bytes(2, "big")
    f[24:26] = b"\0\0"
    f[24:26] = inet_checksum(bytes(f[14:34])).to_bytes(2, "big")
    return bytes(f)


def _frag(p):
    p = Ether(bytes(p))
    p[IP].flags = "MF"
    del p[IP].chksum
    return p


R_IN = udp(RED_REMOTE_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP)   # a frame red's VTEP may send to vm3
B_IN = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP)

# (description, in_port, packet, outputs [(port, vni or None)], drop reason, tenant charged)
ATTACKS = [
    # anti-spoofing: another tenant's addresses from red's port
    ("blue's MAC and IP from red's port", "vm3", udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP), [], "spoofed", "red"),
    ("blue's IP with red's own MAC", "vm3", udp(VM3_MAC, VM2_MAC, VM2_IP, VM2_IP), [], "spoofed", "red"),
    ("gratuitous ARP claiming blue's vm2", "vm3", Ether(src=VM3_MAC, dst=BROADCAST) / ARP(op=2, hwsrc=VM3_MAC, psrc=VM2_IP, hwdst=BROADCAST, pdst=VM2_IP), [], "spoofed", "red"),
    ("ARP with blue's sender MAC", "vm3", Ether(src=VM3_MAC, dst=BROADCAST) / ARP(op=1, hwsrc=VM1_MAC, psrc=VM3_IP, pdst=BLUE_GW2), [], "spoofed", "red"),
    ("VLAN-tagged frame from a VM", "vm3", Ether(src=VM3_MAC, dst=RED_REMOTE_MAC) / Dot1Q(vlan=100) / IP(src=VM3_IP, dst=RED_REMOTE_IP) / UDP(), [], "spoofed", "red"),
    ("IPv6 from a VM (no v6 addresses)", "vm1", Ether(src=VM1_MAC, dst=VM2_MAC) / IPv6() / UDP(), [], "ipv6_unsupported", "blue"),
    ("IPv6 with another VM's MAC", "vm1", Ether(src=VM2_MAC, dst=VM2_MAC) / IPv6() / UDP(), [], "spoofed", "blue"),
    ("IPv6 from red's VM with blue's MAC", "vm3", Ether(src=VM1_MAC, dst=BROADCAST) / IPv6() / UDP(), [], "spoofed", "red"),
    ("runt frame", "vm1", bytes(udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP))[:13], [], "spoofed", "blue"),
    # destinations that belong to the other tenant
    ("red to blue's remote MAC", "vm3", udp(VM3_MAC, BLUE_REMOTE_MAC, VM3_IP, BLUE_REMOTE_IP), [], "isolation", "red"),
    ("red to blue's local MAC (same IP as its own)", "vm3", udp(VM3_MAC, VM1_MAC, VM3_IP, VM1_IP), [], "isolation", "red"),
    ("blue to red's local MAC", "vm2", udp(VM2_MAC, VM3_MAC, VM2_IP, VM3_IP), [], "isolation", "blue"),
    ("blue's VNI carrying a frame for red's vm3", "p0", vxlan(udp(BLUE_REMOTE_MAC, VM3_MAC, BLUE_REMOTE_IP, VM3_IP), BLUE_VNI, VTEP_BLUE), [], "isolation", "blue"),
    ("routing into blue's subnet 10.0.1.0/24 from red", "vm3", udp(VM3_MAC, GW_MAC, VM3_IP, VM2_IP), [], "unroutable", "red"),
    ("fabric frame to the (shared) gateway MAC", "p0", vxlan(udp(RED_REMOTE_MAC, GW_MAC, RED_REMOTE_IP, VM3_IP), RED_VNI, VTEP_RED), [], "unroutable", "red"),
    # forged VXLAN
    ("red's VNI from blue's VTEP", "p0", vxlan(R_IN, RED_VNI, VTEP_BLUE), [], "unknown_vtep", None),
    ("blue's VNI from red's VTEP", "p0", vxlan(B_IN, BLUE_VNI, VTEP_RED), [], "unknown_vtep", None),
    ("blue's VNI from an unknown VTEP", "p0", vxlan(B_IN, BLUE_VNI, "192.0.2.99"), [], "unknown_vtep", None),
    ("blue's VNI from our own VTEP address", "p0", vxlan(B_IN, BLUE_VNI, VTEP_LOCAL), [], "unknown_vtep", None),
    ("unknown VNI from blue's VTEP", "p0", vxlan(B_IN, 300, VTEP_BLUE), [], "unknown_vni", None),
    ("VNI 0", "p0", vxlan(B_IN, 0, VTEP_BLUE), [], "unknown_vni", None),
    ("VNI 100 + 0x10000 (same low bytes as blue's)", "p0", vxlan(B_IN, BLUE_VNI | 0x10000, VTEP_BLUE), [], "unknown_vni", None),
    ("inner 802.1Q tag", "p0", vxlan(Ether(src=RED_REMOTE_MAC, dst=VM3_MAC) / Dot1Q(vlan=5) / IP(src=RED_REMOTE_IP, dst=VM3_IP) / UDP(), RED_VNI, VTEP_RED), [], "inner_vlan", "red"),
    ("inner 802.1ad tag", "p0", vxlan(Ether(src=RED_REMOTE_MAC, dst=VM3_MAC, type=0x88A8) / Dot1Q(vlan=5) / IP(src=RED_REMOTE_IP, dst=VM3_IP) / UDP(), RED_VNI, VTEP_RED), [], "inner_vlan", "red"),
    ("VXLAN header cut short", "p0", _cut_vxlan(14 + 20 + 8 + 4), [], "vxlan_truncated", None),
    ("no room for the inner Ethernet header", "p0", _cut_vxlan(14 + 20 + 8 + 8 + 13), [], "vxlan_truncated", None),
    ("UDP length beyond the frame", "p0", _cut_vxlan(60), [], "vxlan_truncated", None),
    ("I flag clear", "p0", vxlan(R_IN, RED_VNI, VTEP_RED, flags=0x00), [], "vxlan_bad_flags", None),
    ("only reserved flags set", "p0", vxlan(R_IN, RED_VNI, VTEP_RED, flags=0x80), [], "vxlan_bad_flags", None),
    ("wrong non-zero UDP checksum", "p0", bytes(vxlan(R_IN, RED_VNI, VTEP_RED, udp_chksum=0x1234)), [], "vxlan_bad_checksum", None),
    # not for us at all
    ("VXLAN to another VTEP address", "p0", vxlan(R_IN, RED_VNI, VTEP_RED, dst_vtep="192.0.2.50"), [], "underlay", None),
    ("VXLAN as an IP fragment", "p0", _frag(vxlan(R_IN, RED_VNI, VTEP_RED)), [], "underlay", None),
    ("VXLAN on another UDP port", "p0", Ether(bytes(vxlan(R_IN, RED_VNI, VTEP_RED)).replace(b"\x12\xb5", b"\x12\xb6", 1)), [], "underlay", None),
    ("plain IP from the fabric to a VM", "p0", udp(NEXTHOP_MAC, VM3_MAC, RED_REMOTE_IP, VM3_IP), [], "underlay", None),
    ("ARP from the fabric for a tenant's gateway", "p0", arp_request(NEXTHOP_MAC, VTEP_RED, BLUE_GW1), [], "underlay", None),
    ("garbage on the uplink", "p0", b"\xde\xad" * 7, [], "underlay", None),
    # nested VXLAN is decapsulated once, never twice
    ("VXLAN in VXLAN, middle frame to red's vm3", "p0", _nested(RED_VNI, VM3_MAC), [], "isolation", "blue"),
    ("VXLAN in VXLAN, middle frame to our uplink MAC", "p0", _nested(RED_VNI, UPLINK_MAC), [("vm1", None), ("vm2", None)], None, "blue"),
    # broadcast, multicast and ARP stay in the tenant
    ("broadcast from red", "vm3", udp(VM3_MAC, BROADCAST, VM3_IP, "10.0.0.255"), [("p0", RED_VNI)], None, "red"),
    ("multicast from blue", "vm1", udp(VM1_MAC, "01:00:5e:00:00:fb", VM1_IP, "224.0.0.251"), [("vm2", None), ("p0", BLUE_VNI)], None, "blue"),
    ("red asks for blue's second gateway: flooded in red, not answered", "vm3", arp_request(VM3_MAC, VM3_IP, BLUE_GW2), [("p0", RED_VNI)], None, "red"),
    ("red asks for blue's vm2", "vm3", arp_request(VM3_MAC, VM3_IP, VM2_IP), [("p0", RED_VNI)], None, "red"),
    ("ARP for our VTEP inside red's VNI: flooded to red", "p0", vxlan(arp_request(RED_REMOTE_MAC, RED_REMOTE_IP, VTEP_LOCAL), RED_VNI, VTEP_RED), [("vm3", None)], None, "red"),
    ("broadcast from blue's fabric", "p0", vxlan(udp(BLUE_REMOTE_MAC, BROADCAST, BLUE_REMOTE_IP, "10.0.0.255"), BLUE_VNI, VTEP_BLUE), [("vm1", None), ("vm2", None)], None, "blue"),
]


@pytest.mark.parametrize("desc,port,pkt,outs,reason,tenant", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack(desc, port, pkt, outs, reason, tenant):
    dp = Dataplane.from_topology(TOPO)
    got = dp.process(bytes(pkt), in_port=port)
    seen = []
    for o in got:
        if o.port == "p0":
            dst, vni, inner = parse_vxlan_out(EXAMPLE, o.data)
            assert dst in EXAMPLE.per[tenant].vteps and inner == bytes(pkt)
            seen.append(("p0", vni))
        else:
            assert EXAMPLE.port_tenant[o.port] == tenant
            seen.append((o.port, None))
    assert sorted(seen) == sorted(outs), [(o.port, Ether(o.data).summary()) for o in got]
    st_ = dp.stats()
    assert st_["ports"][port]["drops"] == ({reason: 1} if reason else {})
    for name, t in st_["tenants"].items():
        charged = name == tenant
        assert (t["rx_packets"], t["dropped"], t["drops"]) == (
            (1, 1 if reason else 0, {reason: 1} if reason else {}) if charged else (0, 0, {})), name
        assert t["tx_packets"] == (len(outs) if charged else 0)
    # the model agrees
    run_and_check(Dataplane.from_topology(TOPO), EXAMPLE, [(port, bytes(pkt))])


def test_arp_for_our_vtep_is_answered_on_the_uplink_only():
    dp = Dataplane.from_topology(TOPO)
    req = arp_request(NEXTHOP_MAC, "192.0.2.254", VTEP_LOCAL)
    [o] = dp.process(req, in_port="p0")
    a = Ether(o.data)
    assert o.port == "p0" and (a.src, a.dst) == (UPLINK_MAC, NEXTHOP_MAC)
    assert (a[ARP].op, a[ARP].hwsrc, a[ARP].psrc, a[ARP].hwdst, a[ARP].pdst) == (2, UPLINK_MAC, VTEP_LOCAL, NEXTHOP_MAC, "192.0.2.254")
    assert all(t["rx_packets"] == 0 for t in dp.stats()["tenants"].values()), "no tenant's traffic"
    # a VM asking for the VTEP address learns nothing about the underlay
    outs = dp.process(arp_request(VM3_MAC, VM3_IP, VTEP_LOCAL), in_port="vm3")
    assert [o.port for o in outs] == ["p0"] and Ether(outs[0].data)[VXLAN].vni == RED_VNI


def test_large_batches_keep_every_output_with_its_input():
    """More inputs than one native batch (256): outputs stay tied to their inputs."""
    m = EXAMPLE
    s = seeds(m)
    inputs = (s * (700 // len(s) + 1))[:700]
    run_and_check(Dataplane.from_topology(TOPO), m, inputs)


# ---- per-tenant counters: only the tenant a packet belongs to ----------------------------------------

def test_tenant_counters_stay_with_their_tenant_across_a_reload():
    """Counters belong to the tenant (by name), not to its position in the file."""
    t = yaml.safe_load(open(TOPO))
    dp = Dataplane.from_topology(t)
    dp.process([udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP)] * 5, in_port="vm1")
    dp.load_topology({"uplink": t["uplink"], "tenants": {"red": t["tenants"]["red"], "blue": t["tenants"]["blue"]}})
    s = dp.stats()["tenants"]
    assert s["red"]["rx_packets"] == 0 and s["red"]["tx_packets"] == 0, "red never sent or received anything"
    assert s["blue"]["rx_packets"] == 5


def test_forged_vxlan_is_not_charged_to_the_tenant_it_impersonates():
    """VXLAN from a VTEP not named for the VNI is unauthenticated: it shows on the
    uplink's drops (unknown_vtep), never in the impersonated tenant's counters."""
    dp = Dataplane.from_topology(TOPO)
    dp.process([vxlan(R_IN, RED_VNI, VTEP_BLUE), vxlan(R_IN, RED_VNI, "192.0.2.99")], in_port="p0")
    s = dp.stats()["tenants"]
    assert s["red"]["rx_packets"] == 0 and s["red"]["dropped"] == 0
    assert s["blue"]["rx_packets"] == 0


def _v6_example():
    t = yaml.safe_load(open(TOPO))
    t["uplink"]["ip"] = "2001:db8::1"
    for name, v in (("blue", "2001:db8::2"), ("red", "2001:db8::3")):
        t["tenants"][name]["remote"][0]["vtep"] = v
        t["tenants"][name]["flood"] = [v]
    return t


@pytest.mark.parametrize("topo", [TOPO, _v6_example()], ids=["ipv4-underlay", "ipv6-underlay"])
def test_truncation_at_every_byte(topo):
    """Every legitimate frame kind, cut after every byte: each layer's header is cut short
    somewhere in here, and every cut must be refused (or, where the bytes left are still a
    valid frame, handled) exactly as the model says; nothing leaks, nothing crashes."""
    m = Model(topo)
    inputs = []
    for port, f in seeds(m):
        inputs += [(port, f[:n]) for n in range(len(f) + 1)]
    for i in range(0, len(inputs), 1000):
        run_and_check(Dataplane.from_topology(topo), m, inputs[i:i + 1000])
