// parse.h: stage 1 of the fast path: frame -> datapath flow key.
//
// Uses:  Packet::data/len and the metadata (in_port, recirc_id, tunnel, ct_*
//        and, for a tracked packet, Packet::ct).
// Sets:  the datapath part of a Flow (every other word is zero), and
//        Packet::l3_ofs / l4_ofs (kNoOffset when that header is absent or cut).
// Next:  the exact-match cache (worker.cc).
//
// Parsing goes as far as the bytes allow and never fails: a header that is cut
// short leaves its fields (and everything after it) zero, so a truncated TCP
// header matches no tp_dst other than 0, exactly like Open vSwitch. Layers:
// Ethernet II (802.3 length frames get dl_type 0x05ff), one 802.1Q/802.1ad tag,
// IPv4 (options skipped; payload clipped to min(total length, captured)), IPv6
// (hop-by-hop, routing, destination options, fragment and AH headers skipped),
// ARP for Ethernet/IPv4, and TCP, UDP, SCTP, ICMP, ICMPv6 ports/types.
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

namespace parse_detail {

inline uint8_t parse_l4(Flow* key, Packet* p, const uint8_t* l4, int32_t avail, uint16_t l4_ofs, bool v6) {
  switch (key->nw_proto) {
    case kIpTcp:
      if (avail < 20) return kParseTruncated;
      if ((l4[12] >> 4) < 5) return kParseMalformed;
      std::memcpy(&key->tp_src, l4, 4);
      key->tcp_flags = static_cast<uint16_t>(load16(l4 + 12) & be16(0x0fff));
      break;
    case kIpUdp:
      if (avail < 8) return kParseTruncated;
      std::memcpy(&key->tp_src, l4, 4);
      break;
    case kIpSctp:
      if (avail < 12) return kParseTruncated;
      std::memcpy(&key->tp_src, l4, 4);
      break;
    case kIpIcmp:
    case kIpIcmpv6:
      if ((key->nw_proto == kIpIcmpv6) != v6) return kParseUnknown;
      if (avail < 4) return kParseTruncated;
      key->tp_src = be16(l4[0]);
      key->tp_dst = be16(l4[1]);
      break;
    default:
      return kParseUnknown;
  }
  p->l4_ofs = l4_ofs;
  return 0;
}

inline uint8_t parse_ipv4(Flow* key, Packet* p, const uint8_t* d, uint32_t off, uint32_t n) {
  if (n < off + 20) return kParseTruncated;
  const uint8_t* ip = d + off;
  uint32_t ihl = (ip[0] & 15u) * 4;
  if ((ip[0] >> 4) != 4 || ihl < 20) return kParseMalformed;
  if (n < off + ihl) return kParseTruncated;
  uint32_t tot = be16(load16(ip + 2));
  if (tot < ihl) return kParseMalformed;
  std::memcpy(&key->nw_src, ip + 12, 8);
  key->nw_tos = ip[1];
  key->nw_ttl = ip[8];
  key->nw_proto = ip[9];
  uint16_t frag = be16(load16(ip + 6));
  if (frag & 0x3fff) key->nw_frag = (frag & 0x1fff) ? (kFragAny | kFragLater) : kFragAny;
  p->l3_ofs = static_cast<uint16_t>(off);
  uint8_t flags = tot > n - off ? kParseTruncated : 0;
  if (key->nw_frag & kFragLater) return flags;
  int32_t avail = static_cast<int32_t>(std::min(n - off, tot) - ihl);
  return flags | parse_l4(key, p, ip + ihl, avail, static_cast<uint16_t>(off + ihl), false);
}

inline bool ipv6_ext(uint8_t nh) { return nh == 0 || nh == 43 || nh == 60 || nh == 44 || nh == 51; }

inline uint8_t parse_ipv6(Flow* key, Packet* p, const uint8_t* d, uint32_t off, uint32_t n) {
  if (n < off + 40) return kParseTruncated;
  const uint8_t* ip = d + off;
  if ((ip[0] >> 4) != 6) return kParseMalformed;
  key->nw_tos = static_cast<uint8_t>(((ip[0] & 15) << 4) | (ip[1] >> 4));
  key->nw_ttl = ip[7];
  std::memcpy(key->ipv6_src, ip + 8, 32);
  p->l3_ofs = static_cast<uint16_t>(off);
  uint32_t plen = be16(load16(ip + 4));
  uint8_t flags = plen > n - off - 40 ? kParseTruncated : 0;
  int32_t avail = static_cast<int32_t>(std::min(n - off - 40, plen));
  uint32_t pos = off + 40;
  uint8_t nh = ip[6];
  for (int hops = 0; ipv6_ext(nh) && hops < 16; hops++) {
    const uint8_t* e = d + pos;
    if (nh == 44) {  // fragment header
      if (avail < 8) {
        key->nw_proto = nh;
        return flags | kParseTruncated;
      }
      uint16_t fo = be16(load16(e + 2));
      key->nw_frag = kFragAny | ((fo & 0xfff8) ? kFragLater : 0);
      nh = e[0];
      pos += 8;
      avail -= 8;
      if (key->nw_frag & kFragLater) {
        key->nw_proto = nh;
        return flags;
      }
      continue;
    }
    if (avail < 2) {
      key->nw_proto = nh;
      return flags | kParseTruncated;
    }
    int32_t len = nh == 51 ? (e[1] + 2) * 4 : (e[1] + 1) * 8;
    if (avail < len) {
      key->nw_proto = nh;
      return flags | kParseTruncated;
    }
    nh = e[0];
    pos += static_cast<uint32_t>(len);
    avail -= len;
  }
  key->nw_proto = nh;
  return flags | parse_l4(key, p, d + pos, avail, static_cast<uint16_t>(pos), true);
}

inline uint8_t parse_arp(Flow* key, Packet* p, const uint8_t* d, uint32_t off, uint32_t n) {
  if (n < off + 28) return kParseTruncated;
  const uint8_t* a = d + off;
  if (load16(a) != be16(1) || load16(a + 2) != be16(kEthIp) || a[4] != 6 || a[5] != 4) return kParseUnknown;
  uint16_t op = be16(load16(a + 6));
  if (op <= 0xff) key->nw_proto = static_cast<uint8_t>(op);
  std::memcpy(key->arp_sha, a + 8, 6);
  std::memcpy(&key->nw_src, a + 14, 4);
  std::memcpy(key->arp_tha, a + 18, 6);
  std::memcpy(&key->nw_dst, a + 24, 4);
  p->l3_ofs = static_cast<uint16_t>(off);
  return 0;
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
  if (be16(type) < 0x600) type = be16(0x05ff);
  key->dl_type = type;
  if (type == be16(kEthIp)) return parse_detail::parse_ipv4(key, p, d, off, n);
  if (type == be16(kEthIpv6)) return parse_detail::parse_ipv6(key, p, d, off, n);
  if (type == be16(kEthArp)) return parse_detail::parse_arp(key, p, d, off, n);
  return kParseUnknown;
}

}  // namespace dpu
