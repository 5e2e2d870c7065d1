// ct_other.cc: UDP and ICMP echo pseudo-connections, and the protocol table.
//
// A UDP flow or an ICMP query (echo, timestamp) is a connection from its
// first packet until it has been idle for its timeout (UDP 5 minutes, RFC
// 4787 REQ-5; ICMP 60 seconds, RFC 5508 REQ-1). Packets in the original
// direction are +new until a reply has been seen, +est after (as Open
// vSwitch); only a query starts an ICMP connection, so an unsolicited echo
// reply is +inv.
#include "ct_proto.h"

namespace dpu {
namespace {

bool udp_valid_new(const CtPacket&) { return true; }

bool icmp_valid_new(const CtPacket& p) {
  uint8_t type;
  std::memcpy(&type, &p.key.dport, 1);
  return p.key.v6 ? type == 128 : (type == 8 || type == 13);
}

void udp_init(Conn* c, const CtPacket&) {
  c->set_other_state(0);
  c->tmo = TM_UDP;
}

void icmp_init(Conn* c, const CtPacket&) {
  c->set_other_state(0);
  c->tmo = TM_ICMP;
}

CtUpdate other_update(Conn* c, const CtPacket&, bool reply) { return ct_other_update(c, reply); }

const char* no_state(const Conn*) { return nullptr; }

}  // namespace

const CtProto kCtUdp = {udp_valid_new, udp_init, other_update, no_state};
const CtProto kCtIcmp = {icmp_valid_new, icmp_init, other_update, no_state};

const CtProto& ct_proto(uint8_t ip_proto) {
  switch (ip_proto) {
    case kIpTcp: return kCtTcp;
    case kIpUdp: return kCtUdp;
    default: return kCtIcmp;
  }
}

}  // namespace dpu
