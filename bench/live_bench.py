#!/usr/bin/env python3
"""Live forwarding, dpu against the I/O ceiling and Open vSwitch, in one run.

    sudo python3 bench/live_bench.py [--scenarios live-l3,live-vxlan,live-snat] [--io afpacket,afxdp]
                                     [--flows 1000,100000] [--repeat 3] [--burst N] [--kernel-rx gen|dut]
                                     [--json] [--hold]

Builds the namespaces (dpu.livebench), measures the raw ceiling (a sendmmsg
blaster into a veth, a TPACKET_V3 receiver that only counts), dpu's forwarded
rate with 1 and 2 workers for each I/O backend, and Open vSwitch's userspace
datapath (its own ovsdb-server and ovs-vswitchd, datapath_type=netdev, ports
of type system and afxdp) on the same topology and traffic, all on one set
of namespaces and in turns (each device started, measured once and stopped,
--repeat times over); prints every figure (medians of the turns) and the
ratios the targets are stated in:

    dpu / raw ceiling >= 0.8;  dpu (afpacket) / OVS (afpacket) >= 3;
    dpu (afxdp) / OVS (afxdp) >= 1;  dpu 2 workers / 1 worker >= 1.6

--hold sets up the first scenario's rig with dpu (the first --io and --workers)
and, unless --no-ovs, Open vSwitch, prints one JSON line saying where they are
(namespaces, temporary directory, process ids) and waits. Whenever the run
ends, by its end, SIGTERM, SIGINT (exit status 130) or SIGHUP, the namespaces,
the processes in them and the temporary directory are removed.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpu.livebench import LIVE_SCENARIOS, hold, render, run_live  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(LIVE_SCENARIOS))
    ap.add_argument("--io", default="afpacket,afxdp")
    ap.add_argument("--flows", default="1000,100000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--burst", type=int, default=None, help="dpu run --burst (default: dpu's)")
    ap.add_argument("--kernel-rx", choices=("gen", "dut"), default="gen",
                    help="where the kernel's receive work for the device's ingress veth runs: on the "
                         "generator's CPU (default) or in a NAPI thread on the device's (dpu.livebench)")
    ap.add_argument("--no-ovs", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hold", action="store_true",
                    help="set up the first scenario's rig and devices, print where they are, wait for a signal")
    a = ap.parse_args()
    if a.hold:
        hold(a.scenarios.split(",")[0], io=a.io.split(",")[0], workers=int(a.workers.split(",")[0]),
             ovs=not a.no_ovs, kernel_rx=a.kernel_rx, burst=a.burst,
             ready=lambda info: print(json.dumps(info, sort_keys=True), flush=True))
        return 0
    results = []
    for name in a.scenarios.split(","):
        # dpu with each backend and worker count, then Open vSwitch, all on one rig and
        # measured in turns (dpu.livebench.measure): their ratios are not the rig's or the
        # hour's. A backend that cannot start is a result with "error", not the end of the run.
        rs = run_live(name, repeat=a.repeat, workers=tuple(int(w) for w in a.workers.split(",")),
                      io=tuple(x for x in a.io.split(",") if x), flows=tuple(int(f) for f in a.flows.split(",")),
                      ovs=not a.no_ovs, burst=a.burst, kernel_rx=a.kernel_rx)
        for r in rs:
            print(json.dumps(r, sort_keys=True) if a.json else render(r), flush=True)
        results += rs
    print("\nRatios (targets: ceiling >= 0.8, vs OVS afpacket >= 3, vs OVS afxdp >= 1, 2 workers >= 1.6x):")
    ok = [r for r in results if "error" not in r]
    for r in ok:
        if r["dut"] != "dpu":
            continue
        line = [f"{r['scenario']} {r['io']} workers={r['workers']} flows={r['flows']}: "
                f"{r['mpps'] / r['raw_ceiling_mpps']:.2f} of the ceiling"]
        o = next((x for x in ok if x["dut"] == "ovs" and x["scenario"] == r["scenario"] and x["flows"] == r["flows"]
                  and x["io"] == r["io"]), None)
        if o and o["mpps"]:
            line.append(f"{r['mpps'] / o['mpps']:.2f}x OVS ({o['io']})")
            if r.get("saturation_mpps_est") and o.get("saturation_mpps_est"):
                # both below full load (the generator's limit): compare what each forwarded per busy second
                line.append(f"{r['saturation_mpps_est'] / o['saturation_mpps_est']:.2f}x OVS at full load (est.)")
        one = next((x for x in ok if x["dut"] == "dpu" and x["scenario"] == r["scenario"] and x["flows"] == r["flows"]
                    and x["io"] == r["io"] and x["workers"] == 1), None)
        if r["workers"] > 1 and one and one["mpps"]:
            line.append(f"{r['mpps'] / one['mpps']:.2f}x one worker")
        print("  " + ", ".join(line))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the rig is gone already (dpu.cleanup ran before this was raised)
        sys.exit(130)
