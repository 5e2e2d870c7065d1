"""Traffic generator (dpu.gen / dpu._gen): flows, field ranges, lengths, checksums, pcap I/O.

Every case's packets are checked two independent ways: all of them by the tests'
checksum verifier (tests/helpers/checksums.py), and a sample by scapy (delete the length
and checksum fields, rebuild, compare bytes). tshark, when installed, checks the pcap too.
"""
import shutil
import subprocess

import numpy as np
import pytest
from scapy.all import ICMPv6EchoRequest, IP, IPv6, TCP, UDP, Ether, Raw, rdpcap, raw

from dpu import gen
from dpu.errors import DpuError
from helpers.checksums import assert_checksums

# A row: (id, template, generate() keyword arguments, flows-distinct check applies).
CASES = [
    ("udp4-sport-x-dst", 'Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")/'
     'IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)',
     dict(flows=300, vary={"udp.sport": "1000-1099", "ip.dst": "10.0.0.0/24"}, size=64)),
    ("tcp4-default-flows", 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/TCP(dport=8080, flags="S")',
     dict(flows=500, size=64)),
    ("udp4-options-ttl-tos", 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1", options=[IPOption_RR()])/'
     'UDP(sport=4001, dport=4000)',
     dict(flows=200, vary={"ip.src": "172.16.0.0/12", "udp.dport": "1024-65535", "ip.ttl": "1-255",
                           "ip.tos": "0-255"}, size=128)),
    ("vlan-udp4", 'Ether()/Dot1Q(vlan=10, prio=5)/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(sport=4001, dport=4000)',
     dict(flows=64, vary={"ip.src": "10.9.0.0/26", "vlan.vid": "100-163"}, size=70)),
    ("tcp6-carry", 'Ether()/IPv6(src="2001:db8::1", dst="2001:db8::2")/TCP(sport=4001, dport=8443)',
     dict(flows=256, vary={"ipv6.src": "2001:db8:0:0:ffff:ffff:ffff:ffc0-2001:db8:0:1::ff", "tcp.sport": "5000-5001"},
          size=100)),
    ("udp6-dst-hlim", 'Ether()/IPv6(src="2001:db8::1", dst="2001:db8::2")/UDP(sport=4001, dport=4000)',
     dict(flows=256, vary={"ipv6.dst": "2001:db8:ff::/120", "ipv6.hlim": "1-64"}, size=90)),
    ("icmpv6-default-flows", 'Ether()/IPv6(src="2001:db8::1", dst="2001:db8::2")/ICMPv6EchoRequest(id=7)',
     dict(flows=50, size=80)),
    ("icmp4-default-flows", 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/ICMP()', dict(flows=20, size=64)),
    ("vxlan-outer", 'Ether()/IP(src="192.168.0.1", dst="192.168.0.2")/UDP(sport=49152, dport=4789)/'
     'VXLAN(vni=5, flags=0x08)/Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b")/'
     'IP(src="10.0.0.1", dst="10.0.0.2")/UDP(sport=4001, dport=4000)',
     dict(flows=100, vary={"udp.sport": "49152-65535", "ip.src": "192.168.1.0/24"}, size=128)),
    ("udp4-seeded", 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(sport=4001, dport=4000)',
     dict(flows=1000, vary={"ip.dst": "10.0.0.0/22", "udp.sport": "1024-1031"}, size=64, seed=7)),
    ("tcp4-sport-no-flows", 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/TCP(dport=8080)',
     dict(vary={"tcp.sport": "2000-2999"}, size=66)),
]
IDS = [c[0] for c in CASES]


def _count(kw):
    return 3 * kw["flows"] + 7 if kw.get("flows") else 2500


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request):
    name, template, kw = request.param
    return name, template, kw, gen.generate(template, _count(kw), **kw)


def _offsets(frame: bytes) -> dict:
    """First offset of each scapy layer class name in the frame."""
    out = {}
    layer = Ether(frame)
    while layer:
        out.setdefault(type(layer).__name__, len(frame) - len(raw(layer)))
        layer = layer.payload
    return out


def _rows(pk):
    assert len(set(pk.lengths.tolist())) == 1
    n, length = len(pk), int(pk.lengths[0])
    assert np.array_equal(pk.offsets, np.arange(n, dtype=np.uint64) * length)
    return pk.data.reshape(n, length)


def _verify_checksums(pk, udp_zero=False):
    """Every packet through the tests' checksum verifier (the outermost IPv4 header,
    TCP/UDP/ICMP/ICMPv6): all right, a UDP checksum 0 kept where the template has none
    (``udp_zero``) and never 0 where it has one. Returns the L4 checksum fields (None for
    ICMPv4), read at the first packet's offsets."""
    want = None
    for i in range(len(pk)):
        checked = assert_checksums(pk[i], udp_zero=udp_zero)
        assert want is None or checked == want, f"packet {i}: verified {checked}, packet 0: {want}"
        want = checked
    assert want and any(name.split()[0] in ("TCP", "UDP", "ICMP", "ICMPv6") for name in want), want
    a = _rows(pk)
    off = _offsets(pk[0])
    if "IP" in off and ("IPv6" not in off or off["IP"] < off["IPv6"]):
        ip = off["IP"]
        l4, proto = ip + int(a[0, ip] & 15) * 4, int(a[0, ip + 9])
    else:
        ip = off["IPv6"]
        l4, proto = ip + 40, int(a[0, ip + 6])
    if proto == 1:
        return None
    csum_at = {6: 16, 17: 6, 58: 2}[proto]
    return a[:, l4 + csum_at].astype(np.uint32) << 8 | a[:, l4 + csum_at + 1]


def _scapy_rebuild(frame: bytes) -> bytes:
    """The frame rebuilt by scapy with every length and checksum recomputed."""
    p = Ether(frame)
    for layer in p.iterpayloads():
        for f in ("len", "chksum", "cksum", "plen"):
            if f in layer.fields and not (isinstance(layer, UDP) and f == "chksum" and layer.chksum == 0):
                delattr(layer, f)
    return raw(p)


def _five_tuples(pk):
    """One row of bytes (addresses, protocol, ports) per packet."""
    a = _rows(pk)
    off = _offsets(pk[0])
    cols = []
    if "IP" in off:
        cols.append(a[:, off["IP"] + 12:off["IP"] + 20])
        cols.append(a[:, off["IP"] + 9:off["IP"] + 10])
    else:
        cols.append(a[:, off["IPv6"] + 8:off["IPv6"] + 40])
        cols.append(a[:, off["IPv6"] + 6:off["IPv6"] + 7])
    for l4 in ("TCP", "UDP"):
        if l4 in off:
            cols.append(a[:, off[l4]:off[l4] + 4])
            break
    return np.concatenate(cols, axis=1)


# --------------------------------------------------------------------------- every case

def test_lengths_are_as_requested(case):
    name, _, kw, pk = case
    assert len(pk) == _count(kw)
    if "size" in kw:
        assert (pk.lengths == kw["size"]).all()
    p = Ether(pk[len(pk) // 2])
    assert len(raw(p)) == len(pk[len(pk) // 2])
    if IP in p:
        assert p[IP].len == len(pk[0]) - _offsets(pk[0])["IP"]
    if IPv6 in p:
        assert p[IPv6].plen == len(pk[0]) - _offsets(pk[0])["IPv6"] - 40
    if UDP in p:
        assert p[UDP].len == len(pk[0]) - _offsets(pk[0])["UDP"]


def test_every_packet_has_correct_checksums(case):
    _verify_checksums(case[3])


def test_sample_matches_scapy_recomputation(case):
    pk = case[3]
    rng = np.random.default_rng(1)
    idx = sorted({0, 1, len(pk) - 1, *rng.integers(0, len(pk), 25).tolist()})
    for i in idx:
        frame = pk[i]
        assert _scapy_rebuild(frame) == frame, f"packet {i} differs from scapy's rebuild:\n{Ether(frame).show2(dump=True)}"


def test_flows_are_distinct_and_repeat(case):
    name, _, kw, pk = case
    n = kw.get("flows")
    a = _rows(pk)
    if n is None:  # no flows: packet i is "flow i"; the 1000-port range cycles
        tuples = _five_tuples(pk)
        assert len({r.tobytes() for r in tuples[:1000]}) == 1000
        assert np.array_equal(a[1000:], a[:-1000])
        return
    tuples = _five_tuples(pk)
    assert len({r.tobytes() for r in tuples[:n]}) == n, "flows must be distinct 5-tuples"
    assert np.array_equal(a[n:], a[:-n]), "packet i must be a copy of flow i % N"


# --------------------------------------------------------------------------- flow layout

def test_mixed_radix_first_field_fastest():
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', 24, flows=12,
                      vary={"udp.sport": "1000-1002", "ip.dst": "10.0.0.0/30"})
    for i in range(24):
        p = Ether(pk[i])
        f = i % 12
        assert (p[UDP].sport, p[IP].dst) == (1000 + f % 3, f"10.0.0.{f // 3}")


def test_other_fields_cycle_with_the_flow():
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', 20, flows=10,
                      vary={"eth.dst": "02:00:00:00:00:01-02:00:00:00:00:03", "udp.sport": "1000-1009"})
    for i in range(20):
        p = Ether(pk[i])
        assert p.dst == f"02:00:00:00:00:0{i % 10 % 3 + 1}"
        assert p[UDP].sport == 1000 + i % 10


def test_default_flows_spill_into_ip_source():
    n = 70000  # more than the 64512 default source ports
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', n, flows=n)
    t = _five_tuples(pk)
    assert len({r.tobytes() for r in t}) == n
    srcs = {bytes(r) for r in t[:, :4]}
    assert srcs == {bytes([10, 1, 0, 1]), bytes([10, 1, 0, 2])}
    _verify_checksums(pk)


def test_non_ip_flows_are_distinct_mac_pairs():
    pk = gen.generate('Ether(src="02:00:00:00:01:00", dst="02:00:00:00:00:02")/ARP()', 300, flows=100)
    a = _rows(pk)
    assert len({r.tobytes() for r in a[:100, :12]}) == 100
    assert np.array_equal(a[100:], a[:-100])
    assert Ether(pk[99]).src == "02:00:00:00:01:63"


def test_vlan_id_varies_and_priority_stays():
    pk = gen.generate('Ether()/Dot1Q(vlan=10, prio=5)/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)',
                      8, vary={"vlan.vid": "4090-4095"})
    vids = [Ether(b).vlan for b in pk]
    assert vids == [4090, 4091, 4092, 4093, 4094, 4095, 4090, 4091]
    assert {Ether(b).prio for b in pk} == {5}


def test_ipv6_range_carries_across_64_bits():
    pk = gen.generate('Ether()/IPv6(src="2001:db8::1", dst="2001:db8::2")/UDP(dport=4000)', 3,
                      vary={"ipv6.src": "2001:db8:0:0:ffff:ffff:ffff:ffff-2001:db8:0:1::1"})
    assert [Ether(b)[IPv6].src for b in pk] == ["2001:db8::ffff:ffff:ffff:ffff", "2001:db8:0:1::", "2001:db8:0:1::1"]


def test_seed_permutes_values_but_keeps_them_distinct():
    t = 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)'
    kw = dict(flows=256, vary={"ip.dst": "10.0.0.0/24"})
    plain, s1, s1b, s2 = (gen.generate(t, 256, seed=s, **kw) for s in (0, 1, 1, 2))
    dst = lambda pk: [bytes(r) for r in _five_tuples(pk)[:, 4:8]]  # noqa: E731
    assert dst(plain) == [bytes([10, 0, 0, i]) for i in range(256)]
    assert sorted(dst(s1)) == dst(plain) and dst(s1) != dst(plain)
    assert dst(s1) == dst(s1b) and dst(s1) != dst(s2)
    _verify_checksums(s1)


# --------------------------------------------------------------------------- checksums

def test_udp_checksum_zero_stays_zero():
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000, chksum=0)', 500, flows=250,
                      vary={"udp.sport": "1000-1009", "ip.src": "10.2.0.0/24"}, size=64)
    _verify_checksums(pk, udp_zero=True)


def test_udp_checksum_that_becomes_zero_is_sent_as_ffff():
    # Over all 65536 source ports exactly one makes the computed checksum 0: sent as 0xffff.
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', 65536,
                      vary={"udp.sport": "0-65535"}, size=64)
    sums = _verify_checksums(pk)
    hits = np.nonzero(sums == 0xFFFF)[0]
    assert len(hits) == 1
    frame = pk[int(hits[0])]
    assert _scapy_rebuild(frame) == frame  # scapy also sends 0 as 0xffff


def test_template_forms_agree_and_captured_padding_is_replaced():
    s = 'Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)'
    pkt = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.1.0.1", dst="10.0.0.1") / UDP(dport=4000)
    kw = dict(flows=10, size=64)
    a = gen.generate(s, 20, **kw)
    b = gen.generate(pkt, 20, **kw)
    captured = raw(pkt) + b"\x00" * 18  # a 60-byte frame as captured: 42 header bytes, 18 of padding
    c = gen.generate(captured, 20, **kw)
    assert np.array_equal(a.data, b.data) and np.array_equal(a.data, c.data)
    unset = Ether() / IP(src="10.1.0.1", dst="10.0.0.1") / UDP(dport=4000)
    gen.generate(unset, 1)
    assert "dst" not in unset.fields and "src" not in unset.fields  # the caller's packet is not modified
    d = gen.generate(raw(pkt / Raw(b"\x00" * 22)), 20, flows=10)  # bytes as they are, no size
    assert np.array_equal(a.data, d.data)
    e = gen.generate(captured, 20, flows=10, size=50)  # below the captured 60, above the 42 of headers
    assert (e.lengths == 50).all() and Ether(e[3])[IP].len == 36
    _verify_checksums(e)
    assert _scapy_rebuild(e[3]) == e[3]


def test_no_flows_no_vary_repeats_the_template():
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', 5)
    assert len(pk) == 5 and len(set(pk)) == 1 and len(pk[0]) == 42


# --------------------------------------------------------------------------- Packets and pcap

def test_packets_indexing_and_iteration():
    pk = gen.generate('Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)', 10, flows=10, start_ns=5,
                      interval_ns=3)
    assert list(pk)[-1] == pk[-1] == pk[9]
    assert pk.timestamps_ns.tolist() == [5 + 3 * i for i in range(10)]
    sub = pk[2:5]
    assert len(sub) == 3 and sub[0] == pk[2]
    with pytest.raises(IndexError):
        pk[10]
    assert pk.data.dtype == np.uint8 and pk.offsets.dtype == np.uint64
    assert pk.lengths.dtype == np.uint32 and pk.timestamps_ns.dtype == np.uint64
    empty = gen.generate('Ether()/IP()/UDP()', 0)
    assert len(empty) == 0 and list(empty) == []


def test_write_pcap_reads_back_identically(tmp_path):
    start = 1_700_000_000_123_456_789
    pk = gen.generate('Ether()/IPv6(src="2001:db8::1", dst="2001:db8::2")/TCP(dport=443)', 300, flows=100,
                      size=78, start_ns=start, interval_ns=1_001)
    path = tmp_path / "out.pcap"
    assert pk.write_pcap(path) == 300
    back = rdpcap(str(path))
    assert [raw(p) for p in back] == list(pk)
    assert [int(p.time * 10**9) for p in back] == [start + 1_001 * i for i in range(300)]
    mine = gen.read_pcap(path)
    assert np.array_equal(mine.data, pk.data) and np.array_equal(mine.timestamps_ns, pk.timestamps_ns)
    assert np.array_equal(mine.lengths, pk.lengths) and np.array_equal(mine.offsets, pk.offsets)


def test_generate_pcap_streams_the_same_packets(tmp_path):
    t = 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)'
    kw = dict(flows=777, vary={"ip.dst": "10.0.0.0/16", "udp.sport": "1000-1001"}, size=64, seed=3,
              start_ns=10, interval_ns=7)
    gen.generate(t, 5000, **kw).write_pcap(tmp_path / "a.pcap")
    # 1000-byte chunks (15 packets) force many chunk boundaries, flow state carried across them
    assert gen.generate_pcap(tmp_path / "b.pcap", t, 5000, chunk_bytes=1000, **kw) == 5000
    assert (tmp_path / "a.pcap").read_bytes() == (tmp_path / "b.pcap").read_bytes()


def test_pcap_errors_are_dpu_errors(tmp_path):
    with pytest.raises(DpuError, match="cannot open"):
        gen.read_pcap(tmp_path / "missing.pcap")
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a pcap at all")
    with pytest.raises(DpuError, match="bad magic"):
        gen.read_pcap(bad)
    with pytest.raises(DpuError, match="cannot create"):
        gen.generate_pcap(tmp_path / "no-dir" / "x.pcap", 'Ether()/IP()/UDP()', 1)


# --------------------------------------------------------------------------- bad inputs

UDP4 = 'Ether()/IP(src="10.1.0.1", dst="10.0.0.1")/UDP(dport=4000)'
BAD = [
    ("unknown-field", UDP4, dict(vary={"ip.dsst": "10.0.0.0/24"}), r"unknown field 'ip\.dsst'"),
    ("range-too-small", UDP4, dict(flows=1000, vary={"udp.sport": "1000-1099"}),
     r"flows=1000.*only 100 distinct flows \(l4\.sport: 100\)"),
    ("ranges-too-small", UDP4, dict(flows=1000, vary={"udp.sport": "1-10", "ip.dst": "10.0.0.0/28"}),
     r"only 160 distinct flows \(l4\.sport: 10 x ip\.dst: 16\)"),
    ("size-below-headers", UDP4, dict(size=40), r"size 40 is smaller than the template's headers \(42 bytes\)"),
    ("range-no-end", UDP4, dict(vary={"udp.sport": "1000-"}), r"vary\['udp\.sport'\]: bad range '1000-'"),
    ("range-reversed", UDP4, dict(vary={"udp.sport": "2000-1000"}), r"bad range '2000-1000'.*below the first"),
    ("range-not-a-number", UDP4, dict(vary={"udp.dport": "http"}), r"vary\['udp\.dport'\]: bad value 'http'"),
    ("port-out-of-range", UDP4, dict(vary={"udp.sport": "70000"}), r"outside the field's range 0\.\.65535"),
    ("prefix-too-long", UDP4, dict(vary={"ip.dst": "10.0.0.0/33"}), r"bad range '10\.0\.0\.0/33'.*prefix length"),
    ("bad-address", UDP4, dict(vary={"ip.dst": "10.0.0.300"}), r"bad value '10\.0\.0\.300'"),
    ("bad-mac", UDP4, dict(vary={"eth.src": "02:00:00:00:00"}), r"bad value '02:00:00:00:00'.*MAC"),
    ("prefix-on-port", UDP4, dict(vary={"udp.sport": "1000/8"}), r"a /prefix is for addresses"),
    ("tcp-alias-on-udp", UDP4, dict(vary={"tcp.sport": "1-10"}), r"L4 header is UDP, not TCP"),
    ("no-vlan", UDP4, dict(vary={"vlan.vid": "1-10"}), r"no Dot1Q \(VLAN\) header"),
    ("ipv4-field-on-ipv6", 'Ether()/IPv6()/UDP()', dict(vary={"ip.src": "10.0.0.0/8"}), r"no IPv4 header"),
    ("ports-on-icmp", 'Ether()/IP()/ICMP()', dict(vary={"l4.sport": "1-9"}), r"no TCP or UDP header"),
    ("same-field-twice", UDP4, dict(vary={"udp.sport": "1-9", "l4.sport": "1-9"}), r"same field \(l4\.sport\)"),
    ("flows-zero", UDP4, dict(flows=0), r"flows must be a positive int"),
    ("flows-without-key", UDP4, dict(flows=10, vary={"ip.ttl": "1-64"}), r"no field that tells flows apart"),
    ("template-name-error", 'Ether()/Bogus()', {}, r"template 'Ether\(\)/Bogus\(\)': NameError"),
    ("template-not-ethernet", 'IP()/UDP()', {}, r"must start with Ether"),
    ("template-short-bytes", b"\x00" * 10, {}, r"shorter than an Ethernet header"),
    ("size-too-big", UDP4, dict(size=10**6), r"size 1000000 is larger than the largest frame"),
    ("size-past-ipv4-length", UDP4, dict(size=65550),
     r"size 65550 is larger than this template allows: its IPv4 total length field .* at most 65,549 bytes"),
    ("size-past-ipv6-length", 'Ether()/IPv6()/TCP()', dict(size=100_000),
     r"its IPv6 payload length field .* at most 65,589 bytes"),
]


def test_size_up_to_the_length_fields_limit():
    """The largest frame an IPv4 UDP template can describe is 14 + 65,535 bytes;
    an ARP template has no length field and goes to the largest frame."""
    p = gen.generate(UDP4, 1, size=65549)
    assert int(p.lengths[0]) == 65549
    assert int(gen.generate('Ether()/ARP()', 1, size=gen.MAX_FRAME).lengths[0]) == gen.MAX_FRAME


@pytest.mark.parametrize("template,kw,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_value_error(template, kw, message):
    with pytest.raises(ValueError, match=message):
        gen.generate(template, 10, **kw)


def test_bad_count_raises_value_error():
    with pytest.raises(ValueError, match="count must be a non-negative int"):
        gen.generate(UDP4, -1)


# --------------------------------------------------------------------------- tshark

TSHARK_PREFS = ["-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
                # The payloads are zero padding: show them to tshark as plain data (VXLAN's 4789 excepted),
                # or application dissectors on whatever port a flow uses (RSL on 5000, DNS on 53...)
                # report the padding as their own malformed messages.
                "-d", "tcp.port==1-65535,data", "-d", "udp.port==1-4788,data", "-d", "udp.port==4790-49151,data"]


def _tshark(path, *args):
    r = subprocess.run(["tshark", "-n", "-r", str(path), *TSHARK_PREFS, *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed (apt-get install tshark)")
def test_tshark_finds_no_bad_checksums_or_malformed_packets(tmp_path):
    batches = [gen.generate(t, _count(kw), **kw) for _, t, kw in CASES]
    frames = [f for b in batches for f in b]
    path = tmp_path / "all.pcap"
    gen.Packets(np.frombuffer(b"".join(frames), np.uint8),
                np.cumsum([0] + [len(f) for f in frames[:-1]], dtype=np.uint64),
                np.array([len(f) for f in frames], np.uint32),
                np.arange(len(frames), dtype=np.uint64) * 1000).write_pcap(path)
    bad = ("_ws.malformed || _ws.expert.severity >= warning || ip.checksum.status == 0 || "
           "udp.checksum.status == 0 || tcp.checksum.status == 0 || icmpv6.checksum.status == 0 || "
           "icmp.checksum.status == 0")
    assert _tshark(path, "-Y", bad) == ""
    # tshark really checked them: every protocol's checksum was seen and found good
    status = _tshark(path, "-T", "fields", "-e", "ip.checksum.status", "-e", "udp.checksum.status",
                     "-e", "tcp.checksum.status", "-e", "icmpv6.checksum.status")
    cols = [line.split("\t") for line in status.splitlines()]
    assert len(cols) == len(frames)
    for i, proto in enumerate(("ip", "udp", "tcp", "icmpv6")):
        assert any(c[i].startswith("1") for c in cols), f"tshark verified no {proto} checksum"
    # and a corrupted checksum would have been caught
    broken = bytearray(frames[0])
    broken[24] ^= 0xFF  # IPv4 header checksum of the first (untagged) case
    path2 = tmp_path / "broken.pcap"
    gen.Packets(np.frombuffer(bytes(broken), np.uint8), [0], [len(broken)], [0]).write_pcap(path2)
    assert _tshark(path2, "-Y", bad) != ""
