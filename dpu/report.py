"""What an operator reads after a run, rendered one way everywhere.

``dpu demo`` prints these tables after its replay, ``dpu run`` when it stops,
``dpu stats`` for a running instance and ``dpu replay --show`` after a replay.
Each view is what the Open vSwitch tool of the same job shows:

=============  ==========================================  =====================
view           like                                        data
=============  ==========================================  =====================
``ports``      ``ovs-ofctl dump-ports``                    per port counters
``flows``      ``ovs-ofctl dump-flows``                    per rule packets/bytes
``tables``     ``ovs-ofctl dump-tables``                   lookups, matches
``groups``     ``ovs-ofctl dump-groups`` (+ group stats)   per group packets/bytes
``megaflows``  ``ovs-appctl dpctl/dump-flows``             masks, hits, actions
``workers``    ``ovs-appctl dpif-netdev/pmd-stats-show``   per worker cache hits
=============  ==========================================  =====================

Every table goes through :func:`table`; cache hit rates are computed by
:func:`cache_stats` only (the demo, the benchmarks, replays and ``dpu stats``
agree); rates are written by :func:`rate_text` (``12.3 kpps``, never
``0.00 Mpps``); the counter names and their descriptions come from
``native/include/dpu/counters.def`` through ``dpu._core.counters()``.
"""
from __future__ import annotations

import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence

from . import _core

#: counters.def as data: {"traffic"|"port"|"worker": [(stats key, description)]}.
COUNTERS: Dict[str, List[tuple]] = {k: [tuple(x) for x in v] for k, v in _core.counters().items()}
WORKER_COUNTERS = [name for name, _ in COUNTERS["worker"]]
#: a live port's queue counters (``interfaces`` of dpu stats), summed over its queues
QUEUE_COUNTERS = [name for name, _ in _core.queue_counters()]

#: The views of :func:`render_views`, in the order they print.
VIEWS = ("ports", "flows", "tables", "groups", "megaflows", "workers")
#: The OVS command names a user may give for a view.
VIEW_ALIASES = {"dump-ports": "ports", "dump-flows": "flows", "dump-tables": "tables", "dump-groups": "groups",
                "dpctl/dump-flows": "megaflows", "pmd-stats-show": "workers", "pmd": "workers", "caches": "workers"}


def table(rows: List[List[object]], header: List[str], align: Optional[str] = None) -> str:
    """Columns padded to their widest cell. ``align`` has one letter per column,
    ``l`` or ``r``; by default the first column is left-aligned and the rest right."""
    align = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(("{:<%d}" if a == "l" else "{:>%d}") % w for a, w in zip(align, widths))
    return "\n".join(fmt.format(*[str(c) for c in r]).rstrip() for r in [header] + rows)


def _drops(d: Dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def _pct(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


# ---- rates --------------------------------------------------------------------------------

def rate_text(pps: float) -> str:
    """A packet rate with the unit that keeps it readable: 12.35 Mpps, 8.21 kpps, 950 pps."""
    if pps >= 1e6:
        return f"{pps / 1e6:.2f} Mpps"
    if pps >= 1e3:
        return f"{pps / 1e3:.2f} kpps"
    return f"{pps:.0f} pps"


def tcpreplay_lines(packets: int, nbytes: int, seconds: float, verb: str = "replayed") -> List[str]:
    """The two lines tcpreplay ends with: ``Actual: N packets (B bytes) sent in S seconds``
    and ``Rated: X Bps, Y Mbps, Z pps``."""
    bps = nbytes / seconds if seconds > 0 else 0.0
    pps = packets / seconds if seconds > 0 else 0.0
    return [f"Actual: {packets} packets ({nbytes} bytes) {verb} in {seconds:.6f} seconds",
            f"Rated: {bps:.1f} Bps, {bps * 8 / 1e6:.2f} Mbps, {pps:.2f} pps"]


# ---- worker counters and cache rates ----------------------------------------------------------

def worker_delta(after: dict, before: Optional[dict]) -> dict:
    """One worker's counters between two stats() calls (``megaflows`` is a gauge: as after)."""
    out = {}
    for k, v in after.items():
        if k == "cycles":
            out[k] = {s: c - (before or {}).get("cycles", {}).get(s, 0) for s, c in v.items()}
        elif k == "megaflows" or before is None:
            out[k] = v
        else:
            out[k] = v - before.get(k, 0)
    return out


def counters_delta(after: dict, before: Optional[dict]) -> dict:
    """A port's or tenant's counters between two stats() calls: every number, and
    the drops by reason that moved."""
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


def stats_since(st: dict, zero: dict) -> dict:
    """``stats()`` (with a live dpu's ``interfaces``) less an earlier snapshot of it
    (``dpu clear-stats``): the counters of ports, tenants, tables, workers and
    interfaces since then. Gauges stay as they are (rules in a table, megaflows,
    conntrack), and so does conntrack (its connections are not counters)."""
    out = dict(st)
    out["ports"] = {n: counters_delta(c, zero["ports"].get(n)) for n, c in st["ports"].items()}
    out["tenants"] = {n: counters_delta(c, zero["tenants"].get(n)) for n, c in st["tenants"].items()}
    t0 = {t["table"]: t for t in zero["tables"]}
    out["tables"] = [{**t, **{k: t[k] - t0.get(t["table"], {}).get(k, 0) for k in ("lookups", "matches", "misses")}}
                     for t in st["tables"]]
    w0 = zero["workers"]
    out["workers"] = [worker_delta(w, w0[i] if i < len(w0) else None) for i, w in enumerate(st["workers"])]
    out["workers_total"] = worker_delta(st["workers_total"], zero["workers_total"])
    out["pmd"] = out["workers_total"]  # the old name of the same dict
    if "interfaces" in st:
        q0 = {(q["ofport"], q["ifname"]): q for q in zero.get("interfaces", [])}
        out["interfaces"] = [{k: v - q0.get((q["ofport"], q["ifname"]), {}).get(k, 0)
                              if isinstance(v, int) and k != "ofport" else v for k, v in q.items()}
                             for q in st["interfaces"]]
    return out


def sum_workers(workers: Iterable[dict]) -> dict:
    total: dict = {}
    for w in workers:
        for k, v in w.items():
            if k == "cycles":
                c = total.setdefault("cycles", {})
                for s, n in v.items():
                    c[s] = c.get(s, 0) + n
            else:
                total[k] = total.get(k, 0) + v
    return total


def cache_stats(w: dict) -> dict:
    """Cache behaviour from worker counters (one worker's, a sum or a delta),
    the one definition every report uses.

    A *lookup* is a pass that asked the caches: every pass except the VXLAN
    frames terminated right after parsing (``tunnel_pops``), which no cache
    sees. Each lookup is answered by the EMC, the megaflow cache or an upcall,
    so the three rates add up to 1. As in pmd-stats-show, ``passes_per_packet``
    counts recirculations (tunnel pops and conntrack) as passes."""
    packets, passes = w.get("packets", 0), w.get("passes", 0)
    lookups = passes - w.get("tunnel_pops", 0)
    emc, mf, up = w.get("emc_hits", 0), w.get("megaflow_hits", 0), w.get("upcalls", 0)
    probed = mf + up  # lookups that reached the megaflow cache
    return {
        "packets": packets,
        "passes": passes,
        "recirculations": w.get("recirculations", 0),
        "tunnel_pops": w.get("tunnel_pops", 0),
        "lookups": lookups,
        "emc_hits": emc,
        "megaflow_hits": mf,
        "upcalls": up,
        "upcalls_not_installed": w.get("upcall_no_install", 0),
        "emc_hit_rate": round(emc / lookups, 4) if lookups else 0.0,
        "megaflow_hit_rate": round(mf / lookups, 4) if lookups else 0.0,
        "upcall_rate": round(up / lookups, 4) if lookups else 0.0,
        "passes_per_packet": round(passes / packets, 3) if packets else 0.0,
        "subtables_per_lookup": round(w.get("subtable_probes", 0) / probed, 2) if probed else 0.0,
        "packets_per_batch": round(packets / w["batches"], 1) if w.get("batches") else 0.0,
        "megaflows": w.get("megaflows", 0),
    }


def cache_line(c: dict) -> str:
    """One line of :func:`cache_stats`: what the demo and ``dpu run`` print."""
    return (f"Caches: {c['packets']:,} packets, {c['passes']:,} passes ({c['recirculations']:,} after tunnel pop "
            f"or conntrack), {c['lookups']:,} lookups: EMC hits {c['emc_hit_rate']:.1%}, megaflow hits "
            f"{c['megaflow_hit_rate']:.1%}, upcalls {c['upcalls']:,} ({c['upcall_rate']:.1%}); "
            f"megaflows {c['megaflows']:,}")


# ---- the views ------------------------------------------------------------------------------

def ports_table(ports: Dict[str, dict]) -> str:
    """dump-ports: packets and bytes each way, drops (by reason), what a port refused to send."""
    rows = [[n, c["rx_packets"], c.get("rx_bytes", 0), c["tx_packets"], c.get("tx_bytes", 0), c["dropped"],
             c.get("tx_dropped", 0), _drops(c["drops"])] for n, c in ports.items()]
    return table(rows, ["port", "rx pkts", "rx bytes", "tx pkts", "tx bytes", "dropped", "tx_dropped",
                        "drops by reason"], "lrrrrrrl")


def interfaces_table(interfaces: List[dict], names: Optional[Dict[int, str]] = None) -> str:
    """The interfaces of a live dataplane (``dpu run``'s final report, ``dpu
    stats``): per attached port, its queue counters (counters.def). With
    ``names`` (ofport -> port name) the first column is the port's name."""
    rows = [[names.get(q["ofport"], q["ofport"]) if names is not None else q["ofport"], q["ifname"]]
            + [q.get(c, 0) for c in QUEUE_COUNTERS] for q in interfaces]
    return table(rows, ["port" if names is not None else "ofport", "interface"] + QUEUE_COUNTERS)


def tables_table(tables: List[dict]) -> str:
    """dump-tables: per OpenFlow table, active rules, lookups, matches, misses."""
    rows = [[t["table"], t["active"], t["lookups"], t["matches"], t["misses"]] for t in tables]
    return table(rows, ["table", "rules", "lookups", "matches", "misses"])


def flows_table(flows: List[dict]) -> str:
    """dump-flows: every rule with its packets and bytes."""
    rows = [[f["table"], f["priority"], f["n_packets"], f["n_bytes"], f["match"] or "*", f["actions"]]
            for f in flows]
    return table(rows, ["table", "priority", "n_packets", "n_bytes", "match", "actions"], "rrrrll")


def groups_table(groups: List[dict]) -> str:
    """dump-groups with the group stats: packets and bytes per group."""
    rows = [[g["group_id"], g["n_packets"], g["n_bytes"], g["text"]] for g in groups]
    return table(rows, ["group_id", "n_packets", "n_bytes", "group"], "rrrl")


def megaflows_table(megaflows: List[dict]) -> str:
    """dpctl/dump-flows: each worker's megaflows, masked match, hits, datapath actions."""
    rows = [[m["worker"], m["n_packets"], m["n_bytes"], m["match"] or "*", m["actions"]] for m in megaflows]
    return table(rows, ["worker", "packets", "bytes", "megaflow (masked match)", "actions"], "rrrll")


def workers_table(workers: List[dict]) -> str:
    """pmd-stats-show: per worker, packets, passes, how the caches answered, upcalls."""
    rows = []
    for i, w in enumerate(workers):
        c = cache_stats(w)
        rows.append([i if i or len(workers) == 1 else "0 (api)", c["packets"], c["passes_per_packet"],
                     f"{c['emc_hits']} ({_pct(c['emc_hits'], c['lookups'])})",
                     f"{c['megaflow_hits']} ({_pct(c['megaflow_hits'], c['lookups'])})",
                     f"{c['upcalls']} ({_pct(c['upcalls'], c['lookups'])})",
                     c["tunnel_pops"], w.get("tunnel_pushes", 0), w.get("ct_packets", 0), c["subtables_per_lookup"],
                     c["packets_per_batch"], c["megaflows"]])
    return table(rows, ["worker", "packets", "passes/pkt", "emc hits", "megaflow hits", "upcalls", "tnl pops",
                        "tnl pushes", "ct pkts", "subtables/lookup", "pkts/batch", "megaflows"])


def counter_tables(st: dict, ports: Optional[Dict[str, dict]] = None, zones: Optional[List[list]] = None,
                   connections: Optional[List[str]] = None) -> str:
    """The tables of ``stats()`` output ``st``. ``ports`` replaces st["ports"]
    (a replay shows its own deltas); ``zones`` are [tenant, zone, limit] rows;
    ``connections`` a few lines of the connection table to show."""
    out = ["Ports:", ports_table(st["ports"] if ports is None else ports)]
    out += ["\nTables:", tables_table(st["tables"])]
    if st["tenants"]:
        out.append("\nTenants:")
        rows = [[n, c["rx_packets"], c["tx_packets"], c["dropped"], _drops(c["drops"])]
                for n, c in st["tenants"].items()]
        out.append(table(rows, ["tenant", "in", "out", "dropped", "drops by reason"], "lrrrl"))
    ct = st["conntrack"]
    out.append(f"\nConntrack: {ct['connections']:,} connections ({ct['bytes_per_connection']} bytes each), "
               f"{ct['nat_mappings']:,} NAT mappings")
    if zones:
        # (zones' keys are strings once the stats went through JSON: dpu stats --ctl)
        rows = [[n, z, ct["zones"].get(z, ct["zones"].get(str(z), 0)), limit or "-"] for n, z, limit in zones]
        out.append(table(rows, ["tenant", "zone", "connections", "limit"]))
    for line in connections or []:
        out.append(f"  {line}")
    sg = st.get("security_groups")
    if sg and sg["rules"]:
        out.append("\nSecurity groups (new connections each rule allowed; packets no rule allowed):")
        rows = [[r["tenant"], r["group"], f"{r['direction']}[{r['rule']}]", r["text"], r["hits"]] for r in sg["rules"]]
        rows += [[d["tenant"], d["port"], d["direction"], "denied", d["packets"]] for d in sg["denied"]]
        out.append(table(rows, ["tenant", "group / port", "rule", "", "hits"], "llllr"))
    out.append("\n" + cache_line(cache_stats(workers_total(st))))
    return "\n".join(out)


def workers_total(st: dict) -> dict:
    """The summed worker counters of a stats() dict, by its name or its old one ("pmd")."""
    return st["workers_total"] if "workers_total" in st else st["pmd"]


def parse_views(text: str) -> List[str]:
    """``--show`` LIST: view names (or the OVS command names, or ``all``), comma-separated."""
    out: List[str] = []
    for item in (x.strip().lower() for x in text.split(",")):
        if not item:
            continue
        if item == "all":
            out += [v for v in VIEWS if v not in out]
            continue
        v = VIEW_ALIASES.get(item, item)
        if v not in VIEWS:
            raise ValueError(f"unknown view '{item}' (views: {', '.join(VIEWS)}, all; or the OVS names "
                             f"{', '.join(VIEW_ALIASES)})")
        if v not in out:
            out.append(v)
    return out


def render_views(d: dict, views: Sequence[str]) -> str:
    """The chosen views of a replay summary's ``as_dict()``, titled, in VIEWS order."""
    titles = {"ports": "Ports (dump-ports)", "flows": "Flows (dump-flows)", "tables": "Tables (dump-tables)",
              "groups": "Groups (dump-groups)", "megaflows": "Megaflows (dpctl/dump-flows)",
              "workers": "Workers (pmd-stats-show)"}
    render = {"ports": lambda: ports_table(d["ports"]), "flows": lambda: flows_table(d["flows"]),
              "tables": lambda: tables_table(d["tables"]), "groups": lambda: groups_table(d["groups"]),
              "megaflows": lambda: megaflows_table(d["megaflows"]),
              "workers": lambda: workers_table(d["workers"]) + "\n" + cache_line(d["cache"])}
    parts = []
    for v in VIEWS:
        if v in views:
            body = render[v]() if (v not in ("flows", "groups", "megaflows") or d[v]) else "(none)"
            parts.append(f"{titles[v]}:\n{body}")
    return "\n\n".join(parts)


def tenant_zones(dp) -> List[list]:
    """[tenant, zone, connection limit] for the tenants of dp's topology that track connections."""
    if dp.topology is None:
        return []
    return [[n, t.zone, t.connection_limit] for n, t in dp.topology.topology.tenants.items()
            if t.nat or t.connection_limit or t.security]


# ---- progress -------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr, only on a terminal and for work that
    lasts (nothing in the first half second). Called as ``progress(done, total,
    packets)``; ``label`` names the step (``progress.label = "generating"``)."""

    def __init__(self, enabled: bool, label: str = "", show_rate: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.shown = False
        self.label = label
        self.show_rate = show_rate

    def __call__(self, done: int, total: int, packets: int) -> None:
        if not self.enabled or total <= 0:
            return
        elapsed = time.perf_counter() - self.t0
        if not self.shown and elapsed < 0.5:
            return
        frac = min(done / total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = rate_text(packets / elapsed) if elapsed > 0 and self.show_rate else ""
        label = f"{self.label} " if self.label else ""
        sys.stderr.write(f"\r{label}[{bar}] {frac * 100:5.1f}%  {packets:,} packets  {rate}\033[K")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.shown = False


def show_arg(text: str) -> List[str]:
    """argparse type of ``--show``: :func:`parse_views`, its error as a usage error."""
    import argparse

    try:
        return parse_views(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
