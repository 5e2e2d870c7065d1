// trace.cc: dpu trace (as ovs-appctl ofproto/trace): Dataplane::trace and its text.
//
// A trace runs one packet through a private Worker whose recorder gets every
// pass (the slow path's table walk, TraceEvents, for each lookup: the first,
// after a tunnel pop, after conntrack) and every conntrack result, and whose
// sink keeps what the datapath emitted. Here the passes become text: the
// "Flow:" and "Final flow:" lines (flow_text), the megaflow, the datapath
// actions (dp_format.h) and conntrack's verdicts. Counters are untouched; the
// control mutex is held for the trace, like a commit.
#include <cstring>

#include <arpa/inet.h>

#include "dataplane.h"
#include "dp_format.h"
#include "worker.h"

namespace dpu {

// "Flow:" text: every field that exists for this kind of packet.
std::string Dataplane::flow_text(const Flow& f, bool with_pipeline, const PortNames* ports) const {
  Match m;
  Flow& k = m.mask;
  k.in_port = 0xffffffffu;
  if (f.tun_flags & kTunPresent) {
    k.tun_id = ~0ull;
    if (f.tun_flags & kTunIpv6) {
      std::memset(k.tun_ipv6_src, 0xff, 32);
    } else {
      k.tun_src = k.tun_dst = 0xffffffffu;
    }
  }
  if (f.ct_state) {
    k.ct_state = 0xff;
    k.ct_zone = 0xffff;
    k.ct_mark = 0xffffffffu;
    std::memset(k.ct_label, 0xff, 16);
    if (f.ct_nw_proto) {
      k.ct_nw_proto = 0xff;
      k.ct_tp_src = k.ct_tp_dst = 0xffff;
      if (f.dl_type == be16(kEthIpv6)) std::memset(k.ct_ipv6_src, 0xff, 32);
      else k.ct_nw_src = k.ct_nw_dst = 0xffffffffu;
    }
  }
  std::memset(k.dl_dst, 0xff, 12);
  k.dl_type = 0xffff;
  k.vlan_tci = 0xffff;
  uint16_t t = be16(f.dl_type);
  if (t == kEthIp || t == kEthIpv6) {
    if (t == kEthIp) k.nw_src = k.nw_dst = 0xffffffffu;
    else std::memset(k.ipv6_src, 0xff, 32);
    k.nw_proto = k.nw_tos = k.nw_ttl = 0xff;
    k.nw_frag = 3;
    if (!(f.nw_frag & kFragLater) &&
        (f.nw_proto == kIpTcp || f.nw_proto == kIpUdp || f.nw_proto == kIpSctp || f.nw_proto == kIpIcmp ||
         f.nw_proto == kIpIcmpv6))
      k.tp_src = k.tp_dst = 0xffff;
    if (f.nw_proto == kIpTcp) k.tcp_flags = be16(0x0fff);
  } else if (t == kEthArp) {
    k.nw_src = k.nw_dst = 0xffffffffu;
    k.nw_proto = 0xff;
    std::memset(k.arp_sha, 0xff, 12);
  }
  if (with_pipeline) {
    if (f.metadata) k.metadata = ~0ull;
    for (int i = 0; i < 8; i++)
      if (f.regs[i]) k.regs[i] = 0xffffffffu;
  }
  flow_and(m.value, f, m.mask);
  return format_match(m, 0, false, ports);
}

// "tcp 10.0.1.11:40000 > 198.51.100.1:80" (ICMP: "icmp 10.0.1.11 > 8.8.8.8 id 7 type 8").
static std::string tuple_text(const CtKey& k) {
  auto addr = [&](const uint32_t* a) {
    char b[64];
    inet_ntop(k.v6 ? AF_INET6 : AF_INET, a, b, sizeof b);
    return std::string(b);
  };
  std::string proto = k.proto == kIpTcp ? "tcp" : k.proto == kIpUdp ? "udp" : k.proto == kIpIcmp ? "icmp"
                      : k.proto == kIpIcmpv6 ? "icmpv6" : std::to_string(k.proto);
  if (k.proto == kIpIcmp || k.proto == kIpIcmpv6) {
    uint8_t tc[2];
    std::memcpy(tc, &k.dport, 2);
    return proto + " " + addr(k.src) + " > " + addr(k.dst) + " id " + std::to_string(be16(k.sport)) + " type " +
           std::to_string(tc[0]);
  }
  return proto + " " + addr(k.src) + ":" + std::to_string(be16(k.sport)) + " > " + addr(k.dst) + ":" +
         std::to_string(be16(k.dport));
}

static std::string ct_result_text(const CtSpec& spec, const CtResult& r) {
  std::string s = "conntrack zone " + std::to_string(spec.zone) + ": ";
  if (r.drop != DROP_NONE) return s + tuple_text(r.before) + ": dropped (" + drop_reason_name(r.drop) + ")";
  s += "ct_state=" + format_field_value(field_def(FieldId::CT_STATE), r.state, r.state, nullptr);
  if (r.state & kCsInvalid) return s;
  s += " " + tuple_text(r.before);
  if (r.created) s += ", new connection committed (a trace commits nothing)";
  if (r.nat_applied) s += ", translated to " + tuple_text(r.after);
  if (r.mark) s += ", ct_mark=" + hex_u128(r.mark);
  if (r.label) s += ", ct_label=" + hex_u128(r.label);
  if (spec.recirc_id) s += "; recirculate (recirc_id=" + std::to_string(spec.recirc_id) + ")";
  return s;
}

// A trace is the packet through a private worker that walks the tables on
// every pass, records each walk and each conntrack result, changes no
// connection (dry run) and credits no rule; what that worker emits is what
// the datapath would emit.
// A trace is the packet through a private worker that walks the tables on
// every pass, records each walk and each conntrack result, changes no
// connection (dry run) and credits no rule; what that worker emits is what
// the datapath would emit. The control mutex is held throughout: the trace
// sees one version, whose ports name what it shows.
Status Dataplane::trace(const uint8_t* pkt, size_t len, uint32_t in_port, TraceResult* out) {
  std::lock_guard<std::mutex> guard(mu_);
  const Config& cur = *config_.load(std::memory_order_relaxed);
  if (!cur.ports->get(in_port)) return unknown_input_port(in_port);
  if (len > Packet::max_capacity())
    return Status::Error(Err::INVALID, "packet of " + std::to_string(len) + " bytes exceeds the " +
                                           std::to_string(Packet::max_capacity()) + "-byte maximum frame");
  class Recorder : public TraceRecorder, public PortSink {
   public:
    Recorder(const Dataplane* dp, const PortTable* ports, TraceResult* o) : dp_(dp), ports_(ports), o_(o) {}
    void walk(const Flow& key, const XlateOut& xo, std::vector<TraceEvent>&& events) override {
      TracePass tp;
      tp.in_port = key.in_port;
      tp.recirc_id = key.recirc_id;
      tp.events = std::move(events);
      tp.actions = format_dp_actions(xo.actions, ports_);
      tp.drop_reason = xo.drop_reason;
      tp.flow = dp_->flow_text(key, false, ports_);
      tp.final_flow = dp_->flow_text(xo.final_flow, true, ports_);
      Match mf;
      mf.mask = xo.wc;
      std::memset(reinterpret_cast<uint8_t*>(&mf.mask) + kKeyBytes, 0, sizeof(Flow) - kKeyBytes);
      flow_and(mf.value, key, mf.mask);
      tp.megaflow = format_match(mf, 0, false, ports_);
      o_->passes.push_back(std::move(tp));
    }
    void conntrack(const CtSpec& spec, const CtResult& r) override {
      if (!o_->passes.empty()) o_->passes.back().conntrack.push_back(ct_result_text(spec, r));
    }
    uint32_t send(uint32_t port, Packet* const* pkts, uint32_t n) override {
      for (uint32_t i = 0; i < n; i++)
        o_->outputs.emplace_back(port, std::vector<uint8_t>(pkts[i]->data(), pkts[i]->data() + pkts[i]->len));
      return n;
    }

   private:
    const Dataplane* dp_;
    const PortTable* ports_;
    TraceResult* o_;
  } rec(this, cur.ports.get(), out);
  Worker w(this, 256);
  w.set_trace(&rec);
  w.set_sink(&rec);
  Batch b;
  Packet* p = w.pool().get_for(static_cast<uint32_t>(len));
  std::memcpy(p->data(), pkt, len);
  p->len = static_cast<uint16_t>(len);
  p->md.in_port = in_port;
  b.push(p);
  w.process(b);
  for (size_t i = 0; i < w.ports().size(); i++)
    for (int r = 1; r < DROP_COUNT; r++)
      if (w.ports()[i].drops[r]) out->drop_reason = static_cast<uint16_t>(r);
  return Status::Ok();
}

}  // namespace dpu
