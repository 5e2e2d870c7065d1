"""What a user sees after a run: the views of dpu replay (dump-flows,
dump-ports, dump-tables, dump-groups, dpctl/dump-flows, pmd-stats-show) and
their JSON, cache rates computed one way, tunnel port counters, the drops
pcap (read back with tshark), rates without "0.00 Mpps", progress, and the
counters list (counters.def) as the one source of counter names."""
import json
import os
import shutil
import subprocess

import pytest
from scapy.all import IP, UDP, Ether, PcapWriter, Raw

from dpu import Dataplane, _core, report
from dpu.cli import main as cli_main
from helpers.packets import (
    BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, NEXTHOP_MAC, UPLINK_MAC, VM1_IP, VM1_MAC, VTEP_BLUE, udp, vxlan,
)

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
E = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb")


def write(path, pkts, t0=1.0):
    w = PcapWriter(str(path), nano=True, linktype=1)
    for i, p in enumerate(pkts):
        p.time = t0 + i / 1000
        w.write(p)
    w.close()
    return str(path)


def to(dst, i=0, size=0):
    return E / IP(src="10.1.0.1", dst=dst, id=i) / UDP(sport=1000 + i, dport=53) / Raw(b"r" * (10 + size))


RULES = ["table=0,priority=100,in_port=a,ip,nw_dst=10.0.0.5,actions=output:b",
         "table=0,priority=90,in_port=a,ip,nw_dst=10.0.0.6,actions=group:1",
         "table=0,priority=10,in_port=a,ip,nw_dst=10.0.0.0/24,actions=goto_table:1",
         "table=1,priority=5,ip,nw_dst=10.0.0.9,actions=drop"]


def rules_dp():
    dp = Dataplane(ports=["a", "b", "c"])
    dp.add_group("group_id=1,type=all,bucket=actions=output:b,bucket=actions=output:c")
    dp.add_flows(RULES)
    return dp


def traffic():
    # 5 to the output rule, 3 to the group, 2 dropped in table 1, 4 missing table 1 (10.0.0.7)
    return ([to("10.0.0.5", i) for i in range(5)] + [to("10.0.0.6", i) for i in range(3)]
            + [to("10.0.0.9", i) for i in range(2)] + [to("10.0.0.7", i) for i in range(4)])


# ---- per-rule, per-table, per-group counts, megaflows, workers -----------------------------------------

def test_rule_table_group_counters_match_the_packets(tmp_path):
    pkts = traffic()
    dp = rules_dp()
    s = dp.replay({"a": write(tmp_path / "a.pcap", pkts)}, tmp_path / "o")
    by_match = {(f["table"], f["match"]): f for f in s.flows}
    size = len(pkts[0])
    assert by_match[(0, "priority=100,ip,in_port=a,nw_dst=10.0.0.5")]["n_packets"] == 5
    assert by_match[(0, "priority=100,ip,in_port=a,nw_dst=10.0.0.5")]["n_bytes"] == 5 * size
    assert by_match[(0, "priority=90,ip,in_port=a,nw_dst=10.0.0.6")]["n_packets"] == 3
    assert by_match[(0, "priority=10,ip,in_port=a,nw_dst=10.0.0.0/24")]["n_packets"] == 6
    assert by_match[(1, "priority=5,ip,nw_dst=10.0.0.9")]["n_packets"] == 2
    assert [(g["group_id"], g["n_packets"], g["n_bytes"]) for g in s.groups] == [(1, 3, 3 * size)]
    tables = {t["table"]: t for t in s.tables}
    assert (tables[0]["lookups"], tables[0]["matches"], tables[0]["misses"]) == (14, 14, 0)
    assert (tables[1]["lookups"], tables[1]["matches"], tables[1]["misses"]) == (6, 2, 4)
    # a second replay on the same dataplane: this replay's counts, not the totals
    s2 = dp.replay({"a": write(tmp_path / "b.pcap", pkts[:5])}, tmp_path / "o2")
    assert {f["match"]: f["n_packets"] for f in s2.flows}["priority=100,ip,in_port=a,nw_dst=10.0.0.5"] == 5
    assert sum(f["n_packets"] for f in s2.flows) == 5 and s2.groups[0]["n_packets"] == 0
    assert dp.dump_flows("ip,nw_dst=10.0.0.5")[0].n_packets == 10


def test_megaflows_with_masks_and_hits(tmp_path):
    pkts = traffic()
    s = rules_dp().replay({"a": write(tmp_path / "a.pcap", pkts)}, tmp_path / "o")
    assert sum(m["n_packets"] for m in s.megaflows) == len(pkts), s.megaflows
    assert {m["worker"] for m in s.megaflows} == {0}
    m5 = [m for m in s.megaflows if "nw_dst=10.0.0.5" in m["match"]]
    assert len(m5) == 1 and m5[0]["n_packets"] == 5 and m5[0]["actions"] == "b"
    assert "recirc_id=0" in m5[0]["match"] and "in_port=a" in m5[0]["match"]
    assert any(m["actions"].startswith("drop") for m in s.megaflows)


def test_workers_and_cache_rates_in_the_summary(tmp_path):
    pkts = traffic()
    s = rules_dp().replay({"a": write(tmp_path / "a.pcap", pkts)}, tmp_path / "o")
    (w,) = s.workers
    assert w["packets"] == len(pkts) and set(report.WORKER_COUNTERS) <= set(w)
    c = s.cache
    assert c["lookups"] == len(pkts) and c["emc_hits"] + c["megaflow_hits"] + c["upcalls"] == len(pkts)
    assert c["upcalls"] == len(s.megaflows) == 4


def test_bytes_and_rates_as_tcpreplay_prints_them(tmp_path):
    pkts = traffic()
    s = rules_dp().replay({"a": write(tmp_path / "a.pcap", pkts)}, tmp_path / "o")
    assert s.bytes_in == sum(len(p) for p in pkts)
    assert s.bytes_out == 5 * len(pkts[0]) + 3 * 2 * len(pkts[0]) and s.packets_out == 11
    text = s.render()
    actual, rated = [ln for ln in text.splitlines() if ln.startswith(("Actual:", "Rated:"))]
    assert actual.startswith(f"Actual: 14 packets ({s.bytes_in} bytes) replayed in ")
    assert rated.startswith("Rated: ") and " Bps, " in rated and " Mbps, " in rated and rated.endswith(" pps")
    assert "0.00 Mpps" not in text


# ---- the CLI: --show and --json ------------------------------------------------------------------------

def rules_file(tmp_path):
    f = tmp_path / "rules.txt"
    f.write_text("group_id=1,type=all,bucket=actions=output:b,bucket=actions=output:c\n" + "\n".join(RULES) + "\n")
    return str(f)


def test_cli_show_views(tmp_path, capsys):
    a = write(tmp_path / "a.pcap", traffic())
    args = ["replay", "--flows", rules_file(tmp_path), "--in", f"a={a}", "--out-dir", str(tmp_path / "o"),
            "--no-progress"]
    assert cli_main(args + ["--show", "flows,tables,groups,megaflows,workers,ports"]) == 0
    out = capsys.readouterr().out
    for title in ("Ports (dump-ports):", "Flows (dump-flows):", "Tables (dump-tables):", "Groups (dump-groups):",
                  "Megaflows (dpctl/dump-flows):", "Workers (pmd-stats-show):"):
        assert title in out, title
    flows = out.split("Flows (dump-flows):\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert flows[0].split() == ["table", "priority", "n_packets", "n_bytes", "match", "actions"]
    line = next(ln for ln in flows if "nw_dst=10.0.0.5" in ln)
    assert line.split() == ["0", "100", "5", str(5 * len(traffic()[0])), "priority=100,ip,in_port=a,nw_dst=10.0.0.5",
                            "output:b"]
    megaflows = out.split("Megaflows (dpctl/dump-flows):\n", 1)[1].split("\n\n", 1)[0].splitlines()
    line = next(ln for ln in megaflows if "nw_dst=10.0.0.5" in ln)
    assert line.split() == ["0", "5", str(5 * len(traffic()[0])), "recirc_id=0,ip,in_port=a,nw_dst=10.0.0.5", "b"]
    assert "Caches: 14 packets" in out and "EMC hits" in out
    # the OVS command names and "all" work too
    assert cli_main(args + ["--show", "dump-flows,pmd-stats-show"]) == 0
    out = capsys.readouterr().out
    assert "Flows (dump-flows):" in out and "Workers (pmd-stats-show):" in out and "Ports (dump-ports):" not in out
    assert cli_main(args + ["--show", "all"]) == 0
    assert "Megaflows (dpctl/dump-flows):" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(args + ["--show", "flowz"])
    assert "unknown view 'flowz'" in capsys.readouterr().err


def test_cli_json_has_every_view(tmp_path, capsys):
    a = write(tmp_path / "a.pcap", traffic())
    assert cli_main(["replay", "--flows", rules_file(tmp_path), "--in", f"a={a}", "--out-dir", str(tmp_path / "o"),
                     "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # the documented fields stay
    assert (d["packets_in"], d["packets_out"], d["dropped"]) == (14, 11, 6)
    assert set(d) >= {"mpps", "seconds", "outputs", "ports", "drops", "tenants", "conntrack"}
    # and the new ones
    assert set(d) >= {"bytes_in", "bytes_out", "pps", "bps", "flows", "tables", "groups", "megaflows", "workers",
                      "cache"}
    assert sum(f["n_packets"] for f in d["flows"] if f["table"] == 0) == 14
    assert d["groups"][0]["n_packets"] == 3 and d["cache"]["lookups"] == 14
    assert d["bytes_in"] == 14 * len(traffic()[0])


# ---- one definition of cache hit rates --------------------------------------------------------------------

def vxlan_in(i):
    inner = udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP, sport=2000 + i)
    return vxlan(inner, BLUE_VNI, VTEP_BLUE)


def test_cache_rates_agree_between_demo_bench_and_replay(tmp_path):
    """With VXLAN, a terminated frame makes a pass no cache sees: the rates are
    over lookups, and EMC + megaflow + upcall rates add up to 1 everywhere."""
    from dpu import bench

    dp = Dataplane.from_topology(TOPO)
    s = dp.replay({"p0": write(tmp_path / "p0.pcap", [vxlan_in(i % 4) for i in range(40)])}, tmp_path / "o")
    c = s.cache
    assert c["tunnel_pops"] == 40 and c["passes"] == 80 and c["lookups"] == 40
    assert abs(c["emc_hit_rate"] + c["megaflow_hit_rate"] + c["upcall_rate"] - 1) < 1e-3
    # the demo's tables (report.counter_tables) print the same rates
    text = report.counter_tables(dp.stats(), ports=s.ports)
    assert f"EMC hits {c['emc_hit_rate']:.1%}, megaflow hits {c['megaflow_hit_rate']:.1%}" in text
    # the benchmark's figures come from the same function
    dp2, pkts, ports, _ = bench._vxlan_decap()
    res = bench.measure(dp2, pkts, ports, 20_000, 1)
    assert abs(res["emc_hit_rate"] + res["megaflow_hit_rate"] - 1) < 1e-3  # warm: no upcalls


# ---- tunnel ports count what they carry -----------------------------------------------------------------

@pytest.mark.parametrize("fast_tunnel", [True, False])
def test_vxlan_port_counts_encap_and_decap(tmp_path, fast_tunnel):
    dp = Dataplane.from_topology(TOPO)
    dp._core.set_fast_tunnel(fast_tunnel)
    out = [udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP, sport=3000 + i) for i in range(3)]
    back = [vxlan_in(i) for i in range(5)]
    s = dp.replay({"vm1": write(tmp_path / "vm1.pcap", out), "p0": write(tmp_path / "p0.pcap", back, 2.0)},
                  tmp_path / "o")
    v = s.ports["vxlan0"]
    assert (v["tx_packets"], v["tx_bytes"]) == (3, sum(len(p) for p in out))
    assert (v["rx_packets"], v["rx_bytes"]) == (5, sum(len(vxlan_in(i)) - 50 for i in range(5)))
    assert v["dropped"] == 0
    assert s.ports["p0"]["rx_packets"] == 5 and s.ports["p0"]["tx_packets"] == 3
    assert s.ports["vm1"]["tx_packets"] == 5
    # what the tunnel port carried went through the uplink too: counted once in the totals
    assert (s.packets_in, s.packets_out) == (8, 8)
    st = dp.stats()
    assert st["ports"]["vxlan0"]["rx_packets"] == 5 and st["ports"]["vxlan0"]["tx_packets"] == 3
    assert st["workers_total"]["tunnel_pushes"] == 3


# ---- drops pcap ----------------------------------------------------------------------------------------

def tshark_fields(path, *fields):
    if not shutil.which("tshark"):
        pytest.skip("tshark is not installed")
    cmd = ["tshark", "-r", str(path), "-T", "fields", "-E", "separator=|"]
    for f in fields:
        cmd += ["-e", f]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [ln.split("|") for ln in r.stdout.splitlines()]


def test_drops_pcap_one_record_per_drop_with_its_reason(tmp_path):
    pkts = traffic() + [to("10.0.0.5", 99, size=10100)]  # and a frame no buffer holds: oversize
    dp = rules_dp()
    drops = tmp_path / "drops.pcapng"
    s = dp.replay({"a": write(tmp_path / "a.pcap", pkts)}, tmp_path / "o", drops_pcap=drops)
    assert s.dropped == 7 and s.drops == {"table_miss": 4, "action_drop": 2, "oversize": 1}
    assert s.drops_written == 7 and s.drops_pcap == str(drops)
    rows = tshark_fields(drops, "frame.comment", "frame.interface_name", "ip.dst", "frame.len", "frame.cap_len")
    assert len(rows) == 7
    comments = [r[0] for r in rows]
    assert comments.count("drop_reason=table_miss in_port=a") == 4
    assert comments.count("drop_reason=action_drop in_port=a") == 2
    assert comments.count("drop_reason=oversize in_port=a") == 1
    assert {r[1] for r in rows} == {"a"}
    by_reason = {}
    for c, _, dst, wire, cap in rows:
        by_reason.setdefault(c.split()[0], []).append((dst, int(wire), int(cap)))
    assert {d for d, _, _ in by_reason["drop_reason=table_miss"]} == {"10.0.0.7"}
    assert {d for d, _, _ in by_reason["drop_reason=action_drop"]} == {"10.0.0.9"}
    assert by_reason["drop_reason=oversize"] == [("", len(pkts[-1]), 0)]  # its length, no bytes
    # the frames are the packets as they arrived, in order
    assert [int(r[3]) for r in rows[:6]] == [len(p) for p in pkts if p[IP].dst in ("10.0.0.9", "10.0.0.7")]


def test_drops_pcap_from_the_cli_and_its_comment_field(tmp_path, capsys):
    a = write(tmp_path / "a.pcap", traffic())
    drops = tmp_path / "d.pcapng"
    assert cli_main(["replay", "--flows", rules_file(tmp_path), "--in", f"a={a}", "--out-dir", str(tmp_path / "o"),
                     "--drops-pcap", str(drops), "--no-progress"]) == 0
    assert f"drops: 6 packets written to {drops}" in capsys.readouterr().out
    # pkt_comment is the field older Wireshark versions name it
    rows = tshark_fields(drops, "frame.comment")
    assert sorted(r[0] for r in rows) == ["drop_reason=action_drop in_port=a"] * 2 + ["drop_reason=table_miss in_port=a"] * 4


def test_drops_pcap_never_overwrites_an_input(tmp_path, capsys):
    a = write(tmp_path / "a.pcap", traffic())
    before = open(a, "rb").read()
    assert cli_main(["replay", "--flows", rules_file(tmp_path), "--in", f"a={a}", "--out-dir", str(tmp_path / "o"),
                     "--drops-pcap", a, "--no-progress"]) != 0
    assert open(a, "rb").read() == before
    capsys.readouterr()
    from dpu.errors import DpuError

    with pytest.raises(DpuError, match="drops file"):
        rules_dp().replay({"a": a}, tmp_path / "o2", drops_pcap=a)
    assert open(a, "rb").read() == before


def test_drops_pcap_after_decap_is_the_frame_as_received(tmp_path):
    """A VXLAN frame for an unknown VNI: the drop record is the whole outer frame."""
    dp = Dataplane.from_topology(TOPO)
    bad = vxlan(udp(BLUE_REMOTE_MAC, VM1_MAC, BLUE_REMOTE_IP, VM1_IP), 999, VTEP_BLUE)
    drops = tmp_path / "d.pcapng"
    s = dp.replay({"p0": write(tmp_path / "p0.pcap", [bad, vxlan_in(1)])}, tmp_path / "o", drops_pcap=drops)
    assert s.drops == {"unknown_vni": 1}
    rows = tshark_fields(drops, "frame.comment", "vxlan.vni", "frame.len")
    assert rows == [["drop_reason=unknown_vni in_port=p0", "999", str(len(bad))]]


# ---- rates and progress ------------------------------------------------------------------------------------

def test_rate_text_never_prints_zero_mpps():
    assert report.rate_text(12_345_678) == "12.35 Mpps"
    assert report.rate_text(2_512.4) == "2.51 kpps"
    assert report.rate_text(3) == "3 pps"


def test_small_runs_print_a_readable_rate(tmp_path, capsys):
    a = write(tmp_path / "a.pcap", traffic()[:2])
    assert cli_main(["replay", "--flows", rules_file(tmp_path), "--in", f"a={a}", "--out-dir", str(tmp_path / "o"),
                     "--no-progress"]) == 0
    assert "0.00 Mpps" not in capsys.readouterr().out
    assert cli_main(["gen", 'Ether(dst="02:00:00:00:00:02")/IP(src="10.0.0.1",dst="10.0.0.2")/UDP()', "-n", "3",
                     "-o", str(tmp_path / "g.pcap")]) == 0
    out = capsys.readouterr().out
    assert "wrote 3 packets" in out and "0.00 Mpps" not in out and "pps" in out


def test_gen_reports_progress(tmp_path):
    from dpu import gen

    calls = []
    n = gen.generate_pcap(tmp_path / "g.pcap", 'Ether()/IP(dst="10.0.0.1")/UDP()', 50_000, size=64,
                          progress=lambda *a: calls.append(a))
    assert n == 50_000 and calls
    total = 24 + 50_000 * (16 + 64)
    assert calls[-1] == (total, total, 50_000) and all(d <= t for d, t, _ in calls)
    assert os.path.getsize(tmp_path / "g.pcap") == total


def test_bench_and_demo_report_progress(tmp_path):
    from dpu import bench, demo

    calls = []
    bench.run("l3-rewrite-1k", packets=50_000, repeat=2, progress=lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)] and calls[-1][2] == 100_000
    calls.clear()
    demo.make_traffic(str(tmp_path / "in"), 2000, progress=lambda *a: calls.append(a))
    streams = sum(len(s) for s in demo.TRAFFIC.values())
    assert len(calls) == streams and calls[-1][:2] == (streams, streams)


def test_progress_bar_labels_its_step(monkeypatch):
    import io

    err = io.StringIO()
    monkeypatch.setattr(report.sys, "stderr", err)
    bar = report.Progress(False, "generating")
    bar.enabled, bar.t0 = True, bar.t0 - 2  # as on a terminal, after two seconds
    bar(1, 4, 10)
    bar.close()
    assert "generating [#######" in err.getvalue() and " 25.0%" in err.getvalue() and "0.00 Mpps" not in err.getvalue()


# ---- counters: one list, one name for workers -----------------------------------------------------------------

def test_counters_come_from_counters_def():
    c = _core.counters()
    assert set(c) == {"traffic", "port", "worker"}
    dp = Dataplane(ports=["a", "b"])
    st = dp.stats()
    worker_keys = {n for n, _ in c["worker"]}
    assert worker_keys <= set(st["workers"][0]) and worker_keys <= set(st["workers_total"])
    assert {"tunnel_pops", "tunnel_pushes", "emc_hits"} <= worker_keys
    port_keys = {n for n, _ in c["traffic"] + c["port"]}
    assert port_keys <= set(st["ports"]["a"])
    # "pmd" is the old name of the summed worker counters, kept for scripts
    assert st["pmd"] == st["workers_total"]
    text = open(os.path.join(os.path.dirname(__file__), "..", "native", "include", "dpu", "counters.def")).read()
    assert all(f'"{n}"' in text for n in worker_keys)
