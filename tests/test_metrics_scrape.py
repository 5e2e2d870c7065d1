"""The metrics endpoint's own series (issue 30): dpu_build_info, the process_* metrics
Prometheus clients export, and scrapes that change nothing (the worker gauges come from
samples WorkerLoad takes on its own clock). Served live: test_live_views.py."""
import os
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dpu import __version__, _core
from dpu.metrics import Collector, MetricsServer, WorkerLoad
from helpers.instances import unattached_instance
from helpers.packets import PKT_UDP


def samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_build_info_and_process_metrics(tmp_path):
    srv = MetricsServer("127.0.0.1", 0, unattached_instance(tmp_path))
    try:
        s = samples(srv.registry)
    finally:
        srv.close()
    info = {k: v for k, v in s.items() if k[0] == "dpu_build_info"}
    assert info == {("dpu_build_info", (("backends", ",".join(_core.IO_BACKENDS)), ("isa", _core.BUILD_ISA),
                                        ("version", __version__))): 1.0}
    assert _core.BUILD_ISA in ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
    with open("/proc/self/stat") as f:  # this process's start, as the kernel has it
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = int(next(line for line in f if line.startswith("btime")).split()[1])
    assert abs(s[("process_start_time_seconds", ())] - (btime + ticks / os.sysconf("SC_CLK_TCK"))) < 1
    assert s[("process_open_fds", ())] > 0 and s[("process_resident_memory_bytes", ())] > 0
    assert s[("process_start_time_seconds", ())] <= time.time()


def test_a_scrape_changes_nothing(tmp_path):
    """Traffic between two scrapes does not move the windowed gauges (no sample was
    taken), and neither does the first scrape: a second scraper sees what the first saw.
    A sample (the sampler's thread takes one a second) does."""
    inst = unattached_instance(tmp_path)
    from prometheus_client.registry import CollectorRegistry

    load = WorkerLoad(inst.dp)  # not started: samples only when told
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(inst, load))
    inst.dp.process([PKT_UDP] * 64, in_port="p1")
    a = samples(reg)
    inst.dp.process([PKT_UDP] * 64, in_port="p1")
    b = samples(reg)
    key = ("dpu_worker_packets_per_batch", (("worker", "0"),))
    assert a[key] == b[key] == 0.0 and a[("dpu_worker_busy_ratio", (("worker", "0"),))] == 0.0
    assert b[("dpu_worker_packets_total", (("worker", "0"),))] == 128, "the counters themselves are current"
    load.sample()
    c, d = samples(reg), samples(reg)
    assert c[key] == d[key] == 64.0, "two batches of 64 between the samples"


def test_the_sampler_runs_on_its_own_and_stops(tmp_path):
    inst = unattached_instance(tmp_path)
    load = WorkerLoad(inst.dp, window=60, every=0.05)
    load.start()
    try:
        inst.dp.process([PKT_UDP] * 10, in_port="p1")
        deadline = time.monotonic() + 10
        while load.ratios()[0][1] != 10.0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the sampler's next tick
        assert load.ratios()[0][1] == 10.0
    finally:
        load.close()
    assert not load._thread.is_alive()
