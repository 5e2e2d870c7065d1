// runner.h: the three ways packets enter a dataplane from the API: in-memory
// buffers (process), capture files (replay), and the benchmark loop.
//
// Each is a receive queue (ports/mem_rx.h, ports/pcap_rx.h) drained burst by
// burst through Worker::receive under the worker's mutex (so table commits
// interleave between bursts), the same step a live worker takes (live.h),
// with outputs to a PortSink. A burst holds packets of one input port, as a
// NIC queue's does, so a packet sees all the conntrack state that packets
// before it created. All of them are called from the bindings with the GIL
// released.
#pragma once

#include "drop_writer.h"

#include <memory>
#include <string>
#include <vector>

#include "dataplane.h"
#include "dpu/pcap.h"
#include "ports/pcap_rx.h"

namespace dpu {

// ---- what the ways in decide, once (Python asks these) ----------------------------
// Every input port number names a port of the dataplane, else UNKNOWN_PORT
// "unknown input port N" ("packet i: unknown input port N" with
// `per_packet`): process_buffers, the benchmark, trace and the replayer
// check their inputs here; Python hands numbers over and leaves it to them.
Status check_input_ports(Dataplane* dp, const uint32_t* ports, size_t n, bool per_packet);

// The files a replay writes: one per port that is not a tunnel,
// <out_dir>/<port name>.pcap.
struct ReplayOutput {
  uint32_t ofport;
  std::string port, path;
};
std::vector<ReplayOutput> replay_outputs(Dataplane* dp, const std::string& out_dir);

// The first output that is the same file as an input (device and inode: a
// link or another spelling of an input is that input), as {output index,
// input index}, or {-1, -1}. A path that names no file (yet) is no input.
// The replayer refuses such outputs; so do the CLI and `dpu run` (for the
// drops file), which format their own messages.
std::pair<int, int> find_overwrite(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs);

// ---- in-memory -------------------------------------------------------------------
struct MemPacket {
  uint32_t port;
  uint32_t index;     // input index it came from
  uint32_t seq;       // emission order within the call
  uint64_t ts_ns;
  uint32_t offset, len;  // into MemOutput::data
};
struct MemOutput {
  std::vector<uint8_t> data;
  std::vector<MemPacket> pkts;
};

// Packets are data[offsets[i] .. offsets[i]+lens[i]) arriving on ports[i].
Status process_buffers(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                       const uint32_t* ports, const uint64_t* ts, size_t n, MemOutput* out, size_t worker = 0);

// ---- benchmark -------------------------------------------------------------------
struct BenchStats {
  uint64_t packets = 0;
  double seconds = 0;
};
// What every output of a churn-hit benchmark must carry (dpu/bench.py,
// churn-hit-1k): route r's two rules stamp it, in one transaction per
// change, with the version that changes it: dl_dst and dl_src are
// 02:00:RR:RR:SS:SS (route, stamp). Change k (from 0) made version
// base + 1 + k and restamped route k % routes. A packet of a batch that ran at
// version V must carry, in both addresses, the stamp route r had at V: one
// version, never a mix, and never older than the batch.
struct BenchCheck {
  bool on = false;
  uint64_t base = 0;    // the version every route's stamp was from before the changes
  uint32_t routes = 0;
  uint64_t checked = 0, wrong = 0;  // results
};
// Cycles through the n template packets until `total` packets were processed,
// `burst` at a time (1..kBatchMax), copying each into a pool buffer (as a NIC
// would DMA it) and discarding the outputs after counting them (and checking
// them, with `check`).
BenchStats bench_run(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                     const uint32_t* ports, size_t n, uint64_t total, uint32_t burst = kDefaultBurst,
                     BenchCheck* check = nullptr);

// ---- replay ----------------------------------------------------------------------
// With a drops file, every arrival that produced no output is written to it
// (pcapng: one interface per input port, named after it; each packet's
// comment says "drop_reason=R in_port=P"), as it arrived, in arrival order
// (an oversize frame, which no buffer held, as its length alone after the
// rest of its burst).
struct ReplayInput {
  uint32_t port;
  std::string path;
};

class Replayer {
 public:
  Replayer(Dataplane* dp, std::vector<ReplayInput> inputs, std::string out_dir, std::string drops_pcap = "");
  ~Replayer();
  Status open();
  // Processes up to max_packets more arrivals (0: no limit). Returns false when
  // every input is exhausted or an input failed (then *st says why; everything
  // read before the failure was processed and written).
  bool run(uint64_t max_packets, Status* st);
  Status close();  // flushes and closes the output files
  uint64_t packets() const;
  uint64_t drops_written() const;  // records in the drops file
  uint64_t bytes_done() const;
  uint64_t bytes_total() const;
  std::vector<std::pair<std::string, std::string>> outputs() const;  // port name, file

 private:
  class Writers;
  Status check_drops(const std::vector<std::string>& in_paths, const std::vector<ReplayOutput>& outs) const;

  Dataplane* dp_;
  std::vector<ReplayInput> spec_;
  std::string out_dir_;
  std::unique_ptr<PcapRx> rx_;
  std::unique_ptr<Writers> writers_;
  std::string drops_path_;
  std::unique_ptr<PcapngDropWriter> drops_;
  bool done_ = false;
};

}  // namespace dpu
