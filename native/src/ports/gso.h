// gso.h: receive offloads, in one place (docs/live.md, "Offloads"), for
// every backend (ports/backend.h): GRO on our side turned off, and what a
// local sender left undone finished.
//
// Our side: GRO, the receive offload that merges frames before a packet
// socket or XDP's generic mode sees them, is turned off on every attached
// interface for as long as dpu runs (GroOff; LiveWorkers turns it back on
// at stop), so the dataplane sees frames as they were on the wire (LRO is off
// on veth and forwarding hosts already).
//
// Their side: a sender on the far side of a veth or tap (a VM namespace, a
// container, a Linux VXLAN VTEP) hands its frames over before "hardware"
// would have cut them into segments or filled in their checksums. With
// PACKET_VNET_HDR the kernel says so per frame, in a virtio_net_hdr: a GSO
// type and segment size for a super-frame, and where a checksum left partial
// starts (frame_offload reads it; without the header, TP_STATUS_CSUMNOTREADY
// only says that some checksum is partial). What Linux 6.18 gives a packet
// socket (measured, docs/live.md):
//  - a VXLAN super-frame (outer IPv4/IPv6 + UDP + VXLAN + Ethernet + IP +
//    TCP) carries the INNER GSO type (TCPV4 or TCPV6: there is no tunnel bit
//    in the 10- or 12-byte header a packet socket can have), csum_start at
//    the inner TCP header, hdr_len up to its end. The outer UDP checksum field
//    is 0 when the tunnel has none (noudpcsum) and otherwise holds the
//    pseudo-header sum the segmentation is to finish: that field is the
//    only sign of tx-udp_tnl-csum-segmentation;
//  - a frame that is not a super-frame may have one checksum partial (inner
//    TCP, outer UDP when the inner frame has no L4 checksum); with local
//    checksum offload the outer UDP checksum was computed assuming the inner
//    one done, so finishing that one makes both right.
//
// GsoCutter cuts a super-frame the way the kernel's GSO would have: plain TCP
// or UDP (UDP_SEGMENT), or either inside a UDP tunnel with an 8-byte header
// and an Ethernet frame inside (VXLAN). Each segment gets its own outer IP
// length, id and checksum, outer UDP length and checksum (zero stays zero),
// inner IP length and id, TCP sequence number and flags (FIN and PSH on the
// last segment, CWR on the first) or UDP length, and an L4 checksum. A super-
// frame it cannot follow (another tunnel, another GSO type, headers it does
// not know) is refused with an OffloadKind: the caller drops it
// (offload_unsupported) and the live loop names the ethtool feature to turn
// off on the sender (offload_fix). Segments are handed out as room allows,
// so a 64 KB frame at a small MSS (hundreds of segments) spans bursts.
//
// Called by AfPacketQueue on its cold path (a frame marked as a super-frame,
// or longer than the MTU without a vnet header) and by the selftest binding.
// AF_XDP sees frames before the kernel could say any of this: a sender behind
// a veth needs its offloads off (docs/live.md). The cutter is pure apart from
// the PacketPool it is given, one per queue (thread); GroOff takes a lock of
// its own and may be called from any thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "dpu/batch.h"

namespace dpu {

// linux/virtio_net.h's struct virtio_net_hdr (that header is not C++-clean):
// what PACKET_VNET_HDR puts before each frame, in host byte order.
struct VnetHdr {
  uint8_t flags;
  uint8_t gso_type;
  uint16_t hdr_len, gso_size, csum_start, csum_offset;
};
static_assert(sizeof(VnetHdr) == 10, "virtio_net_hdr is 10 bytes");
constexpr uint8_t kVnetNeedsCsum = 1;
constexpr uint8_t kGsoNone = 0, kGsoTcpV4 = 1, kGsoUdp = 3, kGsoTcpV6 = 4, kGsoUdpL4 = 5, kGsoEcn = 0x80;

// What the kernel said about one frame: a GSO type (ECN bit off; 0: none), the
// segment size, and a partial checksum (csum_start -1: none, -2: at the L4
// header, for TP_STATUS_CSUMNOTREADY without a vnet header).
struct FrameOffload {
  uint8_t gso_type = kGsoNone;
  uint16_t gso_size = 0;
  int csum_start = -1;
  int csum_offset = 0;
};
// tag: bytes put before the frame's L3 header since (a VLAN tag put back).
inline FrameOffload decode_vnet(const VnetHdr& vh, uint32_t tag) {
  FrameOffload o;
  o.gso_type = vh.gso_type & static_cast<uint8_t>(~kGsoEcn);
  o.gso_size = vh.gso_size;
  if (vh.flags & kVnetNeedsCsum) {
    o.csum_start = vh.csum_start + static_cast<int>(tag);
    o.csum_offset = vh.csum_offset;
  }
  return o;
}
// What the kernel said about a received frame: its virtio_net_hdr, just
// before `frame`, when the socket has PACKET_VNET_HDR (`vnet`); else only
// whether some checksum is partial (TP_STATUS_CSUMNOTREADY: at the L4 header).
inline FrameOffload frame_offload(const uint8_t* frame, bool vnet, bool csum_not_ready, uint32_t tag) {
  FrameOffload o;
  if (vnet) {
    VnetHdr vh;
    std::memcpy(&vh, frame - sizeof vh, sizeof vh);
    o = decode_vnet(vh, tag);
  } else if (csum_not_ready) {
    o.csum_start = -2;  // somewhere: at the L4 header
  }
  return o;
}

// Why a super-frame was refused: one bit each, OR'd into the queue's counters.
enum OffloadKind : uint32_t {
  kOffloadGsoType = 1u << 0,    // a GSO type other than TCP and UDP_SEGMENT (UFO)
  kOffloadUdpTunnel = 1u << 1,  // a UDP tunnel that is not VXLAN-like (VXLAN-GPE, Geneve options)
  kOffloadGre = 1u << 2,        // GRE
  kOffloadIpip = 1u << 3,       // IPv4/IPv6 in IPv4/IPv6
  kOffloadHeaders = 1u << 4,    // headers it cannot follow: extension headers, lengths that disagree, too big a segment
};
constexpr uint32_t kOffloadKinds = 5;
// For the log line: the kind's name (selftest), what the frames are, and the
// ethtool features to turn off on the device that sends them.
struct OffloadFix {
  const char* name;
  const char* what;
  const char* features;
};
OffloadFix offload_fix(uint32_t kind);

// Finishes the checksum at csum_start + csum_offset (the field holds the
// pseudo-header sum, as the kernel leaves it), or with csum_start -2 the L4
// checksum wherever the headers put it. Out of range: left alone.
void finish_partial(uint8_t* d, uint32_t len, int csum_start, int csum_offset);

// GRO off on the interfaces dpu receives on, and back on when it lets them go.
class GroOff {
 public:
  // Off on ifname (best effort: not every device has it); remembered, once,
  // when it was on.
  void turn_off(const std::string& ifname);
  // Back on wherever turn_off turned it off; forgotten.
  void restore();

 private:
  std::mutex mu_;  // the control thread and workers reattaching
  std::vector<std::string> ifnames_;
};

class GsoCutter {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;  // start(): not a super-frame
  // A frame of n bytes (from f, which must stay valid until the last segment
  // is out) with what the kernel said about it; mtu: the interface's, for a
  // frame without a GSO size. Returns 0 when there are segments to take,
  // kNone when there is nothing to cut (take the frame as it came), or the
  // OffloadKind that refuses it.
  uint32_t start(const uint8_t* f, uint32_t n, const FrameOffload& o, uint32_t mtu);
  // Up to room segments from pool into pkts (data and len only); fewer when
  // the pool runs dry. busy() until the last one is out.
  uint32_t take(PacketPool& pool, Packet** pkts, uint32_t room);
  bool busy() const { return next_ < count_; }

 private:
  uint32_t write(uint32_t i, uint8_t* d) const;

  const uint8_t* f_ = nullptr;
  uint32_t next_ = 0, count_ = 0;
  uint32_t oip_ = 0, oudp_ = 0;  // outer IP and UDP header offsets (0: not a tunnel)
  uint32_t ip_ = 0, l4_ = 0;     // the IP header segmented and its TCP/UDP header
  uint32_t hl_ = 0;              // all headers: the payload starts here
  uint32_t payload_ = 0, mss_ = 0;
  uint32_t seq0_ = 0;
  uint16_t oid0_ = 0, id0_ = 0;
  uint8_t proto_ = 0;
  bool o4_ = false, v4_ = false, ocsum_ = false;
};

}  // namespace dpu
