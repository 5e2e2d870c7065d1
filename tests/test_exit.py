"""A clean exit while other threads are inside Dataplane calls (issue 26).

A daemon thread that is in a native call (GIL released) when the interpreter
exits used to die in CPython's finalization with "terminate called without an
active exception" and SIGABRT: taking the GIL back, it was ended by
pthread_exit, whose unwinding met a noexcept destructor. Each case runs a child
interpreter whose daemon thread keeps calling into the core while the main
thread works and then exits; it must exit with status 0 and say nothing on
stderr, and an atexit hook that runs after the core's own can still use the
Dataplane. The crash hit every run before the fix; each case runs a few.
"""
import os
import subprocess
import sys

import pytest
from netns import write_pcap
from helpers import child_env
from helpers.packets import PKT_UDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 4

SETUP = """
import atexit, os, sys, threading
late = []
atexit.register(lambda: print("late", late[0].stats()["workers_total"]["packets"] > 0))  # runs last
from dpu import Dataplane
data = bytes.fromhex({frame!r})  # tests/helpers/packets.py's PKT_UDP (scapy is not imported here: slow)
dp = Dataplane(ports=["p1", "p2"], flows=["table=0,priority=1,actions=output:p2"])
late.append(dp)
started = threading.Event()
def churn():
    i = 0
    while True:
        dp.add_flow(f"table=0,priority=10,udp,tp_dst={{i % 1000}},actions=output:p2")
        dp.del_flows(f"table=0,udp,tp_dst={{i % 1000}}")
        i += 1
        started.set()
threading.Thread(target=churn, daemon=True).start()
started.wait()
"""

MAIN = {
    "process": """
for _ in range(20):
    dp.process([data] * 200, "p1")
""",
    "replay": """
for i in range(10):
    dp.replay({{"p1": {src!r}}}, os.path.join({tmp!r}, f"out{{i}}"))
""",
    # a call that runs for ever: exit waits a bounded time for it, then leaves it (and the
    # Dataplane it uses) to the process's end
    "endless": """
import numpy as np
from helpers.wait import wait_for
one = (np.array([0], np.uint64), np.array([len(data)], np.uint32), np.array([1], np.uint32))
threading.Thread(target=dp._core.bench, args=(data, *one, 1 << 62), daemon=True).start()
wait_for(lambda: dp.stats()["workers_total"]["packets"], 60, "the endless call to be inside the core")
""",
}


@pytest.mark.parametrize("main", list(MAIN))
def test_exit_with_a_thread_inside_dataplane_calls(main, tmp_path):
    src = write_pcap(str(tmp_path / "in.pcap"), [bytes(PKT_UDP)] * 900)  # 1 ms apart: under a second
    code = SETUP.format(frame=bytes(PKT_UDP).hex()) + MAIN[main].format(tmp=str(tmp_path), src=src)
    for run in range(RUNS if main != "endless" else 2):
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env=child_env())
        assert (r.returncode, r.stderr) == (0, ""), f"run {run}: exit status {r.returncode}: {r.stderr[-3000:]}"
        # the main thread may still call in from an atexit hook run after the core's own
        assert r.stdout.split() == ["late", "True"], r.stdout
