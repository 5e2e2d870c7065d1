"""A/B (or A/B/C...) of dpu bench scenarios by wall clock: builds alternated process by process.

    python3 tools/ab.py --builds OLD,NEW[,...] [--rounds 7] [--packets 5000000] [--cpu 1] SCENARIO...

Each BUILD is a checkout with its core built in place (`setup.py build_ext --inplace`; a checkout
from before `python -m dpu` works too). In every round each scenario runs once per build, one
process each, `dpu bench --repeat 1`, pinned to one CPU with taskset; the order of the builds
rotates from round to round, so no build always runs first or right after another. Printed: each
round's Mpps, then per scenario each build's median and its ratio to the first build's median in
the same run, with the per-round ratios (their spread says how far to trust a median). A ratio is
a claim only from one run on one machine (docs/performance.md, "A/B").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MAIN = "import sys; from dpu.cli import main; sys.exit(main())"


def bench(build: str, scenario: str, packets: int, cpu: str) -> float:
    env = {**os.environ, "PYTHONPATH": build, "PYTHONHASHSEED": "0"}
    cmd = ["taskset", "-c", cpu, sys.executable, "-c", MAIN, "bench", "--json", "--repeat", "1",
           "--packets", str(packets), scenario]
    r = subprocess.run(cmd, cwd=build, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ab: {build}: dpu bench {scenario} failed: {r.stderr.strip()[-800:]}")
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return float(json.loads(line)["mpps"])
    raise SystemExit(f"ab: {build}: dpu bench {scenario} printed no JSON line")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", required=True, help="comma-separated checkouts, the first is the reference")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--packets", type=int, default=5_000_000)
    ap.add_argument("--cpu", default="1", help="taskset CPU list (default 1)")
    ap.add_argument("scenarios", nargs="+")
    args = ap.parse_args()
    builds = [os.path.abspath(b) for b in args.builds.split(",")]
    for b in builds:
        if not os.path.isdir(os.path.join(b, "dpu")):
            ap.error(f"{b} is not a dpu checkout (no dpu/ in it)")
    names = [os.path.basename(b) for b in builds]
    runs = {s: {b: [] for b in builds} for s in args.scenarios}
    for rnd in range(args.rounds):
        for s in args.scenarios:
            k = rnd % len(builds)
            for b in builds[k:] + builds[:k]:
                runs[s][b].append(bench(b, s, args.packets, args.cpu))
            print(f"round {rnd} {s}: " + " ".join(f"{n} {runs[s][b][-1]:.2f}" for n, b in zip(names, builds)),
                  flush=True)
    print("medians, Mpps (ratio to the first build; per-round ratios)")
    for s in args.scenarios:
        ref = runs[s][builds[0]]
        cols = []
        for n, b in zip(names, builds):
            ratios = " ".join(f"{x / r:.2f}" for x, r in zip(runs[s][b], ref))
            cols.append(f"{n} {statistics.median(runs[s][b]):.2f} "
                        f"({statistics.median(runs[s][b]) / statistics.median(ref):.3f}; {ratios})")
        print(f"{s}: " + "  ".join(cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
