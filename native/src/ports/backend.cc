// backend.cc: the registry of I/O backends (see backend.h).
#include "backend.h"

namespace dpu {

const std::vector<const IoBackend*>& io_backends() {
  static const std::vector<const IoBackend*> all = {&afpacket_backend(), &afxdp_backend()};
  return all;
}

const IoBackend* find_io_backend(const std::string& name) {
  for (const IoBackend* b : io_backends())
    if (name == b->name()) return b;
  return nullptr;
}

std::string io_backend_names() {
  std::string s;
  for (const IoBackend* b : io_backends()) s += (s.empty() ? "" : ", ") + std::string(b->name());
  return s;
}

}  // namespace dpu
