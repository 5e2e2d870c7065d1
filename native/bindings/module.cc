// module.cc: dpu._core, the pybind11 binding of the native core.
//
// The seam is thin: objects map one-to-one onto the C++ classes, batches cross
// as buffers (bytes + numpy offset/length/port arrays), never packet by packet,
// and the GIL is released around everything that touches packets or tables.
// C++ Status codes become dpu.errors exceptions here and only here
// (raise_status, through dpu.errors.from_native: the one code-to-class mapping).
//
// Exit. Every GIL release goes through NativeCall, so that the interpreter's exit
// is clean whatever other threads are doing (see "the exit gate" below).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>
#include <x86intrin.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "../src/conntrack/ct_proto.h"
#include "../src/core_log.h"
#include "../src/dataplane.h"
#include "../src/dp_format.h"
#include "../src/dpcls.h"
#include "dpu/mem.h"
#include "../src/live.h"
#include "../src/merge_runs.h"
#include "../src/ports/backend.h"
#include "../src/ports/gso.h"
#include "../src/ports/traffic.h"
#include "../src/runner.h"
#include "dpu/ofparse.h"

namespace py = pybind11;
using namespace dpu;

namespace {

// ---- the exit gate: calls in flight when the interpreter exits ---------------------------------
// A thread in a call that released the GIL may still be there when the interpreter finalizes (a
// daemon thread: Python does not wait for those). Taking the GIL back then, CPython ends it with
// pthread_exit, whose unwinding stops at the noexcept destructor that was taking the GIL
// (pybind11's gil_scoped_release): std::terminate, SIGABRT. And finalization may free what the call
// is using. So:
//   - every release is a NativeCall, counted in flight until it has the GIL back;
//   - close_exit_gate, an atexit hook (run before finalization, by the thread that then finalizes),
//     closes the gate and waits, GIL released, up to kExitWait for the calls in flight: one that
//     ends meanwhile returns as usual (nothing finalizes while the gate waits);
//   - once closed, any other thread starting a call, or ending one still running when the wait
//     gave up (a long replay), is parked, GIL released, until the process ends: it never runs
//     native code again and never takes the GIL back (CPython 3.14 hangs such threads the same way);
//   - while such a call runs, the objects it may use (Dataplane, Replayer, Live) are not freed:
//     ExitSafeDelete leaves them to the end of the process.
// The finalizing thread itself goes on as before: atexit hooks and finalizers may still call in.
struct ExitGate {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t in_flight = 0;      // NativeCalls not yet back with the GIL
  bool closed = false;
  std::thread::id finalizer;   // the thread that closed it
};
ExitGate* g_exit = new ExitGate;  // never freed: parked threads outlive static destruction
constexpr std::chrono::seconds kExitWait{2};

bool parks_here(const ExitGate& g) { return g.closed && std::this_thread::get_id() != g.finalizer; }

[[noreturn]] void park_until_exit() {
  for (;;) pause();
}

class NativeCall {
 public:
  NativeCall() {
    bool park;
    {
      std::lock_guard<std::mutex> l(g_exit->mu);
      park = parks_here(*g_exit);
      if (!park) g_exit->in_flight++;
    }
    tstate_ = PyEval_SaveThread();
    if (park) park_until_exit();
  }
  NativeCall(const NativeCall&) = delete;
  NativeCall& operator=(const NativeCall&) = delete;
  // noexcept(false): a call that passed the check below just as the gate gave up waiting may
  // still be ended by pthread_exit while it takes the GIL; its unwinding must then pass.
  ~NativeCall() noexcept(false) {
    {
      std::unique_lock<std::mutex> l(g_exit->mu);
      if (parks_here(*g_exit)) {
        if (--g_exit->in_flight == 0) g_exit->cv.notify_all();
        l.unlock();
        park_until_exit();
      }
    }
    PyEval_RestoreThread(tstate_);
    std::lock_guard<std::mutex> l(g_exit->mu);
    if (--g_exit->in_flight == 0) g_exit->cv.notify_all();
  }

 private:
  PyThreadState* tstate_;
};

void close_exit_gate() {
  PyThreadState* ts = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> l(g_exit->mu);
    g_exit->closed = true;
    g_exit->finalizer = std::this_thread::get_id();
    g_exit->cv.wait_for(l, kExitWait, [] { return g_exit->in_flight == 0; });
  }
  PyEval_RestoreThread(ts);
}

template <class T>
struct ExitSafeDelete {
  void operator()(T* p) const {
    {
      std::lock_guard<std::mutex> l(g_exit->mu);
      if (g_exit->closed && g_exit->in_flight > 0) return;  // a call still running may use it
    }
    delete p;
  }
};
template <class T>
using ExitSafePtr = std::unique_ptr<T, ExitSafeDelete<T>>;

}  // namespace

using DataplaneClass = py::class_<Dataplane, ExitSafePtr<Dataplane>>;

namespace {

// Text of a status as str; a token or file name cut inside a UTF-8 sequence
// must not turn the error into a UnicodeDecodeError.
py::object status_text(const std::string& t) {
  return py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(t.data(), static_cast<Py_ssize_t>(t.size()), "replace"));
}

[[noreturn]] void raise_status(const Status& s) {
  py::gil_scoped_acquire gil;
  py::object errors = py::module_::import("dpu.errors");
  py::dict kw;
  kw["token"] = s.token.empty() ? py::none() : status_text(s.token);
  kw["position"] = s.position >= 0 ? py::cast(s.position) : py::none();
  kw["line"] = s.line >= 0 ? py::cast(s.line) : py::none();
  kw["file"] = s.file.empty() ? py::none() : status_text(s.file);
  kw["record"] = s.record >= 0 ? py::cast(s.record) : py::none();
  kw["reason"] = status_text(s.message);
  py::object exc = errors.attr("from_native")(err_name(s.code), status_text(s.describe()), **kw);
  PyErr_SetObject(py::type::handle_of(exc).ptr(), exc.ptr());
  throw py::error_already_set();
}

void check(const Status& s) {
  if (!s.ok()) raise_status(s);
}

template <class T>
const T* arr_ptr(const py::array_t<T, py::array::c_style | py::array::forcecast>& a, size_t n, const char* what) {
  if (static_cast<size_t>(a.size()) != n) throw py::value_error(std::string(what) + " has the wrong length");
  return a.data();
}

std::string mac_str(const uint8_t* m) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

py::dict port_dict(const PortInfo& p, Dataplane& dp) {
  py::dict d;
  d["name"] = p.name;
  d["ofport"] = p.ofport;
  d["tunnel"] = p.tunnel;
  if (p.tunnel) {
    const TunnelCfg& c = p.tnl;
    char ip[64];
    inet_ntop(c.ipv6 ? AF_INET6 : AF_INET, c.local_ip, ip, sizeof ip);
    d["underlay"] = dp.port_name(c.underlay);
    d["local_ip"] = std::string(ip);
    d["local_mac"] = mac_str(c.local_mac);
    d["nexthop_mac"] = mac_str(c.nexthop_mac);
#define DPU_TUNNEL_PARAM(m, type, def, lo, hi, api, help) d[#m] = c.m;
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
  }
  return d;
}

py::dict drops_dict(const uint64_t* drops) {
  py::dict d;
  for (int r = 1; r < DROP_COUNT; r++)
    if (drops[r]) d[drop_reason_name(r)] = drops[r];
  return d;
}

py::dict traffic_dict(const TrafficCounters& c) {
  py::dict p;
#define DPU_TRAFFIC_COUNTER(m, h) p[#m] = c.m;
#include "dpu/counters.def"
#undef DPU_TRAFFIC_COUNTER
  p["drops"] = drops_dict(c.drops);
  return p;
}

py::dict port_counters_dict(const PortCounters& c) {
  py::dict p = traffic_dict(c);
#define DPU_PORT_COUNTER(m, h) p[#m] = c.m;
#include "dpu/counters.def"
#undef DPU_PORT_COUNTER
  return p;
}

py::dict worker_counters_dict(const WorkerCounters& c) {
  py::dict d;
#define DPU_WORKER_COUNTER(m, n, h) d[n] = c.m;
#include "dpu/counters.def"
#undef DPU_WORKER_COUNTER
  py::dict cyc;
  for (int i = 0; i < STAGE_COUNT; i++) cyc[kStageNames[i]] = c.cycles[i];
  d["cycles"] = cyc;
  return d;
}

// ---- the transaction: typed objects, one apply -------------------------------------------------

py::dict apply_txn(Dataplane& dp, const Txn& txn) {
  TxnResult res;
  Status st;
  {
    NativeCall nogil;
    st = dp.apply(txn, &res);
  }
  check(st);
  py::dict d;
  d["flows_added"] = res.flows_added;
  d["flows_modified"] = res.flows_modified;
  d["flows_deleted"] = res.flows_deleted;
  d["groups_added"] = res.groups_added;
  d["groups_modified"] = res.groups_modified;
  d["groups_deleted"] = res.groups_deleted;
  d["ports_added"] = res.ports_added;
  d["version"] = res.version;
  return d;
}

// dpu.Transaction builds a Txn from these and hands it to Dataplane.apply:
// ports as PortSpec, flow and group changes as (OpKind, text), zones as
// CtZone, port forwards as NatMapping, timeouts as CtTimeout. Every value
// is checked by Dataplane::apply, which commits all of it or none.
void bind_txn(py::module_& m) {
  py::enum_<TxnOp::Kind>(m, "OpKind", "a flow or group change of a transaction (ovs-ofctl's commands)")
      .value("ADD_FLOW", TxnOp::ADD_FLOW)
      .value("MOD_FLOWS", TxnOp::MOD_FLOWS)
      .value("MOD_FLOWS_STRICT", TxnOp::MOD_FLOWS_STRICT)
      .value("DEL_FLOWS", TxnOp::DEL_FLOWS)
      .value("DEL_FLOWS_STRICT", TxnOp::DEL_FLOWS_STRICT)
      .value("ADD_GROUP", TxnOp::ADD_GROUP)
      .value("MOD_GROUP", TxnOp::MOD_GROUP)
      .value("DEL_GROUPS", TxnOp::DEL_GROUPS)
      .value("REPLACE_FLOWS", TxnOp::REPLACE_FLOWS);
  py::class_<PortSpec> ps(m, "PortSpec", "a port to add: plain, or (tunnel=True) a VXLAN port over `underlay`");
  ps.def(py::init<>())
      .def_readwrite("name", &PortSpec::name)
      .def_readwrite("ofport", &PortSpec::ofport)
      .def_readwrite("tunnel", &PortSpec::tunnel)
      .def_readwrite("underlay", &PortSpec::underlay)
      .def_readwrite("local_ip", &PortSpec::local_ip)
      .def_readwrite("local_mac", &PortSpec::local_mac)
      .def_readwrite("nexthop_mac", &PortSpec::nexthop_mac);
#define DPU_TUNNEL_PARAM(mem, type, def, lo, hi, api, help) ps.def_readwrite(#mem, &PortSpec::mem, help);
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
  py::class_<CtZoneSpec>(m, "CtZone", "a conntrack zone's settings: connection limit (0: none), endpoint-independent filtering")
      .def(py::init([](int64_t zone, int64_t limit, bool eif) { return CtZoneSpec{zone, limit, eif}; }), py::arg("zone"),
           py::arg("limit") = 0, py::arg("eif") = false)
      .def_readwrite("zone", &CtZoneSpec::zone)
      .def_readwrite("limit", &CtZoneSpec::limit)
      .def_readwrite("eif", &CtZoneSpec::eif)
      .def("__repr__", [](const CtZoneSpec& z) {
        return "CtZone(zone=" + std::to_string(z.zone) + ", limit=" + std::to_string(z.limit) +
               ", eif=" + (z.eif ? "True" : "False") + ")";
      });
  py::class_<NatStaticSpec>(m, "NatMapping", "a static NAT mapping (port forward): public endpoint <-> internal endpoint")
      .def(py::init([](int64_t zone, int64_t proto, std::string internal_ip, int64_t internal_port, std::string public_ip,
                       int64_t public_port) {
             return NatStaticSpec{zone, proto, std::move(internal_ip), internal_port, std::move(public_ip), public_port};
           }),
           py::arg("zone"), py::arg("proto"), py::arg("internal_ip"), py::arg("internal_port"), py::arg("public_ip"),
           py::arg("public_port"))
      .def_readwrite("zone", &NatStaticSpec::zone)
      .def_readwrite("proto", &NatStaticSpec::proto)
      .def_readwrite("internal_ip", &NatStaticSpec::internal_ip)
      .def_readwrite("internal_port", &NatStaticSpec::internal_port)
      .def_readwrite("public_ip", &NatStaticSpec::public_ip)
      .def_readwrite("public_port", &NatStaticSpec::public_port)
      .def("__repr__", [](const NatStaticSpec& n) {
        return "NatMapping(zone=" + std::to_string(n.zone) + ", proto=" + std::to_string(n.proto) + ", internal_ip='" +
               n.internal_ip + "', internal_port=" + std::to_string(n.internal_port) + ", public_ip='" + n.public_ip +
               "', public_port=" + std::to_string(n.public_port) + ")";
      });
  py::class_<CtTimeoutSpec>(m, "CtTimeout", "a conntrack timeout by name (CT_TIMEOUTS), in seconds")
      .def(py::init([](std::string name, double seconds) { return CtTimeoutSpec{std::move(name), seconds}; }),
           py::arg("name"), py::arg("seconds"))
      .def_readwrite("name", &CtTimeoutSpec::name)
      .def_readwrite("seconds", &CtTimeoutSpec::seconds);
  py::class_<Txn>(m, "Txn", "one transaction: validated whole by Dataplane.apply, then committed whole")
      .def(py::init<>())
      .def("add_port", [](Txn& t, const PortSpec& p) { t.add_ports.push_back(p); }, py::arg("port"))
      .def("del_port", [](Txn& t, const std::string& name) { t.del_ports.push_back(name); }, py::arg("name"))
      .def("add_ops",
           [](Txn& t, const std::vector<std::pair<TxnOp::Kind, std::string>>& ops) {
             t.ops.reserve(t.ops.size() + ops.size());
             for (const auto& o : ops) t.ops.push_back(TxnOp{o.first, o.second});
           },
           py::arg("ops"))
      .def("set_tenants",
           [](Txn& t, const std::vector<std::pair<std::string, uint64_t>>& tenants) {
             t.set_tenants = true;
             t.tenants.clear();
             for (const auto& x : tenants) t.tenants.push_back({x.first, x.second});
           },
           py::arg("tenants"))
      .def("set_ct_zones",
           [](Txn& t, const std::vector<CtZoneSpec>& zones) {
             t.set_ct_zones = true;
             t.ct_zones = zones;
           },
           py::arg("zones"))
      .def("set_nat_static",
           [](Txn& t, const std::vector<NatStaticSpec>& maps) {
             t.set_nat_static = true;
             t.nat_static = maps;
           },
           py::arg("mappings"))
      .def("set_ct_timeouts", [](Txn& t, const std::vector<CtTimeoutSpec>& v) { t.ct_timeouts = v; }, py::arg("timeouts"))
      .def_readwrite("ct_max_connections", &Txn::ct_max_connections)
      .def_readwrite("create_ports", &Txn::create_ports)
      .def_property_readonly("n_ops", [](const Txn& t) { return t.ops.size(); })
      .def_property_readonly("empty", [](const Txn& t) {
        return t.add_ports.empty() && t.del_ports.empty() && t.ops.empty() && !t.set_tenants && !t.set_ct_zones &&
               !t.set_nat_static && t.ct_timeouts.empty() && !t.ct_max_connections;
      });
}

// ---- conntrack ----------------------------------------------------------------------------------

const char* const kTimeoutNames[TM_COUNT] = {
#define DPU_CT_TIMEOUT(e, name, seconds, help) #name,
#include "dpu/ct_timeouts.def"
#undef DPU_CT_TIMEOUT
};

py::dict ct_key_dict(const CtKey& k) {
  py::dict d;
  char a[64], b[64];
  inet_ntop(k.v6 ? AF_INET6 : AF_INET, k.src, a, sizeof a);
  inet_ntop(k.v6 ? AF_INET6 : AF_INET, k.dst, b, sizeof b);
  d["src"] = std::string(a);
  d["dst"] = std::string(b);
  if (k.proto == kIpIcmp || k.proto == kIpIcmpv6) {
    uint8_t tc[2];
    std::memcpy(tc, &k.dport, 2);
    d["id"] = be16(k.sport);
    d["type"] = tc[0];
    d["code"] = tc[1];
  } else {
    d["sport"] = be16(k.sport);
    d["dport"] = be16(k.dport);
  }
  return d;
}

py::list ct_dump(Dataplane& dp, int zone) {
  std::vector<Conntrack::Entry> v;
  {
    NativeCall nogil;
    const int64_t now = dp.conntrack().now(dp.now_ns());
    dp.conntrack().dump(zone, now, &v);  // live connections only; expiry is the workers' (housekeeping)
  }
  py::list l;
  for (const auto& e : v) {
    py::dict d;
    d["text"] = Conntrack::format(e);
    d["proto"] = e.orig.proto;
    d["zone"] = e.orig.zone;
    d["orig"] = ct_key_dict(e.orig);
    d["key"] = py::bytes(reinterpret_cast<const char*>(&e.orig), sizeof e.orig);  // for ct_flush_keys()
    d["reply"] = ct_key_dict(e.reply);
    d["mark"] = e.mark;
    d["label"] = py::int_(py::reinterpret_steal<py::object>(
        PyLong_FromString(hex_u128(e.label).c_str(), nullptr, 16)));
    d["state"] = e.protoinfo ? py::cast(std::string(e.protoinfo)) : py::none();
    d["expires_in"] = static_cast<double>(e.expires_in_ns) / 1e9;
    d["snat"] = (e.nat & kNatSrc) != 0;
    d["dnat"] = (e.nat & kNatDst) != 0;
    l.append(d);
  }
  return l;
}

// Counters only, each read relaxed: no worker's lock is taken and nothing
// expires here (a scrape must not change what it measures; expiry runs in
// the workers' stages and housekeeping).
py::dict ct_stats(Dataplane& dp) {
  Conntrack& ct = dp.conntrack();
  py::dict d;
  d["connections"] = ct.count();
  std::vector<std::pair<uint16_t, uint32_t>> zones;
  ct.zone_counts(&zones);
  py::dict z;
  for (const auto& kv : zones) z[py::int_(kv.first)] = kv.second;
  d["zones"] = z;
  d["bytes_per_connection"] = ct.bytes_per_conn();
  d["table_bytes"] = ct.table_bytes();
  d["max_connections"] = ct.config().max_conns;
  d["nat_mappings"] = ct.nat().mappings();
  d["recirc_ids"] = dp.recirc().size();
  uint64_t created = 0, expired = 0, removed = 0;
  for (size_t i = 0; i < dp.n_workers(); i++) {
    const CtWorker::Counts c = dp.worker(i).ct_counts();
    created += c.created;
    expired += c.expired;
    removed += c.removed;
  }
  d["created"] = created;
  d["expired"] = expired;
  d["removed"] = removed + ct.flushed();  // by packets (RST, a forced commit) and by flushes
  return d;
}

py::dict ct_config_get(Dataplane& dp) {
  CtConfig c = dp.conntrack().config();
  py::dict t;
  for (int i = 0; i < TM_COUNT; i++) t[kTimeoutNames[i]] = static_cast<double>(c.timeout_ns[i]) / 1e9;
  py::dict d;
  d["timeouts"] = t;
  d["max_connections"] = c.max_conns;
  return d;
}

void bind_conntrack(DataplaneClass& c) {
  c.def("ct_dump", &ct_dump, py::arg("zone") = -1)
      .def("ct_flush",
           [](Dataplane& dp, int zone) {
             NativeCall nogil;
             return dp.conntrack().flush(zone);
           },
           py::arg("zone") = -1)
      .def("ct_flush_keys",
           [](Dataplane& dp, const std::vector<py::bytes>& keys) {
             std::vector<CtKey> origs;
             for (const py::bytes& b : keys) {
               std::string s = b;
               if (s.size() != sizeof(CtKey))
                 throw py::value_error("a connection key is " + std::to_string(sizeof(CtKey)) +
                                       " bytes, as ct_dump() gives it");
               CtKey k;
               std::memcpy(&k, s.data(), sizeof k);
               origs.push_back(k);
             }
             NativeCall nogil;
             return dp.conntrack().flush_keys(origs);
           },
           py::arg("keys"))
      .def("ct_stats", &ct_stats)
      .def("ct_settings",
           [](Dataplane& dp) {
             Dataplane::CtSettings s = dp.ct_settings();
             return py::make_tuple(s.zones, s.nat_static);
           },
           "(zones, NAT mappings) as committed: [CtZone], [NatMapping]")
      .def("ct_config", &ct_config_get)
      .def("set_frag_nx_match",
           [](Dataplane& dp, bool on) {
             NativeCall nogil;
             dp.set_frag_nx_match(on);
           })
      .def("frag_nx_match", &Dataplane::frag_nx_match);
}

// ---- module-level helpers: clock calibration, self-tests, drop reasons -------------------
// The seam's facts, from where the core keeps them (read by the Python side).
void bind_seam_facts(py::module_& m) {
  // The seam's facts, from where the core keeps them: conntrack's timeouts
  // (ct_timeouts.def: name, default seconds, what it applies to) with their
  // bounds in seconds and the connection limit's; a tunnel port's settings
  // (tunnel_params.def: member, default, min, max, API name, meaning).
  {
    py::list t;
#define DPU_CT_TIMEOUT(e, name, seconds, help) t.append(py::make_tuple(#name, static_cast<double>(seconds), help));
#include "dpu/ct_timeouts.def"
#undef DPU_CT_TIMEOUT
    m.attr("CT_TIMEOUTS") = py::tuple(t);
    m.attr("CT_TIMEOUT_RANGE") = py::make_tuple(kCtTimeoutMinNs / 1e9, kCtTimeoutMaxNs / 1e9);
    m.attr("CT_MAX_CONNECTIONS_RANGE") = py::make_tuple(kCtMaxConnsMin, kCtMaxConnsMax);
    m.attr("CT_MAX_CONNECTIONS_DEFAULT") = CtConfig().max_conns;
    py::list p;
#define DPU_TUNNEL_PARAM(mem, type, def, lo, hi, api, help)                                                 \
  p.append(py::make_tuple(#mem, std::is_same_v<type, bool> ? py::object(py::bool_(def)) : py::object(py::int_(def)), \
                          lo, hi, api, help));
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
    m.attr("TUNNEL_PARAMS") = py::tuple(p);
    m.attr("TUNNEL_MTU_MIN_IPV6") = kTunnelMtuMinIpv6;
    m.attr("MAX_OFPORT") = kMaxOfport;
  }
  m.attr("DEFAULT_BURST") = kDefaultBurst;  // frames a worker takes from a queue at a time (batch.h)
  m.attr("MAX_BURST") = kBatchMax;
  // The live I/O backends this build can open (`dpu demo` names them): AF_XDP only where
  // setup.py found libxdp and libbpf (ports/backend.h, the registry).
  py::list io;
  for (const IoBackend* b : io_backends())
    if (b->built()) io.append(b->name());
  m.attr("IO_BACKENDS") = py::tuple(io);
  // The x86-64 level this module was compiled for, as the compiler's macros
  // say (setup.py chooses it; dpu_build_info's isa label).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
  m.attr("BUILD_ISA") = "x86-64-v4";
#elif defined(__AVX2__) && defined(__BMI2__) && defined(__FMA__)
  m.attr("BUILD_ISA") = "x86-64-v3";
#elif defined(__SSE4_2__) && defined(__POPCNT__)
  m.attr("BUILD_ISA") = "x86-64-v2";
#elif defined(__x86_64__)
  m.attr("BUILD_ISA") = "x86-64";
#else
  m.attr("BUILD_ISA") = "unknown";
#endif
}

// The cycle counter's calibration and the native self-tests (tests/test_selftest.py).
void bind_selftests(py::module_& m) {
  m.def("tsc_hz", [] {
    // Calibrates the cycle counter the worker's stage profiler reads.
    auto t0 = std::chrono::steady_clock::now();
    uint64_t c0 = __rdtsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
    }
    uint64_t c1 = __rdtsc();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(c1 - c0) / s;
  });
  m.def("selftest_merge_runs", [](uint64_t iterations, uint64_t seed) {
    // merge_runs (the transmit queues' reordering) against std::sort: random
    // distinct values cut into 1 to 9 ascending runs in random order, with
    // buffers reused from one round to the next as a worker reuses them.
    uint64_t mismatches = 0;
    XorShift rnd{seed | 1};
    std::vector<uint64_t> v, want, scratch;
    std::vector<uint32_t> runs;
    for (uint64_t it = 0; it < iterations; it++) {
      const size_t n = rnd() % 600, k = 1 + rnd() % 9;
      v.clear();
      for (size_t i = 0; i < n; i++) v.push_back(rnd() << 10 | i);  // distinct
      std::vector<size_t> cut;
      for (size_t i = 1; i < k && n; i++) cut.push_back(rnd() % n);
      cut.push_back(0);
      cut.push_back(n);
      std::sort(cut.begin(), cut.end());
      for (size_t i = 0; i + 1 < cut.size(); i++) std::sort(v.begin() + cut[i], v.begin() + cut[i + 1]);
      want = v;
      std::sort(want.begin(), want.end());
      merge_runs(v, scratch, runs, [](uint64_t a, uint64_t b) { return a < b; });
      if (v != want) mismatches++;
    }
    return mismatches;
  });
  m.def("selftest_gso", [](py::bytes vnet_and_frame, uint32_t mtu, uint32_t room, uint32_t pool_size) {
    // The AF_PACKET queue's cold path without a socket: a virtio_net_hdr and
    // the frame after it, as PACKET_VNET_HDR hands them over, through
    // decode_vnet and GsoCutter, `room` segments at a time from a pool of
    // `pool_size` packets (both small: a cut that spans bursts, as the queue's
    // does). Returns (frames out, "" or the name of the kind that refused it).
    const std::string in = vnet_and_frame;
    if (in.size() < sizeof(VnetHdr) + 14 || in.size() > 65536 + sizeof(VnetHdr))
      throw py::value_error("selftest_gso: a 10-byte virtio_net_hdr and a frame of 14..65536 bytes");
    VnetHdr vh;
    std::memcpy(&vh, in.data(), sizeof vh);
    const auto* f = reinterpret_cast<const uint8_t*>(in.data()) + sizeof vh;
    const uint32_t n = static_cast<uint32_t>(in.size() - sizeof vh);
    const FrameOffload off = decode_vnet(vh, 0);
    PacketPool pool(std::max<uint32_t>(pool_size, 1), std::max<uint32_t>(pool_size, 1));
    std::vector<Packet*> pkts(std::max<uint32_t>(room, 1));
    py::list out;
    GsoCutter cut;
    const uint32_t why = cut.start(f, n, off, mtu);
    if (why == GsoCutter::kNone) {  // as it came, its checksum finished
      std::vector<uint8_t> d(f, f + n);
      finish_partial(d.data(), n, off.csum_start, off.csum_offset);
      out.append(py::bytes(reinterpret_cast<const char*>(d.data()), n));
    } else if (why == 0) {
      while (cut.busy()) {
        const uint32_t k = cut.take(pool, pkts.data(), static_cast<uint32_t>(pkts.size()));
        if (!k) throw std::runtime_error("selftest_gso: no progress");
        for (uint32_t i = 0; i < k; i++) {
          out.append(py::bytes(reinterpret_cast<const char*>(pkts[i]->data()), pkts[i]->len));
          pool.put(pkts[i]);
        }
      }
    }
    return py::make_tuple(out, why && why != GsoCutter::kNone ? offload_fix(why).name : "");
  }, py::arg("vnet_and_frame"), py::arg("mtu") = 1500, py::arg("room") = kBatchMax, py::arg("pool_size") = 64);
  m.def("selftest_ct_tcp", [](uint64_t iterations, uint64_t seed) {
    uint64_t fast = 0, refused = 0;
    const uint64_t mismatches = ct_tcp_selftest(iterations, seed, &fast, &refused);
    return std::make_tuple(mismatches, fast, refused);
  });
  m.def("selftest_simd", [](uint64_t iterations, uint64_t seed) {
    // The vectorised helpers against their plain versions on random keys
    // (STYLE.md #8): fixed-size zeroing, the conntrack bucket scan, EMC
    // entries and their key compare, frame copies, and the key hash's
    // spread (both hashes must send 64k random keys to nearly all of 64k slots
    // the way a uniform hash would).
    uint64_t mismatches = 0;
    XorShift rnd{seed | 1};
    alignas(64) uint64_t a[kKeyWords];
    for (uint64_t it = 0; it < iterations; it++) {
      uint8_t buf[kKeyBytes + 16];
      std::memset(buf, 0xaa, sizeof buf);
      zero_fixed<kKeyBytes>(buf + 1);
      for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != ((i >= 1 && i < 1 + kKeyBytes) ? 0 : 0xaa)) mismatches++;
      // copy_frame against memcpy, every length around its vector cases
      uint8_t src[180], dst[200], ref[200];
      for (size_t i = 0; i < sizeof src; i++) src[i] = static_cast<uint8_t>(rnd());
      size_t len = rnd() % 170, at = rnd() % 8;
      std::memset(dst, 0x55, sizeof dst);
      std::memset(ref, 0x55, sizeof ref);
      copy_frame(dst + at, src + 3, len);
      std::memcpy(ref + at, src + 3, len);
      if (std::memcmp(dst, ref, sizeof dst) != 0) mismatches++;
    }
    mismatches += Conntrack::selftest_tag_matches(iterations, seed);  // the conntrack bucket's tag scan
    mismatches += Emc::selftest(iterations, seed);  // the EMC's split entries
    std::vector<uint8_t> seen_fast(1 << 16), seen_plain(1 << 16);
    for (int i = 0; i < (1 << 16); i++) {
      for (size_t k = 0; k < kKeyWords; k++) a[k] = 0;
      a[0] = static_cast<uint64_t>(i);  // keys that differ in few bits, like real flows
      a[11] = rnd() & 0xffff;
      seen_fast[hash_key_words(a, 7) & 0xffff] = 1;
      seen_plain[hash_key_words_plain(a, 7) & 0xffff] = 1;
    }
    size_t filled_fast = 0, filled_plain = 0;
    for (int i = 0; i < (1 << 16); i++) {
      filled_fast += seen_fast[i];
      filled_plain += seen_plain[i];
    }
    return py::make_tuple(mismatches, filled_fast, filled_plain);
  });
  // counters.def as data: {"traffic"|"port"|"worker": [(stats key, description)]}.
}

// The single lists (counters.def, errors.def, drop_reasons.def), exported.
void bind_lists(py::module_& m) {
  m.def("counters", [] {
    py::dict d;
    py::list traffic, port, worker;
#define DPU_TRAFFIC_COUNTER(m, h) traffic.append(py::make_tuple(#m, h));
#define DPU_PORT_COUNTER(m, h) port.append(py::make_tuple(#m, h));
#define DPU_WORKER_COUNTER(m, n, h) worker.append(py::make_tuple(n, h));
#include "dpu/counters.def"
#undef DPU_TRAFFIC_COUNTER
#undef DPU_PORT_COUNTER
#undef DPU_WORKER_COUNTER
    d["traffic"] = traffic;
    d["port"] = port;
    d["worker"] = worker;
    return d;
  });
  // counters.def's queue group: [(key in a live port's interfaces entry, description)].
  m.def("queue_counters", [] {
    py::list queue;
#define DPU_QUEUE_COUNTER(m, h) queue.append(py::make_tuple(#m, h));
#include "dpu/counters.def"
#undef DPU_QUEUE_COUNTER
    return queue;
  });
  // errors.def as data: [(code name, dpu.errors class name, meaning)]; dpu/errors.py builds its
  // name -> class mapping from it.
  m.def("errors", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> v;
#define DPU_ERR(name, cls, help) v.emplace_back(#name, #cls, help);
#include "dpu/errors.def"
#undef DPU_ERR
    return v;
  });
  // The first output that is an input (the same file), as (output index, input index), or None:
  // the one decision behind every "writing it would destroy an input" (runner.h).
  m.def(
      "find_overwrite",
      [](const std::vector<std::string>& outputs, const std::vector<std::string>& inputs) -> py::object {
        std::pair<int, int> hit;
        {
          NativeCall nogil;
          hit = find_overwrite(outputs, inputs);
        }
        return hit.first < 0 ? py::object(py::none()) : py::object(py::make_tuple(hit.first, hit.second));
      },
      py::arg("outputs"), py::arg("inputs"));
  m.def("drop_reasons", [] {
    std::vector<std::pair<std::string, std::string>> v;
    for (int r = 0; r < drop_reason_count(); r++) v.emplace_back(drop_reason_name(r), drop_reason_help(r));
    return v;
  });
  // What the core said since the last call (core_log.h), oldest first, and forgotten here:
  // [(level, seconds since the epoch, text)], for dpu.logs to log.
  m.def("take_log", [] {
    std::vector<std::tuple<std::string, double, std::string>> v;
    for (auto& r : corelog::take())
      v.emplace_back(corelog::level_name(r.level), static_cast<double>(r.unix_ns) / 1e9, std::move(r.text));
    return v;
  });

}

void bind_module_functions(py::module_& m) {
  bind_seam_facts(m);
  bind_selftests(m);
  bind_lists(m);
}

// ---- the streaming pcap replayer ------------------------------------------------------------
void bind_replayer(py::module_& m) {
  py::class_<Replayer, ExitSafePtr<Replayer>>(m, "Replayer")
      .def("run",
           [](Replayer& r, uint64_t max_packets) {
             Status st;
             bool more;
             {
               NativeCall nogil;
               more = r.run(max_packets, &st);
             }
             if (!st.ok()) {
               r.close();
               raise_status(st);
             }
             return more;
           })
      .def("close", [](Replayer& r) { check(r.close()); })
      .def_property_readonly("packets", &Replayer::packets)
      .def_property_readonly("bytes_done", &Replayer::bytes_done)
      .def_property_readonly("bytes_total", &Replayer::bytes_total)
      .def_property_readonly("drops_written", &Replayer::drops_written)
      .def("outputs", &Replayer::outputs);
}


// ---- live mode: worker threads on Linux interfaces --------------------------------------------
void bind_live(py::module_& m, DataplaneClass& c) {
  py::class_<LiveWorkers, ExitSafePtr<LiveWorkers>>(m, "Live")
      .def("start",
           [](LiveWorkers& r) {
             Status st;
             {
               NativeCall nogil;
               st = r.start();
             }
             check(st);
           })
      .def("stop",
           [](LiveWorkers& r) {
             NativeCall nogil;
             r.stop();
           })
      .def_property_readonly("running", &LiveWorkers::running)
      .def_property_readonly("drops_written", &LiveWorkers::drops_written)
      .def("check_drops", [](const LiveWorkers& r) { check(r.drops_status()); })
      .def("queue_stats", [](const LiveWorkers& r) {
        py::list out;
        for (const LiveQueueStats& q : r.queue_stats()) {
          py::dict d;
          d["ofport"] = q.ofport;
          d["ifname"] = q.ifname;
#define DPU_QUEUE_COUNTER(m, help) d[#m] = q.c.m;
#include "dpu/counters.def"
#undef DPU_QUEUE_COUNTER
          d["rx_truncated"] = q.c.rx_too_long;  // the old name of rx_too_long, kept for scripts
          py::list refused;  // super-frames it could not cut, by kind: (what they are, ethtool features to turn off)
          for (uint32_t b = 0; b < kOffloadKinds; b++)
            if (q.c.offload_kinds & (1u << b)) {
              const OffloadFix fx = offload_fix(1u << b);
              refused.append(py::make_tuple(fx.what, fx.features));
            }
          d["unsupported_offloads"] = refused;
          out.append(d);
        }
        return out;
      });
  c.def(
      "live",
      [](Dataplane& dp, const std::vector<std::pair<uint32_t, std::string>>& ports, const std::string& io,
         uint32_t burst, uint32_t idle_ms, uint32_t first_worker, const std::string& drops_pcap) {
        LiveConfig cfg;
        cfg.drops_pcap = drops_pcap;
        for (const auto& p : ports) cfg.ports.push_back({p.first, p.second});
        cfg.io = io;
        cfg.burst = std::max<uint32_t>(1, std::min<uint32_t>(burst, kBatchMax));
        cfg.idle_ms = idle_ms;
        cfg.first_worker = first_worker;
        return ExitSafePtr<LiveWorkers>(new LiveWorkers(&dp, std::move(cfg)));
      },
      py::arg("ports"), py::arg("io") = "afpacket", py::arg("burst") = kDefaultBurst, py::arg("idle_ms") = 1,
      py::arg("first_worker") = 0, py::arg("drops_pcap") = "",
      py::keep_alive<0, 1>());
}

// ---- traffic tools (benchmarks): a blaster and a counting receiver ------------------------------
void bind_traffic(py::module_& m) {
  m.def(
      "blast",
      [](const std::string& ifname, const py::bytes& buf, py::array_t<uint64_t> offsets, py::array_t<uint32_t> lens,
         double seconds, double rate_pps) {
        std::string data = buf;
        size_t n = static_cast<size_t>(offsets.size());
        if (static_cast<size_t>(lens.size()) != n) throw py::value_error("offsets and lens differ in length");
        const uint64_t* off = offsets.data();
        const uint32_t* ln = lens.data();
        for (size_t i = 0; i < n; i++)
          if (off[i] > data.size() || ln[i] > data.size() - off[i]) throw py::value_error("frame runs past the buffer");
        TrafficResult r;
        Status st;
        {
          NativeCall nogil;
          st = blast(ifname, reinterpret_cast<const uint8_t*>(data.data()), off, ln, n, seconds, rate_pps, &r);
        }
        check(st);
        return py::make_tuple(r.packets, r.bytes, r.seconds);
      },
      py::arg("ifname"), py::arg("data"), py::arg("offsets"), py::arg("lens"), py::arg("seconds"),
      py::arg("rate_pps") = 0.0);
  m.def(
      "count_rx",
      [](const std::string& ifname, double seconds) {
        TrafficResult r;
        Status st;
        {
          NativeCall nogil;
          st = count_rx(ifname, seconds, &r);
        }
        check(st);
        return py::make_tuple(r.packets, r.bytes, r.seconds);
      },
      py::arg("ifname"), py::arg("seconds"));
}

// Port names as of one moment, for formatting without the table lock.
class PortNameSnapshot : public PortNames {
 public:
  explicit PortNameSnapshot(Dataplane& dp) {
    for (const PortInfo& p : dp.ports()) {
      if (names_.size() <= p.ofport) names_.resize(p.ofport + 1);
      names_[p.ofport] = p.name;
    }
  }
  uint32_t port_number(std::string_view name) const override {
    for (size_t i = 0; i < names_.size(); i++)
      if (!names_[i].empty() && names_[i] == name) return static_cast<uint32_t>(i);
    return 0;
  }
  std::string port_name(uint32_t p) const override { return p < names_.size() ? names_[p] : std::string(); }

 private:
  std::vector<std::string> names_;
};

struct MegaflowRow {
  size_t worker;
  std::string match, actions;
  uint64_t n_packets, n_bytes;
  double used;  // seconds since last used, -1: never
};

// Every worker's megaflows (ovs-appctl dpctl/dump-flows), each worker's
// cache read under its mutex, between batches.
std::vector<MegaflowRow> dump_megaflows(Dataplane& dp) {
  PortNameSnapshot names(dp);
  std::vector<MegaflowRow> rows;
  for (size_t i = 0; i < dp.n_workers(); i++) {
    dp.worker(i).dump_megaflows([&](const MegaflowDump& d) {
      Match m;
      m.value = d.key;
      m.mask = d.mask;
      const double used = d.used_ns ? std::max<int64_t>(0, dp.now_ns() - d.used_ns) / 1e9 : -1.0;
      rows.push_back({i, format_match(m, 0, false, &names), format_dp_actions(*d.actions, &names), d.n_packets,
                      d.n_bytes, used});
    });
  }
  return rows;
}

// ---- control: transactions, ports, tenants, dumps ----------------------------------------------
void bind_control(DataplaneClass& c) {
  c.def(py::init<size_t>(), py::arg("workers") = 1)
      .def("apply", apply_txn, py::arg("txn"))
      .def("ports",
           [](Dataplane& dp) {
             py::list l;
             for (const PortInfo& p : dp.ports()) l.append(port_dict(p, dp));
             return l;
           })
      .def("tenants",
           [](Dataplane& dp) {
             py::list l;
             for (const auto& t : dp.tenants()) l.append(py::make_tuple(t.name, t.metadata, t.slot));
             return l;
           })
      .def("dump_flows",
           [](Dataplane& dp, const std::string& sel, bool strict) {
             std::vector<FlowDump> v;
             Status st;
             {
               NativeCall nogil;
               st = dp.dump_flows(sel, strict, &v);
             }
             check(st);
             py::list l;
             for (const FlowDump& f : v)
               l.append(py::make_tuple(f.table, f.priority, f.cookie, f.n_packets, f.n_bytes, f.duration, f.match,
                                       f.actions));
             return l;
           })
      .def("dump_groups",
           [](Dataplane& dp) {
             std::vector<GroupDump> v;
             {
               NativeCall nogil;
               v = dp.dump_groups();
             }
             py::list l;
             for (const GroupDump& g : v) l.append(py::make_tuple(g.group_id, g.text, g.n_packets, g.n_bytes));
             return l;
           })
      .def("dump_megaflows",
           [](Dataplane& dp) {
             std::vector<MegaflowRow> v;
             {
               NativeCall nogil;
               v = dump_megaflows(dp);
             }
             py::list l;
             for (const MegaflowRow& r : v)
               l.append(py::make_tuple(r.worker, r.match, r.n_packets, r.n_bytes, r.actions, r.used));
             return l;
           })
      .def(
          "tables",
          [](Dataplane& dp, bool sync) {
            std::vector<std::array<uint64_t, 3>> v;
            {
              NativeCall nogil;
              dp.table_counters(&v, sync);
            }
            return v;
          },
          py::arg("sync") = true);
}

// ---- counters ------------------------------------------------------------------------------------
void bind_counters(DataplaneClass& c) {
  c.def("stats",
           [](Dataplane& dp) {
             Totals t;
             {
               NativeCall nogil;
               t = dp.totals();
             }
             py::dict d;
             py::dict ports;
             for (const auto& pc : t.ports) ports[py::int_(pc.first)] = port_counters_dict(pc.second);
             d["ports"] = ports;
             py::list tenants;
             for (const TenantCounters& c : t.tenants) tenants.append(traffic_dict(c));
             d["tenants"] = tenants;
             py::dict total = worker_counters_dict(t.workers_total);
             total["megaflows"] = t.megaflows;
             d["workers_total"] = total;
             d["pmd"] = total;  // the old name of the same dict
             py::list workers;
             for (size_t i = 0; i < t.workers.size(); i++) {
               py::dict w = worker_counters_dict(t.workers[i]);
               w["megaflows"] = t.worker_megaflows[i];
               workers.append(w);
             }
             d["workers"] = workers;
             return d;
           });
}

// ---- trace -----------------------------------------------------------------------------------------
void bind_trace(DataplaneClass& c) {
  c.def("trace",
           [](Dataplane& dp, const py::bytes& pkt, uint32_t in_port) {
             std::string s = pkt;
             TraceResult tr;
             Status st;
             {
               NativeCall nogil;
               st = dp.trace(reinterpret_cast<const uint8_t*>(s.data()), s.size(), in_port, &tr);
             }
             check(st);
             py::list passes;
             for (const TracePass& p : tr.passes) {
               py::list events;
               for (const TraceEvent& e : p.events) {
                 static const char* kinds[] = {"table", "miss", "action", "note"};
                 py::dict ev;
                 ev["kind"] = kinds[e.kind];
                 ev["depth"] = e.depth;
                 ev["table"] = e.table;
                 ev["priority"] = e.priority;
                 ev["cookie"] = e.cookie;
                 ev["text"] = e.text;
                 events.append(ev);
               }
               py::dict d;
               d["in_port"] = dp.port_name(p.in_port);
               d["flow"] = p.flow;
               d["events"] = events;
               d["final_flow"] = p.final_flow;
               d["megaflow"] = p.megaflow;
               d["datapath_actions"] = p.actions;
               d["recirc_id"] = p.recirc_id;
               d["conntrack"] = p.conntrack;
               d["drop_reason"] = p.drop_reason ? py::cast(drop_reason_name(p.drop_reason)) : py::none();
               passes.append(d);
             }
             py::list outs;
             for (const auto& o : tr.outputs)
               outs.append(py::make_tuple(dp.port_name(o.first),
                                          py::bytes(reinterpret_cast<const char*>(o.second.data()), o.second.size())));
             py::dict d;
             d["passes"] = passes;
             d["outputs"] = outs;
             d["drop_reason"] = tr.drop_reason ? py::cast(drop_reason_name(tr.drop_reason)) : py::none();
             return d;
           });
}

// ---- packets: in-memory processing, benchmark loop, replay, worker knobs -------------------------------
void bind_packets(DataplaneClass& c) {
  c.def("process",
           [](Dataplane& dp, const py::bytes& data, py::array_t<uint64_t, py::array::c_style | py::array::forcecast> offsets,
              py::array_t<uint32_t, py::array::c_style | py::array::forcecast> lens,
              py::array_t<uint32_t, py::array::c_style | py::array::forcecast> ports, const py::object& ts_obj,
              size_t worker) {
             size_t n = static_cast<size_t>(offsets.size());
             std::string_view buf = data;
             const uint64_t* off = arr_ptr(offsets, n, "offsets");
             const uint32_t* ln = arr_ptr(lens, n, "lens");
             const uint32_t* pt = arr_ptr(ports, n, "ports");
             for (size_t i = 0; i < n; i++)
               if (off[i] > buf.size() || ln[i] > buf.size() - off[i]) throw py::value_error("packet " + std::to_string(i) + " runs past the buffer");
             py::array_t<uint64_t, py::array::c_style | py::array::forcecast> ts;
             const uint64_t* tsp = nullptr;
             if (!ts_obj.is_none()) {
               ts = ts_obj.cast<py::array_t<uint64_t, py::array::c_style | py::array::forcecast>>();
               tsp = arr_ptr(ts, n, "timestamps");
             }
             MemOutput out;
             Status st;
             {
               NativeCall nogil;
               st = process_buffers(&dp, reinterpret_cast<const uint8_t*>(buf.data()), off, ln, pt, tsp, n, &out, worker);
             }
             check(st);
             size_t k = out.pkts.size();
             py::array_t<uint32_t> o_port(k), o_index(k), o_off(k), o_len(k);
             py::array_t<uint64_t> o_ts(k);
             auto a = o_port.mutable_unchecked<1>();
             auto b = o_index.mutable_unchecked<1>();
             auto c = o_off.mutable_unchecked<1>();
             auto e = o_len.mutable_unchecked<1>();
             auto f = o_ts.mutable_unchecked<1>();
             for (size_t i = 0; i < k; i++) {
               a(i) = out.pkts[i].port;
               b(i) = out.pkts[i].index;
               c(i) = out.pkts[i].offset;
               e(i) = out.pkts[i].len;
               f(i) = out.pkts[i].ts_ns;
             }
             return py::make_tuple(py::bytes(reinterpret_cast<const char*>(out.data.data()), out.data.size()), o_port,
                                   o_index, o_off, o_len, o_ts);
           },
           py::arg("data"), py::arg("offsets"), py::arg("lens"), py::arg("ports"), py::arg("timestamps"),
           py::arg("worker") = 0)
      .def("bench",
           [](Dataplane& dp, const py::bytes& data, py::array_t<uint64_t, py::array::c_style | py::array::forcecast> offsets,
              py::array_t<uint32_t, py::array::c_style | py::array::forcecast> lens,
              py::array_t<uint32_t, py::array::c_style | py::array::forcecast> ports, uint64_t total, uint32_t burst,
              py::object check) {
             if (burst < 1 || burst > kBatchMax)
               throw py::value_error("burst: 1.." + std::to_string(kBatchMax) + ", got " + std::to_string(burst));
             size_t n = static_cast<size_t>(offsets.size());
             std::string_view buf = data;
             const uint64_t* off = arr_ptr(offsets, n, "offsets");
             const uint32_t* ln = arr_ptr(lens, n, "lens");
             const uint32_t* pt = arr_ptr(ports, n, "ports");
             for (size_t i = 0; i < n; i++) {
               if (off[i] > buf.size() || ln[i] > buf.size() - off[i]) throw py::value_error("packet runs past the buffer");
               if (ln[i] > Packet::max_capacity()) throw py::value_error("packet larger than a buffer");
             }
             const Status ports_ok = check_input_ports(&dp, pt, n, false);  // (`check` is the argument here)
             if (!ports_ok.ok()) raise_status(ports_ok);
             BenchCheck bc;
             if (!check.is_none()) {  // (base version, routes): churn-hit's stamps (runner.h)
               auto t = check.cast<std::pair<uint64_t, uint32_t>>();
               if (t.second == 0) throw py::value_error("check: routes must be at least 1");
               bc.on = true;
               bc.base = t.first;
               bc.routes = t.second;
             }
             BenchStats bs;
             {
               NativeCall nogil;
               bs = bench_run(&dp, reinterpret_cast<const uint8_t*>(buf.data()), off, ln, pt, n, total, burst, &bc);
             }
             if (bc.on) return py::tuple(py::make_tuple(bs.packets, bs.seconds, bc.checked, bc.wrong));
             return py::tuple(py::make_tuple(bs.packets, bs.seconds));
           },
           py::arg("data"), py::arg("offsets"), py::arg("lens"), py::arg("ports"), py::arg("total"),
           py::arg("burst") = kDefaultBurst, py::arg("check") = py::none())
      .def("replayer",
           [](Dataplane& dp, const std::vector<std::pair<uint32_t, std::string>>& inputs, const std::string& out_dir,
              const std::string& drops_pcap) {
             std::vector<ReplayInput> in;
             for (const auto& i : inputs) in.push_back({i.first, i.second});
             ExitSafePtr<Replayer> r(new Replayer(&dp, std::move(in), out_dir, drops_pcap));
             Status st;
             {
               NativeCall nogil;
               st = r->open();
             }
             check(st);
             return r;
           },
           py::arg("inputs"), py::arg("out_dir"), py::arg("drops_pcap") = "", py::keep_alive<0, 1>())
      .def("replay_outputs",
           [](Dataplane& dp, const std::string& out_dir) {
             std::vector<std::pair<std::string, std::string>> v;
             for (const ReplayOutput& o : replay_outputs(&dp, out_dir)) v.emplace_back(o.port, o.path);
             return v;
           },
           py::arg("out_dir"), "(port, file) of each file a replay into out_dir writes")
      .def("set_profile",
           [](Dataplane& dp, bool on) {
             NativeCall nogil;
             dp.worker(0).set_profile(on);
           })
      .def("set_emc_insert_inv_prob",
           [](Dataplane& dp, uint32_t n) {
             NativeCall nogil;
             dp.worker(0).set_emc_insert_inv_prob(n);
           })
      .def("set_fast_tunnel",
           [](Dataplane& dp, bool on) {
             NativeCall nogil;
             dp.worker(0).set_fast_tunnel(on);
           })
      .def("set_max_megaflows",
           [](Dataplane& dp, size_t n) {
             NativeCall nogil;
             dp.worker(0).set_max_megaflows(n);
           })
      .def("version", &Dataplane::version)
      .def("warp", &Dataplane::warp)
      .def("stop_clock", &Dataplane::stop_clock)
      .def("port_number", &Dataplane::port_number)
      .def("port_name", &Dataplane::port_name);
}

}  // namespace

// setup.py builds this once per instruction-set level, as dpu._core_v1, dpu._core_v3...
// (DPU_CORE_MODULE; BUILD_ISA says which); dpu/_core.py imports the one the CPU runs best under
// the name dpu._core, which is what the classes call themselves whichever build it is.
#ifndef DPU_CORE_MODULE
#define DPU_CORE_MODULE _core
#endif
PYBIND11_MODULE(DPU_CORE_MODULE, m) {
  m.attr("__name__") = "dpu._core";  // before any class: their __module__ and signatures
  m.doc() = "dpu native core (see native/ and DESIGN.md)";
  py::module_::import("atexit").attr("register")(py::cpp_function(&close_exit_gate));
  // a forked child has only the forking thread: no call in flight, and a mutex some other thread
  // may have held at the fork
  pthread_atfork(nullptr, nullptr, [] { g_exit = new ExitGate; });
  bind_module_functions(m);
  bind_txn(m);
  bind_replayer(m);
  DataplaneClass dp(m, "Dataplane");
  bind_control(dp);
  bind_counters(dp);
  bind_trace(dp);
  bind_packets(dp);
  bind_conntrack(dp);
  bind_live(m, dp);
  bind_traffic(m);
}
