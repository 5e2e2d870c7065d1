"""The fabric mirror, dataplane side: what FRR installed becomes one transaction.

What it does: holds the flows and groups the learned entries of every tenant
compiled to last time (``dpu.topology.learned``) and, given what the kernel
shadow holds now, commits the difference as ONE dataplane transaction: flows
added, changed (an add with the same strict match replaces the actions: a
moved MAC), deleted (strictly, by their own cookie, so no topology flow is
ever touched), and the learned flood groups modified. Nothing else changes, so
the workers keep every cached megaflow the change cannot affect (the
dataplane's revalidation) and a burst of changes costs what it changes.

After a topology reload (``retopology``) everything is compiled again against
the new tenants and diffed the same way.

What it reads: a Dataplane with the topology loaded, and per tenant an object
with the attributes of ``dpu.fabric.shadow.Learned``. Who calls it: dpu run's
fabric loop (on each shadow watch callback) and tests. Thread-safety: one
caller at a time (the fabric loop); ``snapshot()`` may be read from any thread.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, Mapping, Optional

from .topology import Topology
from .topology.learned import LEARNED_COOKIE, LearnedFlows, compile_learned, route_type


# Upper bounds (seconds) of the netlink-to-dataplane latency histogram (Prometheus' le).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ChangeLatency:
    """How long the fabric's changes took from netlink to the dataplane: from the moment the
    first event of a change was read (the shadow watch's batch) to its transaction committed.
    Last, max, and a histogram over LATENCY_BUCKETS (per bucket, not cumulative)."""

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.last: Optional[float] = None
        self.max = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)   # the last: above every bound

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.count += 1
        self.sum += seconds
        self.last = seconds
        self.max = max(self.max, seconds)
        i = 0
        while i < len(LATENCY_BUCKETS) and seconds > LATENCY_BUCKETS[i]:
            i += 1
        self.buckets[i] += 1

    def snapshot(self) -> dict:
        return {"count": self.count, "sum_s": self.sum, "last_s": self.last, "max_s": self.max,
                "buckets": [[le, n] for le, n in zip(list(LATENCY_BUCKETS) + [float("inf")], self.buckets)]}


class FabricMirror:
    """Keeps a dataplane's learned flows equal to what the fabric learned."""

    def __init__(self, dp: Any, topo: Topology) -> None:
        self.dp = dp
        self.topo = topo
        self.learned: Dict[str, Any] = {}
        self.current = LearnedFlows()
        self.changes = 0            # transactions committed
        self.flow_changes = 0       # flows added, modified or deleted over all of them
        self.last_change: Optional[float] = None   # time.time() of the last transaction
        self.last_apply_s = 0.0     # how long the last apply took (compile + commit)
        self.latency = ChangeLatency()   # netlink event -> transaction committed
        self._lock = threading.Lock()
        self._index: Optional[dict] = None   # entry_for's, built on first use after a change

    def apply(self, learned: Mapping[str, Any], since: Optional[float] = None) -> dict:
        """Makes the dataplane forward by ``learned`` (tenant name -> Learned, all tenants:
        a tenant absent has learned nothing). Returns what changed. ``since``: the
        time.monotonic() the netlink events behind this call began to be read; a transaction
        made counts its latency from there (``latency``)."""
        t0 = time.perf_counter()
        memo = self.current.memo
        if len(memo) > 4 * len(self.current.flows) + 4096:   # entries that came and went: start afresh
            memo = None
        new = compile_learned(self.topo, learned, memo)
        result = self._commit(new)
        with self._lock:
            self.learned = dict(learned)
            self.current = new
            self._index = None
            self.last_apply_s = time.perf_counter() - t0
            if since is not None and any(result.values()):
                self.latency.add(time.monotonic() - since)
        return result

    def retopology(self, topo: Topology) -> dict:
        """The topology was reloaded: the learned entries compiled against it again."""
        self.topo = topo
        self.current.memo = {}   # compiled against the old tenants
        return self.apply(self.learned)

    def clear(self) -> dict:
        """Every learned flow and bucket removed (e.g. the fabric is no longer used)."""
        return self.apply({})

    def _commit(self, new: LearnedFlows) -> dict:
        old = self.current
        added = [text for key, text in new.flows.items() if old.flows.get(key) != text]
        deleted = [key for key in old.flows if key not in new.flows]
        # The topology makes each tenant's learned flood group (empty) and removes it with
        # the tenant: the mirror only fills it.
        groups = [g for gid, g in new.groups.items() if old.groups.get(gid) != g]
        n = len(added) + len(deleted) + len(groups)
        if n:
            t = self.dp.transaction()
            for g in groups:
                t.mod_group(g)
            for key in deleted:
                t.del_flows(key, strict=True)
            for text in added:
                t.add_flow(text)
            t.commit()
            with self._lock:
                self.changes += 1
                self.flow_changes += len(added) + len(deleted)
                self.last_change = time.time()
        return {"flows_added": len(added), "flows_deleted": len(deleted),
                "groups_changed": len(groups)}

    def snapshot(self) -> dict:
        """What is in force: per tenant the learned entries by kind, the entries left out
        by reason, and the change counters (for dpu evpn and the metrics)."""
        with self._lock:
            cur = self.current
            return {
                "tenants": {name: dict(c) for name, c in cur.entries.items()},
                "skipped": dict(cur.skipped),
                "transactions": self.changes,
                "flow_changes": self.flow_changes,
                "last_change": self.last_change,
                "last_apply_s": self.last_apply_s,
                "latency": self.latency.snapshot(),
            }

    def entry_for(self, table: int, priority: int, cookie: int, match: str) -> Optional[str]:
        """The learned entry a flow stands for, given as a trace or dump-flows shows it
        (its match's fields in any order): what dpu trace names."""
        if cookie >> 56 != LEARNED_COOKIE >> 56:
            return None
        with self._lock:
            if self._index is None:
                self._index = {}
                for key, entry in self.current.used.items():
                    fields = key.split(",")
                    self._index[(fields[0].split("=")[1].split("/")[0],)
                                + _match_key(fields[1:])] = entry
            return self._index.get((f"{cookie:#x}",) + _match_key([f"table={table}", f"priority={priority}"]
                                                                  + match.split(",")))

    def annotate(self, trace: Any) -> Any:
        """``trace`` with a line after each learned flow it went through naming the entry."""
        for p in trace.passes:
            events = []
            for ev in p.events:
                events.append(ev)
                if ev.get("kind") == "table" and ev.get("cookie"):
                    entry = self.entry_for(ev["table"], ev["priority"], ev["cookie"], ev["text"])
                    if entry:
                        events.append({"kind": "note", "depth": ev["depth"], "table": ev["table"], "priority": 0,
                                       "cookie": 0, "text": f"learned from the fabric: {entry}"})
            p.events = events
        return trace


def _match_key(fields) -> tuple:
    """A match as a sorted tuple of its fields (table and priority included), whatever
    order they were written in."""
    return tuple(sorted(f.strip() for f in fields if f.strip()))


def evpn_view(topo: Topology, mirror: Optional[FabricMirror] = None) -> dict:
    """What `dpu evpn` shows: the fabric's configuration, and per tenant its VNIs, VTEPs,
    MACs and IPs (with where each came from: local, static, or the EVPN route type that
    carried it) and routes with their router MACs. Offline (no mirror) only what the
    topology says; live also what FRR installed and is in force."""
    ev = topo.evpn
    out: Dict[str, Any] = {"evpn": None, "tenants": {}}
    if ev is not None:
        out["evpn"] = {"asn": ev.asn, "router_id": str(ev.router_id), "router_mac": ev.router_mac, "frr": ev.frr,
                       "graceful_restart": ev.graceful_restart, "vtep": str(topo.uplink.ip),
                       "peers": [{"address": str(p.address), "remote_asn": p.remote_asn or ev.asn,
                                  "ebgp": p.remote_asn is not None and p.remote_asn != ev.asn} for p in ev.peers]}
    learned = mirror.learned if mirror is not None else {}
    for t in topo.tenants.values():
        got = learned.get(t.name)
        vteps: Dict[str, dict] = {str(v): {"vtep": str(v), "source": "static"} for v in t.vteps}
        macs = [{"mac": ep.mac, "ip": str(ep.ip), "vtep": None, "source": "local", "port": p}
                for p, ep in t.ports.items()]
        macs += [{"mac": ep.mac, "ip": str(ep.ip), "vtep": str(ep.vtep), "source": "static",
                  "pinned": ep.pinned} for ep in t.remote]
        routes = []
        flood = [{"vtep": str(v), "source": "static"} for v in t.flood]
        if got is not None:
            ips = {}
            for (vni, ip), mac in got.neighs.items():
                if vni == t.vni:
                    ips.setdefault(mac.lower(), []).append(ip)
            for (vni, mac), vtep in sorted(got.macs.items()):
                if vni != t.vni:
                    continue
                mac = mac.lower()
                for ip in ips.get(mac) or [None]:
                    macs.append({"mac": mac, "ip": ip, "vtep": vtep, "source": "learned",
                                 "route": "type-2 MAC+IP" if ip else "type-2 MAC"})
                vteps.setdefault(vtep, {"vtep": vtep, "source": "learned"})
            for vtep in sorted(got.flood.get(t.vni, ())):
                flood.append({"vtep": vtep, "source": "learned", "route": "type-3"})
                vteps.setdefault(vtep, {"vtep": vtep, "source": "learned"})
            host_ips = {ip for (_, ip) in got.neighs}
            for prefix, vtep in sorted(got.routes.items()):
                routes.append({"prefix": prefix, "vtep": vtep, "router_mac": got.rmacs.get(vtep),
                               "route": route_type(prefix, host_ips)})
            for vtep, rmac in got.rmacs.items():
                vteps.setdefault(vtep, {"vtep": vtep, "source": "learned"})["router_mac"] = rmac
        out["tenants"][t.name] = {"vni": t.vni, "l3vni": t.l3vni, "gateway_mac": t.gateway_mac,
                                  "vteps": sorted(vteps.values(), key=lambda v: v["vtep"]),
                                  "macs": macs, "flood": flood, "routes": routes}
    if mirror is not None:
        snap = mirror.snapshot()
        out["learned"] = snap["tenants"]
        out["skipped"] = snap["skipped"]
        out["transactions"] = snap["transactions"]
        out["last_change"] = snap["last_change"]
        lat = snap["latency"]
        out["change_latency"] = {k: lat[k] for k in ("count", "last_s", "max_s")}
    return out


def evpn_text(view: dict) -> str:
    """`dpu evpn` as text, one block per tenant (the layout of vtysh's `show evpn`)."""
    ev = view.get("evpn")
    out = []
    if ev is None:
        out.append("EVPN: not configured (no evpn: section; remote endpoints are static)")
    else:
        peers = ", ".join(f"{p['address']} (AS {p['remote_asn']}{', eBGP' if p['ebgp'] else ''})" for p in ev["peers"])
        out.append(f"EVPN: AS {ev['asn']}, router-id {ev['router_id']}, VTEP {ev['vtep']}, router MAC "
                   f"{ev['router_mac']}, FRR {ev['frr']}" + (", graceful restart" if ev["graceful_restart"] else ""))
        out.append("  peers: " + (peers or "(none here: the operator's FRR has them)"))
    if "transactions" in view:
        age = ""
        if view.get("last_change"):
            age = f", last change {time.time() - view['last_change']:.1f}s ago"
        out.append(f"  {view['transactions']} transaction(s) from the fabric{age}")
        lat = view.get("change_latency") or {}
        if lat.get("count"):
            out.append(f"  netlink to dataplane: last {lat['last_s'] * 1e3:.0f} ms, max {lat['max_s'] * 1e3:.0f} ms "
                       f"over {lat['count']} change(s)")
        if view.get("skipped"):
            out.append("  left out: " + ", ".join(f"{k} {v}" for k, v in sorted(view["skipped"].items())))
    for name, t in view["tenants"].items():
        out.append("")
        out.append(f"tenant {name}: L2 VNI {t['vni']}" + (f", L3 VNI {t['l3vni']}" if t["l3vni"] else "")
                   + f", gateway MAC {t['gateway_mac']}")
        out.append("  VTEPs:")
        for v in t["vteps"] or [{"vtep": "(none)", "source": ""}]:
            rm = f"  router MAC {v['router_mac']}" if v.get("router_mac") else ""
            out.append(f"    {v['vtep']:<16} {v['source']}{rm}")
        out.append("  MACs:")
        out.append(f"    {'MAC':<18} {'IP':<16} {'where':<16} from")
        for m in t["macs"]:
            where = m["port"] if m["source"] == "local" else m["vtep"]
            src = m.get("route") or m["source"]
            if m["source"] == "learned":
                src = f"learned, {m['route']}"
            elif m.get("pinned"):
                src = "static, pinned"
            out.append(f"    {m['mac']:<18} {m['ip'] or '-':<16} {where:<16} {src}")
        if t["flood"]:
            out.append("  flood: " + ", ".join(f"{f['vtep']} ({f['source']})" for f in t["flood"]))
        if t["routes"]:
            out.append("  routes:")
            for r in t["routes"]:
                out.append(f"    {r['prefix']:<18} via {r['vtep']:<16} router MAC {r['router_mac'] or '(unknown)'}"
                           f"  {r['route']}")
    return "\n".join(out) + "\n"
