// afxdp_lib.cc: libxdp and libbpf opened on first use (see afxdp_lib.h).
#include "afxdp_lib.h"

#ifdef DPU_HAVE_AFXDP

#include <dlfcn.h>

namespace dpu {

namespace {

constexpr const char* kInstall = "install them with `apt-get install libxdp1 libbpf1` (Debian, Ubuntu) or "
                                 "`dnf install libxdp libbpf` (Fedora, RHEL)";

struct Loaded {
  XdpLib lib{};
  std::string why;  // empty: loaded
};

Loaded load() {
  Loaded l;
  // libxdp.so.1 needs libbpf.so.1 itself; libbpf first names the one missing.
  void* bpf = dlopen("libbpf.so.1", RTLD_NOW | RTLD_LOCAL);
  void* xdp = bpf ? dlopen("libxdp.so.1", RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!bpf || !xdp) {
    const char* err = dlerror();
    l.why = std::string("AF_XDP needs libxdp.so.1 and libbpf.so.1, which this host lacks (") +
            (err ? err : "not found") + "): " + kInstall;
    return l;
  }
#define DPU_XDP_LOOKUP(handle, fn, version)                                                              \
  l.lib.fn = reinterpret_cast<decltype(&::fn)>(dlvsym(handle, #fn, version));                            \
  if (!l.lib.fn && l.why.empty())                                                                       \
    l.why = "AF_XDP: " #fn "@" version " is not in the lib" #handle " installed: it is older than the " \
            "one dpu was built with (libxdp 1.2, libbpf 1.0 or later); " + std::string(kInstall);
  DPU_XDP_FUNCTIONS(DPU_XDP_LOOKUP)
#undef DPU_XDP_LOOKUP
  return l;  // the libraries stay open for the life of the process
}

}  // namespace

const XdpLib* xdp_lib(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.why.empty()) {
    *why = loaded.why;
    return nullptr;
  }
  return &loaded.lib;
}

}  // namespace dpu

#endif  // DPU_HAVE_AFXDP
