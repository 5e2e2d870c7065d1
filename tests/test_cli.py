"""The dpu command: each subcommand end to end through its real entry point."""
import json
import os
import subprocess
import sys

import pytest

from dpu.cli import main

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")


@pytest.fixture
def rules(tmp_path):
    f = tmp_path / "rules.txt"
    f.write_text("# router\n"
                 "table=0,priority=100,in_port=vm1,ip,nw_dst=10.0.0.0/24,actions=mod_dl_dst:02:00:00:00:00:02,goto_table:1\n"
                 "table=1,ip,actions=dec_ttl,output:vm2\n")
    return f


def test_trace_text_like_ofproto_trace(rules, capsys):
    assert main(["trace", "--flows", str(rules), "--in-port", "vm1",
                 'Ether(dst="02:00:00:00:00:09")/IP(dst="10.0.0.5",ttl=9)/UDP(sport=1,dport=2)']) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("Flow: udp,in_port=vm1,vlan_tci=0x0000,")
    assert " 0. ip,in_port=vm1,nw_dst=10.0.0.0/24, priority 100" in out
    assert "    mod_dl_dst:02:00:00:00:00:02" in out and "    goto_table:1" in out
    assert " 1. ip, priority 32768" in out and "    dec_ttl" in out and "    output:vm2" in out
    assert "Megaflow: recirc_id=0,ip,in_port=vm1,nw_dst=10.0.0.0/24,nw_ttl=9" in out
    assert "Datapath actions: set(eth(dst=02:00:00:00:00:02)),set(ipv4(ttl=8)),vm2" in out
    assert "Output: vm2 (42 bytes)" in out


def test_trace_hex_miss_and_json(rules, capsys):
    from scapy.all import ARP, Ether

    hexpkt = bytes(Ether() / ARP()).hex()
    assert main(["trace", "--flows", str(rules), "--in-port", "vm1", "--hex", hexpkt]) == 0
    out = capsys.readouterr().out
    assert " 0. No match." in out and "Datapath actions: drop(table_miss)" in out and "Dropped: table_miss" in out
    assert main(["trace", "--flows", str(rules), "--in-port", "vm1", "--json", "--hex", hexpkt]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["drop_reason"] == "table_miss" and d["passes"][0]["events"][0]["kind"] == "miss"


def test_trace_tunnel_pop_shows_both_passes(capsys):
    pkt = ('Ether(src="02:00:00:00:00:02",dst="02:00:00:00:00:01")/IP(src="192.0.2.2",dst="192.0.2.1")'
           '/UDP(sport=5000,dport=4789,chksum=0)/VXLAN(flags=0x08,vni=100)'
           '/Ether(src="02:00:00:00:02:21",dst="02:00:00:00:01:11")/IP(src="10.0.0.21",dst="10.0.0.11")/UDP(sport=1,dport=2)')
    assert main(["trace", "--config", TOPO, "--in-port", "p0", pkt]) == 0
    out = capsys.readouterr().out
    assert "Datapath actions: tnl_pop(vxlan0)" in out
    assert "tunnel pop: looked up again with in_port=vxlan0" in out
    assert "Flow: tun_id=0x64,tun_src=192.0.2.2,tun_dst=192.0.2.1,udp,in_port=vxlan0" in out
    assert "Output: vm1" in out


def test_trace_bad_expression(rules, capsys):
    with pytest.raises(SystemExit):
        main(["trace", "--flows", str(rules), "--in-port", "vm1", "Ether(/"])
    assert "cannot build packet" in capsys.readouterr().err


def test_compile_prints_commented_flows(capsys):
    assert main(["compile", TOPO, "--check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# dpu compile ")
    assert "# table 0: tenant red (vni 200): local ports, anti-spoofing" in out
    assert "group_id=1,type=all," in out
    assert "in_port=vxlan0,tun_id=0x64,tun_src=192.0.2.2,vlan_tci=0x0000,actions=write_metadata:0x64,goto_table:30" in out


def test_compile_reports_path_errors(tmp_path, capsys):
    bad = tmp_path / "t.yaml"
    bad.write_text(open(TOPO).read().replace("ip: 10.0.0.11}\n    remote", "ip: 10.0.5.11}\n    remote", 1).replace(
        "vm3: {mac: 02:00:00:00:03:11, ip: 10.0.0.11}", "vm3: {mac: 02:00:00:00:03:11, ip: 10.0.5.11}"))
    assert main(["compile", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "tenants.red.ports.vm3.ip: 10.0.5.11 is not inside any subnet of tenant red" in err


def test_flows_normalises(rules, capsys):
    assert main(["flows", str(rules)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("table=0, n_packets=0, n_bytes=0, priority=100,ip,in_port=vm1,nw_dst=10.0.0.0/24 actions=mod_dl_dst:02:00:00:00:00:02,goto_table:1")
    assert main(["flows", "--plain", str(rules)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "table=1,ip,actions=dec_ttl,output:vm2"


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "replay" in r.stdout and "bench" in r.stdout


def test_gen_writes_distinct_flows(tmp_path, capsys):
    from scapy.all import IP, UDP, rdpcap

    out = tmp_path / "t.pcap"
    assert main(["gen", 'Ether(dst="02:00:00:00:00:02")/IP(src="10.0.0.1",dst="10.0.0.2")/UDP(sport=1,dport=80)',
                 "-n", "500", "--flows", "50", "--vary", "udp.sport=2000-2999", "--size", "64", "-o", str(out)]) == 0
    assert "wrote 500 packets" in capsys.readouterr().out
    pkts = rdpcap(str(out))
    assert len(pkts) == 500 and all(len(p) == 64 for p in pkts)
    assert len({p[UDP].sport for p in pkts}) == 50 and pkts[0][UDP].sport == pkts[50][UDP].sport
    assert {p[IP].dst for p in pkts} == {"10.0.0.2"}


def test_gen_bad_field_is_an_error(tmp_path, capsys):
    assert main(["gen", "Ether()/IP()/UDP()", "-n", "5", "--flows", "2", "--vary", "ip.nonsense=1-2",
                 "-o", str(tmp_path / "x.pcap")]) == 1
    assert "nonsense" in capsys.readouterr().err


def test_demo_runs_and_counts(tmp_path, capsys):
    assert main(["demo", "--out-dir", str(tmp_path / "d"), "--packets", "20000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    r = d["replay"]
    assert r["packets_in"] >= 19000 and r["packets_out"] > 0
    assert set(r["drops"]) >= {"spoofed", "isolation", "unknown_vtep", "unknown_vni"}
    assert set(d["tenants"]) == {"blue", "red"} and d["tenants"]["blue"]["rx_packets"] > 0
    # the SYN flood's text promises 3,000 connections against red's quota of 1,000, whatever --packets
    assert d["tenants"]["red"]["drops"]["ct_quota"] == 2000
    for f in ("topology.yaml", "flows.txt", "in/vm1.pcap", "in/p0.pcap", "out/p0.pcap", "out/vm2.pcap"):
        assert (tmp_path / "d" / f).exists(), f
    assert main(["demo", "--out-dir", str(tmp_path / "t"), "--packets", "5000"]) == 0
    text = capsys.readouterr().out
    assert "Ports:" in text and "Tenants:" in text and "pps" in text and "0.00 Mpps" not in text


def test_bench_json_lines(capsys):
    assert main(["bench", "l3-rewrite-1k", "--packets", "200000", "--repeat", "1", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    d = json.loads(line)
    assert d["scenario"] == "l3-rewrite-1k" and d["flows"] == 1000 and d["rules"] == 1000
    assert d["packet_size"] == 64 and d["mpps"] > 0 and abs(d["ns_per_packet"] * d["mpps"] - 1000) < 1


def test_bench_burst_is_the_batch_size(capsys):
    """--burst reaches the worker: a run of N packets is N/burst batches, and the JSON says which."""
    from dpu import _core, bench

    assert main(["bench", "l3-rewrite-1k", "--packets", "64000", "--repeat", "1", "--json", "--burst", "32"]) == 0
    assert json.loads(capsys.readouterr().out)["burst"] == 32
    dp, pkts, ports, _ = bench.BUILDERS["l3-rewrite-1k"]()
    data = pkts.data.tobytes()
    for burst, batches in ((32, 400), (None, 12800 // _core.DEFAULT_BURST), (256, 50)):
        before = dp.stats()["workers_total"]["batches"]
        args = (data, pkts.offsets, pkts.lengths, ports, 12800) + (() if burst is None else (burst,))
        assert dp._core.bench(*args)[0] == 12800
        assert dp.stats()["workers_total"]["batches"] - before == batches, burst
    with pytest.raises(ValueError, match="burst: 1..256, got 0"):
        dp._core.bench(data, pkts.offsets, pkts.lengths, ports, 100, 0)


def test_bench_unknown_scenario(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "no-such-scenario"])
    assert "unknown scenario" in capsys.readouterr().err


def test_progress_bar_on_a_terminal(monkeypatch):
    import io

    from dpu import cli

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(cli.sys, "stderr", err)
    bar = cli._Progress(True)
    bar.t0 -= 2  # a long input: shown once half a second has passed
    bar(50, 100, 1_000_000)
    bar.close()
    assert "50.0%" in err.getvalue() and "1,000,000 packets" in err.getvalue() and err.getvalue().endswith("\n")
    quiet = cli._Progress(True)  # a short run: nothing within the first half second
    quiet(50, 100, 10)
    assert not quiet.shown


def test_trace_with_a_topology_refuses_unknown_ports(capsys):
    assert main(["trace", "--config", TOPO, "--in-port", "vm9", "Ether()/IP()/UDP()"]) == 1
    assert "unknown port 'vm9'" in capsys.readouterr().err


NAT_TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "nat-gateway.yaml")


def test_trace_follows_conntrack_and_nat(capsys):
    assert main(["trace", "--config", NAT_TOPO, "--in-port", "vm1",
                 'Ether(src="02:00:00:00:01:11",dst="02:00:00:00:01:01")/IP(src="10.0.0.11",dst="198.51.100.1")'
                 '/TCP(sport=40000,dport=80,flags="S")']) == 0
    out = capsys.readouterr().out
    # two recirculations: the lookup, then the commit with NAT
    assert "recirc(0x1) - resume conntrack" in out and "recirc(0x2) - resume conntrack" in out
    assert "40. metadata=0x64,ip, priority 100" in out and "ct(table=41,zone=100,nat)" in out
    assert "conntrack zone 100: ct_state=+new+trk tcp 10.0.0.11:40000 > 198.51.100.1:80" in out
    assert ("ct_state=+new+trk+snat tcp 10.0.0.11:40000 > 198.51.100.1:80, new connection committed "
            "(a trace commits nothing), translated to tcp 203.0.113.10:40000 > 198.51.100.1:80") in out
    assert "Output: inet (54 bytes)" in out


def _nat_captures(tmp_path, gap_s):
    """vm1 sends a UDP query and opens a TCP connection; the answers come
    `gap_s` seconds after the last packet from vm1."""
    from scapy.all import IP, TCP, UDP, Ether, wrpcap

    gw, inet = "02:00:00:00:01:01", "02:00:00:00:00:31"
    t0 = 1_700_000_000
    out = [Ether(src="02:00:00:00:01:11", dst=gw) / IP(src="10.0.0.11", dst="198.51.100.1") / UDP(sport=5000, dport=53),
           Ether(src="02:00:00:00:01:11", dst=gw) / IP(src="10.0.0.11", dst="198.51.100.1")
           / TCP(sport=40000, dport=80, flags="S", seq=100)]
    back = [Ether(src="02:00:00:00:00:32", dst=inet) / IP(src="198.51.100.1", dst="203.0.113.10")
            / TCP(sport=80, dport=40000, flags="SA", seq=900, ack=101)]
    out.append(Ether(src="02:00:00:00:01:11", dst=gw) / IP(src="10.0.0.11", dst="198.51.100.1")
               / TCP(sport=40000, dport=80, flags="A", seq=101, ack=901))
    later = [Ether(src="02:00:00:00:00:32", dst=inet) / IP(src="198.51.100.1", dst="203.0.113.10")
             / UDP(sport=53, dport=5000),
             Ether(src="02:00:00:00:00:32", dst=inet) / IP(src="198.51.100.1", dst="203.0.113.10")
             / TCP(sport=80, dport=40000, flags="PA", seq=901, ack=101) / b"data"]
    for i, p in enumerate(out):
        p.time = t0 + i * 2
    back[0].time = t0 + 3
    for i, p in enumerate(later):
        p.time = t0 + 4 + gap_s + i
    wrpcap(str(tmp_path / "vm1.pcap"), out)
    wrpcap(str(tmp_path / "inet.pcap"), back + later)


@pytest.mark.parametrize("gap,udp_back,tcp_back", [
    (240, True, True),           # 4 minutes: the UDP mapping (5 min) is still there
    (360, False, True),          # 6 minutes: the UDP mapping is gone, the TCP connection (2 h 4 min) is not
    (2 * 3600, False, True),     # 2 hours idle: TCP still passes
    (2 * 3600 + 300, False, False),  # past 2 h 4 min: gone too
], ids=["4min", "6min", "2h", "2h5min"])
def test_replay_clock_follows_packet_timestamps(tmp_path, capsys, gap, udp_back, tcp_back):
    """A capture spanning hours replays its timeouts faithfully in seconds."""
    _nat_captures(tmp_path, gap)
    assert main(["replay", "--config", NAT_TOPO, "--in", f"vm1={tmp_path / 'vm1.pcap'}",
                 "--in", f"inet={tmp_path / 'inet.pcap'}", "--out-dir", str(tmp_path / "out"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ports"]["vm1"]["tx_packets"] == 1 + int(udp_back) + int(tcp_back)
    dropped = s["tenants"]["blue"]["drops"]
    assert dropped.get("nat_unsolicited", 0) == int(not udp_back)  # a UDP answer: a new, unsolicited connection
    assert dropped.get("ct_invalid", 0) == int(not tcp_back)       # TCP data with no connection is +inv


def test_ct_dump_after_replay(tmp_path, capsys):
    _nat_captures(tmp_path, 10)
    args = ["ct", "dump", "--config", NAT_TOPO, "--in", f"vm1={tmp_path / 'vm1.pcap'}",
            "--in", f"inet={tmp_path / 'inet.pcap'}"]
    assert main(args + ["--zone", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "tcp,orig=(src=10.0.0.11,dst=198.51.100.1,sport=40000,dport=80),reply=(src=198.51.100.1,dst=203.0.113.10,"
        "sport=80,dport=40000),zone=100,protoinfo=(state=ESTABLISHED)",
        "udp,orig=(src=10.0.0.11,dst=198.51.100.1,sport=5000,dport=53),reply=(src=198.51.100.1,dst=203.0.113.10,"
        "sport=53,dport=5000),zone=100",
    ]
    assert main(args + ["--zone", "200"]) == 0 and capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as e:
        main(["ct", "flush", "--config", NAT_TOPO])
    assert e.value.code == 2 and "running dataplane" in capsys.readouterr().err
