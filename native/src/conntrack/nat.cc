// nat.cc: NAT mappings and port selection (see nat.h).
#include "nat.h"

#include "dpu/flow_key.h"
#include "dpu/mem.h"

namespace dpu {

// One public address's ports for one protocol: a bit per port (1 = taken)
// and a summary bit per word that is full. Written under the table's mutex;
// predict() reads it without, so words are loaded and stored atomically
// (relaxed: plain moves on x86).
struct NatTable::PortBits {
  uint64_t w[1024] = {};
  uint64_t full[16] = {};
  static uint64_t ld(const uint64_t& x) { return __atomic_load_n(&x, __ATOMIC_RELAXED); }
  static void st(uint64_t& x, uint64_t v) { __atomic_store_n(&x, v, __ATOMIC_RELAXED); }
  bool test(uint16_t p) const { return ld(w[p >> 6]) >> (p & 63) & 1; }
  void set(uint16_t p) {
    const uint64_t v = ld(w[p >> 6]) | 1ull << (p & 63);
    st(w[p >> 6], v);
    if (v == ~0ull) st(full[p >> 12], ld(full[p >> 12]) | 1ull << ((p >> 6) & 63));
  }
  void clear(uint16_t p) {
    st(w[p >> 6], ld(w[p >> 6]) & ~(1ull << (p & 63)));
    st(full[p >> 12], ld(full[p >> 12]) & ~(1ull << ((p >> 6) & 63)));
  }
  // First free port in [from, to] (inclusive, from <= to), or -1. Full words
  // are skipped through the summary: at most 16 summary words and 2 partial
  // words are read.
  int first_free(uint32_t from, uint32_t to) const {
    uint32_t word = from >> 6;
    uint64_t m = ~ld(w[word]) & (~0ull << (from & 63));
    while (true) {
      if (m) {
        uint32_t p = (word << 6) | static_cast<uint32_t>(__builtin_ctzll(m));
        return p <= to ? static_cast<int>(p) : -1;
      }
      // next word that is not full
      uint32_t next = word + 1;
      if ((next << 6) > to) return -1;
      uint32_t sw = next >> 6;
      uint64_t notfull = ~ld(full[sw]) & (~0ull << (next & 63));
      while (!notfull) {
        if (++sw >= 16 || (sw << 12) > to) return -1;
        notfull = ~ld(full[sw]);
      }
      word = (sw << 6) | static_cast<uint32_t>(__builtin_ctzll(notfull));
      if ((word << 6) > to) return -1;
      m = ~ld(w[word]);
    }
  }
  // The port take_port() picks: `preferred` if free, else the first free
  // one from `start`, wrapping once; -1 if none.
  int pick(uint16_t lo, uint16_t hi, uint16_t preferred, uint32_t start) const {
    if (preferred >= lo && preferred <= hi && !test(preferred)) return preferred;
    const uint32_t s = search_from(lo, hi, start);
    int p = first_free(s, hi);
    if (p < 0 && s > lo) p = first_free(lo, s - 1);
    return p;
  }
};

NatTable::NatTable() = default;

NatTable::~NatTable() = default;  // mappings live in chunks_, bitmaps in port_bits_

uint64_t NatTable::IntKeyHash::operator()(const IntKey& k) const {
  return mix128(k.a ^ 0x9e3779b97f4a7c15ull, k.b ^ 0xc2b2ae3d27d4eb4full);
}

uint64_t NatTable::U64Hash::operator()(uint64_t k) const { return mix128(k ^ 0x9e3779b97f4a7c15ull, 0xff51afd7ed558ccdull); }

NatTable::IntKey NatTable::int_key(uint16_t zone, uint8_t proto, uint32_t addr, uint16_t port, uint64_t pool) {
  IntKey k;
  k.a = static_cast<uint64_t>(addr) << 32 | static_cast<uint64_t>(port) << 16 | zone;
  k.b = pool ^ (static_cast<uint64_t>(proto) << 56);
  return k;
}

NatMapping* NatTable::new_mapping() {
  if (free_.empty()) {
    constexpr size_t kChunk = 4096;
    chunks_.emplace_back(new NatMapping[kChunk]);
    for (size_t i = kChunk; i-- > 0;) free_.push_back(&chunks_.back()[i]);
  }
  NatMapping* m = free_.back();
  free_.pop_back();
  m->ext_addr = 0;
  m->refs = 0;
  m->is_static = m->reachable = false;
  n_mappings_++;
  return m;
}

// The fields prefetch_release() reads without the lock are written
// atomically (relaxed): a flush on another thread may free and reuse a
// mapping an expiring connection still names.
void NatTable::set_keys(NatMapping* m, uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port,
                        uint16_t ext_port, uint64_t pool, void* port_bits) {
  __atomic_store_n(&m->zone, zone, __ATOMIC_RELAXED);
  __atomic_store_n(&m->proto, proto, __ATOMIC_RELAXED);
  __atomic_store_n(&m->int_addr, int_addr, __ATOMIC_RELAXED);
  __atomic_store_n(&m->int_port, int_port, __ATOMIC_RELAXED);
  __atomic_store_n(&m->ext_port, ext_port, __ATOMIC_RELAXED);
  __atomic_store_n(&m->pool, pool, __ATOMIC_RELAXED);
  __atomic_store_n(&m->port_bits, port_bits, __ATOMIC_RELAXED);
}

uint64_t NatTable::ext_key(uint8_t proto, uint32_t addr, uint16_t port) {
  return static_cast<uint64_t>(proto) << 48 | static_cast<uint64_t>(addr) << 16 | port;
}

static uint64_t pool_id(const NatRange& r) {
  return (static_cast<uint64_t>(r.addr_min) << 32 | r.addr_max) ^ (static_cast<uint64_t>(r.port_min) << 16 | r.port_max) * 0x9e3779b97f4a7c15ull;
}

NatTable::PortBits& NatTable::bits(uint8_t proto, uint32_t addr) {
  const uint64_t k = static_cast<uint64_t>(proto) << 32 | addr;
  BitsHint& hint = hints_[hint_slot(k)];
  PortBits** p = ports_.find(k);
  PortBits* b;
  if (p) {
    b = *p;
  } else {
    port_bits_.push_back(std::make_unique<PortBits>());
    b = port_bits_.back().get();
    b->set(0);  // port 0 is never handed out
    ports_.put(k, b);
  }
  if (hint.key.load(std::memory_order_relaxed) != k) {
    hint.bits.store(b, std::memory_order_relaxed);
    hint.key.store(k, std::memory_order_relaxed);
  }
  return *b;
}

// Paired pooling: the public address is a function of the internal one
// (network order in, host order out).
uint32_t NatTable::paired_addr(uint16_t zone, uint32_t int_addr, const NatRange& r) {
  const uint64_t n_addr = uint64_t{r.addr_max} - r.addr_min + 1;  // 2**32 for 0.0.0.0-255.255.255.255
  uint32_t h = hash_words(be32(int_addr), zone, 0x6e6174u, 0);  // not the protocol: one address for all of them
  return r.addr_min + static_cast<uint32_t>(h % n_addr);
}

// The ports a new mapping may take: the rule's range, else 1024-65535
// (ICMP identifiers: 1-65535).
void NatTable::port_range(uint8_t proto, const NatRange& r, uint16_t* lo, uint16_t* hi) {
  const bool icmp = proto == kIpIcmp || proto == kIpIcmpv6;
  *lo = r.port_min ? r.port_min : (icmp ? 1 : 1024);
  *hi = r.port_min ? r.port_max : 65535;
}

// Where the search for a free port starts when the preferred one is taken
// (`start`: a hash of the internal endpoint, or random).
uint32_t NatTable::search_from(uint16_t lo, uint16_t hi, uint32_t start) {
  return lo + start % (static_cast<uint32_t>(hi - lo) + 1);
}

uint32_t NatTable::hashed_start(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t want) {
  return hash_words(be32(int_addr), want, zone, proto);
}

// A free port in [lo, hi] of (proto, addr): `preferred` if free, else the
// first free one from `start` (wrapping once).
bool NatTable::take_port(uint8_t proto, uint32_t addr, uint16_t lo, uint16_t hi, uint16_t preferred, uint32_t start,
                         bool dry_run, uint16_t* out) {
  PortBits& b = bits(proto, addr);
  const int p = b.pick(lo, hi, preferred, start);
  if (p < 0) return false;
  if (!dry_run) b.set(static_cast<uint16_t>(p));
  *out = static_cast<uint16_t>(p);
  return true;
}

NatMapping* NatTable::acquire(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port, const NatRange& r,
                              bool reachable, bool dry_run, uint32_t* ext_addr, uint16_t* ext_port) {
  const uint64_t pool = pool_id(r);
  std::lock_guard<std::mutex> g(mu_);
  NatMapping** found = by_int_.find(int_key(zone, proto, int_addr, int_port, pool));
  if (found) {
    NatMapping* m = *found;
    *ext_addr = m->ext_addr;
    *ext_port = m->ext_port;
    if (!dry_run) m->refs++;
    return m;
  }
  const uint32_t addr = paired_addr(zone, int_addr, r);
  uint16_t lo, hi;
  port_range(proto, r, &lo, &hi);
  const uint16_t want = be16(int_port);
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  uint32_t start = r.random ? static_cast<uint32_t>(rng_) : hashed_start(zone, proto, int_addr, want);
  uint16_t port;
  PortBits& b = bits(proto, be32(addr));
  if (!r.port_min && !r.random && want && want < lo && !b.test(want)) {
    port = want;  // no range given: a low source port is kept too, when free
    if (!dry_run) b.set(port);
  } else if (!take_port(proto, be32(addr), lo, hi, r.random ? 0 : want, start, dry_run, &port)) {
    return nullptr;
  }
  *ext_addr = be32(addr);
  *ext_port = be16(port);
  if (dry_run) return reinterpret_cast<NatMapping*>(this);  // non-null: would succeed
  NatMapping* m = new_mapping();
  set_keys(m, zone, proto, int_addr, int_port, *ext_port, pool, &b);
  m->ext_addr = *ext_addr;
  m->refs = 1;
  by_int_.put(int_key(zone, proto, int_addr, int_port, pool), m);
  // Only zones that filter endpoint-independently look mappings up by their
  // public endpoint; the port bitmap alone says which ports are taken.
  if (reachable) {
    const uint64_t ek = ext_key(proto, m->ext_addr, m->ext_port);
    if (!by_ext_.find(ek)) {
      by_ext_.put(ek, m);
      m->reachable = true;
    }
  }
  return m;
}

void NatTable::free_mapping(NatMapping* m) {
  const IntKey ik = int_key(m->zone, m->proto, m->int_addr, m->int_port, m->pool);
  NatMapping** mi = by_int_.find(ik);
  if (mi && *mi == m) by_int_.erase(ik);
  const uint64_t ek = ext_key(m->proto, m->ext_addr, m->ext_port);
  NatMapping** me = by_ext_.find(ek);  // static mappings and reachable ones: a small table
  if (me && *me == m) by_ext_.erase(ek);
  if (!me || *me == m) {  // else a static mapping holds the port
    PortBits* b = m->port_bits ? static_cast<PortBits*>(m->port_bits) : &bits(m->proto, m->ext_addr);
    b->clear(be16(m->ext_port));
  }
  free_.push_back(m);
  n_mappings_--;
}

void NatTable::prefetch_acquire(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port,
                                const NatRange& r) const {
  by_int_.prefetch(int_key(zone, proto, int_addr, int_port, pool_id(r)));
  // The bitmap words a new mapping's port search starts with: the source
  // port's, and (when that one is taken) the hashed start's.
  const uint32_t addr = paired_addr(zone, int_addr, r);
  const uint64_t k = static_cast<uint64_t>(proto) << 32 | be32(addr);
  const BitsHint& hint = hints_[hint_slot(k)];
  if (hint.key.load(std::memory_order_relaxed) != k) return;
  const PortBits* b = hint.bits.load(std::memory_order_relaxed);
  if (!b) return;
  const uint16_t want = be16(int_port);
  dpu::prefetch_w(&b->w[want >> 6]);
  if (r.random) return;
  uint16_t lo, hi;
  port_range(proto, r, &lo, &hi);
  const uint32_t s = search_from(lo, hi, hashed_start(zone, proto, int_addr, want));
  dpu::prefetch_w(&b->w[s >> 6]);
  dpu::prefetch(&b->full[s >> 12]);
}

bool NatTable::predict(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port, const NatRange& r,
                       uint32_t* ext_addr, uint16_t* ext_port) const {
  if (r.random) return false;
  const uint32_t addr = paired_addr(zone, int_addr, r);
  const uint64_t k = static_cast<uint64_t>(proto) << 32 | be32(addr);
  const BitsHint& hint = hints_[hint_slot(k)];
  if (hint.key.load(std::memory_order_relaxed) != k) return false;
  const PortBits* b = hint.bits.load(std::memory_order_relaxed);
  if (!b) return false;
  uint16_t lo, hi;
  port_range(proto, r, &lo, &hi);
  const uint16_t want = be16(int_port);
  int p;
  if (!r.port_min && want && want < lo && !b->test(want)) p = want;  // as acquire() keeps a low port
  else p = b->pick(lo, hi, want, hashed_start(zone, proto, int_addr, want));
  if (p < 0) return false;
  *ext_addr = be32(addr);
  *ext_port = be16(static_cast<uint16_t>(p));
  return true;
}

void NatTable::prefetch_release(const NatMapping* m) const {
  by_int_.prefetch(int_key(__atomic_load_n(&m->zone, __ATOMIC_RELAXED), __atomic_load_n(&m->proto, __ATOMIC_RELAXED),
                           __atomic_load_n(&m->int_addr, __ATOMIC_RELAXED),
                           __atomic_load_n(&m->int_port, __ATOMIC_RELAXED), __atomic_load_n(&m->pool, __ATOMIC_RELAXED)),
                   true);
  // PortBits outlive the table's mappings: a stale pointer is still a bitmap.
  if (const auto* b = static_cast<const PortBits*>(__atomic_load_n(&m->port_bits, __ATOMIC_RELAXED)))
    dpu::prefetch_w(&b->w[be16(__atomic_load_n(&m->ext_port, __ATOMIC_RELAXED)) >> 6]);
}

void NatTable::release(NatMapping* m) { release(&m, m ? 1 : 0); }

void NatTable::release(NatMapping* const* ms, size_t n) {
  if (!n) return;
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < n; i++) {
    NatMapping* m = ms[i];
    if (--m->refs == 0 && !m->is_static) free_mapping(m);
  }
}

NatMapping* NatTable::find_ext(uint16_t zone, uint8_t proto, uint32_t ext_addr, uint16_t ext_port, bool dry_run,
                               NatMapping* out) {
  std::lock_guard<std::mutex> g(mu_);
  NatMapping** m = by_ext_.find(ext_key(proto, ext_addr, ext_port));
  if (!m || (*m)->zone != zone) return nullptr;
  *out = **m;
  if (!dry_run) (*m)->refs++;
  return *m;
}

void NatTable::make_reachable(uint16_t zone) {
  std::lock_guard<std::mutex> g(mu_);
  by_int_.for_each([&](const IntKey&, NatMapping* m) {
    if (m->zone != zone || m->reachable) return;
    const uint64_t ek = ext_key(m->proto, m->ext_addr, m->ext_port);
    if (by_ext_.find(ek)) return;
    by_ext_.put(ek, m);
    m->reachable = true;
  });
}

void NatTable::set_static(const std::vector<StaticMapping>& maps) {
  std::lock_guard<std::mutex> g(mu_);
  for (NatMapping* m : static_) {
    m->is_static = false;
    if (m->refs == 0) free_mapping(m);  // otherwise it lives on as a dynamic mapping until its connections end
  }
  static_.clear();
  for (const StaticMapping& s : maps) {
    NatMapping* m = new_mapping();
    NatRange one;
    one.addr_min = one.addr_max = be32(s.ext_addr);
    set_keys(m, s.zone, s.proto, s.int_addr, s.int_port, s.ext_port, pool_id(one), nullptr);
    m->ext_addr = s.ext_addr;
    m->is_static = true;
    static_.push_back(m);
    by_int_.put(int_key(m->zone, m->proto, m->int_addr, m->int_port, m->pool), m);
    by_ext_.put(ext_key(m->proto, m->ext_addr, m->ext_port), m);  // shadows a dynamic one until it ends
    bits(m->proto, m->ext_addr).set(be16(m->ext_port));
  }
}

size_t NatTable::mappings() {
  std::lock_guard<std::mutex> g(mu_);
  return n_mappings_;
}

void NatTable::pick_dst(const NatRange& r, uint32_t client, uint16_t client_port, uint16_t orig_port, uint32_t* addr,
                        uint16_t* port) {
  const uint64_t n_addr = uint64_t{r.addr_max} - r.addr_min + 1;
  uint32_t h = hash_words(be32(client), be16(client_port), 0x646e6174u, 0);
  *addr = be32(r.addr_min + static_cast<uint32_t>(h % n_addr));
  uint16_t p = be16(orig_port);
  if (r.port_min && (p < r.port_min || p > r.port_max))
    p = static_cast<uint16_t>(r.port_min + h % (static_cast<uint32_t>(r.port_max - r.port_min) + 1));
  *port = be16(p);
}

}  // namespace dpu
