// afxdp.h: a Linux interface through AF_XDP (`dpu run --io afxdp`).
//
// Per interface, shared by its queues: a small XDP program that redirects
// every frame to the XSK bound to the receive queue it arrived on (frames
// of a queue nobody bound go on to the kernel), its XSKMAP, and the link
// that attaches it: native (driver) mode, or generic (SKB) mode when the
// driver refuses (the reason is printed once as a `dpu: note:` line). The
// program is attached through a BPF link, so it goes away with the process
// however the process ends; the interface is put in promiscuous mode by a
// packet-socket membership, which goes the same way.
//
// Per (port, worker): one UMEM (4 KiB chunks) and one XSK bound to the
// receive queue numbered like the worker, so N workers need N queues (the
// LiveWorkers' preflight says so before anything starts; an interface with
// more queues than workers hands what lands on the others to the kernel).
// The kernel picks zero-copy where the driver can, copy mode elsewhere
// (veth: copy). Receive copies each frame out of the UMEM into a pool
// packet and gives the chunk straight back to the fill ring; transmit
// copies into free TX chunks, kicks the kernel with sendto, and takes
// chunks back from the completion ring. Frames longer than a chunk (jumbo
// frames) travel as several descriptors (multi-buffer, XDP_USE_SG, Linux
// 6.6+); where that is not available, longer frames are dropped by the
// kernel on receive (counted as rx_ring_drops) and refused on transmit.
//
// What the kernel counted (XDP_STATISTICS) is fetched by refresh_counters:
// frames dropped for want of a fill chunk or room in the RX ring are
// rx_ring_drops; descriptors it rejected on transmit are tx_refused.
//
// A local sender on the other end of a veth leaves TCP/UDP checksums to
// offload, and XDP sees the frame before anything finishes them: give such
// peers `ethtool -K <peer> tx off` (as for any AF_XDP dataplane on veth).
// Frames from a NIC carry finished checksums.
//
// Built when the headers of libxdp and libbpf are found (DPU_HAVE_AFXDP);
// without them opening a queue says how to get them. The libraries
// themselves are not linked: the first queue opens them (afxdp_lib.h), so
// the core imports on a host without them and `--io afxdp` there says what
// to install. Thread-safety: a queue belongs to
// one worker; queues may be opened and closed from several threads at once
// (workers reattaching a re-created interface): the per-interface part, the
// program's attachment, is shared under a lock.
#pragma once

#include "backend.h"

// Opened through afxdp_backend() (backend.h); the queue class is private to
// afxdp.cc.
