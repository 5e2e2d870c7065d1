// pcap.cc: classic pcap and pcapng reading, classic pcap writing (see pcap.h).
#include "dpu/pcap.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace dpu {

namespace {
constexpr size_t kBuf = 1 << 20;
constexpr uint32_t kMaxRecord = 262144;
constexpr uint32_t kShb = 0x0A0D0D0A, kIdb = 1, kEpb = 6, kSpb = 3, kOpb = 2;
constexpr uint32_t kBom = 0x1A2B3C4D;
}  // namespace

PcapReader::~PcapReader() { close(); }

void PcapReader::close() {
  if (f_) std::fclose(f_);
  f_ = nullptr;
}

uint16_t PcapReader::u16(const uint8_t* p) const {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return swap_ ? __builtin_bswap16(v) : v;
}

uint32_t PcapReader::u32(const uint8_t* p) const {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return swap_ ? __builtin_bswap32(v) : v;
}

bool PcapReader::fail(const std::string& msg) {
  status_ = Status::Error(Err::PCAP, msg);
  status_.file = path_;
  status_.record = records_ + 1;
  return false;
}

bool PcapReader::ensure(size_t n) {
  if (end_ - pos_ >= n) return true;
  if (eof_) return false;
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  if (buf_.size() < n) buf_.resize(n);
  while (end_ < n) {
    size_t got = std::fread(buf_.data() + end_, 1, buf_.size() - end_, f_);
    file_pos_ += got;
    end_ += got;
    if (got == 0) {
      eof_ = true;
      break;
    }
  }
  return end_ - pos_ >= n;
}

Status PcapReader::open(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) {
    Status s = Status::Error(Err::IO, std::string("cannot open: ") + std::strerror(errno));
    s.file = path;
    return s;
  }
  struct stat st;
  if (fstat(fileno(f_), &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
  buf_.resize(kBuf);
  if (!ensure(4)) {
    Status s = Status::Error(Err::PCAP, "empty or too short to be a capture file");
    s.file = path;
    return s;
  }
  uint32_t magic;
  std::memcpy(&magic, buf_.data(), 4);
  if (magic == kShb) {
    ng_ = true;
    if (!read_shb()) return status_;
    return Status::Ok();
  }
  switch (magic) {
    case 0xa1b2c3d4: break;
    case 0xa1b23c4d: nsec_ = true; break;
    case 0xd4c3b2a1: swap_ = true; break;
    case 0x4d3cb2a1: swap_ = nsec_ = true; break;
    default: {
      Status s = Status::Error(Err::PCAP, "not a pcap or pcapng file (bad magic number)");
      s.file = path;
      return s;
    }
  }
  if (!ensure(24)) {
    Status s = Status::Error(Err::PCAP, "truncated file header");
    s.file = path;
    return s;
  }
  const uint8_t* h = buf_.data() + pos_;
  snaplen_ = u32(h + 16);
  uint32_t link = u32(h + 20) & 0x03ffffff;
  if (link != 1) {
    Status s = Status::Error(Err::PCAP, "link type " + std::to_string(link) + " is not Ethernet (1)");
    s.file = path;
    return s;
  }
  pos_ += 24;
  return Status::Ok();
}

bool PcapReader::next(PcapRecord* rec) {
  if (!status_.ok() || !f_) return false;
  return ng_ ? next_ng(rec) : next_classic(rec);
}

bool PcapReader::next_classic(PcapRecord* rec) {
  if (!ensure(16)) {
    if (end_ == pos_) return false;  // clean end of file
    return fail("truncated record header (" + std::to_string(end_ - pos_) + " of 16 bytes)");
  }
  const uint8_t* h = buf_.data() + pos_;
  uint32_t sec = u32(h), frac = u32(h + 4), incl = u32(h + 8), orig = u32(h + 12);
  if (incl > kMaxRecord) return fail("implausible captured length " + std::to_string(incl));
  if (!nsec_ && frac >= 1000000) return fail("microseconds field " + std::to_string(frac) + " out of range");
  if (nsec_ && frac >= 1000000000) return fail("nanoseconds field " + std::to_string(frac) + " out of range");
  if (!ensure(16 + incl))
    return fail("truncated record: header says " + std::to_string(incl) + " bytes, " +
                std::to_string(end_ - pos_ - 16) + " left in the file");
  h = buf_.data() + pos_;
  rec->ts_ns = static_cast<uint64_t>(sec) * 1000000000ull + (nsec_ ? frac : static_cast<uint64_t>(frac) * 1000);
  rec->caplen = incl;
  rec->origlen = orig;
  rec->data = h + 16;
  pos_ += 16 + incl;
  records_++;
  return true;
}

bool PcapReader::read_shb() {
  if (!ensure(12)) return fail("truncated section header block");
  const uint8_t* b = buf_.data() + pos_;
  uint32_t bom;
  std::memcpy(&bom, b + 8, 4);
  if (bom == kBom) swap_ = false;
  else if (bom == __builtin_bswap32(kBom)) swap_ = true;
  else return fail("pcapng section header has a bad byte-order magic");
  uint32_t len = u32(b + 4);
  if (len < 28 || len % 4 || len > (16u << 20)) return fail("pcapng section header has a bad length");
  if (!ensure(len)) return fail("truncated section header block");
  pos_ += len;
  ifaces_.clear();
  return true;
}

bool PcapReader::next_ng(PcapRecord* rec) {
  for (;;) {
    if (!ensure(8)) {
      if (end_ == pos_) return false;
      return fail("truncated pcapng block header");
    }
    const uint8_t* b = buf_.data() + pos_;
    uint32_t type;
    std::memcpy(&type, b, 4);
    if (type == kShb) {
      if (!read_shb()) return false;
      continue;
    }
    type = u32(b);
    uint32_t len = u32(b + 4);
    if (len < 12 || len % 4 || len > kMaxRecord + 64)
      return fail("pcapng block of type " + std::to_string(type) + " has a bad length " + std::to_string(len));
    if (!ensure(len))
      return fail("truncated pcapng block: says " + std::to_string(len) + " bytes, " + std::to_string(end_ - pos_) +
                  " left in the file");
    b = buf_.data() + pos_;
    if (u32(b + len - 4) != len) return fail("pcapng block lengths disagree");
    const uint8_t* body = b + 8;
    const uint32_t body_len = len - 12;
    if (type == kIdb) {
      if (body_len < 8) return fail("short interface description block");
      Iface ifc;
      ifc.linktype = u16(body);
      ifc.snaplen = u32(body + 4);
      uint32_t o = 8;
      while (o + 4 <= body_len) {
        uint16_t code = u16(body + o), olen = u16(body + o + 2);
        if (code == 0) break;
        if (o + 4 + olen > body_len) return fail("interface option runs past its block");
        const uint8_t* v = body + o + 4;
        if (code == 9 && olen >= 1) {
          uint8_t r = v[0];
          uint64_t units = 1;
          if (r & 0x80) {
            if ((r & 0x7f) > 63) return fail("if_tsresol out of range");
            units = 1ull << (r & 0x7f);
          } else {
            if (r > 19) return fail("if_tsresol out of range");
            for (int i = 0; i < r; i++) units *= 10;
          }
          ifc.units = units;
        } else if (code == 14 && olen >= 8) {
          uint64_t off;
          std::memcpy(&off, v, 8);
          ifc.offset_s = static_cast<int64_t>(swap_ ? __builtin_bswap64(off) : off);
          if (ifc.offset_s > (int64_t{1} << 33) || ifc.offset_s < -(int64_t{1} << 33))
            return fail("if_tsoffset out of range");
        }
        o += 4 + ((olen + 3u) & ~3u);
      }
      ifaces_.push_back(ifc);
      pos_ += len;
      continue;
    }
    if (type == kEpb || type == kOpb || type == kSpb) {
      uint32_t ifidx = 0, caplen, origlen, hdr;
      uint64_t ts = 0;
      if (type == kSpb) {
        if (body_len < 4) return fail("short simple packet block");
        origlen = u32(body);
        hdr = 4;
        caplen = body_len - 4;
        if (caplen > origlen) caplen = origlen;
        if (!ifaces_.empty() && ifaces_[0].snaplen && caplen > ifaces_[0].snaplen) caplen = ifaces_[0].snaplen;
      } else {
        if (body_len < 20) return fail("short packet block");
        if (type == kEpb) {
          ifidx = u32(body);
          ts = (static_cast<uint64_t>(u32(body + 4)) << 32) | u32(body + 8);
        } else {
          ifidx = u16(body);
          ts = (static_cast<uint64_t>(u32(body + 4)) << 32) | u32(body + 8);
        }
        caplen = u32(body + 12);
        origlen = u32(body + 16);
        hdr = 20;
        if (caplen > body_len - hdr) return fail("packet block captured length runs past its block");
      }
      if (ifidx >= ifaces_.size()) return fail("packet refers to undefined interface " + std::to_string(ifidx));
      const Iface& ifc = ifaces_[ifidx];
      if (ifc.linktype != 1)
        return fail("interface " + std::to_string(ifidx) + " has link type " + std::to_string(ifc.linktype) +
                    ", not Ethernet (1)");
      unsigned __int128 ns = static_cast<unsigned __int128>(ts) * 1000000000u / ifc.units;
      rec->ts_ns = static_cast<uint64_t>(ns) + static_cast<uint64_t>(ifc.offset_s * 1000000000ll);
      rec->caplen = caplen;
      rec->origlen = origlen;
      rec->data = body + hdr;
      pos_ += len;
      records_++;
      return true;
    }
    pos_ += len;  // other block types: skip
  }
}

PcapWriter::~PcapWriter() { close(); }

Status PcapWriter::open(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) {
    Status s = Status::Error(Err::IO, std::string("cannot create: ") + std::strerror(errno));
    s.file = path;
    return s;
  }
  buf_.resize(kBuf);
  uint32_t hdr[6] = {0xa1b23c4d, 0x00040002, 0, 0, kMaxRecord, 1};
  std::memcpy(buf_.data(), hdr, 24);
  n_ = 24;
  return Status::Ok();
}

void PcapWriter::flush() {
  if (!f_ || n_ == 0) return;
  if (std::fwrite(buf_.data(), 1, n_, f_) != n_ && !error_) {
    error_ = true;
    errno_ = errno;
  }
  n_ = 0;
}

void PcapWriter::write(uint64_t ts_ns, const uint8_t* data, uint32_t len) {
  if (!f_) return;
  if (n_ + 16 + len > buf_.size()) flush();
  uint32_t h[4] = {static_cast<uint32_t>(ts_ns / 1000000000ull), static_cast<uint32_t>(ts_ns % 1000000000ull), len,
                   len};
  std::memcpy(buf_.data() + n_, h, 16);
  std::memcpy(buf_.data() + n_ + 16, data, len);
  n_ += 16 + len;
  packets_++;
}

Status PcapWriter::close() {
  if (!f_) return Status::Ok();
  flush();
  if (std::fflush(f_) != 0 && !error_) {
    error_ = true;
    errno_ = errno;
  }
  if (std::fclose(f_) != 0 && !error_) {
    error_ = true;
    errno_ = errno;
  }
  f_ = nullptr;
  if (error_) {
    Status s = Status::Error(Err::IO, std::string("write failed: ") + std::strerror(errno_ ? errno_ : EIO));
    s.file = path_;
    return s;
  }
  return Status::Ok();
}

}  // namespace dpu
