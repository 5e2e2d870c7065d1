// core_log.cc: the queue of records the core says (see core_log.h).
#include "core_log.h"

#include <chrono>
#include <deque>
#include <mutex>

namespace dpu {
namespace corelog {
namespace {

struct Queue {
  std::mutex mu;
  std::deque<Record> waiting;
  uint64_t lost = 0;  // dropped since the last take(), the queue being full
};

Queue& queue() {
  static Queue* q = new Queue;  // never destroyed: a worker may still say() while the process exits
  return *q;
}

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void say(Level level, std::string text) {
  Record r{level, unix_ns(), std::move(text)};
  Queue& q = queue();
  std::lock_guard<std::mutex> g(q.mu);
  if (q.waiting.size() >= kMaxWaiting) {
    q.waiting.pop_front();
    q.lost++;
  }
  q.waiting.push_back(std::move(r));
}

std::vector<Record> take() {
  Queue& q = queue();
  std::vector<Record> out;
  std::lock_guard<std::mutex> g(q.mu);
  if (q.lost) {
    out.push_back({Level::kWarning, unix_ns(),
                   std::to_string(q.lost) + " earlier records of the core were lost (more than " +
                       std::to_string(kMaxWaiting) + " waited to be logged)"});
    q.lost = 0;
  }
  out.insert(out.end(), std::make_move_iterator(q.waiting.begin()), std::make_move_iterator(q.waiting.end()));
  q.waiting.clear();
  return out;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarning: return "warning";
    case Level::kError: return "error";
  }
  return "info";
}

}  // namespace corelog
}  // namespace dpu
