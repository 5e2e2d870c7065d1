// status.h: errors crossing the native API.
//
// The control plane (parsers, validate-then-commit entry points, pcap readers)
// reports failure as a Status: a code, a message, and where it happened (the
// token and its character position in a flow, the file and record number in a
// pcap, the line of a flows file). The fast path never produces a Status: it
// counts drops instead (drop_reasons.def).
//
// Codes are listed once, in errors.def, with the Python exception each maps to
// (dpu/errors.py builds its mapping from that list, exported by the binding;
// native/bindings/module.cc raises through it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace dpu {

// The codes: errors.def, one line each (name, Python class, meaning).
enum class Err : uint8_t {
  OK = 0,
#define DPU_ERR(name, cls, help) name,
#include "dpu/errors.def"
#undef DPU_ERR
};

// "PARSE", "UNKNOWN_PORT", ...: the name dpu.errors.from_native maps to a class.
inline const char* err_name(Err code) {
  switch (code) {
    case Err::OK: return "OK";
#define DPU_ERR(name, cls, help) \
    case Err::name:               \
      return #name;
#include "dpu/errors.def"
#undef DPU_ERR
  }
  return "UNKNOWN";
}

struct Status {
  Err code = Err::OK;
  std::string message;
  std::string token;    // offending token, if any
  int position = -1;    // 0-based character offset of token in its line, -1 if none
  int line = -1;        // 1-based line in a list/file, -1 if none
  std::string file;     // file name, if any
  int64_t record = -1;  // 1-based pcap record number, -1 if none

  bool ok() const { return code == Err::OK; }
  static Status Ok() { return Status(); }
  static Status Error(Err c, std::string msg) {
    Status s;
    s.code = c;
    s.message = std::move(msg);
    return s;
  }
  static Status At(Err c, std::string msg, std::string tok, int pos) {
    Status s = Error(c, std::move(msg));
    s.token = std::move(tok);
    s.position = pos;
    return s;
  }
  // Human text: "line 3: position 17 ('nw_dsst'): unknown field".
  std::string describe() const;
};

}  // namespace dpu
