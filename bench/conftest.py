"""pytest-benchmark suite: `python3 -m pytest bench` (not part of the README's
test command: these take minutes and measure, they do not check behaviour).

Each test times the native benchmark loop only (dataplane and traffic are built
outside the timed region), reports Mpps and ns/packet in extra_info, and asserts
the target from the issue (dpu.bench.TARGETS_MPPS)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
