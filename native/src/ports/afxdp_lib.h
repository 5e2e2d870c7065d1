// afxdp_lib.h: libxdp and libbpf, opened when AF_XDP is first asked for.
//
// The core does not link them: `import dpu` works on a host without them, and
// only `dpu run --io afxdp` needs them. The first AF_XDP queue opens both
// libraries (dlopen) and looks up the few functions afxdp.cc calls, each at the
// symbol version the build compiled against (the headers' inline ring
// functions need no library); the table below is the whole list. When either
// library or a function is missing, xdp_lib() says which and what to install,
// and keeps saying it (it tries once per process).
//
// Thread-safety: xdp_lib() may be called from several threads at once (the
// first call loads, the others wait); the table never changes after.
#pragma once

#ifdef DPU_HAVE_AFXDP

#include <bpf/bpf.h>
#include <xdp/xsk.h>

#include <string>

// X(library handle, function, symbol version): every libbpf/libxdp function afxdp.cc calls.
#define DPU_XDP_FUNCTIONS(X)                              \
  X(bpf, bpf_map_create, "LIBBPF_0.6.0")                  \
  X(bpf, bpf_prog_load, "LIBBPF_0.6.0")                   \
  X(bpf, bpf_link_create, "LIBBPF_0.0.8")                 \
  X(bpf, bpf_obj_get_info_by_fd, "LIBBPF_0.0.1")          \
  X(bpf, bpf_map_delete_elem, "LIBBPF_0.0.1")             \
  X(xdp, xsk_umem__create, "LIBXDP_1.2.0")                \
  X(xdp, xsk_umem__delete, "LIBXDP_1.2.0")                \
  X(xdp, xsk_socket__create, "LIBXDP_1.2.0")              \
  X(xdp, xsk_socket__delete, "LIBXDP_1.2.0")              \
  X(xdp, xsk_socket__fd, "LIBXDP_1.2.0")                  \
  X(xdp, xsk_socket__update_xskmap, "LIBXDP_1.2.0")

namespace dpu {

struct XdpLib {
#define DPU_XDP_POINTER(handle, fn, version) decltype(&::fn) fn;
  DPU_XDP_FUNCTIONS(DPU_XDP_POINTER)
#undef DPU_XDP_POINTER
};

// The functions, or nullptr with *why set: which library or function is
// missing and the Debian packages that bring them.
const XdpLib* xdp_lib(std::string* why);

}  // namespace dpu

#endif  // DPU_HAVE_AFXDP
