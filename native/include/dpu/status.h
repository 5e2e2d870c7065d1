// status.h: errors crossing the native API.
//
// The control plane (parsers, validate-then-commit entry points, pcap readers)
// reports failure as a Status: a code, a message, and where it happened (the
// token and its character position in a flow, the file and record number in a
// pcap, the line of a flows file). The fast path never produces a Status: it
// counts drops instead (drop_reasons.def).
//
// Codes map one-to-one onto Python exceptions in dpu/errors.py; the mapping is
// done in one place, native/bindings/module.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace dpu {

enum class Err : uint8_t {
  OK = 0,
  PARSE,         // malformed flow / group / match text
  UNKNOWN_PORT,  // a port name or number that is not configured
  UNKNOWN_TABLE, // table id out of range
  UNKNOWN_GROUP, // group id not configured
  UNKNOWN_FIELD, // field name not known
  BAD_VALUE,     // value or mask not valid for the field
  CONFLICT,      // object exists / is in use
  PCAP,          // corrupt or unsupported capture file
  IO,            // open/read/write failure
  INVALID,       // any other invalid argument
};

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
