// afpacket.h: a Linux interface through AF_PACKET (one socket per port and
// worker), the live mode's default I/O (`dpu run --io afpacket`).
//
// Receive: a TPACKET_V3 ring of `block_nr` blocks of `block_size` bytes,
// memory-mapped; the kernel hands a block over when it is full or after
// `retire_ms`, and the worker copies each frame into a pool buffer (frames
// of up to Packet::max_capacity() bytes: jumbo frames included). A VLAN tag the kernel
// took off is put back; a checksum the sender left to offload (veth) is
// finished, so the dataplane always sees wire bytes. The sockets of one
// interface form a PACKET_FANOUT group (hash of the flow), so N workers
// share its traffic; PACKET_IGNORE_OUTGOING keeps a worker from reading what
// any worker sent.
// Transmit: sendmmsg with PACKET_QDISC_BYPASS (straight to the driver, as a
// DPDK port would), on a second socket of the interface that receives
// nothing and has no PACKET_VNET_HDR (one iovec a frame, no header for the
// kernel to copy in and parse). (A mapped TX ring was slower on veth: the
// kernel builds each frame from pages of the ring, and freeing them costs
// more than the copy it saves.)
// The interface is put in promiscuous mode (a membership, dropped with the
// socket); GRO is off while dpu runs (gso.h, GroOff). Opened through
// afpacket_backend() (backend.h: queue count, reattach policy).
//
// Offloads a local sender left undone: with PACKET_VNET_HDR the kernel says,
// per frame, where a checksum is still to be filled in and whether the frame
// is a super-frame (a local stack, or a Linux VXLAN VTEP, handing a veth or
// tap 64 KB with segmentation offload on) and its segment size. Checksums are
// finished and super-frames are cut into segments (gso.h: plain TCP and UDP,
// and both inside VXLAN) as the kernel's GSO would have, so the dataplane and
// the next hop see what a wire would carry. That is the cold branch of
// rx_burst; a frame that needs none of it pays one test. A super-frame gso.h
// cannot cut is refused (drop offload_unsupported, counters.offload_kinds).
// Without PACKET_VNET_HDR (older kernels) a TCP frame longer than the MTU is
// cut at the MTU and checksums marked not-ready are finished at the L4 header.
//
// An interface that goes down keeps its socket: transmit fails and counts
// (tx_refused), receive simply has nothing; when it comes back up, traffic
// flows again. Thread-safety: one socket, one worker thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "dpu/status.h"
#include "gso.h"
#include "port_io.h"

struct tpacket3_hdr;  // linux/if_packet.h

namespace dpu {

struct AfPacketConfig {
  std::string ifname;
  uint32_t ofport = 0;
  int fanout_id = -1;         // join this PACKET_FANOUT group (-1: alone)
  uint32_t block_size = 1u << 18;
  uint32_t block_nr = 16;
  uint32_t frame_size = 2048; // ring slot (a frame may span several in V3)
  uint32_t retire_ms = 1;     // hand over a partly filled block after this long
};

class AfPacketQueue : public PortQueue {
 public:
  AfPacketQueue() = default;
  ~AfPacketQueue() override;
  AfPacketQueue(const AfPacketQueue&) = delete;
  AfPacketQueue& operator=(const AfPacketQueue&) = delete;

  Status open(const AfPacketConfig& cfg);
  uint32_t rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) override;
  uint32_t tx_burst(Packet* const* pkts, uint32_t n) override;
  int fd() const override { return fd_; }
  bool bound() const override;
  void refresh_counters() override;  // PACKET_STATISTICS: frames the kernel dropped (ring full)
  void clear_error() override;       // SO_ERROR: ENETDOWN after the interface went down

 private:
  bool next_block();
  void release_block();
  // Length, port, time; finishes a checksum left to offload.
  void fill(Packet* p, uint32_t len, uint64_t ts, const FrameOffload& off);
  // The cold branch: a frame the kernel marked as a super-frame, or (no vnet
  // header) one longer than the MTU, cut into pkts[*got..cap), refused, or
  // taken as it came. False when pool or room ran out first: the frame stays
  // in the ring, and the next burst goes on where this one stopped.
  bool rx_super(const tpacket3_hdr* h, const uint8_t* frame, uint32_t need, const FrameOffload& off, uint64_t ts,
                PacketPool& pool, Packet** pkts, uint32_t cap, uint32_t* got);

  int fd_ = -1;
  int tx_fd_ = -1;             // the transmit socket; -1: fd_ transmits
  int ifindex_ = 0;
  uint32_t ofport_ = 0;
  uint32_t mtu_ = 1500;        // IP bytes a frame of this interface carries
  bool vnet_ = false;          // frames carry a virtio_net_hdr (PACKET_VNET_HDR)
  std::vector<uint8_t> scratch_;  // a super-frame with its VLAN tag put back
  GsoCutter cutter_;           // the super-frame being cut (busy() across bursts)
  uint8_t* ring_ = nullptr;
  size_t ring_bytes_ = 0;
  uint32_t block_size_ = 0, block_nr_ = 0;
  uint32_t cur_ = 0;           // block being read
  uint8_t* pkt_ = nullptr;     // next frame header in it, or nullptr
  uint32_t left_ = 0;          // frames left in it
};

}  // namespace dpu
