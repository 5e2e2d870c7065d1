// ct_packet.h: a packet as connection tracking sees it, and NAT's rewrite of
// it.
//
// ct_extract() reads the tuple (and, for TCP, the sequence numbers, flags
// and window) from the packet's bytes at its parsed offsets: the bytes as the
// actions before the ct left them, which the flow key no longer describes.
// Packets conntrack cannot follow (not IP, fragments, a cut or impossible L4
// header, an unsupported protocol or ICMP type) are refused: their state is
// +trk+inv. An ICMP or ICMPv6 error is tracked as related to the connection
// of the packet it quotes: its key is the reverse of the quoted tuple, which
// is the key of the connection in the direction the error travels.
//
// ct_nat_packet() rewrites addresses, ports and ICMP identifiers so that a
// packet of one direction leaves with the tuple the other direction's key
// expects, updating every checksum incrementally (RFC 1624): IPv4 header,
// TCP, UDP (a zero UDP checksum stays zero), ICMP; for an ICMP error also the
// quoted IP header and L4 ports and their checksums (RFC 5508).
//
// Pure on the packet; worker threads.
#pragma once

#include <cstdint>

#include "conn.h"
#include "dpu/batch.h"

namespace dpu {

enum : uint16_t { kTcpFin = 0x01, kTcpSyn = 0x02, kTcpRst = 0x04, kTcpPsh = 0x08, kTcpAck = 0x10, kTcpUrg = 0x20 };

// Fields are written by ct_extract() as the packet has them: the TCP
// fields for TCP, the inner ones for an ICMP error; nothing is cleared
// beforehand (no 100-byte memset per packet).
struct CtPacket {
  CtPacket() {}
  CtKey key;                   // the lookup key (an ICMP error: the reverse of its quote)
  uint8_t* l3;
  uint8_t* l4;
  uint32_t l4_len;             // L4 header and payload within the IP packet
  bool icmp_error = false;
  uint8_t* inner_l3;           // the quoted packet (ICMP errors)
  uint8_t* inner_l4;
  uint32_t inner_l4_len;       // quoted L4 bytes present
  // TCP
  uint16_t tcp_flags;
  uint32_t seq, ack, payload;
  uint16_t win;
  int8_t wscale;               // window scale option of a SYN, -1 if absent
};

bool ct_extract(Packet* p, uint16_t zone, CtPacket* out);

// NAT for a packet of connection `c` travelling in direction `dir` (0 orig,
// 1 reply); `cp` from ct_extract.
void ct_nat_packet(const Conn& c, int dir, CtPacket* cp);
// The same for an IPv4 packet that is not an ICMP error, from the
// translation of c's other key (ct_xlat(c.key[1 - dir])) alone.
void ct_nat_xlat(const CtXlat& o, CtPacket* cp);

}  // namespace dpu
