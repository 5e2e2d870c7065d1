"""What FRR installed for a tenant, read from the kernel: netlink messages folded into `Learned`.

`Shadow.read()` folds fresh dumps of a tenant's namespace (`watch.settled_dump`) into a new
`Fold`; the watch (dpu.fabric.watch) keeps one per tenant and folds each event into it. Both go
through `Fold`, the one place that says what an entry FRR installed means (tests/EVPN_LAB.md,
"What FRR installs"). Each kernel object is keyed as the kernel keys it: a VXLAN FDB entry by MAC (and,
for the flood list's all-zero MAC, by remote), a neighbour by device and address, a route by
table, prefix and metric. So an event sets or clears exactly what it names, an object that
replaces one of zebra's (a static FDB entry, a kernel route over the same key) clears it, and
replaying events over a dump taken after the socket was opened ends in the kernel's state.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Dict, Optional, Set, Tuple

from . import netlink as nl

ALIAS = "dpu-shadow"


@dataclass
class Learned:
    """One tenant as FRR installed it in the kernel (tests/EVPN_LAB.md, "What FRR installs").

    macs:   (vni, mac) -> remote VTEP   type-2 MAC: `dst VTEP self extern_learn` on vx<vni>
    flood:  vni -> remote VTEPs          type-3: all-zero MAC `dst VTEP self permanent`
    neighs: (vni, ip) -> mac             type-2 MAC+IP: `extern_learn` neighbours on br<vni>
    rmacs:  remote VTEP -> router MAC    the VTEP as a neighbour on br<l3vni> (else vx<l3vni>'s FDB)
    routes: "a.b.c.d/n" -> remote VTEP   host (type-2) and prefix (type-5) routes, `proto bgp`
                                         via VTEP onlink on br<l3vni> (ECMP: the lowest VTEP)
    seq:    (vni, mac) -> MAC mobility sequence: the kernel does not carry it, so read() leaves
            it empty (zebra applies RFC 7432 section 15 and installs only the winner); see
            dpu.fabric.frr.ManagedFrr.mac_sequences()
    """
    macs: Dict[Tuple[int, str], str] = field(default_factory=dict)
    flood: Dict[int, Set[str]] = field(default_factory=dict)
    neighs: Dict[Tuple[int, str], str] = field(default_factory=dict)
    rmacs: Dict[str, str] = field(default_factory=dict)
    routes: Dict[str, str] = field(default_factory=dict)
    seq: Dict[Tuple[int, str], int] = field(default_factory=dict)


@dataclass
class Link:
    index: int
    name: str
    kind: Optional[str]
    master: int
    alias: str
    mac: str
    flags: int
    vni: Optional[int] = None
    local: Optional[str] = None
    port: Optional[int] = None
    table: Optional[int] = None


@dataclass
class Scan:
    """One namespace's links (with their IPv4 addresses) and, as asked, FDB, neighbours, routes."""
    links: Dict[int, Link]
    addrs: Dict[int, Set[str]]
    fdb: list
    neigh: list
    routes: list

    def by_name(self, name: str) -> Optional[Link]:
        return next((link for link in self.links.values() if link.name == name), None)


def dump_ns(ns: Optional[str], entries: bool = True, routes: bool = False) -> Scan:
    """Dumps namespace ns (None: this process's): links and addresses; FDB and IPv4 neighbours
    with `entries`; IPv4 routes with `routes`."""
    with nl.Rtnl(ns) as sock:
        raw = sock.dump("links")
        addrs: Dict[int, Set[str]] = {}
        for a in sock.dump("addresses"):
            local = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
            addrs.setdefault(a["index"], set()).add(f"{local}/{a['prefixlen']}")
        fdb = sock.dump("fdb") if entries else []
        neigh = sock.dump("neighbours") if entries else []
        rts = sock.dump("routes") if routes else []
    links = {}
    for m in raw:
        info = m.get_attr("IFLA_LINKINFO")
        data = info.get_attr("IFLA_INFO_DATA") if info else None
        link = Link(m["index"], m.get_attr("IFLA_IFNAME"), nl.link_kind(m), m.get_attr("IFLA_MASTER") or 0,
                    m.get_attr("IFLA_IFALIAS") or "", (m.get_attr("IFLA_ADDRESS") or "").lower(), m["flags"])
        if link.kind == "vxlan" and data is not None:
            link.vni = data.get_attr("IFLA_VXLAN_ID")
            link.local = data.get_attr("IFLA_VXLAN_LOCAL") or data.get_attr("IFLA_VXLAN_LOCAL6")
            link.port = data.get_attr("IFLA_VXLAN_PORT")
        elif link.kind == "vrf" and data is not None:
            link.table = data.get_attr("IFLA_VRF_TABLE")
        links[link.index] = link
    return Scan(links, addrs, fdb, neigh, rts)


@dataclass(frozen=True)
class Place:
    """Where a tenant's objects are: namespace ns (None: this process's), inside VRF device vrf
    (kernel mode) or alone in their namespace (vrf None); its routes are in `table`."""
    ns: Optional[str]
    vrf: Optional[str]
    table: int


def members(scan: Scan, place: Place) -> Set[int]:
    """The ifindexes of a tenant's devices in its namespace's scan."""
    if place.vrf is None:
        return set(scan.links)
    vrf = scan.by_name(place.vrf)
    if vrf is None:
        return set()
    bridges = {i for i, link in scan.links.items() if link.master == vrf.index}
    return {vrf.index} | bridges | {i for i, link in scan.links.items() if link.master in bridges}


class Fold:
    """One tenant's Learned, folded from netlink messages (dumped or events) of its namespace."""

    def __init__(self, scan: Scan, place: Place, tag: str) -> None:
        self.mine = members(scan, place)
        links = {i: scan.links[i] for i in self.mine}
        self.l3_bridges = {i for i, link in links.items() if link.alias == f"{ALIAS}:{tag}:l3vni"}
        vx = {i: link for i, link in links.items() if link.kind == "vxlan" and link.vni is not None}
        self.l2_vx = {i: link.vni for i, link in vx.items() if link.master not in self.l3_bridges}
        self.l3_vx = {i for i, link in vx.items() if link.master in self.l3_bridges}
        self.svi_vni = {link.master: link.vni for link in vx.values() if link.master not in self.l3_bridges}
        self.table = place.table
        self.out = Learned()
        self._rmac_fdb: Dict[str, str] = {}     # router MAC -> VTEP: br<l3vni>'s VXLAN FDB (keyed by MAC)
        self._rmac_neigh: Dict[str, str] = {}   # VTEP -> router MAC: its neighbour on br<l3vni>
        self._routes: Dict[str, Dict[int, str]] = {}    # prefix -> metric -> VTEP (zebra's routes only)

    def fill(self, scan: Scan) -> "Fold":
        for e in scan.fdb:
            self.fdb(e, True)
        for n in scan.neigh:
            self.neigh(n, True)
        for r in scan.routes:
            self.route(r, True)
        return self

    def message(self, m) -> bool:
        """Folds one event (RTM_NEW*/RTM_DEL*); whether what this tenant learned changed."""
        event = m.get("event")
        if event in ("RTM_NEWNEIGH", "RTM_DELNEIGH"):
            if m["family"] == socket.AF_BRIDGE:
                return self.fdb(m, event == "RTM_NEWNEIGH")
            return self.neigh(m, event == "RTM_NEWNEIGH")
        if event in ("RTM_NEWROUTE", "RTM_DELROUTE"):
            return self.route(m, event == "RTM_NEWROUTE")
        return False

    def fdb(self, e, present: bool) -> bool:
        """A VXLAN FDB entry (mac, dst): zebra's remote MACs, flood lists, router MACs. A new
        entry that is not zebra's replaces the MAC's; a deleted one clears it only if it named
        the same remote."""
        i, mac, dst = e["ifindex"], e.get_attr("NDA_LLADDR"), e.get_attr("NDA_DST")
        if dst is None or not e["flags"] & nl.NTF_SELF:
            return False
        zebra = present and bool(e["flags"] & nl.NTF_EXT_LEARNED)
        only_if = None if present else dst
        if i in self.l2_vx:
            vni = self.l2_vx[i]
            if mac == nl.ZERO_MAC:
                have = self.out.flood.get(vni, set())
                if present == (dst in have):
                    return False
                if present:
                    self.out.flood.setdefault(vni, set()).add(dst)
                else:
                    have.discard(dst)
                    if not have:
                        del self.out.flood[vni]
                return True
            return put(self.out.macs, (vni, mac), dst if zebra else None, only_if)
        if i in self.l3_vx and mac != nl.ZERO_MAC:
            vteps = {dst, self._rmac_fdb.get(mac)} - {None}
            before = {v: self._rmac(v) for v in vteps}
            put(self._rmac_fdb, mac, dst if zebra else None, only_if)
            return any(self._rmac(v) != r for v, r in before.items())
        return False

    def neigh(self, n, present: bool) -> bool:
        """An IPv4 neighbour: zebra's MAC+IP entries on an SVI, router MACs on br<l3vni>. A
        neighbour rewritten FAILED without a MAC is zebra beginning to delete it: gone."""
        if n["family"] != socket.AF_INET:
            return False
        i, ip, mac = n["ifindex"], n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR")
        ok = (present and bool(n["flags"] & nl.NTF_EXT_LEARNED) and mac is not None
              and not n["state"] & nl.NUD_FAILED)
        if i in self.svi_vni:
            return put(self.out.neighs, (self.svi_vni[i], ip), mac if ok else None)
        if i in self.l3_bridges:
            before = self._rmac(ip)
            put(self._rmac_neigh, ip, mac if ok else None)
            return self._rmac(ip) != before
        return False

    def _rmac(self, vtep: str) -> Optional[str]:
        """The router MAC of a VTEP: its neighbour's, else the lowest of the FDB entries naming
        it (the lowest, not the last: a dump and a stream of events list them in different orders)."""
        mac = self._rmac_neigh.get(vtep)
        if mac is None:
            mac = min((m for m, dst in self._rmac_fdb.items() if dst == vtep), default=None)
        return mac

    def route(self, r, present: bool) -> bool:
        """A route in the tenant's table: zebra's (`proto bgp`) host and prefix routes on the
        tenant's devices (ECMP: the lowest VTEP). Any other route over the same prefix and metric
        (another protocol's, or one out of a device not the tenant's) replaced zebra's: it clears it."""
        table = r.get_attr("RTA_TABLE") or r["table"]
        if table != self.table:
            return False
        oif = r.get_attr("RTA_OIF")
        prefix = f"{r.get_attr('RTA_DST') or '0.0.0.0'}/{r['dst_len']}"
        metric = r.get_attr("RTA_PRIORITY") or 0
        gateway = None
        if present and r["proto"] == nl.RTPROT_BGP and (oif is None or oif in self.mine):
            hops = [h.get_attr("RTA_GATEWAY") for h in r.get_attr("RTA_MULTIPATH") or ()] or [r.get_attr("RTA_GATEWAY")]
            gateway = min((g for g in hops if g), key=ipaddress.ip_address, default=None)
        by_metric = self._routes.setdefault(prefix, {})
        if not put(by_metric, metric, gateway):
            if not by_metric:
                del self._routes[prefix]
            return False
        if not by_metric:
            del self._routes[prefix]
        return put(self.out.routes, prefix, by_metric[min(by_metric)] if by_metric else None)

    def learned(self) -> Learned:
        """A copy of what is folded so far (the router MACs of both sources merged: the
        neighbour's wins), safe to hand to another thread."""
        o = self.out
        rmacs = {vtep: self._rmac(vtep) for vtep in set(self._rmac_fdb.values()) | set(self._rmac_neigh)}
        return Learned(macs=dict(o.macs), flood={v: set(d) for v, d in o.flood.items()}, neighs=dict(o.neighs),
                       rmacs=rmacs, routes=dict(o.routes))


def put(d: dict, key, value, only_if=None) -> bool:
    """d[key] = value, or (value None) removes it — only while it holds `only_if` when given
    (an FDB entry's delete names the remote it removes). Whether d changed."""
    old = d.get(key)
    if value is None:
        if old is None or (only_if is not None and old != only_if):
            return False
        del d[key]
        return True
    if old == value:
        return False
    d[key] = value
    return True


def learned_of(scan: Scan, place: Place, tag: str) -> Learned:
    """What zebra installed for one tenant, from its namespace's scan."""
    return Fold(scan, place, tag).fill(scan).learned()
