"""Pcap replay: feed capture files through a dataplane, write one pcap per port.

Inputs are merged by timestamp (ties keep input order), every output keeps the
timestamp of the packet it came from, and the files are streamed, so inputs
larger than memory are fine. The native replayer runs with the GIL released
in chunks, between which the caller's progress callback runs.

The summary holds this replay's counts (deltas, so a dataplane can replay
several times): ports, tenants, rules (dump-flows), tables, groups, the
megaflows in the caches afterwards (dpctl/dump-flows), each worker's counters
(pmd-stats-show) and cache rates, bytes and rates as tcpreplay prints them.
``drops_pcap`` writes every dropped arrival, as it arrived, to a pcapng file
whose packet comments say why (``drop_reason=R in_port=P``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import report
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
    bytes_in: int = 0                                          # frames received on (non-tunnel) ports
    bytes_out: int = 0                                         # frames sent on (non-tunnel) ports
    flows: List[dict] = field(default_factory=list)      # dump-flows: every rule, this replay's n_packets/n_bytes
    tables: List[dict] = field(default_factory=list)     # dump-tables: lookups, matches, misses
    groups: List[dict] = field(default_factory=list)     # dump-groups: every group, this replay's counts
    megaflows: List[dict] = field(default_factory=list)  # dpctl/dump-flows: the caches afterwards
    workers: List[dict] = field(default_factory=list)    # pmd-stats-show: each worker's counters
    drops_pcap: Optional[str] = None                      # the drops file, if one was asked for
    drops_written: int = 0                                # its records

    @property
    def mpps(self) -> float:
        return self.packets_in / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def pps(self) -> float:
        return self.packets_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def bps(self) -> float:
        """Input bit rate (frames as captured, without pcap headers), as tcpreplay's Mbps."""
        return self.bytes_in * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def cache(self) -> dict:
        """EMC/megaflow/upcall counts and rates of this replay (report.cache_stats)."""
        return report.cache_stats(report.sum_workers(self.workers))

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
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "pps": round(self.pps, 1),
            "bps": round(self.bps, 1),
            "flows": self.flows,
            "tables": self.tables,
            "groups": self.groups,
            "megaflows": self.megaflows,
            "workers": self.workers,
            "cache": self.cache,
            "drops_pcap": self.drops_pcap,
            "drops_written": self.drops_written,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    def render(self, views: Sequence[str] = ("ports",)) -> str:
        """The chosen views (report.VIEWS: ports, flows, tables, groups,
        megaflows, workers), then the totals, tcpreplay's two lines, drops by
        reason, tenants and conntrack."""
        lines = [report.render_views(self.as_dict(), views)] if views else []
        lines.append("")
        lines.append(
            f"packets in {self.packets_in}, out {self.packets_out}, dropped {self.dropped}"
            f" in {self.seconds:.3f}s ({report.rate_text(self.pps)})"
        )
        lines += report.tcpreplay_lines(self.packets_in, self.bytes_in, self.seconds)
        lines.append(f"Out: {self.packets_out} packets ({self.bytes_out} bytes)")
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
        if self.drops_pcap:
            lines.append(f"drops: {self.drops_written} packets written to {self.drops_pcap}")
        return "\n".join(lines)


def _counted(rows: List[dict], before: Dict[Any, dict], key: Callable[[dict], Any],
             fields: Sequence[str] = ("n_packets", "n_bytes")) -> List[dict]:
    """rows with their counters less what they were before (a row new since, or
    restarted, like a re-installed megaflow, keeps its own)."""
    out = []
    for r in rows:
        b = before.get(key(r))
        if b is not None and all(r[f] >= b[f] for f in fields):
            r = {**r, **{f: r[f] - b[f] for f in fields}}
        out.append(r)
    return out


class _Snapshot:
    """What a replay's summary is the difference of: counters, rules, groups,
    megaflows, tables, workers."""

    def __init__(self, dp) -> None:
        self.stats = dp.stats()
        self.flows = [{"table": f.table, "priority": f.priority, "cookie": f.cookie, "match": f.match,
                       "actions": f.actions, "n_packets": f.n_packets, "n_bytes": f.n_bytes}
                      for f in dp.dump_flows()]
        self.groups = [{"group_id": g.group_id, "text": g.text, "n_packets": g.n_packets, "n_bytes": g.n_bytes}
                       for g in dp.dump_groups()]
        self.megaflows = [{"worker": m.worker, "match": m.match, "n_packets": m.n_packets, "n_bytes": m.n_bytes,
                           "actions": m.actions} for m in dp.dump_megaflows()]
        self.tunnels = {p["name"] for p in dp._core.ports() if p.get("tunnel")}


def _fill(summary: ReplaySummary, s0: _Snapshot, s1: _Snapshot) -> None:
    """The summary's counts: s1 less s0."""
    before, tenants_before = s0.stats["ports"], s0.stats["tenants"]
    stats1 = s1.stats
    summary.tenants = {name: report.counters_delta(c, tenants_before.get(name))
                       for name, c in stats1["tenants"].items()}
    ct = stats1["conntrack"]
    summary.conntrack = {"connections": ct["connections"], "zones": {str(z): n for z, n in ct["zones"].items()}}
    for name, c in stats1["ports"].items():
        d = report.counters_delta(c, before.get(name))
        summary.ports[name] = d
        if name in s1.tunnels:  # what a tunnel port carries was received or sent on its underlay too
            continue
        summary.packets_in += d["rx_packets"]
        summary.bytes_in += d["rx_bytes"]
        summary.packets_out += d["tx_packets"]
        summary.bytes_out += d["tx_bytes"]
        summary.dropped += d["dropped"]
        for reason, v in d["drops"].items():
            summary.drops[reason] = summary.drops.get(reason, 0) + v
    flow_key = lambda f: (f["table"], f["priority"], f["match"])  # noqa: E731 - unique per rule, as in OpenFlow
    summary.flows = _counted(s1.flows, {flow_key(f): f for f in s0.flows}, flow_key)
    summary.groups = _counted(s1.groups, {g["group_id"]: g for g in s0.groups}, lambda g: g["group_id"])
    mf_key = lambda m: (m["worker"], m["match"])  # noqa: E731
    summary.megaflows = _counted(s1.megaflows, {mf_key(m): m for m in s0.megaflows}, mf_key)
    tables0 = {t["table"]: t for t in s0.stats["tables"]}
    tables = _counted(stats1["tables"], tables0, lambda t: t["table"], ("lookups", "matches", "misses"))
    summary.tables = [t for t in tables if t["lookups"] or t["active"]]
    w0 = s0.stats["workers"]
    summary.workers = [report.worker_delta(w, w0[i] if i < len(w0) else None) for i, w in enumerate(stats1["workers"])]


def replay(
    dp,
    inputs: Union[Dict[str, str], Sequence[Tuple[str, str]]],
    out_dir: Union[str, os.PathLike],
    progress: Optional[Progress] = None,
    chunk: int = 1_000_000,
    drops_pcap: Optional[Union[str, os.PathLike]] = None,
) -> ReplaySummary:
    pairs = list(inputs.items()) if isinstance(inputs, dict) else [tuple(x) for x in inputs]
    resolved = [(dp._input_port(port), str(path)) for port, path in pairs]  # a number: the core checks it
    os.makedirs(out_dir, exist_ok=True)
    s0 = _Snapshot(dp)
    summary = ReplaySummary()
    t0 = time.perf_counter()
    r = dp._core.replayer(resolved, str(out_dir), os.fspath(drops_pcap) if drops_pcap else "")
    if drops_pcap:
        summary.drops_pcap = os.fspath(drops_pcap)
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
    _fill(summary, s0, _Snapshot(dp))
    summary.outputs = {name: path for name, path in r.outputs()}
    summary.drops_written = r.drops_written
    if error is not None:
        error.summary = summary  # what was processed and written before the failure
        raise error
    return summary
