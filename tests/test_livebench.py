"""The live benchmark's own parts that decide what it reports (dpu.livebench):
Open vSwitch's PMD load read from pmd-stats-show, and where the kernel's
receive work runs. The benchmark itself is not a test (bench/live_bench.py)."""
import os
import shutil
import subprocess

import pytest

from dpu import livebench
from dpu.livebench import BenchError, pmd_cycles

# `ovs-appctl dpif-netdev/pmd-stats-show` of Open vSwitch 3.1 forwarding from an afxdp port
PMD_STATS = """pmd thread numa_id 0 core_id 1:
  packets received: 2654445
  packet recirculations: 0
  emc hits: 2555255
  megaflow hits: 98190
  avg. packets per output batch: 3.03
  idle cycles: 3150479970 (38.00%)
  processing cycles: 5139233944 (62.00%)
  avg cycles per packet: 3122.96 (8289713914/2654445)
  avg processing cycles per packet: 1936.09 (5139233944/2654445)
main thread:
  packets received: 0
  idle cycles: 777 (100.00%)
  processing cycles: 5 (0.00%)
"""


def test_pmd_cycles_sums_the_pmd_threads_only():
    assert pmd_cycles(PMD_STATS) == (5139233944, 5139233944 + 3150479970)
    two = PMD_STATS + PMD_STATS.split("main thread:")[0].replace("core_id 1", "core_id 2")
    assert pmd_cycles(two) == (2 * 5139233944, 2 * (5139233944 + 3150479970))


def test_pmd_cycles_none_when_no_pmd_processed():
    # system ports: the main thread reads them, the PMD thread has nothing to poll
    idle = PMD_STATS.replace("processing cycles: 5139233944", "processing cycles: 0")
    assert pmd_cycles(idle) is None
    assert pmd_cycles("main thread:\n  idle cycles: 9 (100.00%)\n  processing cycles: 3 (0.00%)\n") is None


def test_kernel_rx_is_checked_before_anything_is_built():
    with pytest.raises(BenchError, match="kernel_rx must be gen or dut"):
        livebench.Rig(kernel_rx="cpu1")
    with pytest.raises(BenchError, match="AF_XDP devices only"):
        livebench.run_live("live-l3", io=("afpacket",), kernel_rx="dut")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs (one for the generator)")
@pytest.mark.skipif(not shutil.which("ethtool"), reason="needs ethtool (apt-get install ethtool)")
def test_kernel_rx_dut_moves_in0_napi_thread_to_the_device_cpus():
    with livebench.Rig(kernel_rx="dut") as rig:
        on = subprocess.run(rig.exec("dut", "cat", "/sys/class/net/in0/threaded"), capture_output=True, text=True)
        assert on.stdout.strip() in ("1", "enabled"), on
        rig.pin_kernel_rx()
        pids = subprocess.run(["pgrep", "^napi/in0-"], capture_output=True, text=True).stdout.split()
        assert pids
        want = set(rig.dut_cpus)
        for pid in pids:
            assert os.sched_getaffinity(int(pid)) == want
