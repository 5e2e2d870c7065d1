"""Pcap replay: feed capture files through a dataplane, write one pcap per port.

Inputs are merged by timestamp (ties keep input order), every output keeps the
timestamp of the packet it came from, and the files are streamed, so inputs
larger than memory are fine. The native replayer runs with the GIL released
in chunks, between which the caller's progress callback runs.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import DpuError, PcapError

Progress = Callable[[int, int, int], None]  # bytes done, bytes total, packets


@dataclass
class ReplaySummary:
    packets_in: int = 0
    packets_out: int = 0
    dropped: int = 0
    seconds: float = 0.0
    ports: Dict[str, dict] = field(default_factory=dict)
    drops: Dict[str, int] = field(default_factory=dict)
    outputs: Dict[str, str] = field(default_factory=dict)
    tenants: Dict[str, dict] = field(default_factory=dict)    # per tenant, this replay's counts
    conntrack: Dict[str, Any] = field(default_factory=dict)   # connections (total, per zone) afterwards

    @property
    def mpps(self) -> float:
        return self.packets_in / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "dropped": self.dropped,
            "drops": self.drops,
            "ports": self.ports,
            "outputs": self.outputs,
            "seconds": round(self.seconds, 6),
            "mpps": round(self.mpps, 3),
            "tenants": self.tenants,
            "conntrack": self.conntrack,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    def render(self) -> str:
        lines = [f"{'port':<12} {'rx':>10} {'tx':>10} {'dropped':>10}"]
        for name, c in self.ports.items():
            lines.append(f"{name:<12} {c['rx_packets']:>10} {c['tx_packets']:>10} {c['dropped']:>10}")
        lines.append("")
        lines.append(
            f"packets in {self.packets_in}, out {self.packets_out}, dropped {self.dropped}"
            f" in {self.seconds:.3f}s ({self.mpps:.2f} Mpps)"
        )
        if self.drops:
            lines.append("drops by reason: " + ", ".join(f"{k} {v}" for k, v in sorted(self.drops.items())))
        for name, c in self.tenants.items():
            if c["rx_packets"] or c["dropped"]:
                drops = ", ".join(f"{k} {v}" for k, v in sorted(c["drops"].items()))
                lines.append(f"tenant {name}: in {c['rx_packets']}, out {c['tx_packets']}, dropped {c['dropped']}"
                             + (f" ({drops})" if drops else ""))
        if self.conntrack.get("connections"):
            zones = ", ".join(f"zone {z}: {n}" for z, n in sorted(self.conntrack["zones"].items(), key=lambda kv: int(kv[0])))
            lines.append(f"conntrack: {self.conntrack['connections']} connections ({zones})")
        return "\n".join(lines)


def _port_delta(after: dict, before: Optional[dict]) -> dict:
    out = {}
    for k, v in after.items():  # every counter the core reports (counters.def)
        if isinstance(v, int):
            out[k] = v - (before[k] if before else 0)
    drops = {}
    for r, v in after["drops"].items():
        d = v - (before["drops"].get(r, 0) if before else 0)
        if d:
            drops[r] = d
    out["drops"] = drops
    return out


def replay(
    dp,
    inputs: Union[Dict[str, str], Sequence[Tuple[str, str]]],
    out_dir: Union[str, os.PathLike],
    progress: Optional[Progress] = None,
    chunk: int = 1_000_000,
) -> ReplaySummary:
    pairs = list(inputs.items()) if isinstance(inputs, dict) else [tuple(x) for x in inputs]
    resolved = [(dp.port_number(port), str(path)) for port, path in pairs]
    os.makedirs(out_dir, exist_ok=True)
    stats0 = dp.stats()
    before, tenants_before = stats0["ports"], stats0["tenants"]
    summary = ReplaySummary()
    t0 = time.perf_counter()
    r = dp._core.replayer(resolved, str(out_dir))
    error: Optional[DpuError] = None
    try:
        while r.run(chunk):
            if progress:
                progress(r.bytes_done, r.bytes_total, r.packets)
        if progress:
            progress(r.bytes_total, r.bytes_total, r.packets)
    except PcapError as e:
        error = e
    finally:
        summary.seconds = time.perf_counter() - t0
        try:
            r.close()
        except DpuError as e:  # a write that failed (disk full, ...): reported with the summary
            error = error or e
    stats1 = dp.stats()
    after = stats1["ports"]
    summary.tenants = {name: _port_delta(c, tenants_before.get(name)) for name, c in stats1["tenants"].items()}
    ct = stats1["conntrack"]
    summary.conntrack = {"connections": ct["connections"], "zones": {str(z): n for z, n in ct["zones"].items()}}
    summary.outputs = {name: path for name, path in r.outputs()}
    for name, c in after.items():
        d = _port_delta(c, before.get(name))
        summary.ports[name] = d
        summary.packets_in += d["rx_packets"]
        summary.packets_out += d["tx_packets"]
        summary.dropped += d["dropped"]
        for reason, v in d["drops"].items():
            summary.drops[reason] = summary.drops.get(reason, 0) + v
    if error is not None:
        error.summary = summary  # what was processed and written before the failure
        raise error
    return summary
