"""Runs a dpu bench scenario's loop for callgrind: tools/cg.sh measures instructions per packet.

    python3 tools/cg.py SCENARIO N   # 300,000 packets of warm-up, then N measured
"""
import sys

from dpu import bench

name, n = sys.argv[1], int(sys.argv[2])
dp, pkts, ports, info = bench.BUILDERS[name]()
data = pkts.data.tobytes()
dp._core.bench(data, pkts.offsets, pkts.lengths, ports, 300_000)
if n:
    dp._core.bench(data, pkts.offsets, pkts.lengths, ports, n)
