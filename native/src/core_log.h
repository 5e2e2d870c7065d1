// core_log.h: what the core says outside the fast path, as records for Python's logging.
//
// The core writes nothing to stderr itself. What it has to say while dpu runs (a live
// worker's housekeeping: an interface created again and reattached, or not; an AF_XDP
// queue that opens in a slower mode) is say()d here as a record with a level and the
// time it was said, and dpu.live takes the records (the binding's _core.take_log(): every
// half second, after start and after stop) into Python's logging (dpu/logs.py), where
// they are formatted and filtered like every other line (docs/live.md, "Logs").
//
// Threads: any thread may say() and take(); one mutex guards the queue. Never called per
// packet (STYLE.md #4: the fast path never logs), only on housekeeping and setup paths.
// At most kMaxWaiting records wait for take(); beyond that the oldest go, and the next
// take() begins with a warning saying how many were lost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpu {
namespace corelog {

enum class Level : uint8_t { kDebug, kInfo, kWarning, kError };

struct Record {
  Level level;
  int64_t unix_ns;   // CLOCK_REALTIME when it was said
  std::string text;  // one line, without "dpu:" or the level
};

constexpr size_t kMaxWaiting = 1024;

void say(Level level, std::string text);

// Every waiting record, oldest first; the queue is empty afterwards.
std::vector<Record> take();

// "debug", "info", "warning", "error": Python's level names, lower case.
const char* level_name(Level level);

}  // namespace corelog
}  // namespace dpu
