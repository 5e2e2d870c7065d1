"""Traffic tools for measuring a live dataplane (``python3 -m dpu.traffic``).

  blast --if IF --pcap FILE --seconds S [--rate PPS]
      send the capture's frames on IF in a loop (AF_PACKET sendmmsg, qdisc
      bypassed), as fast as the kernel takes them or at PPS, for S seconds;
      print {"packets", "bytes", "seconds", "pps"} as JSON
  count --if IF --seconds S
      count what IF receives (a TPACKET_V3 ring, blocks counted, nothing
      copied) for S seconds; the same JSON

Both need root or CAP_NET_RAW. The native loops run without the GIL.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import numpy as np

from . import _core


def load_frames(path: str):
    """(bytes, offsets, lengths) of every frame of a pcap/pcapng file."""
    from .gen import read_pcap

    p = read_pcap(path)
    return p.data.tobytes(), p.offsets, p.lengths


def blast(ifname: str, frames, seconds: float, rate_pps: float = 0.0) -> dict:
    data, offsets, lens = frames
    n, b, s = _core.blast(ifname, data, np.asarray(offsets, dtype=np.uint64), np.asarray(lens, dtype=np.uint32),
                          seconds, rate_pps)
    return {"packets": n, "bytes": b, "seconds": round(s, 6), "pps": round(n / s) if s else 0}


def count(ifname: str, seconds: float) -> dict:
    n, b, s = _core.count_rx(ifname, seconds)
    return {"packets": n, "bytes": b, "seconds": round(s, 6), "pps": round(n / s) if s else 0}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dpu.traffic", description="send or count frames on an interface")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("blast")
    b.add_argument("--if", dest="ifname", required=True)
    b.add_argument("--pcap", required=True)
    b.add_argument("--seconds", type=float, default=5.0)
    b.add_argument("--rate", type=float, default=0.0, help="packets per second (0: as fast as possible)")
    c = sub.add_parser("count")
    c.add_argument("--if", dest="ifname", required=True)
    c.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args(argv)
    from .errors import DpuError

    try:
        if a.cmd == "blast":
            out = blast(a.ifname, load_frames(a.pcap), a.seconds, a.rate)
        else:
            out = count(a.ifname, a.seconds)
    except DpuError as e:
        print(f"dpu.traffic: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
