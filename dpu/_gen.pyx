# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""_gen: the traffic generator's per-packet engine and the pcap helpers.

What it does: a :class:`Stamper` holds one built packet (the template) and a
plan made by dpu/gen.py from a scapy dissection of it: which byte ranges vary
(offset, width, range base and size), and which checksums those ranges touch
(the 16-bit words involved, per checksum). ``stamp()`` writes packets back to
back into a caller's buffer: copy the template, write each varied field from
the flow state, then fix every affected checksum incrementally (RFC 1624 eqn.
3, HC' = ~(~HC + ~m + m') summed over the changed words: the ~HC + sum(~m) part
is a constant computed once from the template). No Python object is touched
per packet; the loops run without the GIL.

Flow state: a flow counter that wraps at ``nflows`` (0 = never wraps: packet i
is flow i). "Key" fields are the digits of a mixed-radix odometer driven by the
flow counter (first key field fastest), so flows 0..P-1 get P distinct key
combinations; other fields cycle (digit = flow mod n). Each digit d is shown
as the permuted digit (a*d + b) mod n with gcd(a, n) = 1 (a=1, b=0 unless a
seed asks otherwise), which is a bijection, kept incrementally (+a mod n).

Pcap I/O reuses the core's C++ reader and writer (native/include/dpu/pcap.h)
and checksum helpers (native/src/checksum.h) through cdef extern: no second
implementation of either lives here.

Thread-safety: a Stamper is used by one thread at a time.
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from libcpp.string cimport string
from libcpp.vector cimport vector

import numpy as np


cdef extern from "dpu/status.h" namespace "dpu" nogil:
    # The codes are listed once (errors.def); this side only needs their names.
    cdef enum class Err(uint8_t):
        pass
    const char* err_name(Err code)

    cdef cppclass Status:
        Err code
        string message
        string file
        int64_t record
        bint ok()


cdef extern from "dpu/pcap.h" namespace "dpu" nogil:
    cdef cppclass PcapRecord:
        uint64_t ts_ns
        uint32_t caplen
        uint32_t origlen
        const uint8_t* data

    cdef cppclass PcapReader:
        Status open(const string& path)
        bint next(PcapRecord* rec)
        const Status& status()

    cdef cppclass PcapWriter:
        Status open(const string& path)
        void write(uint64_t ts_ns, const uint8_t* data, uint32_t length)
        Status close()


cdef extern from "checksum.h" namespace "dpu" nogil:
    uint16_t load16(const uint8_t* p)
    void store16(uint8_t* p, uint16_t v)
    uint16_t csum_fold(uint64_t s)


cdef enum:
    MAX_FIELDS = 16
    MAX_CSUMS = 4
    MAX_WORDS = 32
    WIDTH_VID = 0  # 802.1Q VLAN id: the low 12 bits of the 16-bit TCI


ctypedef struct FieldPlan:
    uint32_t off      # byte offset in the packet
    uint32_t width    # bytes (1, 2, 4, 6, 16) or WIDTH_VID
    uint64_t base_lo  # first value of the range (low 64 bits)
    uint64_t base_hi  # high 64 bits (16-byte fields only)
    uint64_t n        # number of values in the range (>= 1, < 2**63)
    uint64_t a        # permutation multiplier, gcd(a, n) == 1, a < n or a == 0 when n == 1
    uint64_t b        # permutation offset, b < n
    bint key          # odometer digit (True) or cycles with the flow (False)


ctypedef struct CsumPlan:
    uint32_t off      # offset of the 16-bit checksum in the packet
    bint udp          # a result of 0 is sent as 0xffff
    uint64_t c0       # ~HC + sum(~old word) from the template
    uint32_t nwords
    uint32_t words[MAX_WORDS]  # offsets of the words that may change


cdef inline void put_be(uint8_t* p, uint64_t v, uint32_t w) noexcept nogil:
    cdef uint32_t j
    for j in range(w):
        p[w - 1 - j] = <uint8_t>(v >> (8 * j))


class NativeError(Exception):
    """Raised with the native Status's text; dpu.gen maps it to dpu.errors."""

    def __init__(self, kind, message, file, record):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.file = file
        self.record = record


cdef object status_error(const Status& s):
    kind = err_name(s.code).decode()
    msg = s.message.decode("utf-8", "replace")
    f = s.file.decode("utf-8", "replace") if s.file.size() else None
    rec = s.record if s.record >= 0 else None
    text = msg
    if rec is not None:
        text = f"record {rec}: {text}"
    if f is not None:
        text = f"{f}: {text}"
    return NativeError(kind, text, f, rec)


cdef class Stamper:
    """One template and its variation plan; stamps packets in order, from packet 0."""

    cdef bytes tmpl_obj
    cdef const uint8_t* tmpl
    cdef readonly uint32_t length
    cdef readonly uint64_t nflows
    cdef int nf, nc
    cdef FieldPlan f[MAX_FIELDS]
    cdef CsumPlan c[MAX_CSUMS]
    # state: the next packet's flow and each field's digit / permuted digit
    cdef readonly uint64_t flow
    cdef uint64_t d[MAX_FIELDS]
    cdef uint64_t p[MAX_FIELDS]

    def __init__(self, bytes template, fields, csums, uint64_t nflows):
        """fields: [(off, width, base, n, a, b, key)], base a Python int (up to 128 bits);
        csums: [(off, is_udp, [word offsets])]; nflows: 0 for unbounded."""
        cdef int k, j
        cdef uint64_t s
        if len(template) == 0 or len(template) > 262144:
            raise ValueError(f"template length {len(template)} is not in 1..262144")
        if len(fields) > MAX_FIELDS:
            raise ValueError(f"at most {MAX_FIELDS} varied fields")
        if len(csums) > MAX_CSUMS:
            raise ValueError(f"at most {MAX_CSUMS} checksums")
        self.tmpl_obj = template
        self.tmpl = <const uint8_t*><const char*>self.tmpl_obj
        self.length = <uint32_t>len(template)
        self.nflows = nflows
        self.nf = len(fields)
        for k, (off, width, base, n, a, b, key) in enumerate(fields):
            w = 2 if width == WIDTH_VID else width
            if off < 0 or off + w > self.length:
                raise ValueError(f"field at offset {off} width {w} runs past the {self.length}-byte template")
            if not (1 <= n < (1 << 63)) or not (0 <= b < n) or not (0 <= a < max(n, 2)):
                raise ValueError(f"bad range plan n={n} a={a} b={b}")
            self.f[k].off = off
            self.f[k].width = width
            self.f[k].base_lo = base & 0xFFFFFFFFFFFFFFFF
            self.f[k].base_hi = (base >> 64) & 0xFFFFFFFFFFFFFFFF
            self.f[k].n = n
            self.f[k].a = a
            self.f[k].b = b
            self.f[k].key = bool(key)
        self.nc = len(csums)
        for k, (off, udp, words) in enumerate(csums):
            if off < 0 or off + 2 > self.length:
                raise ValueError(f"checksum at offset {off} runs past the template")
            if len(words) > MAX_WORDS:
                raise ValueError(f"at most {MAX_WORDS} changed words per checksum")
            self.c[k].off = off
            self.c[k].udp = bool(udp)
            self.c[k].nwords = len(words)
            s = <uint16_t>~load16(self.tmpl + <uint32_t>off)
            for j, w in enumerate(words):
                if w < 0 or w + 2 > self.length:
                    raise ValueError(f"checksum word at offset {w} runs past the template")
                self.c[k].words[j] = w
                s += <uint16_t>~load16(self.tmpl + <uint32_t>w)
            self.c[k].c0 = s
        self.reset()

    cpdef reset(self):
        """Start again at packet 0 (flow 0)."""
        cdef int k
        self.flow = 0
        for k in range(self.nf):
            self.d[k] = 0
            self.p[k] = self.f[k].b

    cdef void stamp(self, uint8_t* out, uint64_t count) noexcept nogil:
        """Write the next `count` packets back to back at `out` (count * length bytes)."""
        cdef uint64_t i, v, lo, hi, s
        cdef uint16_t hc, tci
        cdef int k, j
        cdef bint carry
        cdef uint8_t* pkt = out
        cdef uint32_t L = self.length
        cdef FieldPlan* fp
        cdef CsumPlan* cp
        for i in range(count):
            memcpy(pkt, self.tmpl, L)
            for k in range(self.nf):
                fp = &self.f[k]
                v = self.p[k]
                if fp.width == WIDTH_VID:
                    tci = <uint16_t>((pkt[fp.off] << 8) | pkt[fp.off + 1])
                    tci = <uint16_t>((tci & 0xF000) | ((fp.base_lo + v) & 0x0FFF))
                    pkt[fp.off] = <uint8_t>(tci >> 8)
                    pkt[fp.off + 1] = <uint8_t>tci
                elif fp.width == 16:
                    lo = fp.base_lo + v
                    hi = fp.base_hi + (1 if lo < fp.base_lo else 0)
                    put_be(pkt + fp.off, hi, 8)
                    put_be(pkt + fp.off + 8, lo, 8)
                else:
                    put_be(pkt + fp.off, fp.base_lo + v, fp.width)
            for k in range(self.nc):
                cp = &self.c[k]
                s = cp.c0
                for j in range(cp.nwords):
                    s += load16(pkt + cp.words[j])
                hc = <uint16_t>~csum_fold(s)
                if cp.udp and hc == 0:
                    hc = 0xFFFF
                store16(pkt + cp.off, hc)
            pkt += L
            # advance to the next flow
            self.flow += 1
            if self.flow == self.nflows:
                self.flow = 0
                for k in range(self.nf):
                    self.d[k] = 0
                    self.p[k] = self.f[k].b
                continue
            carry = True
            for k in range(self.nf):
                fp = &self.f[k]
                if fp.key and not carry:
                    continue
                self.d[k] += 1
                if self.d[k] == fp.n:
                    self.d[k] = 0
                    self.p[k] = fp.b
                else:
                    self.p[k] += fp.a
                    if self.p[k] >= fp.n:
                        self.p[k] -= fp.n
                    if fp.key:
                        carry = False

    def stamp_into(self, uint8_t[::1] out, uint64_t count):
        """Stamp the next `count` packets into `out` (a uint8 buffer of at least count * length)."""
        if <uint64_t>out.shape[0] < count * self.length:
            raise ValueError("output buffer too small")
        if count == 0:
            return
        with nogil:
            self.stamp(&out[0], count)

    def generate(self, uint64_t count, uint64_t start_ns, uint64_t interval_ns):
        """Packets 0..count-1 as (data, offsets, lengths, timestamps_ns) numpy arrays."""
        cdef uint64_t i, L = self.length
        self.reset()
        data = np.empty(count * L, dtype=np.uint8)
        offsets = np.empty(count, dtype=np.uint64)
        lengths = np.full(count, L, dtype=np.uint32)
        stamps = np.empty(count, dtype=np.uint64)
        cdef uint8_t[::1] dv = data
        cdef uint64_t[::1] ov = offsets
        cdef uint64_t[::1] tv = stamps
        with nogil:
            for i in range(count):
                ov[i] = i * L
                tv[i] = start_ns + i * interval_ns
            if count:
                self.stamp(&dv[0], count)
        return data, offsets, lengths, stamps

    def write_pcap(self, path, uint64_t count, uint64_t start_ns, uint64_t interval_ns, uint64_t chunk):
        """Stream packets 0..count-1 to a pcap file, `chunk` packets at a time."""
        cdef PcapWriter w
        cdef Status st
        cdef string cpath = _path_bytes(path)
        cdef uint64_t i, done = 0, n, L = self.length, ts = start_ns
        if chunk == 0:
            chunk = 1
        self.reset()
        buf = np.empty(min(chunk, max(count, 1)) * L, dtype=np.uint8)
        cdef uint8_t[::1] bv = buf
        cdef uint8_t* bp = &bv[0]
        st = w.open(cpath)
        if not st.ok():
            raise status_error(st)
        with nogil:
            while done < count:
                n = count - done
                if n > chunk:
                    n = chunk
                self.stamp(bp, n)
                for i in range(n):
                    w.write(ts, bp + i * L, <uint32_t>L)
                    ts += interval_ns
                done += n
        st = w.close()
        if not st.ok():
            raise status_error(st)
        return done


cdef string _path_bytes(path) except *:
    import os
    return os.fsencode(path)


def write_pcap(path, const uint8_t[::1] data, const uint64_t[::1] offsets, const uint32_t[::1] lengths,
               const uint64_t[::1] timestamps_ns):
    """Write packets (slices of `data`) to a classic nanosecond pcap through dpu::PcapWriter."""
    cdef PcapWriter w
    cdef Status st
    cdef string cpath = _path_bytes(path)
    cdef Py_ssize_t i, n = offsets.shape[0]
    cdef uint64_t total = <uint64_t>data.shape[0]
    if lengths.shape[0] != n or timestamps_ns.shape[0] != n:
        raise ValueError("offsets, lengths and timestamps_ns must have the same length")
    for i in range(n):
        if offsets[i] + lengths[i] > total or offsets[i] + lengths[i] < offsets[i]:
            raise ValueError(f"packet {i} (offset {offsets[i]}, length {lengths[i]}) runs past the data buffer")
        if lengths[i] > 262144:
            raise ValueError(f"packet {i} is {lengths[i]} bytes; pcap records are at most 262144")
    cdef const uint8_t* base = &data[0] if total else NULL
    st = w.open(cpath)
    if not st.ok():
        raise status_error(st)
    with nogil:
        for i in range(n):
            w.write(timestamps_ns[i], base + offsets[i], lengths[i])
    st = w.close()
    if not st.ok():
        raise status_error(st)
    return n


def read_pcap(path, int64_t limit=-1):
    """Read a pcap or pcapng file through dpu::PcapReader into (data, offsets, lengths, timestamps_ns).

    `limit` >= 0 stops after that many packets. Raises NativeError (kind: the status code's name, 'IO' or 'PCAP') on failure.
    """
    cdef PcapReader r
    cdef PcapRecord rec
    cdef Status st
    cdef string cpath = _path_bytes(path)
    cdef vector[uint8_t] data
    cdef vector[uint64_t] offsets
    cdef vector[uint32_t] lengths
    cdef vector[uint64_t] stamps
    cdef size_t pos
    cdef int64_t got = 0
    st = r.open(cpath)
    if not st.ok():
        raise status_error(st)
    with nogil:
        while limit < 0 or got < limit:
            if not r.next(&rec):
                break
            pos = data.size()
            data.resize(pos + rec.caplen)
            if rec.caplen:
                memcpy(data.data() + pos, rec.data, rec.caplen)
            offsets.push_back(pos)
            lengths.push_back(rec.caplen)
            stamps.push_back(rec.ts_ns)
            got += 1
    if not r.status().ok():
        raise status_error(r.status())
    out_data = np.empty(data.size(), dtype=np.uint8)
    out_off = np.empty(offsets.size(), dtype=np.uint64)
    out_len = np.empty(lengths.size(), dtype=np.uint32)
    out_ts = np.empty(stamps.size(), dtype=np.uint64)
    cdef uint8_t[::1] dv = out_data
    cdef uint64_t[::1] ov = out_off
    cdef uint32_t[::1] lv = out_len
    cdef uint64_t[::1] tv = out_ts
    if data.size():
        memcpy(&dv[0], data.data(), data.size())
    if offsets.size():
        memcpy(&ov[0], offsets.data(), offsets.size() * sizeof(uint64_t))
        memcpy(&lv[0], lengths.data(), lengths.size() * sizeof(uint32_t))
        memcpy(&tv[0], stamps.data(), stamps.size() * sizeof(uint64_t))
    return out_data, out_off, out_len, out_ts
