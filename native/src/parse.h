// parse.h: stage 1 of the fast path: frame -> datapath flow key.
//
// Uses:  Packet::data/len and the metadata (in_port, recirc_id, tunnel, ct_*
//        and, for a tracked packet, Packet::ct).
// Sets:  the datapath part of a Flow (every other word is zero), and
//        Packet::l3_ofs / l4_ofs (kNoOffset when that header is absent; see below).
// Next:  the exact-match cache (worker.cc).
//
// The rules are Open vSwitch 3.1's (lib/flow.c, miniflow_extract), checked
// against ovs-vswitchd itself by tests/test_ovs_compat.py. Parsing never fails:
//
//  * Ethernet II; an 802.3 length frame is dl_type 0x05ff unless it carries an
//    LLC/SNAP header with OUI 0 and an Ethertype, which is then dl_type (and the
//    L3 header follows it). One 802.1Q/802.1ad tag (OVS's default vlan-limit),
//    parsed when the frame has its 4 bytes and the next type; a cut tag leaves
//    the TPID as dl_type.
//  * IPv4 needs 20 bytes, IHL >= 5, the options present, and a total length
//    that covers the header and fits in the frame; otherwise every L3/L4 field
//    is 0 (the version nibble is not checked). Bytes past the total length are
//    padding. A later fragment has no L4 fields.
//  * IPv6 needs 40 bytes and a payload length that fits in the frame, else all
//    L3/L4 fields are 0. Hop-by-hop, routing, destination-options, AH and
//    fragment headers are skipped, each needing 8 bytes present and its whole
//    length; one cut short leaves the addresses but zeroes nw_proto, nw_tos,
//    nw_ttl, nw_frag and L4. A fragment header with offset and M both 0 is not a
//    fragment; a later fragment has nw_proto 44 (the fragment header) and no L4.
//  * ARP and RARP over Ethernet/IPv4 (28 bytes); an opcode above 255 reads 0.
//  * L4 inside the IP datagram: TCP needs 20 bytes and a data offset >= 5 that
//    fits, UDP 8, SCTP 12, ICMP 4 and ICMPv6 8 (type and code in tp_src/tp_dst,
//    whatever the IP version, as OVS); a header that does not fit reads 0.
//
// l3_ofs is set when the packet has an L3 header that set actions may write:
// ARP, or a valid IPv4/IPv6 header whose nw_proto is not 0 (OVS writes no L3
// field of a packet whose nw_proto is 0: a malformed header, IPv4 protocol 0;
// for ARP the opcode in the flow decides when the write is emitted). l4_ofs is
// set with it for IP, except for later fragments, whether or not the L4 header
// itself is complete (execute.h checks the lengths it needs).
//
// Returns kParse* flags for the per-port counters. Header-only so the worker
// loop inlines it; pure apart from the packet offsets; any thread.
#pragma once

#include <algorithm>

#include "checksum.h"
#include "dpu/batch.h"
#include "dpu/flow_key.h"
#include "dpu/mem.h"

namespace dpu {

enum : uint8_t { kParseTruncated = 1, kParseMalformed = 2, kParseUnknown = 4 };

constexpr uint16_t kEthRarp = 0x8035;

namespace parse_detail {

// The L4 fields of an IP packet whose L4 header starts at `l4`, `avail` bytes
// of it inside the datagram. (always_inline, as parse_ipv4: see PacketPool::take.)
__attribute__((always_inline)) inline uint8_t parse_l4(Flow* key, const uint8_t* l4, int32_t avail) {
  switch (key->nw_proto) {
    case kIpTcp: {
      if (avail < 20) return kParseTruncated;
      const int32_t doff = (l4[12] >> 4) * 4;
      if (doff < 20) return kParseMalformed;
      if (avail < doff) return kParseTruncated;
      std::memcpy(&key->tp_src, l4, 4);
      key->tcp_flags = static_cast<uint16_t>(load16(l4 + 12) & be16(0x0fff));
      return 0;
    }
    case kIpUdp:
      if (avail < 8) return kParseTruncated;
      std::memcpy(&key->tp_src, l4, 4);
      return 0;
    case kIpSctp:
      if (avail < 12) return kParseTruncated;
      std::memcpy(&key->tp_src, l4, 4);
      return 0;
    case kIpIcmp:
    case kIpIcmpv6:
      if (avail < (key->nw_proto == kIpIcmp ? 4 : 8)) return kParseTruncated;
      key->tp_src = be16(l4[0]);
      key->tp_dst = be16(l4[1]);
      return 0;
    default:
      return kParseUnknown;
  }
}

__attribute__((always_inline)) inline uint8_t parse_ipv4(Flow* key, Packet* p, const uint8_t* d, uint32_t off,
                                                         uint32_t n) {
  if (n < off + 20) return kParseTruncated;
  const uint8_t* ip = d + off;
  const uint32_t ihl = (ip[0] & 15u) * 4;
  if (ihl < 20) return kParseMalformed;
  if (n < off + ihl) return kParseTruncated;
  const uint32_t tot = be16(load16(ip + 2));
  if (tot > n - off) return kParseTruncated;
  if (tot < ihl) return kParseMalformed;
  std::memcpy(&key->nw_src, ip + 12, 8);
  key->nw_tos = ip[1];
  key->nw_ttl = ip[8];
  key->nw_proto = ip[9];
  const uint16_t frag = be16(load16(ip + 6));
  if (frag & 0x3fff) key->nw_frag = (frag & 0x1fff) ? (kFragAny | kFragLater) : kFragAny;
  if (key->nw_proto) p->l3_ofs = static_cast<uint16_t>(off);
  if (key->nw_frag & kFragLater) return 0;
  if (key->nw_proto) p->l4_ofs = static_cast<uint16_t>(off + ihl);
  return parse_l4(key, ip + ihl, static_cast<int32_t>(tot - ihl));
}

inline uint8_t parse_ipv6(Flow* key, Packet* p, const uint8_t* d, uint32_t off, uint32_t n) {
  if (n < off + 40) return kParseTruncated;
  const uint8_t* ip = d + off;
  const uint32_t plen = be16(load16(ip + 4));
  if (plen > n - off - 40) return kParseTruncated;
  std::memcpy(key->ipv6_src, ip + 8, 32);
  int32_t avail = static_cast<int32_t>(plen);
  uint32_t pos = off + 40;
  uint8_t nh = ip[6], frag = 0;
  for (;;) {
    const bool generic = nh == 0 || nh == 43 || nh == 60;
    if (!generic && nh != 51 && nh != 44) break;  // the L4 header, or one we do not know
    if (avail < 8) return kParseTruncated;
    const uint8_t* e = d + pos;
    int32_t len = 8;
    if (nh == 44) {
      const uint16_t offlg = be16(load16(e + 2));
      nh = e[0];
      if (offlg != 0) {
        frag = kFragAny;
        if (offlg & 0xfff8) {  // a later fragment: no L4 header
          key->nw_tos = static_cast<uint8_t>(((ip[0] & 15) << 4) | (ip[1] >> 4));
          key->nw_ttl = ip[7];
          key->nw_proto = 44;
          key->nw_frag = kFragAny | kFragLater;
          p->l3_ofs = static_cast<uint16_t>(off);
          return 0;
        }
      }
    } else {
      len = generic ? (e[1] + 1) * 8 : (e[1] + 2) * 4;
      nh = e[0];
      if (avail < len) return kParseTruncated;
    }
    pos += static_cast<uint32_t>(len);
    avail -= len;
  }
  key->nw_tos = static_cast<uint8_t>(((ip[0] & 15) << 4) | (ip[1] >> 4));
  key->nw_ttl = ip[7];
  key->nw_proto = nh;
  key->nw_frag = frag;
  p->l3_ofs = static_cast<uint16_t>(off);  // nh is never 0 here: 0 is hop-by-hop
  p->l4_ofs = static_cast<uint16_t>(pos);
  return parse_l4(key, d + pos, avail);
}

inline uint8_t parse_arp(Flow* key, Packet* p, const uint8_t* d, uint32_t off, uint32_t n) {
  if (n < off + 28) return kParseTruncated;
  const uint8_t* a = d + off;
  if (load16(a) != be16(1) || load16(a + 2) != be16(kEthIp) || a[4] != 6 || a[5] != 4) return kParseUnknown;
  const uint16_t op = be16(load16(a + 6));
  if (op <= 0xff) key->nw_proto = static_cast<uint8_t>(op);
  std::memcpy(key->arp_sha, a + 8, 6);
  std::memcpy(&key->nw_src, a + 14, 4);
  std::memcpy(key->arp_tha, a + 18, 6);
  std::memcpy(&key->nw_dst, a + 24, 4);
  p->l3_ofs = static_cast<uint16_t>(off);  // written only while the flow's opcode is not 0 (xlate.cc)
  return 0;
}

// An 802.3 length field at d[off - 2]: the Ethertype of an LLC/SNAP header
// with OUI 0 (and *off moved past it), else 0x05ff.
inline uint16_t snap_type(const uint8_t* d, uint32_t* off, uint32_t n) {
  const uint8_t* l = d + *off;
  if (n < *off + 8 || l[0] != 0xaa || l[1] != 0xaa || l[2] != 0x03 || l[3] || l[4] || l[5]) return be16(0x05ff);
  *off += 8;
  const uint16_t t = load16(l + 6);
  return be16(t) >= 0x600 ? t : be16(0x05ff);
}

}  // namespace parse_detail

__attribute__((always_inline)) inline uint8_t parse_packet(Packet* p, Flow* key) {
  zero_fixed<kKeyBytes>(key);
  const PacketMeta& md = p->md;
  key->in_port = md.in_port;
  key->recirc_id = md.recirc_id;
  if (md.tun_flags) {
    key->tun_id = md.tun_id;
    key->tun_flags = md.tun_flags;
    if (md.tun_flags & kTunIpv6) {
      std::memcpy(key->tun_ipv6_src, p->tun6.src, 16);
      std::memcpy(key->tun_ipv6_dst, p->tun6.dst, 16);
    } else {
      key->tun_src = md.tun_src;
      key->tun_dst = md.tun_dst;
    }
  }
  if (__builtin_expect(md.ct_state != 0, 0)) {
    key->ct_state = static_cast<uint8_t>(md.ct_state);
    key->ct_zone = md.ct_zone;
    key->ct_mark = md.ct_mark;
    const CtPacketMeta& ct = p->ct;
    std::memcpy(key->ct_label, ct.label, 16);
    key->ct_nw_proto = ct.proto;
    if (ct.proto) {
      if (ct.ipv6) {
        std::memcpy(key->ct_ipv6_src, ct.src, 16);
        std::memcpy(key->ct_ipv6_dst, ct.dst, 16);
      } else {
        std::memcpy(&key->ct_nw_src, ct.src, 4);
        std::memcpy(&key->ct_nw_dst, ct.dst, 4);
      }
      key->ct_tp_src = ct.tp_src;
      key->ct_tp_dst = ct.tp_dst;
    }
  }
  p->l3_ofs = p->l4_ofs = kNoOffset;

  const uint8_t* d = p->data();
  const uint32_t n = p->len;
  if (n < 14) return kParseTruncated;
  std::memcpy(key->dl_dst, d, 12);
  uint16_t type = load16(d + 12);
  uint32_t off = 14;
  if (type == be16(kEthVlan) || type == be16(kEthQinQ)) {
    if (n < 18) {
      key->dl_type = type;
      return kParseTruncated;
    }
    key->vlan_tpid = type;
    key->vlan_tci = static_cast<uint16_t>(load16(d + 14) | be16(kVlanPresent));
    type = load16(d + 16);
    off = 18;
  }
  if (be16(type) < 0x600) type = parse_detail::snap_type(d, &off, n);
  key->dl_type = type;
  if (type == be16(kEthIp)) return parse_detail::parse_ipv4(key, p, d, off, n);
  if (type == be16(kEthIpv6)) return parse_detail::parse_ipv6(key, p, d, off, n);
  if (type == be16(kEthArp) || type == be16(kEthRarp)) return parse_detail::parse_arp(key, p, d, off, n);
  return kParseUnknown;
}

}  // namespace dpu
