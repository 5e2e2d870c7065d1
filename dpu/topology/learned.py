"""What the fabric learned, compiled into flows and groups (issue 28: BGP EVPN).

What it does: turns the entries FRRouting installed in a tenant's kernel shadow
(``dpu.fabric.shadow.Learned``: remote MACs with their VTEPs, flood lists,
MAC+IP neighbours, router MACs, host and prefix routes) into the flows and group
buckets that make the dataplane forward by them. Each flow is keyed by its
strict match (cookie, table, priority, match), so the mirror (``dpu.mirror``)
commits only what changed: a new MAC is one flow added, a moved MAC one flow
modified, a withdrawn route one flow deleted.

Where a learned entry lands (the static pipeline is ``compiler``'s):

  table 0   VXLAN accepted from each learned VTEP: on the tenant's L2 VNI to
            table 30, on its L3 VNI to table 35 (the VTEPs the topology names
            are accepted there already).
  table 10  ARP answered for learned MAC+IP neighbours (priority 205, above the
            topology's 200: learned wins unless the topology pins the entry);
            host routes (/32, priority 105) and prefix routes (61 + prefix
            length: below local endpoints' 100, above NAT's 55-60) routed into
            the L3 VNI: inner source our router MAC, inner destination the
            remote VTEP's router MAC, TTL decremented (RFC 9135 symmetric IRB).
  table 20  learned MACs (priority 105) over the L2 VNI to their VTEP.
  group     EVPN_FLOOD_GROUP + tenant index: one bucket per learned flood
            VTEP (type 3), chained from the tenant's flood group.

Entries the topology pins (``remote: [{..., pinned: true}]``), entries for a
tenant's own local endpoints, VNIs no tenant has, and routes whose VTEP has no
router MAC yet are left out and counted (``Learned.skipped``).

What it reads: a Topology that validation accepted and, per tenant name, an
object with the attributes of ``dpu.fabric.shadow.Learned``. What it hands on:
``LearnedFlows``; it applies nothing and raises nothing.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from .security_flows import T_SG
from .compiler import (EVPN_FLOOD_GROUP, T_FABRIC, T_INGRESS, T_L2, T_L3, T_L3VNI, TOPOLOGY_COOKIE_MASK,
                       _arp_reply)
from .schema import TUNNEL_PORT, Tenant, Topology

LEARNED_COOKIE = 0xDA << 56        # top byte: flows the fabric mirror owns (a topology reload keeps them)
LEARNED_COOKIE_MASK = TOPOLOGY_COOKIE_MASK
PRIO_ARP, PRIO_MAC, PRIO_HOST_ROUTE, PRIO_PREFIX_BASE = 205, 105, 105, 61


@dataclass
class LearnedFlows:
    """The flows and groups of the learned entries of every tenant."""

    flows: Dict[str, str] = field(default_factory=dict)     # strict match (with cookie) -> flow text
    groups: Dict[int, str] = field(default_factory=dict)    # group id -> group text
    entries: Dict[str, Dict[str, int]] = field(default_factory=dict)  # tenant -> kind -> entries in force
    skipped: Dict[str, int] = field(default_factory=dict)   # reason -> entries left out
    used: Dict[str, str] = field(default_factory=dict)      # flow key -> the learned entry it stands for
    memo: dict = field(default_factory=dict)                # entry -> its flows (or why left out): compile_learned

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def compile_learned(topo: Topology, learned: Mapping[str, Any], memo: Optional[dict] = None) -> LearnedFlows:
    """The flows and groups that make ``learned`` (tenant name -> Learned) forward.

    ``memo``: the previous result's ``memo`` for the same topology: an entry seen before is
    not compiled again (a change to one entry among 10,000 costs a dictionary lookup for
    each of the others, not a formatted flow)."""
    out = LearnedFlows()
    out.memo = {} if memo is None else memo
    for t in topo.tenants.values():
        _tenant(topo, t, learned.get(t.name), out)
    known = set(topo.tenants)
    for name in learned:
        if name not in known:
            out.skip("unknown_tenant")
    return out


def _emit(out: LearnedFlows, memo_key: tuple, build: Callable[[], Union[str, List[tuple]]]) -> bool:
    """The flows of one entry, from the memo or built (a list of (flow key, text, what it
    stands for)), into ``out``; or the reason it is left out (a str) counted. True if emitted."""
    got = out.memo.get(memo_key)
    if got is None:
        got = out.memo[memo_key] = build()
    if isinstance(got, str):
        out.skip(got)
        return False
    for key, text, entry in got:
        out.flows[key] = text
        out.used[key] = entry
    return True


def _flow(ck: str, match: str, actions: str, entry: str) -> tuple:
    """A flow ``ck,match,actions=actions``, keyed by its strict match (its cookie exactly)."""
    return (f"{ck}/-1,{match}", f"{ck},{match},actions={actions}", entry)


def _tenant(topo: Topology, t: Tenant, got: Any, out: LearnedFlows) -> None:
    gid = EVPN_FLOOD_GROUP + t.index
    out.groups[gid] = f"group_id={gid},type=all"
    counts = {"macs": 0, "neighs": 0, "flood": 0, "routes": 0, "vteps": 0}
    out.entries[t.name] = counts
    if got is None:
        return
    ck = f"cookie={LEARNED_COOKIE | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    tun = f"set_field:{{vni:#x}}->tun_id,set_field:{{vtep}}->tun_dst,output:{TUNNEL_PORT}"
    own_macs = {ep.mac for ep in t.ports.values()} | {ep.mac for ep in t.remote if ep.pinned}
    own_ips = {str(ep.ip) for ep in t.ports.values()} | {str(ep.ip) for ep in t.remote if ep.pinned}
    static_vteps = {str(v) for v in t.vteps}
    static_flood = {str(v) for v in t.flood}
    l2_vteps: Dict[str, None] = {}

    for (vni, mac), vtep in got.macs.items():
        def mac_flows(vni=vni, mac=mac.lower(), vtep=vtep):
            if vni != t.vni:
                return "other_vni"
            if mac in own_macs:
                return "local_or_pinned"
            return [_flow(ck, f"table={T_L2},priority={PRIO_MAC},{md},dl_dst={mac}", tun.format(vni=vni, vtep=vtep),
                          f"type-2 MAC {mac} vni {vni} via {vtep}")]
        if _emit(out, ("mac", t.index, vni, mac, vtep), mac_flows):
            l2_vteps[vtep] = None
            counts["macs"] += 1

    for vni in got.flood:
        if vni != t.vni:
            out.skip("other_vni")
    buckets = []
    for vtep in sorted(got.flood.get(t.vni, ())):
        l2_vteps[vtep] = None
        if vtep not in static_flood:
            buckets.append(f"bucket=actions={tun.format(vni=t.vni, vtep=vtep)}")
            counts["flood"] += 1
    if buckets:
        out.groups[gid] = ",".join([f"group_id={gid},type=all"] + buckets)

    nets = [net for net, _ in t.subnets]
    for (vni, ip), mac in got.neighs.items():
        def neigh_flows(vni=vni, ip=ip, mac=mac.lower()):
            if vni != t.vni:
                return "other_vni"
            if ip in own_ips:
                return "local_or_pinned"
            if not any(ipaddress.ip_address(ip) in n for n in nets):
                return "outside_subnets"
            return [_flow(ck, f"table={T_L3},priority={PRIO_ARP},{md},arp,arp_op=1,arp_tpa={ip}",
                          _arp_reply(mac, ip), f"type-2 MAC+IP {ip} {mac} vni {vni}")]
        if _emit(out, ("neigh", t.index, vni, ip, mac), neigh_flows):
            counts["neighs"] += 1

    for vtep in l2_vteps:
        if vtep in static_vteps:
            continue
        _emit(out, ("vtep", t.index, t.vni, vtep), lambda vtep=vtep: _vtep_flows(ck, t.vni, t.vni, vtep, T_FABRIC, t.security))
        counts["vteps"] += 1

    if t.l3vni is not None:
        _routes(topo, t, got, out, ck, md, own_ips, counts)


def _vtep_flows(ck: str, vni: int, metadata: int, vtep: str, table: int, guarded: Any = False) -> List[tuple]:
    """VXLAN on `vni` from `vtep` accepted: untagged to `table` (with security
    groups, to their table first: it sends it on by VNI), tagged dropped."""
    m = f"table={T_INGRESS},priority={{prio}},in_port={TUNNEL_PORT},tun_id={vni:#x},tun_src={vtep}"
    what = f"VTEP {vtep} ({'vni' if table == T_FABRIC else 'l3vni'} {vni})"
    goto = T_SG if guarded else table
    return [_flow(ck, m.format(prio=200) + ",vlan_tci=0x0000", f"write_metadata:{metadata:#x},goto_table:{goto}",
                  what),
            _flow(ck, m.format(prio=190), f"write_metadata:{metadata:#x},drop(inner_vlan)", what)]


def _routes(topo: Topology, t: Tenant, got: Any, out: LearnedFlows, ck: str, md: str, own_ips: set,
            counts: Dict[str, int]) -> None:
    """Host and prefix routes into the L3 VNI, and VXLAN accepted on it from their VTEPs."""
    l3_vteps: Dict[str, None] = dict.fromkeys(got.rmacs)
    rmac_self = topo.evpn.router_mac
    host_ips = {ip for (_, ip) in got.neighs}   # a /32 that is a MAC+IP came as type 2; else type 5
    for prefix, vtep in got.routes.items():
        rmac = got.rmacs.get(vtep)
        kind = route_type(prefix, host_ips)

        def route_flows(prefix=prefix, vtep=vtep, rmac=rmac, kind=kind):
            net = ipaddress.ip_network(prefix, strict=False)
            if net.version != 4:
                return "ipv6_route"
            if rmac is None:
                return "no_router_mac"
            host = net.prefixlen == 32
            if host and str(net.network_address) in own_ips:
                return "local_or_pinned"
            prio = PRIO_HOST_ROUTE if host else PRIO_PREFIX_BASE + net.prefixlen
            dst = str(net.network_address) if host else str(net)
            return [_flow(ck, f"table={T_L3},priority={prio},{md},dl_dst={t.gateway_mac},ip,nw_dst={dst}",
                          f"mod_dl_src:{rmac_self},mod_dl_dst:{rmac.lower()},dec_ttl,set_field:{t.l3vni:#x}->tun_id,"
                          f"set_field:{vtep}->tun_dst,output:{TUNNEL_PORT}",
                          f"{kind} {net} via {vtep} (rmac {rmac.lower()})")]
        if _emit(out, ("route", t.index, prefix, vtep, rmac, kind), route_flows):
            l3_vteps[vtep] = None
            counts["routes"] += 1
    for vtep in l3_vteps:
        _emit(out, ("l3vtep", t.index, t.l3vni, vtep), lambda vtep=vtep: _vtep_flows(ck, t.l3vni, t.vni, vtep, T_L3VNI, t.security))


def route_type(prefix: str, host_ips=()) -> str:
    """What a route is, as far as the kernel shows it: a host route (/32: a type-2 MAC+IP route,
    or a type-5 /32) or a prefix route (type 5). FRR knows which route carried it; the kernel
    route it installs does not say."""
    return "host route" if prefix.endswith("/32") else "prefix route"


def learned_cookie(t: Optional[Tenant] = None) -> str:
    """The cookie match of the flows the mirror owns (one tenant's, or all)."""
    if t is None:
        return f"cookie={LEARNED_COOKIE:#x}/{LEARNED_COOKIE_MASK:#x}"
    return f"cookie={LEARNED_COOKIE | t.index:#x}/-1"
