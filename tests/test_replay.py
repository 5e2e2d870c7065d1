"""Pcap replay: formats, interleaving by timestamp, order, summaries, bad files."""
import json
import struct

import pytest
from scapy.all import IP, UDP, Ether, PcapNgWriter, PcapWriter, Raw, rdpcap, wrpcap

from dpu import Dataplane
from dpu.cli import main as cli_main
from dpu.errors import PcapError

E = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb")


def pkt(i, dst="10.0.0.5"):
    p = E / IP(src="10.1.0.1", dst=dst, id=i) / UDP(sport=1000 + i, dport=53) / Raw(b"r" * 10)
    return p


def write(path, pkts, times, nano=False):
    for p, t in zip(pkts, times):
        p.time = t
    w = PcapWriter(str(path), nano=nano, linktype=1)
    for p in pkts:
        w.write(p)
    w.close()


def flows_dp():
    return Dataplane(ports=["a", "b", "out", "other"], flows=[
        "in_port=a,actions=output:out", "in_port=b,ip,nw_dst=10.0.0.5,actions=output:out", "in_port=b,actions=drop"])


def test_interleaved_by_timestamp_and_timestamps_kept(tmp_path):
    a, b = tmp_path / "a.pcap", tmp_path / "b.pcapng"
    write(a, [pkt(i) for i in (1, 3, 5)], [1.000001, 3.000003, 5.000005])
    w = PcapNgWriter(str(b))
    for i, t in ((2, 2.5), (4, 4.25), (6, 6.125)):
        p = pkt(i)
        p.time = t
        w.write(p)
    w.close()
    dp = flows_dp()
    s = dp.replay({"a": str(a), "b": str(b)}, tmp_path / "out")
    out = rdpcap(str(tmp_path / "out" / "out.pcap"))
    assert [p[IP].id for p in out] == [1, 2, 3, 4, 5, 6]
    assert [round(float(p.time), 6) for p in out] == [1.000001, 2.5, 3.000003, 4.25, 5.000005, 6.125]
    assert (s.packets_in, s.packets_out, s.dropped) == (6, 6, 0)
    assert s.ports["a"]["rx_packets"] == 3 and s.ports["out"]["tx_packets"] == 6
    # Every port gets a file, empty if nothing went there.
    assert len(rdpcap(str(tmp_path / "out" / "other.pcap"))) == 0


def test_nanosecond_input_and_output(tmp_path):
    a = tmp_path / "a.pcap"
    write(a, [pkt(1), pkt(2)], [10.123456789, 11.000000001], nano=True)
    dp = flows_dp()
    dp.replay([("a", str(a))], tmp_path / "o")
    raw = (tmp_path / "o" / "out.pcap").read_bytes()
    assert struct.unpack("<I", raw[:4])[0] == 0xA1B23C4D  # nanosecond pcap
    sec, ns = struct.unpack("<II", raw[24:32])
    assert (sec, ns) == (10, 123456789)


def test_big_endian_microsecond_pcap(tmp_path):
    a = tmp_path / "be.pcap"
    data = bytes(pkt(7))
    hdr = struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    rec = struct.pack(">IIII", 5, 250000, len(data), len(data)) + data
    a.write_bytes(hdr + rec)
    dp = flows_dp()
    dp.replay({"a": str(a)}, tmp_path / "o")
    (p,) = rdpcap(str(tmp_path / "o" / "out.pcap"))
    assert p[IP].id == 7 and float(p.time) == 5.25


def pcapng_block(btype, body):
    body += b"\x00" * (-len(body) % 4)
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def test_pcapng_tsresol_and_offset(tmp_path):
    data = bytes(pkt(9))
    shb = pcapng_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    # if_tsresol = 9 (ns), if_tsoffset = 100 s
    opts = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HHq", 14, 8, 100) + struct.pack("<HH", 0, 0)
    idb = pcapng_block(1, struct.pack("<HHI", 1, 0, 65535) + opts)
    ts = 1_500_000_007  # ns
    epb = pcapng_block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data)) + data)
    f = tmp_path / "x.pcapng"
    f.write_bytes(shb + idb + epb)
    dp = flows_dp()
    dp.replay({"a": str(f)}, tmp_path / "o")
    raw = (tmp_path / "o" / "out.pcap").read_bytes()
    sec, ns = struct.unpack("<II", raw[24:32])
    assert (sec, ns) == (101, 500000007)


def test_truncated_pcap_stops_after_processing_what_came_before(tmp_path):
    a = tmp_path / "a.pcap"
    write(a, [pkt(i) for i in range(1, 6)], [1, 2, 3, 4, 5])
    raw = a.read_bytes()
    rec = 16 + len(bytes(pkt(1)))
    a.write_bytes(raw[: 24 + 3 * rec + 20])  # record 4 cut short
    dp = flows_dp()
    with pytest.raises(PcapError) as ei:
        dp.replay({"a": str(a)}, tmp_path / "o")
    e = ei.value
    assert e.file == str(a) and e.record == 4
    assert str(a) in str(e) and "record 4" in str(e)
    assert [p[IP].id for p in rdpcap(str(tmp_path / "o" / "out.pcap"))] == [1, 2, 3]
    assert e.summary.packets_in == 3


@pytest.mark.parametrize("content,words", [
    (b"", "empty"),
    (b"\x00\x01\x02\x03" * 10, "magic"),
    (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 105), "link type 105"),
    (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + struct.pack("<IIII", 0, 0, 10**6, 10**6), "implausible"),
])
def test_bad_files_are_clear_errors(tmp_path, content, words):
    f = tmp_path / "bad.pcap"
    f.write_bytes(content)
    with pytest.raises(PcapError) as ei:
        flows_dp().replay({"a": str(f)}, tmp_path / "o")
    assert words in str(ei.value) and str(f) in str(ei.value)


def test_missing_file_and_unknown_port(tmp_path):
    from dpu.errors import DpuIOError, UnknownPortError

    with pytest.raises(DpuIOError):
        flows_dp().replay({"a": str(tmp_path / "nope.pcap")}, tmp_path / "o")
    with pytest.raises(UnknownPortError):
        flows_dp().replay({"zz": str(tmp_path / "nope.pcap")}, tmp_path / "o")


def test_oversize_records_are_counted_not_fatal(tmp_path):
    a = tmp_path / "a.pcap"
    write(a, [pkt(1), E / IP(dst="10.0.0.5") / UDP() / Raw(b"j" * 10100), pkt(3)], [1, 2, 3])
    s = flows_dp().replay({"a": str(a)}, tmp_path / "o")
    assert s.packets_in == 3 and s.packets_out == 2 and s.drops == {"oversize": 1}


def test_cli_replay_json_and_text(tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("# two ports, auto-created\nin_port=vm1,ip,nw_dst=10.0.0.0/24,actions=mod_dl_dst:02:00:00:00:00:02,output:vm2\n"
                     "in_port=vm1,actions=drop\n")
    a = tmp_path / "a.pcap"
    write(a, [pkt(1), pkt(2, dst="10.9.9.9"), pkt(3)], [1, 2, 3])
    assert cli_main(["replay", "--flows", str(rules), "--in", f"vm1={a}", "--out-dir", str(tmp_path / "o"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["packets_in"], d["packets_out"], d["dropped"]) == (3, 2, 1)
    assert d["drops"] == {"action_drop": 1} and d["ports"]["vm2"]["tx_packets"] == 2
    assert set(d) >= {"mpps", "seconds", "outputs", "ports"}
    out = rdpcap(str(tmp_path / "o" / "vm2.pcap"))
    assert [p[Ether].dst for p in out] == ["02:00:00:00:00:02"] * 2
    assert cli_main(["replay", "--flows", str(rules), "--in", f"vm1={a}", "--out-dir", str(tmp_path / "o2")]) == 0
    text = capsys.readouterr().out
    assert "packets in 3, out 2, dropped 1" in text and "action_drop 1" in text


def test_cli_replay_bad_flow_file_reports_line(tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("in_port=vm1,actions=output:vm2\nin_port=vm1,nw_dst=10.0.0.1,actions=drop\n")
    a = tmp_path / "a.pcap"
    write(a, [pkt(1)], [1])
    assert cli_main(["replay", "--flows", str(rules), "--in", f"vm1={a}", "--out-dir", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{rules}:2:" in err and "nw_dst" in err


def test_replay_streams_inputs_larger_than_its_memory(tmp_path, run_python):
    """A 240 MB capture replays in a process whose peak memory stays far below it."""

    from dpu import gen

    src = tmp_path / "big.pcap"
    n = gen.generate_pcap(str(src), 'Ether(dst="02:00:00:00:00:bb")/IP(dst="10.0.0.5")/UDP(sport=1,dport=2)', 3_000_000,
                          flows=1000, size=64)
    assert src.stat().st_size > 200e6
    # The child inherits the test process's peak RSS at fork: reset its high-water
    # mark (clear_refs 5) before the replay and read VmHWM after it.
    code = ("from dpu import Dataplane; dp = Dataplane(ports=['a','out'], flows=['in_port=a,actions=output:out']);"
            "open('/proc/self/clear_refs', 'w').write('5');"
            f"s = dp.replay({{'a': {str(src)!r}}}, {str(tmp_path / 'o')!r});"
            "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0];"
            "print(s.packets_in, s.packets_out, hwm)")
    pin, pout, maxrss_kb = run_python(code, timeout=300).split()
    assert (pin, pout) == (str(n), str(n))
    peak_mb = int(maxrss_kb) / 1024
    assert peak_mb < 150, f"replay peaked at {peak_mb:.0f} MB for a {src.stat().st_size / 1e6:.0f} MB input"
    assert (tmp_path / "o" / "out.pcap").stat().st_size == src.stat().st_size  # same records, ns pcap header
