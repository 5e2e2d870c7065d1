// conntrack.h: the connection table, shared by every worker of a dataplane.
//
// Stage "conntrack" of the fast path (docs/design.md, "The path of a packet"):
//   Uses:  a packet sent to conntrack by a ct action (CtSpec: zone, commit,
//          nat, exec) at its parsed offsets, and the conntrack clock.
//   Sets:  the packet's ct_state, ct_zone, ct_mark and CtPacketMeta (label,
//          original-direction tuple); NAT rewrites its headers; connections
//          are created (commit), updated and found. A packet that cannot be
//          committed (quota, no NAT port, table full) is dropped with that
//          reason.
//   Next:  the worker recirculates the packet (ct(table=T)) or continues its
//          remaining datapath actions (ct without table).
//
// Table: a power-of-two array of buckets, one cache line each, sized from
// the connection limit when the first connection is created (one bucket
// per two connections). Every connection is linked twice, by its original
// and its reply key (conn.h). A bucket holds seven entries in single words
// (the connection's address, the key's direction and a 17-bit tag of the
// key's hash), and a chain for the keys that found it full; so a lookup
// reads one line for the bucket and then only the connections whose tag is
// the key's. Lookups take no lock: words and chains are read with acquire
// loads, and unlinked connections are freed only after every worker that
// might hold one has left its read section (epoch.h). Writers (create,
// expire, flush) lock the buckets they change through 1,024 striped
// spinlocks, two at most, in address order.
//
// Expiry: a connection belongs to the worker that created it; that worker's
// timer wheel (16,384 ticks of ~8.4 ms, each an array of connections) holds
// it at its expiry time and is advanced in bounded slices between batches
// (CtWorker::sweep), never on the per-packet path; a slice prefetches the
// connections, buckets and NAT mappings it is about to release a few
// ahead. A packet refreshes a connection's expiry with one store;
// the wheel re-files refreshed connections when their old tick comes (and
// those due beyond its ~2.3 min span at its far end, so an established TCP
// connection is looked at every 2.3 minutes of its 2 hours), and
// lookups treat a connection past its expiry as gone even before the wheel
// reaches it, so timeouts are exact whenever the sweep runs.
//
// Time: the conntrack clock runs with the monotonic clock (plus warp) from
// the dataplane's creation, and jumps ahead to a packet's timestamp when the
// packet is newer (a replay: hours of capture replay their timeouts
// faithfully, and time goes on from the last packet afterwards). It never
// goes back.
//
// Limits: a global connection limit and per-zone limits (tenant quotas),
// checked when a connection is committed; a packet over either is dropped
// (ct_table_full, ct_quota) and nothing else is disturbed.
//
// Thread-safety: execute()/CtWorker by their worker; config, dump, flush and
// counters from any thread.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "conn.h"
#include "ct_packet.h"
#include "ct_proto.h"
#include "dpu/drops.h"
#include "dpu/fields.h"
#include "dpu/mem.h"
#include "epoch.h"
#include "nat.h"

namespace dpu {

// A ct action as the datapath executes it (built by the slow path; owned by
// the megaflow).
struct CtSpec {
  uint16_t zone = 0;
  bool commit = false, force = false;
  bool nat = false;             // any nat keyword: translate per the connection
  NatRange range;               // nat(src=..)/nat(dst=..) for a new connection
  bool set_mark = false, set_label = false;
  uint32_t mark = 0, mark_mask = 0;
  u128 label = 0, label_mask = 0;
  uint32_t recirc_id = 0;       // ct(table=T): resume there; 0: continue the action list
};

// Timeouts (ct_timeouts.def: names and defaults) and the connection limit,
// with the bounds a transaction is held to (Dataplane::apply): a timeout is
// a whole number of nanoseconds above 0 and at most 30 days.
constexpr int64_t kCtTimeoutMinNs = 1;
constexpr int64_t kCtTimeoutMaxNs = 30ll * 24 * 3600 * 1000000000ll;
constexpr uint32_t kCtMaxConnsMin = 1, kCtMaxConnsMax = 1u << 30;
struct CtConfig {
  int64_t timeout_ns[TM_COUNT] = {
#define DPU_CT_TIMEOUT(e, name, seconds, help) seconds * 1000000000ll,
#include "dpu/ct_timeouts.def"
#undef DPU_CT_TIMEOUT
  };
  uint32_t max_conns = 2u << 20;
};

struct CtZoneCfg {
  uint32_t limit = 0;           // 0: none (the global limit still applies)
  bool eif = false;             // endpoint-independent filtering (RFC 4787 REQ-8)
};

// What the conntrack stage did to one packet. The tuples are written only
// when they are meant to be read (orig with have_tuple; before and after in
// a trace's dry run), so a result costs no 120-byte clear per packet.
// Constructed uninitialised: every Conntrack::execute*() call that decides
// (execute_known() and execute_carried() may return false first, having
// written nothing) writes every field read without a condition above (with
// reset(), or, for a packet of a live connection, along the way:
// decide_plain()). The stage is bound by its stores, about one a cycle
// (docs/performance.md): member initialisers cost five more per packet,
// which the compiler cannot drop once the result's address is passed on.
struct CtResult {
  CtResult() {}
  void reset() {
    state = dir = 0;
    drop = DROP_NONE;
    mark = life = 0;
    label = 0;
    conn = nullptr;
    have_tuple = created = false;
    nat_applied = 0;
  }
  uint8_t state;                // kCs* bits
  uint8_t dir;                  // the packet's direction in conn (0 original, 1 reply)
  uint16_t drop;                // the packet must be dropped, and why
  uint32_t mark;
  uint32_t life;                // conn's life count, read before its mark and label (conn.h)
  u128 label;
  Conn* conn;                   // the connection the packet belongs to, if any
  bool have_tuple;              // orig is the original-direction tuple
  // for trace
  bool created;                 // committed now
  uint8_t nat_applied;          // kNatSrc / kNatDst on this packet
  CtKey orig;
  CtKey before, after;          // the packet's tuple before and after NAT (dry run)
};

// A packet prepared for the stage (Conntrack::prepare): its tuple, the key it
// is looked up by and that key's hash, so that its bucket can be prefetched
// a few packets before it is read.
struct CtPrep {
  CtPacket cp;
  CtKey key;            // the lookup key: the tuple, or its reverse for a packet already translated
  uint32_t hash = 0;
  bool ok = false;      // conntrack can follow the packet (else +inv)
  bool natted = false;  // an earlier ct of this zone translated it
  uint8_t prev_nat = 0;
};

class Conntrack;

// What removals release (the connection counts, NAT mappings), gathered to
// be released at once (Conntrack::release(CtReleases*)): an expiry sweep
// takes the NAT lock and does the counts' locked subtractions once, not once
// a connection.
struct CtReleases {
  std::vector<std::pair<uint16_t, uint32_t>> zones;  // zone, connections
  std::vector<NatMapping*> maps;
};

// A counter with one writer at a time and readers that load it relaxed.
inline void bump(uint64_t& c, uint64_t n = 1) { __atomic_store_n(&c, c + n, __ATOMIC_RELAXED); }

// One worker's side of the table: its epoch slot, expiry wheel, connection
// free list and counters.
class CtWorker {
 public:
  CtWorker(Conntrack* ct, int slot);
  ~CtWorker();
  CtWorker(const CtWorker&) = delete;
  CtWorker& operator=(const CtWorker&) = delete;

  // Around a batch's conntrack stage.
  void begin();
  void end();
  // Expiry: at most `budget` connections of this worker's wheel are looked
  // at; freed memory is reclaimed once no reader can hold it. Another worker
  // may sweep this wheel too (at a quota), so the wheel, the free list and
  // the retired list are under a spinlock.
  void sweep(int64_t now, size_t budget);
  int slot() const { return slot_; }
  static constexpr int64_t kTickNs = int64_t{1} << 23;  // the expiry wheel's tick (kTickShift)

  // This worker's counts: written by one thread at a time (created and
  // removed by the owner, expired under the wheel's lock) with bump(), read
  // by anyone with relaxed loads (counts()), never under a lock.
  uint64_t created = 0, expired = 0, removed = 0;
  struct Counts {
    uint64_t created, expired, removed;
  };
  Counts counts() const {
    return {__atomic_load_n(&created, __ATOMIC_RELAXED), __atomic_load_n(&expired, __ATOMIC_RELAXED),
            __atomic_load_n(&removed, __ATOMIC_RELAXED)};
  }

 private:
  friend class Conntrack;
  static constexpr int kWheelBits = 14;
  static constexpr int kWheelSlots = 1 << kWheelBits;
  // ~8.4 ms: an expired connection's memory, quota slot and NAT port come
  // back within two ticks. (With ~1 s ticks a churn of a million short
  // connections a second kept four times as many in the table as were live:
  // snat-new x1.175 at ~67 ms, x1.057 more at ~17 ms, x1.041 more at ~8.4 ms
  // with twice the ticks, so that the span stays ~2.3 min.)
  static constexpr int kTickShift = 23;
  static_assert(kTickNs == int64_t{1} << kTickShift, "one tick");
  static constexpr size_t kAllocAhead = 2;  // alloc() prefetches the connection it hands out that many calls later

  Conn* alloc();
  void file(Conn* c, int64_t now);
  void reclaim();
  void sweep_locked(int64_t now, size_t budget);
  void lock() {
    while (lock_.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
  }
  bool try_lock() { return !lock_.exchange(1, std::memory_order_acquire); }
  void unlock() { lock_.store(0, std::memory_order_release); }
  std::atomic<uint8_t> lock_{0};

  Conntrack* ct_;
  int slot_;
  std::vector<Conn*> free_;
  std::vector<std::pair<uint64_t, Conn*>> retired_;  // (epoch tag, connection)
  std::unique_ptr<std::vector<Conn*>[]> wheel_;  // by tick: the connections filed there
  std::vector<Conn*> refile_;                     // sweep's scratch
  CtReleases releases_;                           // sweep's scratch
  int64_t cursor_ = -1;         // next tick to process
  size_t filed_ = 0;
  bool in_read_ = false;
};

class Conntrack {
 public:
  Conntrack();
  ~Conntrack();
  Conntrack(const Conntrack&) = delete;
  Conntrack& operator=(const Conntrack&) = delete;

  // ---- configuration (any thread) -------------------------------------------------------
  void set_config(const CtConfig& c);
  CtConfig config() const;
  void set_zones(const std::vector<std::pair<uint16_t, CtZoneCfg>>& zones);  // replaces every zone's settings
  NatTable& nat() { return nat_; }

  // ---- workers -------------------------------------------------------------------------------
  std::unique_ptr<CtWorker> attach();

  // ---- the stage (worker, between CtWorker::begin and end) --------------------------------
  // A batch goes through as a pipeline so that memory latency overlaps
  // (ct_stage.cc): a packet is prepared and its bucket prefetched some
  // packets before its turn, the connections its tag points to a few before,
  // then it is executed.
  // hash: false leaves pr->hash unset (a carried connection may make the
  // lookup unnecessary: hash_prep() when it does not).
  void prepare(Packet* p, const CtSpec& spec, CtPrep* pr, bool hash = true) const;
  static void hash_prep(CtPrep* pr);
  void prefetch_head(uint32_t hash) const {  // the key's bucket
    Bucket* bs = buckets();
    if (bs) dpu::prefetch(&bs[hash & mask_]);
  }
  // The connections in it that the key's tag points to; false if the key
  // cannot be in the table (no tag matches and no chain).
  bool prefetch_node(uint32_t hash) const {
    Bucket* bs = buckets();
    if (!bs) return false;
    const Bucket& b = bs[hash & mask_];
    const uint32_t m = tag_matches(b, tag_of(hash));
    for (uint32_t x = m; x; x &= x - 1)
      prefetch_conn(conn_of(b.slot[__builtin_ctz(x)].load(std::memory_order_relaxed)));
    return m || b.chain.load(std::memory_order_relaxed) != nullptr;
  }
  // For a packet that will open a source-NATed connection: the bucket its
  // reply key will be inserted in, with the port NAT is expected to pick
  // (NatTable::predict), so that insert() does not wait for it.
  void prefetch_snat_reply(const CtPrep& pr, const CtSpec& spec) const;
  void execute(CtWorker& w, Packet* p, const CtSpec& spec, CtPrep& pr, int64_t now, bool dry_run, CtResult* r);
  void execute(CtWorker& w, Packet* p, const CtSpec& spec, int64_t now, bool dry_run, CtResult* r);
  // The stage for an untracked packet whose connection the worker remembers
  // (its cache of established connections, worker.h): `c` stands in for the
  // lookup only if its life count is still `life` (the same live
  // connection; conn.h) and it has not expired, and, for a packet whose
  // flow key does not name its tuple (ICMP; and IPv6, whose keys are read
  // anyway), its key in direction `dir` is the packet's tuple and its other
  // key the one `other` was taken from; then the packet gets exactly what
  // execute() would give it. An IPv4 TCP or UDP packet's connection is
  // vouched for by the cache (the EMC entry's key is its tuple), and then
  // only the connection's first line is read: NAT and the original tuple
  // come from `other`. False: `c` is not the packet's connection and
  // nothing was done.
  bool execute_known(CtWorker& w, Packet* p, const CtSpec& spec, Conn* c, uint8_t dir, uint32_t life,
                     const CtXlat& other, int64_t now, CtResult* r);
  // The stage for a packet that an earlier ct put in connection `c` (in
  // direction `dir`; Packet::ct_conn), prepared without its hash: `c` stands
  // in for the lookup only if it is live and its key in that direction is
  // the lookup key; then the packet gets exactly what execute() would give
  // it. False: nothing was done. Safe for the same reasons as execute_known.
  bool execute_carried(CtWorker& w, Packet* p, const CtSpec& spec, CtPrep& pr, Conn* c, uint8_t dir,
                       int64_t now, bool dry_run, CtResult* r);
  // The two lines a packet of the connection uses (conn.h).
  static void prefetch_conn(const Conn* c) {
    const char* b = reinterpret_cast<const char*>(c);
    dpu::prefetch(b);
    dpu::prefetch(b + 64);
  }
  // What expiry reads (conn.h): the first line, and the third for
  // unlinking it (its chain nodes) and releasing its mapping.
  static void prefetch_for_expiry(const Conn* c) {
    dpu::prefetch(c);
    dpu::prefetch(reinterpret_cast<const char*>(c) + 128);
  }

  // ---- dumps and counters (any thread) ---------------------------------------------------
  struct Entry {
    CtKey orig, reply;
    uint32_t mark;
    u128 label;
    const char* protoinfo;  // TCP state, or nullptr
    int64_t expires_in_ns;
    uint8_t nat;
  };
  void dump(int zone, int64_t now, std::vector<Entry>* out);  // zone -1: all; sorted by zone, protocol, tuple
  // One entry in the shape of `ovs-appctl dpctl/dump-conntrack`:
  // tcp,orig=(src=..,dst=..,sport=..,dport=..),reply=(..),zone=N,mark=M,protoinfo=(state=..)
  static std::string format(const Entry& e);
  size_t flush(int zone);                         // zone -1: all; returns how many
  // The connections whose original-direction keys are among `origs` (as
  // dump() gives them): what a policy change no longer allows. Returns how many.
  size_t flush_keys(const std::vector<CtKey>& origs);
  uint64_t flushed() const { return flushed_.load(std::memory_order_relaxed); }  // by flush(), ever
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  void zone_counts(std::vector<std::pair<uint16_t, uint32_t>>* out) const;
  size_t bytes_per_conn() const;
  size_t table_bytes() const;
  // The conntrack clock at monotonic time `mono` (the dataplane's clock,
  // ns), taking the newest packet timestamp of a batch into account (0: none).
  int64_t now(int64_t mono, int64_t packet_ts = 0);
  // A packet's timestamp (ns, unsigned) on the conntrack clock: saturated at
  // kMaxStamp (2^62 ns, the year 2116 in Unix time), so that a stamp of 2^63
  // or more is a jump to the clock's end rather than a negative time that
  // moves nothing, and clock + timeout never overflows.
  static constexpr int64_t kMaxStamp = int64_t{1} << 62;
  static int64_t stamp(uint64_t ts_ns) {
    return ts_ns >= static_cast<uint64_t>(kMaxStamp) ? kMaxStamp : static_cast<int64_t>(ts_ns);
  }
  void set_origin(int64_t mono) { origin_ = mono; }
  // tag_matches() against tag_matches_plain() on random buckets: mismatches.
  static uint64_t selftest_tag_matches(uint64_t iterations, uint64_t seed);

 private:
  friend class CtWorker;
  struct alignas(64) Stripe {
    std::atomic<uint8_t> l{0};
    void lock() {
      while (l.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
    }
    void unlock() { l.store(0, std::memory_order_release); }
  };
  struct ZoneState {
    std::atomic<uint32_t> count{0};
    std::atomic<uint32_t> limit{0};
    std::atomic<bool> eif{false};
  };
  static constexpr uint32_t kStripes = 1024;

  // A bucket: kSlots entries, each 0 or tag << kTagShift | connection | direction,
  // and the chain of the keys that found every entry taken.
  static constexpr int kSlots = 7;
  static constexpr int kTagShift = 47;  // user-space addresses are below 2^47
  struct alignas(64) Bucket {
    std::atomic<uint64_t> slot[kSlots];
    std::atomic<CtNode*> chain;
  };
  static_assert(sizeof(Bucket) == 64, "a bucket is a cache line");
  static uint64_t tag_of(uint32_t hash) { return (hash * 0x9e3779b1u) >> 15; }  // 17 bits
  static uint64_t entry_of(const CtNode* n, uint32_t hash) {
    return tag_of(hash) << kTagShift | reinterpret_cast<uintptr_t>(Conn::of(n)) | n->dir;
  }
  static Conn* conn_of(uint64_t e) {
    return reinterpret_cast<Conn*>(e & ((uint64_t{1} << kTagShift) - 1) & ~uint64_t{63});
  }
  // Bit i set: slot i of `b` holds an entry with tag `tag` (a hint: a slot
  // may change before it is read again). With AVX2 the bucket's line is
  // compared in two loads, without a branch per slot (snat-1m x1.14: the
  // slot loop's branches were mispredicted); each aligned 8-byte element of
  // an aligned vector load is read whole on x86, as a slot's atomic load
  // would read it. selftest_tag_matches() checks it against the plain loop.
  static uint32_t tag_matches_plain(const Bucket& b, uint64_t tag) {
    uint32_t m = 0;
    for (int i = 0; i < kSlots; i++) {
      const uint64_t e = b.slot[i].load(std::memory_order_relaxed);
      if (e && (e >> kTagShift) == tag) m |= 1u << i;
    }
    return m;
  }
  static uint32_t tag_matches(const Bucket& b, uint64_t tag) {
#if defined(__AVX2__)
    static_assert(offsetof(Bucket, slot) == 0 && offsetof(Bucket, chain) == 56, "the slots, then the chain");
    const __m256i t = _mm256_set1_epi64x(static_cast<long long>(tag)), zero = _mm256_setzero_si256();
    const __m256i* v = reinterpret_cast<const __m256i*>(&b);
    const __m256i lo = _mm256_load_si256(v), hi = _mm256_load_si256(v + 1);  // slots 0-3; 4-6 and the chain
    const __m256i mlo =
        _mm256_andnot_si256(_mm256_cmpeq_epi64(lo, zero), _mm256_cmpeq_epi64(_mm256_srli_epi64(lo, kTagShift), t));
    const __m256i mhi =
        _mm256_andnot_si256(_mm256_cmpeq_epi64(hi, zero), _mm256_cmpeq_epi64(_mm256_srli_epi64(hi, kTagShift), t));
    const uint32_t m = static_cast<uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(mlo))) |
                       static_cast<uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(mhi))) << 4;
    return m & ((1u << kSlots) - 1);
#else
    return tag_matches_plain(b, tag);
#endif
  }
  Bucket* buckets() const { return buckets_.load(std::memory_order_acquire); }
  static bool bucket_empty(const Bucket& b);
  static constexpr uint32_t kMaxBuckets = 1u << 27;  // 8 GiB: 268M connections at the usual two per bucket
  static uint32_t buckets_for(uint32_t max_conns);    // one per two connections, a power of two
  void ensure_table();
  Conn* lookup(const CtKey& k, uint32_t h, int64_t now, int* dir) const;
  template <class F>
  void for_each_node(const Bucket& b, F&& f) const;  // f(CtNode*), the bucket's entries and chain (writer's lock held)
  bool live(const Conn* c, int64_t now) const {
    return !c->dead(std::memory_order_relaxed) && c->expires.load(std::memory_order_relaxed) > now;
  }
  // Expiry's prefetches for a connection: the two buckets it is linked in
  // and its NAT mapping; then (the mapping fetched) the mapping's map slot.
  void prefetch_buckets(const Conn* c) const;
  void prefetch_mapping_slot(const Conn* c) const;
  void lock2(uint32_t b0, uint32_t b1);
  void unlock2(uint32_t b0, uint32_t b1);
  void link(CtNode* n, uint32_t b);    // into an empty entry of bucket b, or its chain
  void unlink(CtNode* n, uint32_t b);
  // Inserts a new connection; false if its reply key is taken (then
  // *existing is the live connection with its original key, if any).
  bool insert(Conn* c, int64_t now, Conn** existing);
  bool remove(Conn* c, CtReleases* later = nullptr);  // unlink; false if it was already gone
  void release(CtReleases* later);
  void refresh(Conn* c, int64_t now) const;
  void exec(Conn* c, const CtSpec& spec) const;
  uint16_t admit(uint16_t zone);  // counts a new connection in, or the drop reason
  void release(uint16_t zone);
  template <class Pred>
  size_t flush_where(Pred pred);  // the connections pred(conn) picks, as flush() removes them
  // The result's connection, mark, label and original tuple: from the
  // connection's keys, or, with `other` (execute_known), from the packet's
  // tuple and the other key's translation, without reading the keys.
  void fill_result(Conn* c, int dir, CtResult* r, const CtPacket* cp = nullptr, const CtXlat* other = nullptr) const;
  // The decision for a packet once its connection (or none) is known:
  // decide_existing() for a live connection's packet (inline, specialised
  // by decide_plain() for execute() and execute_known()), decide_new() for
  // one that would open a connection, finish() for the NAT and result of
  // either kind of match. decide() and decide_new() take a reset result;
  // decide_plain() resets it as far as its path needs.
  void decide(CtWorker& w, Packet* p, const CtSpec& spec, CtPacket& cp, bool natted, uint8_t prev_nat, Conn* c,
              int dir, int64_t now, bool dry_run, CtResult* r);
  bool decide_existing(CtWorker& w, const CtSpec& spec, CtPacket& cp, bool natted, uint8_t prev_nat, Conn* c, int dir,
                       int64_t now, bool dry_run, CtResult* r, const CtXlat* other = nullptr);
  void decide_new(CtWorker& w, Packet* p, const CtSpec& spec, CtPacket& cp, int64_t now, bool dry_run, CtResult* r);
  void finish(const CtSpec& spec, CtPacket& cp, bool natted, uint8_t prev_nat, Conn* c, int dir, bool dry_run,
              CtResult* r, const CtXlat* other = nullptr) const;
  void decide_plain(CtWorker& w, Packet* p, const CtSpec& spec, CtPacket& cp, Conn* c, int dir, int64_t now,
                    CtResult* r, const CtXlat* other = nullptr);
  void sweep_others(const CtWorker* self, int64_t now, size_t budget);
  Conn* alloc_chunk(std::vector<Conn*>* free_list);

  struct FreeDelete {
    void operator()(void* p) const { std::free(p); }
  };
  std::atomic<Bucket*> buckets_{nullptr};       // huge pages, zero until touched (dpu/mem.h)
  uint32_t mask_ = 0;
  std::mutex table_mu_;                            // first allocation, chunks
  std::vector<std::unique_ptr<void, FreeDelete>> chunks_;  // 2 MiB each, huge pages
  std::unique_ptr<Stripe[]> stripes_;
  std::unique_ptr<ZoneState[]> zones_;             // 65,536
  std::atomic<uint64_t> count_{0};
  std::atomic<uint32_t> max_conns_;
  std::atomic<int64_t> timeout_ns_[TM_COUNT];
  std::atomic<int64_t> clock_{0};
  std::atomic<uint64_t> flushed_{0};
  std::atomic<int64_t> offset_{0};  // packet time minus monotonic time, once a packet led
  int64_t origin_ = 0;
  Epoch epoch_;
  NatTable nat_;
  std::mutex workers_mu_;
  std::vector<CtWorker*> workers_;                 // attached (for flush: reclaim hints)
};

}  // namespace dpu
