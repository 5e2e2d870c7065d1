// pcap.h: streaming capture-file reader and writer (one implementation, used by
// replay in the core and by the Cython generator/readers through cdef extern).
//
// PcapReader reads classic pcap (microsecond and nanosecond, either byte order)
// and pcapng (SHB/IDB/EPB/SPB/OPB; per-interface if_tsresol and if_tsoffset;
// several sections), Ethernet link type only, through a 1 MiB buffer, so files
// larger than memory stream. A corrupt or truncated file stops the reader with
// a Status naming the file and the 1-based record number; every record before
// it was returned normally.
//
// PcapWriter writes classic pcap with nanosecond timestamps, Ethernet, buffered.
//
// Thread-safety: one object per thread; no shared state.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dpu/status.h"

namespace dpu {

struct PcapRecord {
  uint64_t ts_ns = 0;
  uint32_t caplen = 0;
  uint32_t origlen = 0;
  const uint8_t* data = nullptr;  // valid until the next call to next()
};

class PcapReader {
 public:
  PcapReader() = default;
  ~PcapReader();
  PcapReader(const PcapReader&) = delete;
  PcapReader& operator=(const PcapReader&) = delete;

  Status open(const std::string& path);
  // Next packet record; false at the end of the file or on error (see status()).
  bool next(PcapRecord* rec);
  const Status& status() const { return status_; }
  int64_t records() const { return records_; }  // packet records returned so far
  uint64_t offset() const { return file_pos_ - (end_ - pos_); }
  uint64_t size() const { return size_; }
  void close();

 private:
  bool ensure(size_t n);  // at least n bytes buffered at pos_, else EOF
  bool fail(const std::string& msg);
  bool next_classic(PcapRecord* rec);
  bool next_ng(PcapRecord* rec);
  bool read_shb();
  uint16_t u16(const uint8_t* p) const;
  uint32_t u32(const uint8_t* p) const;

  std::string path_;
  FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, end_ = 0;
  uint64_t file_pos_ = 0, size_ = 0;
  bool swap_ = false, nsec_ = false, ng_ = false, eof_ = false;
  uint32_t snaplen_ = 0;
  struct Iface {
    uint16_t linktype = 1;
    uint32_t snaplen = 0;
    uint64_t units = 1000000;  // timestamp units per second
    int64_t offset_s = 0;
  };
  std::vector<Iface> ifaces_;
  int64_t records_ = 0;
  Status status_;
};

class PcapWriter {
 public:
  PcapWriter() = default;
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  Status open(const std::string& path);
  void write(uint64_t ts_ns, const uint8_t* data, uint32_t len);
  Status close();
  uint64_t packets() const { return packets_; }

 private:
  void flush();
  std::string path_;
  FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t n_ = 0;
  uint64_t packets_ = 0;
  bool error_ = false;
  int errno_ = 0;  // the first failed write's reason (named in close()'s error)
};

}  // namespace dpu
