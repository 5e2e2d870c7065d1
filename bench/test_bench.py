"""The same scenarios as `dpu bench`, timed by pytest-benchmark."""
import statistics

import pytest

from dpu import bench as B

PACKETS = 2_000_000


@pytest.mark.parametrize("name", [n for n in B.SCENARIOS if n != "replay-10m" and n in B.TARGETS_MPPS])
def test_pipeline_rate(benchmark, name):
    dp, pkts, ports, info = B.BUILDERS[name]()
    data = pkts.data.tobytes()
    dp._core.bench(data, pkts.offsets, pkts.lengths, ports, B.warm_up_packets(len(pkts)))  # let the caches settle
    benchmark.pedantic(dp._core.bench, args=(data, pkts.offsets, pkts.lengths, ports, PACKETS), rounds=5, iterations=1)
    mpps = PACKETS / benchmark.stats.stats.median / 1e6
    benchmark.extra_info.update(info)
    benchmark.extra_info.update({"scenario": name, "packet_size": B.PACKET_SIZE, "mpps": round(mpps, 3),
                                 "ns_per_packet": round(1e3 / mpps, 2), "target_mpps": B.TARGETS_MPPS[name]})
    if name == "tenants-1k":
        assert info["load_seconds"] < 5.0, "a 1,000-tenant / 100,000-endpoint topology loads in under 5 s"
    assert mpps >= B.TARGETS_MPPS[name], f"{name}: {mpps:.2f} Mpps, target {B.TARGETS_MPPS[name]}"


def test_replay_10m(benchmark):
    res = {}

    def run():
        res.update(B.run("replay-10m", repeat=1))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["mpps"] >= B.TARGETS_MPPS["replay-10m"], f"replay-10m: {res['mpps']} Mpps"


def test_security_groups_cost_established_packets_nothing(benchmark):
    """sg-est-1k: snat-est-1k's established traffic with the machine in a group of 100 rules,
    at least 90% of snat-est-1k measured in the same run (the two alternated)."""
    res = {}

    def run():
        res.update(B.run("sg-est-1k", packets=PACKETS, repeat=5))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["ratio"] >= B.SG_TARGET_RATIO, f"sg-est-1k: {res['ratio']:.0%} of snat-est-1k"
