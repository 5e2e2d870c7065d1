"""Issue 30's views of a running dpu, end to end in the live lab (tests/livelab.py):
dump-megaflows with traffic, replace-flows and diff-flows against the running tables,
clear-stats, the metrics (build_info, process start time, scrapes that change
nothing), a real ping to the anycast gateway and a VM's first IPv6 breath.

Needs root (namespaces, AF_PACKET), ethtool and ping; skipped with the reason otherwise.
"""
import json
import re
import shutil
import subprocess
import sys
import time

from helpers.wait import wait_for
from livelab import ROOT, module_lab, skip_unless_live
from netns import Capture, nsexec, sysctl

skip_unless_live()
MB = 1 << 20
lab = module_lab("views")


def n_packets(dump: str) -> int:
    """The n_packets of the one flow a dump-flows text shows."""
    [m] = re.findall(r"n_packets=(\d+),", dump)
    return int(m)


def age(dump: str) -> float:
    [m] = re.findall(r"duration=([0-9.]+)s,", dump)
    return float(m)


def scrapes(d, url: str, n: int) -> list:
    """n scrapes back to back, from one process in dpu's namespace (where the endpoint is)."""
    code = (f"import json, urllib.request\n"
            f"print(json.dumps([urllib.request.urlopen({url!r}, timeout=5).read().decode() for _ in range({n})]))")
    return json.loads(nsexec(d.lab.ns["dpu"], sys.executable, "-c", code).stdout)


def cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "dpu.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_dump_megaflows_with_traffic(lab):
    d = lab.start_dpu()
    try:
        assert lab.ping("vm1", "10.0.0.21", count=3)
        text = d.ctl_cmd("dump-megaflows").stdout
        lines = text.splitlines()
        assert lines[0] == "flow-dump from worker 1:", text
        out = [x for x in lines if "in_port=vm1" in x and "tnl_push(vxlan(vni=100" in x]
        assert out, text
        assert ", packets:" in out[0] and ", bytes:" in out[0] and ", used:" in out[0] and ", actions:" in out[0]
        rows = json.loads(d.ctl_cmd("dump-megaflows", "--json").stdout)["megaflows"]
        mine = [r for r in rows if "in_port=vm1" in r["match"] and "tnl_push" in r["actions"]]
        assert mine and mine[0]["worker"] == 1 and mine[0]["n_packets"] >= 3 and mine[0]["n_bytes"] >= 3 * 98
        assert 0 <= mine[0]["used"] < 30, mine[0]
        assert all(r["used"] is None or r["used"] >= 0 for r in rows)
    finally:
        d.stop()


def test_the_gateway_answers_ping(lab, tmp_path):
    from helpers.tshark import assert_clean

    d = lab.start_dpu()
    try:
        with Capture(lab.ns["vm1"], "eth0", str(tmp_path / "vm1.pcap"), "icmp", "in") as cap:
            assert lab.ping("vm1", "10.0.0.1", count=3), "Linux took the replies: their checksums are right"
            cap.wait(3)
        assert lab.ping("vm2", "10.0.1.1", count=2), "blue's second gateway address"
        assert lab.ping("vm3", "10.0.0.1", count=2), "red's (the same address, its own tenant)"
        if shutil.which("tshark"):
            assert_clean(shutil.which("tshark"), tmp_path / "vm1.pcap", 3)
        st = d.stats()
        assert not st["ports"]["vm1"]["drops"].get("unroutable"), st["ports"]["vm1"]
        assert st["tenants"]["blue"]["tx_packets"] >= 5
    finally:
        d.stop()


def test_a_vms_first_ipv6_breath_is_not_spoofing(lab):
    """IPv6 turned on in a VM: the kernel configures a link-local address (duplicate
    address detection: a neighbour solicitation), joins its groups (MLD reports) and
    asks for routers (a router solicitation). All of it is ipv6_unsupported."""
    d = lab.start_dpu()
    ns = lab.ns["vm2"]
    try:
        before = d.stats()["ports"]["vm2"]["drops"]
        sysctl(ns, "net.ipv6.conf.eth0.disable_ipv6", 0)
        wait_for(lambda: d.stats()["ports"]["vm2"]["drops"].get("ipv6_unsupported", 0) >= 3, 20,
                 "the VM's solicitations and reports dropped as ipv6_unsupported")
        drops = d.stats()["ports"]["vm2"]["drops"]
        assert drops.get("spoofed", 0) == before.get("spoofed", 0), drops
        assert d.stats()["tenants"]["blue"]["drops"]["ipv6_unsupported"] >= 3
    finally:
        sysctl(ns, "net.ipv6.conf.eth0.disable_ipv6", 1, check=False)
        d.stop()


def test_replace_and_diff_flows_against_the_running_tables(lab, tmp_path):
    topo = lab.topology()
    d = lab.start_dpu(topo=topo)
    try:
        compiled = tmp_path / "compiled.flows"
        compiled.write_text(cli("compile", topo).stdout)
        live = f"unix:{d.ctl}"
        r = cli("diff-flows", live, str(compiled), check=False)
        assert (r.returncode, r.stdout) == (0, ""), "the running tables are the compiled ones: " + r.stdout + r.stderr
        assert lab.ping("vm1", "10.0.0.21", count=3)
        d.ctl_cmd("add-flow", "table=0,priority=1000,in_port=vm3,udp,tp_dst=9,actions=drop(policy)")
        r = cli("diff-flows", d.ctl, str(compiled), check=False)  # a socket's path is a running dpu too
        assert r.returncode == 2 and r.stdout == "-table=0,priority=1000,udp,in_port=vm3,tp_dst=9,actions=drop(policy)\n"
        route = d.ctl_cmd("dump-flows", "table=20,metadata=0x64,dl_dst=02:00:00:00:02:21").stdout
        assert n_packets(route) >= 3, route
        wanted = tmp_path / "wanted.flows"
        wanted.write_text(compiled.read_text() + "table=0,priority=1000,in_port=vm3,udp,tp_dst=7,actions=drop(policy)\n")
        r = d.ctl_cmd("replace-flows", str(wanted))
        assert r.stdout.startswith("replaced: flows 1 added, 0 modified, 1 deleted, "), r.stdout
        kept = d.ctl_cmd("dump-flows", "table=20,metadata=0x64,dl_dst=02:00:00:00:02:21").stdout
        assert n_packets(kept) == n_packets(route) and age(kept) >= age(route), ("unchanged: counters and age kept",
                                                                               route, kept)
        r = cli("diff-flows", live, str(wanted), check=False)
        assert (r.returncode, r.stdout) == (0, ""), r.stdout
        assert lab.ping("vm1", "10.0.0.21", count=2), "forwarding went on"
        bad = tmp_path / "bad.flows"
        bad.write_text("table=0,actions=output:nowhere\n")
        r = d.ctl_cmd("replace-flows", str(bad), check=False)
        assert r.returncode == 1 and r.stderr.startswith(f"dpu: UnknownPortError: {bad}:1:"), r.stderr
        assert cli("diff-flows", live, str(wanted), check=False).returncode == 0, "a bad file changes nothing"
    finally:
        d.stop()


def test_clear_stats(lab):
    d = lab.start_dpu(extra=("--metrics", "127.0.0.1:19131"))
    try:
        assert lab.ping("vm1", "10.0.0.21", count=3)
        route = d.ctl_cmd("dump-flows", "table=20,metadata=0x64,dl_dst=02:00:00:00:02:21").stdout
        before = d.stats()
        assert before["cleared_seconds_ago"] is None and before["ports"]["vm1"]["rx_packets"] >= 3
        assert d.ctl_cmd("clear-stats").stdout.startswith("cleared:")
        st = d.stats()
        assert st["ports"]["vm1"]["rx_packets"] == 0 and st["workers_total"]["packets"] == 0, st["ports"]["vm1"]
        assert st["cleared_seconds_ago"] >= 0 and st["tables"][0]["lookups"] == 0
        assert lab.ping("vm1", "10.0.0.21", count=2)
        st = d.stats()
        assert 2 <= st["ports"]["vm1"]["rx_packets"] < before["ports"]["vm1"]["rx_packets"] + 2
        assert "Counters since dpu clear-stats" in d.ctl_cmd("stats").stdout
        # what it does not clear: the rules' counts, the metrics (counters never go back)
        now = d.ctl_cmd("dump-flows", "table=20,metadata=0x64,dl_dst=02:00:00:00:02:21").stdout
        assert n_packets(now) >= n_packets(route) + 2, (route, now)
        text = d.metrics("http://127.0.0.1:19131/metrics")
        rx = [float(x.split()[-1]) for x in text.splitlines() if x.startswith('dpu_port_rx_packets_total{port="vm1"}')]
        assert rx and rx[0] >= before["ports"]["vm1"]["rx_packets"] + 2, rx
    finally:
        d.stop()


def _samples(text):
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_build_info_start_time_and_scrapes_that_change_nothing(lab):
    t0 = time.time()
    d = lab.start_dpu(extra=("--metrics", "127.0.0.1:19132"))
    url = "http://127.0.0.1:19132/metrics"
    try:
        s = _samples(d.metrics(url))
        info = [k for k in s if k[0] == "dpu_build_info"]
        assert len(info) == 1 and s[info[0]] == 1, info
        labels = dict(info[0][1])
        from dpu import __version__

        assert labels["version"] == __version__ and labels["isa"].startswith("x86-64") and "afpacket" in labels["backends"]
        start = s[("process_start_time_seconds", ())]
        assert t0 - 5 <= start <= time.time(), (t0, start)
        # under load, back-to-back scrapes see the same busy share: only the sampler (once a
        # second) moves it, never a scrape
        srv, cli_ = lab.start_transfer("rblue", "vm1", "10.0.0.21", 5401, 16 * MB, 8 * MB)
        time.sleep(1.5)  # not a wait for anything: a few of the sampler's seconds under load
        ratios = []
        for text in scrapes(d, url, 4):
            v = _samples(text)
            ratios.append((v[("dpu_worker_busy_ratio", (("worker", "1"),))],
                           v[("dpu_worker_packets_per_batch", (("worker", "1"),))]))
        assert len(set(ratios)) <= 2, f"4 scrapes, at most one sampler tick among them: {ratios}"
        assert any(r > 0 for r, _ in ratios), ratios
        assert lab.finish(srv, cli_) == "10.0.0.11"
    finally:
        d.stop()
