"""The counter tables an operator reads: ports, tables, tenants, conntrack,
caches. ``dpu demo`` prints them after its replay and ``dpu run`` when it
stops; ``dpu stats`` prints them for a running instance."""
from __future__ import annotations

from typing import Dict, List, Optional


def table(rows: List[List[object]], header: List[str]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the rest right."""
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths))
    return "\n".join([fmt.format(*header)] + [fmt.format(*[str(c) for c in r]) for r in rows])


def _drops(d: Dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def counter_tables(st: dict, ports: Optional[Dict[str, dict]] = None, zones: Optional[List[list]] = None,
                   connections: Optional[List[str]] = None) -> str:
    """The tables of ``stats()`` output ``st``. ``ports`` replaces st["ports"]
    (a replay shows its own deltas); ``zones`` are [tenant, zone, limit] rows;
    ``connections`` a few lines of the connection table to show."""
    out = []
    ports = st["ports"] if ports is None else ports
    out.append("Ports:")
    rows = [[n, c["rx_packets"], c["tx_packets"], c["dropped"], c.get("tx_dropped", 0), _drops(c["drops"])]
            for n, c in ports.items()]
    out.append(table(rows, ["port", "rx", "tx", "dropped", "tx_dropped", "drops by reason"]))
    out.append("\nTables:")
    rows = [[t["table"], t["active"], t["lookups"], t["matches"], t["misses"]] for t in st["tables"]]
    out.append(table(rows, ["table", "rules", "lookups", "matches", "misses"]))
    if st["tenants"]:
        out.append("\nTenants:")
        rows = [[n, c["rx_packets"], c["tx_packets"], c["dropped"], _drops(c["drops"])]
                for n, c in st["tenants"].items()]
        out.append(table(rows, ["tenant", "in", "out", "dropped", "drops by reason"]))
    ct = st["conntrack"]
    out.append(f"\nConntrack: {ct['connections']:,} connections ({ct['bytes_per_connection']} bytes each), "
               f"{ct['nat_mappings']:,} NAT mappings")
    if zones:
        rows = [[n, z, ct["zones"].get(z, 0), limit or "-"] for n, z, limit in zones]
        out.append(table(rows, ["tenant", "zone", "connections", "limit"]))
    for line in connections or []:
        out.append(f"  {line}")
    p = st["pmd"]
    passes = max(p["passes"], 1)
    out.append(f"\nCaches: {p['packets']:,} packets, {p['passes']:,} lookups ({p['recirculations']:,} after tunnel "
               f"pop or conntrack); EMC hits {p['emc_hits'] / passes:.1%}, megaflow hits "
               f"{p['megaflow_hits'] / passes:.1%}, upcalls {p['upcalls']}, megaflows {p['megaflows']}")
    return "\n".join(out)


def tenant_zones(dp) -> List[list]:
    """[tenant, zone, connection limit] for the tenants of dp's topology that track connections."""
    if dp.topology is None:
        return []
    return [[n, t.zone, t.connection_limit] for n, t in dp.topology.topology.tenants.items()
            if t.nat or t.connection_limit]
