// conntrack.cc: the connection table, its workers' expiry wheels, and the
// conntrack stage's per-packet decision (see conntrack.h).
#include "conntrack.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_set>

#include "dpu/mem.h"

namespace dpu {

namespace {
constexpr size_t kChunkBytes = 2u << 20;  // one huge page of connections
constexpr uint32_t kChunkConns = kChunkBytes / sizeof(Conn);
constexpr size_t kQuotaSweep = 1024;  // extra expiry work before refusing a connection over a limit

uint8_t nat_flags(uint8_t conn_nat, int dir) {
  // A reply reverses the translation: un-SNAT rewrites its destination.
  uint8_t f = 0;
  if (conn_nat & kNatSrc) f |= dir ? kCsDstNat : kCsSrcNat;
  if (conn_nat & kNatDst) f |= dir ? kCsSrcNat : kCsDstNat;
  return f;
}
}  // namespace

// ---- configuration -------------------------------------------------------------------------

Conntrack::Conntrack() : stripes_(new Stripe[kStripes]), zones_(new ZoneState[65536]) { set_config(CtConfig()); }

Conntrack::~Conntrack() {  // workers detach first (they belong to the dataplane's workers)
  if (Bucket* bs = buckets()) huge_free_zeroed(bs, (static_cast<size_t>(mask_) + 1) * sizeof(Bucket));
}

void Conntrack::set_config(const CtConfig& c) {
  for (int i = 0; i < TM_COUNT; i++) timeout_ns_[i].store(c.timeout_ns[i], std::memory_order_relaxed);
  max_conns_.store(c.max_conns, std::memory_order_relaxed);
}

CtConfig Conntrack::config() const {
  CtConfig c;
  for (int i = 0; i < TM_COUNT; i++) c.timeout_ns[i] = timeout_ns_[i].load(std::memory_order_relaxed);
  c.max_conns = max_conns_.load(std::memory_order_relaxed);
  return c;
}

void Conntrack::set_zones(const std::vector<std::pair<uint16_t, CtZoneCfg>>& zones) {
  std::vector<bool> eif(65536, false);
  for (const auto& kv : zones) eif[kv.first] = kv.second.eif;
  for (uint32_t z = 0; z < 65536; z++) {
    zones_[z].limit.store(0, std::memory_order_relaxed);
    if (eif[z] && !zones_[z].eif.load(std::memory_order_relaxed)) nat_.make_reachable(static_cast<uint16_t>(z));
    zones_[z].eif.store(eif[z], std::memory_order_relaxed);
  }
  for (const auto& kv : zones) zones_[kv.first].limit.store(kv.second.limit, std::memory_order_relaxed);
}

std::unique_ptr<CtWorker> Conntrack::attach() {
  int slot = epoch_.acquire();
  auto w = std::make_unique<CtWorker>(this, slot);
  std::lock_guard<std::mutex> g(workers_mu_);
  workers_.push_back(w.get());
  return w;
}

int64_t Conntrack::now(int64_t mono, int64_t packet_ts) {
  const int64_t rel = mono - origin_;
  int64_t off = offset_.load(std::memory_order_relaxed);
  while (packet_ts > rel + off && !offset_.compare_exchange_weak(off, packet_ts - rel, std::memory_order_relaxed)) {
  }
  off = offset_.load(std::memory_order_relaxed);
  const int64_t t = rel + off;
  int64_t cur = clock_.load(std::memory_order_relaxed);
  while (t > cur && !clock_.compare_exchange_weak(cur, t, std::memory_order_relaxed)) {
  }
  return std::max(t, cur);
}

void Conntrack::sweep_others(const CtWorker* self, int64_t now, size_t budget) {
  std::lock_guard<std::mutex> g(workers_mu_);
  for (CtWorker* w : workers_) {
    if (w == self || !w->try_lock()) continue;
    w->sweep_locked(now, budget);
    w->unlock();
  }
}

// ---- the table -------------------------------------------------------------------------------

uint32_t Conntrack::buckets_for(uint32_t max_conns) {
  uint32_t n = 512;
  while (n < max_conns / 2 && n < kMaxBuckets) n <<= 1;
  return n;
}

void Conntrack::ensure_table() {
  if (buckets()) return;
  std::lock_guard<std::mutex> g(table_mu_);
  if (buckets()) return;
  const uint32_t n = buckets_for(max_conns_.load(std::memory_order_relaxed));
  // All-zero memory is a table of empty buckets (lock-free atomics of
  // words and pointers): nothing is cleared here, on the first connection's
  // packet path; pages are zeroed as they are first touched.
  // (The buckets are not constructed: an atomic of a lock-free word is its
  // value's bytes, as on every platform dpu builds for.)
  static_assert(std::is_trivially_destructible<Bucket>::value, "buckets are released as raw memory");
  static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<CtNode*>::is_always_lock_free,
                "a bucket's words are plain memory");
  auto* bs = static_cast<Bucket*>(huge_alloc_zeroed(static_cast<size_t>(n) * sizeof(Bucket)));
  mask_ = n - 1;
  buckets_.store(bs, std::memory_order_release);
}

// A reply key (the reverse of the original) as source NAT to public
// address `ea` and port `ep` makes it.
static void set_snat_reply(CtKey* reply, uint32_t ea, uint16_t ep) {
  reply->dst[0] = ea;
  if (reply->proto == kIpIcmp || reply->proto == kIpIcmpv6) reply->sport = ep;  // the echo identifier, both ways
  else reply->dport = ep;
}

void Conntrack::prefetch_snat_reply(const CtPrep& pr, const CtSpec& spec) const {
  const CtKey& k = pr.cp.key;
  uint32_t ea;
  uint16_t ep;
  if (!nat_.predict(spec.zone, k.proto, k.src[0], k.sport, spec.range, &ea, &ep)) return;
  CtKey reply = ct_key_reverse(k);
  set_snat_reply(&reply, ea, ep);
  prefetch_head(ct_key_hash(reply));
}

bool Conntrack::bucket_empty(const Bucket& b) {
  uint64_t any = reinterpret_cast<uintptr_t>(b.chain.load(std::memory_order_relaxed));
  for (const auto& s : b.slot) any |= s.load(std::memory_order_relaxed);
  return any == 0;
}

uint64_t Conntrack::selftest_tag_matches(uint64_t iterations, uint64_t seed) {
  XorShift rnd{seed | 1};
  uint64_t mismatches = 0;
  Bucket b;
  for (uint64_t it = 0; it < iterations; it++) {
    // Tag 0 too: an empty slot must not match it.
    const uint64_t tag = rnd() % 8 == 0 ? 0 : rnd() & ((uint64_t{1} << 17) - 1);
    for (auto& s : b.slot) {  // empty, the tag sought, or another, over a random aligned address
      const uint64_t r = rnd(), t = (r & 3) == 0 ? 0 : (r & 3) == 1 ? tag : (r >> 8) & 0x1ffff;
      s.store(r & 4 ? 0 : t << kTagShift | ((rnd() & ((uint64_t{1} << kTagShift) - 1)) & ~uint64_t{62}),
              std::memory_order_relaxed);
    }
    b.chain.store(reinterpret_cast<CtNode*>(rnd() & 1 ? 0 : tag << kTagShift), std::memory_order_relaxed);
    if (tag_matches(b, tag) != tag_matches_plain(b, tag)) mismatches++;
  }
  return mismatches;
}

Conn* Conntrack::lookup(const CtKey& k, uint32_t h, int64_t now, int* dir) const {
  Bucket* bs = buckets();
  if (!bs) return nullptr;
  const Bucket& b = bs[h & mask_];
  const uint64_t tag = tag_of(h);
  for (uint32_t m = tag_matches(b, tag); m; m &= m - 1) {
    const uint64_t e = b.slot[__builtin_ctz(m)].load(std::memory_order_acquire);
    if (!e || (e >> kTagShift) != tag) continue;  // changed since
    Conn* c = conn_of(e);
    const int d = static_cast<int>(e & 1);
    if (ct_key_eq(c->key[d], k) && live(c, now)) {
      *dir = d;
      return c;
    }
  }
  for (CtNode* n = b.chain.load(std::memory_order_acquire); n; n = n->next.load(std::memory_order_acquire)) {
    if (n->hash != h) continue;
    Conn* c = Conn::of(n);
    if (ct_key_eq(c->key[n->dir], k) && live(c, now)) {
      *dir = n->dir;
      return c;
    }
  }
  return nullptr;
}

// A connection's keys and hashes never change once it is published, and its
// memory stays a connection's while its owner's wheel holds it.
// Its NAT mapping pointer is read atomically: a flush may release it.
void Conntrack::prefetch_buckets(const Conn* c) const {
  Bucket* bs = buckets();
  dpu::prefetch_w(&bs[c->node[0].hash & mask_]);
  dpu::prefetch_w(&bs[c->node[1].hash & mask_]);
  if (const NatMapping* m = __atomic_load_n(&c->mapping, __ATOMIC_RELAXED)) NatTable::prefetch_mapping(m);
}

void Conntrack::prefetch_mapping_slot(const Conn* c) const {
  if (const NatMapping* m = __atomic_load_n(&c->mapping, __ATOMIC_RELAXED)) nat_.prefetch_release(m);
}

template <class F>
void Conntrack::for_each_node(const Bucket& b, F&& f) const {
  for (const auto& s : b.slot) {
    const uint64_t e = s.load(std::memory_order_relaxed);
    if (e) f(&conn_of(e)->node[e & 1]);
  }
  for (CtNode* n = b.chain.load(std::memory_order_relaxed); n; n = n->next.load(std::memory_order_relaxed)) f(n);
}

void Conntrack::lock2(uint32_t b0, uint32_t b1) {
  uint32_t s0 = b0 & (kStripes - 1), s1 = b1 & (kStripes - 1);
  if (s0 > s1) std::swap(s0, s1);
  stripes_[s0].lock();
  if (s1 != s0) stripes_[s1].lock();
}

void Conntrack::unlock2(uint32_t b0, uint32_t b1) {
  uint32_t s0 = b0 & (kStripes - 1), s1 = b1 & (kStripes - 1);
  stripes_[s0].unlock();
  if (s1 != s0) stripes_[s1].unlock();
}

void Conntrack::link(CtNode* n, uint32_t b) {
  Bucket& bk = buckets()[b];
  const uint64_t e = entry_of(n, n->hash);
  for (auto& s : bk.slot) {
    if (s.load(std::memory_order_relaxed) == 0) {
      s.store(e, std::memory_order_release);
      return;
    }
  }
  n->next.store(bk.chain.load(std::memory_order_relaxed), std::memory_order_relaxed);
  bk.chain.store(n, std::memory_order_release);
}

// A removed chain node keeps its next pointer, so a reader standing on it walks on.
void Conntrack::unlink(CtNode* n, uint32_t b) {
  Bucket& bk = buckets()[b];
  const uint64_t e = entry_of(n, n->hash);
  for (auto& s : bk.slot) {
    if (s.load(std::memory_order_relaxed) == e) {
      s.store(0, std::memory_order_release);
      return;
    }
  }
  std::atomic<CtNode*>* prev = &bk.chain;
  for (CtNode* cur = prev->load(std::memory_order_relaxed); cur; cur = cur->next.load(std::memory_order_relaxed)) {
    if (cur == n) {
      prev->store(n->next.load(std::memory_order_relaxed), std::memory_order_release);
      return;
    }
    prev = &cur->next;
  }
}

bool Conntrack::insert(Conn* c, int64_t now, Conn** existing) {
  *existing = nullptr;
  const uint32_t b0 = c->node[0].hash & mask_, b1 = c->node[1].hash & mask_;
  lock2(b0, b1);
  int dir;
  Conn* same = lookup(c->key[0], c->node[0].hash, now, &dir);  // another worker was faster
  Conn* clash = same ? nullptr : lookup(c->key[1], c->node[1].hash, now, &dir);
  if (same || clash) {
    unlock2(b0, b1);
    *existing = same;
    return false;
  }
  c->life.fetch_add(1, std::memory_order_release);  // published (even): keys, NAT and state are written
  link(&c->node[0], b0);
  link(&c->node[1], b1);
  unlock2(b0, b1);
  return true;
}

bool Conntrack::remove(Conn* c, CtReleases* later) {
  const uint32_t b0 = c->node[0].hash & mask_, b1 = c->node[1].hash & mask_;
  lock2(b0, b1);
  if (c->dead(std::memory_order_relaxed)) {
    unlock2(b0, b1);
    return false;
  }
  unlink(&c->node[0], b0);
  unlink(&c->node[1], b1);
  c->life.fetch_add(1, std::memory_order_release);  // odd: out of the table
  unlock2(b0, b1);
  NatMapping* m = c->mapping;
  if (m) __atomic_store_n(&c->mapping, nullptr, __ATOMIC_RELAXED);  // read by the owner's expiry prefetch
  if (!later) {
    release(c->zone);
    nat_.release(m);
    return true;
  }
  const uint16_t zone = c->zone;
  auto z = std::find_if(later->zones.begin(), later->zones.end(), [&](const auto& e) { return e.first == zone; });
  if (z == later->zones.end()) later->zones.push_back({zone, 1});
  else z->second++;
  if (m) later->maps.push_back(m);
  return true;
}

void Conntrack::release(CtReleases* later) {
  uint32_t total = 0;
  for (const auto& [zone, n] : later->zones) {
    zones_[zone].count.fetch_sub(n, std::memory_order_relaxed);
    total += n;
  }
  if (total) count_.fetch_sub(total, std::memory_order_relaxed);
  nat_.release(later->maps.data(), later->maps.size());
  later->zones.clear();
  later->maps.clear();
}

uint16_t Conntrack::admit(uint16_t zone) {
  if (count_.fetch_add(1, std::memory_order_relaxed) >= max_conns_.load(std::memory_order_relaxed)) {
    count_.fetch_sub(1, std::memory_order_relaxed);
    return DROP_CT_TABLE_FULL;
  }
  ZoneState& z = zones_[zone];
  uint32_t limit = z.limit.load(std::memory_order_relaxed);
  if (z.count.fetch_add(1, std::memory_order_relaxed) >= limit && limit) {
    z.count.fetch_sub(1, std::memory_order_relaxed);
    count_.fetch_sub(1, std::memory_order_relaxed);
    return DROP_CT_QUOTA;
  }
  return DROP_NONE;
}

void Conntrack::release(uint16_t zone) {
  zones_[zone].count.fetch_sub(1, std::memory_order_relaxed);
  count_.fetch_sub(1, std::memory_order_relaxed);
}

__attribute__((always_inline)) inline void Conntrack::refresh(Conn* c, int64_t now) const {
  c->expires.store(now + timeout_ns_[c->tmo].load(std::memory_order_relaxed), std::memory_order_relaxed);
}

// ct(commit, exec(set_field:..->ct_mark, set_field:..->ct_label)).
// A change of either adds 2 to the life count (conn.h), after the new value:
// a worker that read the count before the mark and label, and finds it
// unchanged, read the current ones. Writing the value a field already holds
// changes nothing.
void Conntrack::exec(Conn* c, const CtSpec& spec) const {
  if (!spec.set_mark && !spec.set_label) return;
  c->spin_lock();
  bool changed = false;
  if (spec.set_mark) {
    const uint32_t m = c->mark.load(std::memory_order_relaxed);
    const uint32_t v = (m & ~spec.mark_mask) | (spec.mark & spec.mark_mask);
    changed |= v != m;
    c->mark.store(v, std::memory_order_relaxed);
  }
  if (spec.set_label) {
    const u128 l = (static_cast<u128>(c->label_hi.load(std::memory_order_relaxed)) << 64) |
                   c->label_lo.load(std::memory_order_relaxed);
    const u128 v = (l & ~spec.label_mask) | (spec.label & spec.label_mask);
    changed |= v != l;
    c->label_hi.store(static_cast<uint64_t>(v >> 64), std::memory_order_relaxed);
    c->label_lo.store(static_cast<uint64_t>(v), std::memory_order_relaxed);
    c->labelled.store(1, std::memory_order_release);
  }
  if (changed) c->life.fetch_add(2, std::memory_order_release);
  c->spin_unlock();
}

__attribute__((always_inline)) inline void Conntrack::fill_result(Conn* c, int dir, CtResult* r, const CtPacket* cp,
                                                                  const CtXlat* other) const {
  r->conn = c;
  r->dir = static_cast<uint8_t>(dir);
  r->life = c->life.load(std::memory_order_acquire);  // before the mark and the label (exec())
  r->mark = c->mark.load(std::memory_order_relaxed);
  r->label = 0;
  if (c->labelled.load(std::memory_order_acquire))  // else the third line is not read
    r->label = (static_cast<u128>(c->label_hi.load(std::memory_order_relaxed)) << 64) |
               c->label_lo.load(std::memory_order_relaxed);
  r->have_tuple = true;
  if (!other) {
    r->orig = c->key[0];
  } else if (dir == 0) {  // the packet's own tuple (NAT rewrote its bytes, not cp->key)
    r->orig = cp->key;
  } else {  // key[0], as the translation the packet's key was paired with names it (IPv4)
    const uint32_t ports = static_cast<uint32_t>(other->sport) | static_cast<uint32_t>(other->dport) << 16;
    ct_key_set_v4(&r->orig, other->src, other->dst, ports, cp->key.zone, cp->key.proto);
  }
}

Conn* Conntrack::alloc_chunk(std::vector<Conn*>* free_list) {
  std::lock_guard<std::mutex> g(table_mu_);
  std::unique_ptr<void, FreeDelete> chunk(huge_alloc(kChunkBytes));
  // A bucket entry keeps a connection's address in its low 47 bits.
  if (reinterpret_cast<uintptr_t>(chunk.get()) + kChunkBytes > (uintptr_t{1} << kTagShift)) throw std::bad_alloc();
  chunks_.push_back(std::move(chunk));
  Conn* base = static_cast<Conn*>(chunks_.back().get());
  for (uint32_t i = kChunkConns; i-- > 1;) free_list->push_back(&base[i]);
  return &base[0];
}

// Keys, NAT and protocol state of a connection for the packet `cp` (its
// original direction). Without `dry_run` the SNAT port is taken for real.
static bool build_conn(Conn* c, const CtPacket& cp, const NatRange& nat, bool dnat, uint32_t dnat_addr,
                       uint16_t dnat_port, NatTable& table, bool reachable, bool dry_run, uint16_t* drop) {
  c->key[0] = cp.key;
  c->key[1] = ct_key_reverse(cp.key);
  c->zone = cp.key.zone;
  c->nat = 0;
  if (!cp.key.v6 && nat.type == kNatSrc) {
    uint32_t ea;
    uint16_t ep;
    NatMapping* m =
        table.acquire(cp.key.zone, cp.key.proto, cp.key.src[0], cp.key.sport, nat, reachable, dry_run, &ea, &ep);
    if (!m) {
      *drop = DROP_NAT_NO_PORT;
      return false;
    }
    if (!dry_run) c->mapping = m;
    set_snat_reply(&c->key[1], ea, ep);
    c->nat = kNatSrc;
  } else if (!cp.key.v6 && dnat) {
    c->key[1].src[0] = dnat_addr;
    c->key[1].sport = dnat_port;  // TCP/UDP: the port; ICMP: the identifier, kept
    c->nat = kNatDst;
  }
  c->node[0].hash = ct_key_hash(c->key[0]);
  c->node[0].dir = 0;
  c->node[1].hash = ct_key_hash(c->key[1]);
  c->node[1].dir = 1;
  ct_proto(cp.key.proto).init(c, cp);
  return true;
}

// A packet an earlier ct of this zone already translated carries its
// connection's translated tuple: it is found by the reverse of it, in the
// other direction, and not translated twice (as Open vSwitch).
void Conntrack::prepare(Packet* p, const CtSpec& spec, CtPrep* pr, bool hash) const {
  // The slot is reused batch after batch: ct_extract() writes every field a
  // packet of its kind is read by.
  pr->natted = false;
  pr->prev_nat = 0;
  pr->ok = ct_extract(p, spec.zone, &pr->cp);
  if (!pr->ok) return;
  pr->prev_nat = static_cast<uint8_t>(p->md.ct_state & (kCsSrcNat | kCsDstNat));
  pr->natted = pr->prev_nat && p->md.ct_zone == spec.zone;
  pr->key = pr->natted ? ct_key_reverse(pr->cp.key) : pr->cp.key;
  if (hash) hash_prep(pr);
}

void Conntrack::hash_prep(CtPrep* pr) { pr->hash = ct_key_hash(pr->key); }

// The end of a decision on a packet of live connection c (state set): the
// commit's mark and label, the connection's NAT (or the one an earlier ct
// applied), and the result.
__attribute__((always_inline)) inline void Conntrack::finish(const CtSpec& spec, CtPacket& cp, bool natted,
                                                              uint8_t prev_nat, Conn* c, int dir, bool dry_run,
                                                              CtResult* r, const CtXlat* other) const {
  if (spec.commit && !dry_run) exec(c, spec);
  if (natted) {
    r->state |= prev_nat;
  } else if (spec.nat && c->nat && !cp.key.v6) {
    if (other) ct_nat_xlat(*other, &cp);
    else ct_nat_packet(*c, dir, &cp);
    r->nat_applied = c->nat;
    r->state |= nat_flags(c->nat, dir);
    if (dry_run) r->after = ct_key_reverse(c->key[1 - dir]);
  }
  fill_result(c, dir, r, &cp, other);
}

// A packet of live connection c that is not an ICMP error (nor a forced
// commit of its reply): its protocol's state, then the result and NAT.
// False when the packet ends the connection and opens another (removed
// here; decide_new() takes it). Inline, so that decide_plain(), which
// knows most arguments, gets a copy without their tests. With `other`
// (execute_known), the connection's keys are not read: the packet's tuple
// has its protocol, `other` the translation (finish()).
__attribute__((always_inline)) inline bool Conntrack::decide_existing(CtWorker& w, const CtSpec& spec, CtPacket& cp,
                                                                       bool natted, uint8_t prev_nat, Conn* c,
                                                                       int dir, int64_t now, bool dry_run,
                                                                       CtResult* r, const CtXlat* other) {
  const uint8_t proto = other ? cp.key.proto : c->key[0].proto;
  const CtProto& pr = ct_proto(proto);
  CtUpdate u;
  if (dry_run) {  // on a copy: a trace changes nothing (tcp holds UDP's and ICMP's state too)
    Conn tmp;
    tmp.tcp = c->tcp;
    u = pr.update(&tmp, cp, dir == 1);
  } else if (proto == kIpTcp) {
    c->spin_lock();
    u = ct_tcp_update(c, cp, dir == 1);
    c->spin_unlock();
    if (u == CtUpdate::VALID || u == CtUpdate::VALID_NEW) refresh(c, now);
  } else {  // (pr.update, for every protocol but TCP)
    u = ct_other_update(c, dir == 1);
    if (u != CtUpdate::INVALID) refresh(c, now);
  }
  if (u == CtUpdate::NEW) {  // the old connection is over; this packet opens another
    if (!dry_run && remove(c)) bump(w.removed);
    return false;
  }
  if (u == CtUpdate::INVALID) {
    r->reset();  // (decide_plain() leaves it to the path taken)
    r->state = kCsTracked | kCsInvalid;
    return true;
  }
  r->state = static_cast<uint8_t>(kCsTracked | (u == CtUpdate::VALID_NEW ? kCsNew : kCsEstablished) |
                                 (dir ? kCsReplyDir : 0u));
  finish(spec, cp, natted, prev_nat, c, dir, dry_run, r, other);
  return true;
}

// decide() for a packet of live connection c that no trace follows, no
// earlier ct translated and that is not an ICMP error: its tests for those
// folded away.
__attribute__((always_inline)) inline void Conntrack::decide_plain(CtWorker& w, Packet* p, const CtSpec& spec,
                                                                    CtPacket& cp, Conn* c, int dir, int64_t now,
                                                                    CtResult* r, const CtXlat* other) {
  if (spec.commit && spec.force && dir == 1) {
    r->reset();
    decide(w, p, spec, cp, false, 0, c, dir, now, false, r);
    return;
  }
  // The result is reset by the path that needs it: a packet of the live
  // connection gets every field from decide_existing() (the state) and
  // finish() but these three, so it costs no reset first (six stores; the
  // stage runs at about one store a cycle).
  r->drop = DROP_NONE;
  r->created = false;
  r->nat_applied = 0;
  if (!decide_existing(w, spec, cp, false, 0, c, dir, now, false, r, other)) {
    r->reset();
    decide_new(w, p, spec, cp, now, false, r);
  }
}

void Conntrack::execute(CtWorker& w, Packet* p, const CtSpec& spec, int64_t now, bool dry_run, CtResult* r) {
  CtPrep pr;
  prepare(p, spec, &pr);
  execute(w, p, spec, pr, now, dry_run, r);
}

void Conntrack::execute(CtWorker& w, Packet* p, const CtSpec& spec, CtPrep& pr, int64_t now, bool dry_run,
                        CtResult* r) {
  if (!pr.ok) {
    r->reset();
    r->state = kCsTracked | kCsInvalid;
    return;
  }
  int dir = 0;
  Conn* c = lookup(pr.key, pr.hash, now, &dir);
  if (pr.natted) dir = 1 - dir;
  if (c && !dry_run && !pr.natted && !pr.cp.icmp_error) {
    decide_plain(w, p, spec, pr.cp, c, dir, now, r);  // (resets the result as far as needed)
    return;
  }
  r->reset();
  decide(w, p, spec, pr.cp, pr.natted, pr.prev_nat, c, dir, now, dry_run, r);
}

// Only for an untracked packet (no earlier ct translated it). A life count
// equal to the one the worker saw (even: in the table) makes `c` that same
// connection, live now; from then on its memory is not reused before
// CtWorker::end() (epoch.h), and its keys never change. For IPv4 TCP and UDP
// the worker's cache vouches for the tuple: the EMC entry the packet hit
// holds its flow key, which names the tuple (addresses, protocol, ports),
// the megaflow names the zone, and the pair was cached from a packet that
// found `c` in direction `dir`. An ICMP key does not name the echo
// identifier, and IPv6 reads the keys for the result anyway: those compare
// the keys, the packet's with key[dir] and key[1 - dir] with `other`.
bool Conntrack::execute_known(CtWorker& w, Packet* p, const CtSpec& spec, Conn* c, uint8_t dir, uint32_t life,
                              const CtXlat& other, int64_t now, CtResult* r) {
  if (c->life.load(std::memory_order_acquire) != life || c->expires.load(std::memory_order_relaxed) <= now)
    return false;
  CtPacket cp;
  // (The common packet's extraction inline; ct_extract() would try it first too.)
  const bool v4 = p->l3_ofs != kNoOffset && ct_extract_v4(p->data() + p->l3_ofs, p->len - p->l3_ofs, spec.zone, &cp);
  if (!v4 && (!ct_extract(p, spec.zone, &cp) || cp.icmp_error)) return false;
  if (v4 || (!cp.key.v6 && (cp.key.proto == kIpTcp || cp.key.proto == kIpUdp))) {
    decide_plain(w, p, spec, cp, c, dir, now, r, &other);
    return true;
  }
  if (!ct_key_eq(c->key[dir], cp.key) || !ct_xlat_eq(c->key[1 - dir], other)) return false;
  decide_plain(w, p, spec, cp, c, dir, now, r);
  return true;
}

bool Conntrack::execute_carried(CtWorker& w, Packet* p, const CtSpec& spec, CtPrep& pr, Conn* c, uint8_t dir,
                                int64_t now, bool dry_run, CtResult* r) {
  // An ICMP error is looked up by the tuple it quotes: the ordinary way.
  if (!pr.ok || pr.cp.icmp_error) return false;
  if (c->dead() || c->expires.load(std::memory_order_relaxed) <= now) return false;
  // lookup() would find c by its key in direction dir, or, for a packet an
  // earlier ct of this zone translated, by the other one (and flip it).
  if (!ct_key_eq(c->key[pr.natted ? 1 - dir : dir], pr.key)) return false;
  r->reset();
  decide(w, p, spec, pr.cp, pr.natted, pr.prev_nat, c, dir, now, dry_run, r);
  return true;
}

void Conntrack::decide(CtWorker& w, Packet* p, const CtSpec& spec, CtPacket& cp, bool natted, uint8_t prev_nat,
                       Conn* c, int dir, int64_t now, bool dry_run, CtResult* r) {
  if (dry_run) {  // what a trace shows; not written per packet otherwise
    r->before = cp.key;
    r->after = cp.key;
  }

  if (cp.icmp_error) {  // related to the connection it quotes, or invalid
    if (!c) {
      r->state = kCsTracked | kCsInvalid;
      return;
    }
    r->state = static_cast<uint8_t>(kCsTracked | kCsRelated | (dir ? kCsReplyDir : 0u));
    finish(spec, cp, natted, prev_nat, c, dir, dry_run, r);
    return;
  }

  if (c && spec.commit && spec.force && dir == 1) {  // committed the other way: start over
    if (!dry_run && remove(c)) bump(w.removed);
    c = nullptr;
  }
  if (c && decide_existing(w, spec, cp, natted, prev_nat, c, dir, now, dry_run, r)) return;
  decide_new(w, p, spec, cp, now, dry_run, r);
}

// A packet that would start a connection (none found, or the one found is over).
void Conntrack::decide_new(CtWorker& w, Packet* p, const CtSpec& spec, CtPacket& cp, int64_t now, bool dry_run,
                           CtResult* r) {
  // No connection: this packet would start one.
  if (!ct_proto(cp.key.proto).valid_new(cp)) {
    r->state = kCsTracked | kCsInvalid;
    return;
  }
  r->state = kCsTracked | kCsNew;
  // Endpoint-independent filtering: a packet to a mapped public endpoint of
  // the zone reaches its internal endpoint, whoever sends it.
  NatMapping eif_map;
  NatMapping* eif_ref = nullptr;  // the reference the new connection will hold
  if (spec.nat && !cp.key.v6 && zones_[spec.zone].eif.load(std::memory_order_relaxed))
    eif_ref = nat_.find_ext(spec.zone, cp.key.proto, cp.key.dst[0],
                            (cp.key.proto == kIpIcmp) ? cp.key.sport : cp.key.dport, dry_run, &eif_map);
  const bool eif = eif_ref != nullptr;
  if (!spec.commit && !eif) {  // tracked, not remembered: the tuple is the packet's own
    r->have_tuple = true;
    r->orig = cp.key;
    return;
  }
  NatRange range = eif ? NatRange() : spec.range;
  uint32_t dnat_addr = eif_map.int_addr;
  uint16_t dnat_port = eif_map.int_port;
  const bool dnat = eif || (!cp.key.v6 && range.type == kNatDst);
  if (!eif && dnat)
    NatTable::pick_dst(range, cp.key.src[0], cp.key.sport, cp.key.proto == kIpIcmp ? cp.key.sport : cp.key.dport,
                       &dnat_addr, &dnat_port);
  if (!eif && dnat && cp.key.proto == kIpIcmp) dnat_port = cp.key.sport;  // DNAT keeps an echo identifier

  if (dry_run) {
    Conn tmp;
    uint16_t drop = DROP_NONE;
    if (!build_conn(&tmp, cp, range, dnat, dnat_addr, dnat_port, nat_, false, true, &drop)) {
      r->drop = drop;
      return;
    }
    r->created = true;
    if (tmp.nat) {
      ct_nat_packet(tmp, 0, &cp);
      r->nat_applied = tmp.nat;
      r->state |= nat_flags(tmp.nat, 0);
      r->after = ct_key_reverse(tmp.key[1]);
    }
    r->have_tuple = true;
    r->orig = tmp.key[0];
    if (spec.set_mark) r->mark = spec.mark & spec.mark_mask;
    if (spec.set_label) r->label = spec.label & spec.label_mask;
    return;
  }

  uint16_t drop = admit(spec.zone);
  if (drop != DROP_NONE) {  // over a limit: let every worker's expiry catch up once, then refuse
    w.sweep(now, kQuotaSweep);
    sweep_others(&w, now, kQuotaSweep);
    drop = admit(spec.zone);
  }
  if (drop != DROP_NONE) {
    if (eif_ref) nat_.release(eif_ref);
    r->drop = drop;
    return;
  }
  Conn* c = w.alloc();
  const bool reachable = zones_[spec.zone].eif.load(std::memory_order_relaxed);
  bool built = build_conn(c, cp, range, dnat, dnat_addr, dnat_port, nat_, reachable, false, &drop);
  if (!built && drop == DROP_NAT_NO_PORT) {  // ports of expired connections may be waiting to be freed
    w.sweep(now, kQuotaSweep);
    sweep_others(&w, now, kQuotaSweep);
    built = build_conn(c, cp, range, dnat, dnat_addr, dnat_port, nat_, reachable, false, &drop);
  }
  if (!built) {
    release(spec.zone);
    w.lock();
    w.free_.push_back(c);
    w.unlock();
    r->drop = drop;
    return;
  }
  // The reply key's bucket (known only now that NAT chose the port), for
  // insert() to read after the locks.
  prefetch_head(c->node[1].hash);
  if (eif_ref) c->mapping = eif_ref;
  refresh(c, now);
  c->owner = static_cast<uint8_t>(w.slot_);
  Conn* existing;
  if (!insert(c, now, &existing)) {
    release(spec.zone);
    if (c->mapping) nat_.release(c->mapping);
    w.lock();
    w.free_.push_back(c);
    w.unlock();
    if (existing) {  // another worker committed the same connection a moment ago
      execute(w, p, spec, now, dry_run, r);
      return;
    }
    r->drop = DROP_NAT_COLLISION;
    return;
  }
  w.file(c, now);
  bump(w.created);
  exec(c, spec);
  r->created = true;
  if (c->nat) {
    ct_nat_packet(*c, 0, &cp);
    r->nat_applied = c->nat;
    r->state |= nat_flags(c->nat, 0);
    if (dry_run) r->after = ct_key_reverse(c->key[1]);
  }
  fill_result(c, 0, r);
}

// ---- dumps -------------------------------------------------------------------------------------

void Conntrack::dump(int zone, int64_t now, std::vector<Entry>* out) {
  Bucket* bs = buckets();
  if (!bs) return;
  for (uint32_t b = 0; b <= mask_; b++) {
    if (bucket_empty(bs[b])) continue;  // read without the lock: what is inserted meanwhile may be missed either way
    Stripe& s = stripes_[b & (kStripes - 1)];
    s.lock();
    for_each_node(bs[b], [&](CtNode* n) {
      if (n->dir != 0) return;
      Conn* c = Conn::of(n);
      if (!live(c, now) || (zone >= 0 && c->key[0].zone != zone)) return;
      Entry e;
      e.orig = c->key[0];
      e.reply = c->key[1];
      c->spin_lock();
      e.mark = c->mark.load(std::memory_order_relaxed);
      e.label = (static_cast<u128>(c->label_hi.load(std::memory_order_relaxed)) << 64) |
                c->label_lo.load(std::memory_order_relaxed);
      e.protoinfo = ct_proto(c->key[0].proto).state(c);
      c->spin_unlock();
      e.expires_in_ns = c->expires.load(std::memory_order_relaxed) - now;
      e.nat = c->nat;
      out->push_back(e);
    });
    s.unlock();
  }
  std::sort(out->begin(), out->end(), [](const Entry& a, const Entry& b) {
    if (a.orig.zone != b.orig.zone) return a.orig.zone < b.orig.zone;
    if (a.orig.proto != b.orig.proto) return a.orig.proto < b.orig.proto;
    return std::memcmp(&a.orig, &b.orig, sizeof(CtKey)) < 0;
  });
}

static std::string tuple_fields(const CtKey& k) {
  char a[64], b[64];
  inet_ntop(k.v6 ? AF_INET6 : AF_INET, k.src, a, sizeof a);
  inet_ntop(k.v6 ? AF_INET6 : AF_INET, k.dst, b, sizeof b);
  std::string s = std::string("src=") + a + ",dst=" + b;
  if (k.proto == kIpIcmp || k.proto == kIpIcmpv6) {
    uint8_t tc[2];
    std::memcpy(tc, &k.dport, 2);
    s += ",id=" + std::to_string(be16(k.sport)) + ",type=" + std::to_string(tc[0]) + ",code=" + std::to_string(tc[1]);
  } else {
    s += ",sport=" + std::to_string(be16(k.sport)) + ",dport=" + std::to_string(be16(k.dport));
  }
  return s;
}

std::string Conntrack::format(const Entry& e) {
  const uint8_t p = e.orig.proto;
  std::string s = p == kIpTcp ? "tcp" : p == kIpUdp ? "udp" : p == kIpIcmp ? "icmp" : p == kIpIcmpv6 ? "icmpv6"
                                                                                                  : std::to_string(p);
  s += ",orig=(" + tuple_fields(e.orig) + "),reply=(" + tuple_fields(e.reply) + ")";
  if (e.orig.zone) s += ",zone=" + std::to_string(e.orig.zone);
  if (e.mark) s += ",mark=" + std::to_string(e.mark);
  if (e.label) s += ",labels=" + hex_u128(e.label);
  if (e.protoinfo) s += std::string(",protoinfo=(state=") + e.protoinfo + ")";
  return s;
}

size_t Conntrack::flush(int zone) {
  return flush_where([zone](const Conn* c) { return zone < 0 || c->key[0].zone == zone; });
}

size_t Conntrack::flush_keys(const std::vector<CtKey>& origs) {
  if (origs.empty()) return 0;
  std::unordered_set<std::string> want;
  for (const CtKey& k : origs) want.emplace(reinterpret_cast<const char*>(&k), sizeof k);
  return flush_where([&want](const Conn* c) {
    return want.count(std::string(reinterpret_cast<const char*>(&c->key[0]), sizeof(CtKey))) != 0;
  });
}

template <class Pred>
size_t Conntrack::flush_where(Pred pred) {
  Bucket* bs = buckets();
  if (!bs) return 0;
  // Hold an epoch slot: a connection found here is not reused before remove() looks at it.
  int slot = epoch_.acquire();
  epoch_.enter(slot);
  std::vector<Conn*> victims;
  for (uint32_t b = 0; b <= mask_; b++) {
    if (bucket_empty(bs[b])) continue;  // read without the lock: what is inserted meanwhile may be missed either way
    Stripe& s = stripes_[b & (kStripes - 1)];
    s.lock();
    for_each_node(bs[b], [&](CtNode* n) {
      Conn* c = Conn::of(n);
      if (n->dir == 0 && pred(c)) victims.push_back(c);
    });
    s.unlock();
  }
  size_t n = 0;
  for (Conn* c : victims) n += remove(c) ? 1 : 0;
  flushed_.fetch_add(n, std::memory_order_relaxed);
  epoch_.leave(slot);
  epoch_.release(slot);
  return n;
}

void Conntrack::zone_counts(std::vector<std::pair<uint16_t, uint32_t>>* out) const {
  for (uint32_t z = 0; z < 65536; z++) {
    uint32_t n = zones_[z].count.load(std::memory_order_relaxed);
    if (n) out->push_back({static_cast<uint16_t>(z), n});
  }
}

size_t Conntrack::table_bytes() const { return buckets() ? (static_cast<size_t>(mask_) + 1) * sizeof(Bucket) : 0; }

size_t Conntrack::bytes_per_conn() const {
  const uint32_t max = max_conns_.load(std::memory_order_relaxed);
  // Once made, the table keeps its size (a later limit does not resize it).
  const uint32_t n = buckets() ? mask_ + 1 : buckets_for(max);
  return sizeof(Conn) + (static_cast<size_t>(n) * sizeof(Bucket) + max - 1) / std::max<uint32_t>(max, 1);
}

// ---- per-worker: allocation and the expiry wheel ----------------------------------------------------

CtWorker::CtWorker(Conntrack* ct, int slot) : ct_(ct), slot_(slot), wheel_(new std::vector<Conn*>[kWheelSlots]) {}

CtWorker::~CtWorker() {
  {
    std::lock_guard<std::mutex> g(ct_->workers_mu_);
    auto& ws = ct_->workers_;
    ws.erase(std::remove(ws.begin(), ws.end(), this), ws.end());
  }
  // Connections this worker owns leave the table with it.
  lock();
  for (int i = 0; i < kWheelSlots; i++)
    for (Conn* c : wheel_[i]) ct_->remove(c);
  unlock();
  ct_->epoch_.release(slot_);
}

void CtWorker::begin() {
  ct_->epoch_.enter(slot_);
  in_read_ = true;
  ct_->ensure_table();
}

void CtWorker::end() {
  ct_->epoch_.leave(slot_);
  in_read_ = false;
}

Conn* CtWorker::alloc() {
  Conn* c;
  lock();
  if (free_.empty()) reclaim();
  if (free_.empty()) {
    try {
      c = ct_->alloc_chunk(&free_);
    } catch (...) {
      unlock();
      throw;
    }
  } else {
    c = free_.back();
    free_.pop_back();
    // The connection a later alloc() will hand out, fetched for writing
    // now: it was freed long ago and is cold, and constructing it and
    // building its keys would wait for all three lines.
    if (free_.size() > kAllocAhead) {
      const char* n = reinterpret_cast<const char*>(free_[free_.size() - 1 - kAllocAhead]);
      dpu::prefetch_w(n);
      dpu::prefetch_w(n + 64);
      dpu::prefetch_w(n + 128);
    }
  }
  unlock();
  // Constructed dead (an odd life count, conn.h) and kept so until insert()
  // publishes it, its count going on from its last use: a worker holding a
  // stale pointer to this memory (execute_known) must not take it for a
  // connection, least of all for the one it was.
  const uint32_t life = c->life.load(std::memory_order_relaxed);
  new (c) Conn();
  c->life.store(life | 1u, std::memory_order_relaxed);
  return c;
}

void CtWorker::file(Conn* c, int64_t now) {
  lock();
  int64_t now_tick = now >> kTickShift;
  if (cursor_ < 0) cursor_ = now_tick;
  int64_t tick = c->expires.load(std::memory_order_relaxed) >> kTickShift;
  tick = std::max(tick, cursor_);
  tick = std::min(tick, cursor_ + kWheelSlots - 1);
  wheel_[tick & (kWheelSlots - 1)].push_back(c);
  filed_++;
  unlock();
}

void CtWorker::reclaim() {
  if (retired_.empty()) return;
  const uint64_t safe = ct_->epoch_.min_active();
  size_t k = 0;
  while (k < retired_.size() && retired_[k].first < safe) free_.push_back(retired_[k++].second);
  retired_.erase(retired_.begin(), retired_.begin() + static_cast<long>(k));
}

void CtWorker::sweep(int64_t now, size_t budget) {
  lock();
  sweep_locked(now, budget);
  unlock();
}

void CtWorker::sweep_locked(int64_t now, size_t budget) {
  reclaim();
  if (cursor_ < 0) return;
  const int64_t now_tick = now >> kTickShift;
  if (filed_ == 0) {  // nothing to expire: the cursor just follows the clock
    cursor_ = std::max(cursor_, now_tick);
    return;
  }
  // After a jump of more than the wheel's span every slot is due: visit each
  // once, then go on from the present.
  int64_t end_tick = now_tick;
  const bool wrapped = now_tick - cursor_ >= kWheelSlots;
  if (wrapped) end_tick = cursor_ + kWheelSlots - 1;
  size_t empty_budget = 4 * kWheelSlots;  // empty slots cost little but are bounded too
  // What this call unlinks is tagged at the end, all with one epoch bump:
  // one full fence a sweep instead of one a connection (each waited for the
  // stores of the unlinks before it to reach memory). A tag taken after
  // every unlink is as safe for each of them.
  const size_t untagged = retired_.size();
  // A tick's connections are an array, so memory latency overlaps: a
  // connection is fetched kConnAhead places before its turn, the two
  // buckets it would be unlinked from and its NAT mapping kBucketAhead
  // places before, and the mapping's map slot and port word kMapAhead.
  // (At 8, 5 and 2, the mapping read to find its map slot had not arrived:
  // the profile of snat-new put a third of the sweep on that load. At 16,
  // 10 and 4: snat-new x1.05, snat-1m x1.035, two pairs of processes.)
  constexpr size_t kConnAhead = 16, kBucketAhead = 10, kMapAhead = 4;
  while (budget && cursor_ <= end_tick && empty_budget) {
    std::vector<Conn*>& tick_conns = wheel_[cursor_ & (kWheelSlots - 1)];
    if (tick_conns.empty()) {
      cursor_++;
      empty_budget--;
      continue;
    }
    refile_.clear();  // connections still alive go one tick on at least
    while (!tick_conns.empty() && budget) {
      const size_t k = tick_conns.size();
      if (k > kConnAhead) Conntrack::prefetch_for_expiry(tick_conns[k - 1 - kConnAhead]);
      if (k > kBucketAhead) ct_->prefetch_buckets(tick_conns[k - 1 - kBucketAhead]);
      if (k > kMapAhead) ct_->prefetch_mapping_slot(tick_conns[k - 1 - kMapAhead]);
      Conn* c = tick_conns.back();
      tick_conns.pop_back();
      filed_--;
      budget--;
      if (!c->dead() && c->expires.load(std::memory_order_relaxed) > now) {
        refile_.push_back(c);
        continue;
      }
      if (ct_->remove(c, &releases_)) bump(expired);
      retired_.push_back({0, c});
    }
    const bool done = tick_conns.empty();
    if (done && tick_conns.capacity() > 4096) std::vector<Conn*>().swap(tick_conns);  // a burst's tick gives its memory back
    if (done) cursor_++;
    for (Conn* c : refile_) {
      int64_t tick = std::max(c->expires.load(std::memory_order_relaxed) >> kTickShift, cursor_ + (done ? 0 : 1));
      tick = std::min(tick, cursor_ + kWheelSlots - 1);
      wheel_[tick & (kWheelSlots - 1)].push_back(c);
      filed_++;
    }
    if (!done) break;
  }
  if (wrapped && cursor_ > end_tick) cursor_ = now_tick;
  ct_->release(&releases_);
  if (retired_.size() > untagged) {
    const uint64_t tag = ct_->epoch_.retire_tag();
    for (size_t i = untagged; i < retired_.size(); i++) retired_[i].first = tag;
  }
}

}  // namespace dpu
