"""The topology compiler: a validated Topology -> ports, groups and flows.

What it does: turns a ``Topology`` (``schema``) into a ``Compiled``: the ports
(the uplink, the VXLAN tunnel port over it, the tenants' local ports, the
internet port), flood groups, ordinary ovs-ofctl flows, the tenants and their
metadata, conntrack zones and static NAT mappings. Users print it with
``dpu compile`` and extend it with flows of their own; ``Dataplane.load_topology``
applies it in one transaction.

Pipeline (tables):

  0   ingress: a local port's own MAC/IP (anti-spoofing) sets ``metadata`` to
      the tenant's VNI; decapsulated frames are accepted only for configured
      VNIs from VTEPs named for them; everything else is dropped with a reason.
  10  local ingress, L3: ARP suppression (answers for gateways and known
      endpoints of the same tenant), routing via the anycast gateway MAC,
      ICMP echo replies from the gateway's addresses.
  20  local ingress, L2: to local ports, VXLAN to remote endpoints, isolation
      drops for other tenants' MACs, flood group for broadcast/unknown.
  30  from the fabric, L2: to local ports only (split horizon).
  35  from the fabric, routed (EVPN symmetric IRB): a tenant's L3 VNI to the
      router MAC, routed to a local endpoint.
  40-42, 60-62: a tenant's NAT to the internet and back (_compile_nat).

Every compiled flow carries a cookie with TOPOLOGY_COOKIE in its top byte, so
a reload replaces exactly the compiled flows and keeps the user's own.

What it reads: a Topology that validation accepted (it checks nothing itself
and raises nothing). What it hands on: text, in the order it is printed:
the same topology compiles to the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from .schema import TUNNEL_PORT, Tenant, Topology
from .security_flows import (
    T_SG, T_SG_INET, compile_security, delivery_guard, inbound_rules, judge_port, nat_egress, sg_flood_groups,
    with_dst,
)

TOPOLOGY_COOKIE = 0xD9 << 56
TOPOLOGY_COOKIE_MASK = 0xFF << 56

T_INGRESS, T_L3, T_L2, T_FABRIC, T_L3VNI = 0, 10, 20, 30, 35
EVPN_FLOOD_GROUP = 0x10000   # + tenant index: the VTEPs the fabric learned (type 3), set by dpu.mirror
T_NAT_OUT, T_NAT_OUT_CT, T_NAT_OUT_ROUTE = 40, 41, 42
T_INET_IN, T_INET_IN_CT, T_INET_IN_ROUTE = 60, 61, 62
PROTO_NUMBERS = {"tcp": 6, "udp": 17}
UNRESOLVED_MAC = "00:00:00:00:00:00"  # a tunnel port's next hop before ARP answers: output drops


@dataclass
class Compiled:
    """What a topology compiles to: ports, groups and flows, each with a comment."""

    ports: List[dict]
    groups: List[Tuple[str, str]]            # (group text, comment)
    flows: List[Tuple[str, str]]             # (flow text, section comment)
    tenants: List[Tuple[str, int]]           # (name, metadata)
    topology: Topology
    ct_zones: List[Tuple[int, int, bool]] = field(default_factory=list)   # (zone, limit, EIF)
    nat_static: List[tuple] = field(default_factory=list)  # (zone, proto, int ip, int port, pub ip, pub port)

    @property
    def port_names(self) -> List[str]:
        return [p["name"] for p in self.ports]

    def text(self) -> str:
        """The `dpu compile` listing: a flows file (groups as group_id= lines)."""
        u = self.topology.uplink
        out = [f"# dpu compile {self.topology.source}"]
        out.append(f"# ports: {u.port} (uplink), {TUNNEL_PORT} (VTEP {u.ip} udp/{u.vxlan_port} over {u.port}, mtu {u.mtu})")
        if self.topology.internet:
            out.append(f"#   internet: {self.topology.internet.port}")
        for t in self.topology.tenants.values():
            if t.ports:
                out.append(f"#   tenant {t.name} (vni {t.vni}, conntrack zone {t.zone}): " + ", ".join(t.ports))
            if t.nat:
                a, b = t.nat.snat
                nat = [f"snat {a}" + (f"-{b}" if b != a else "")]
                nat += [f"floating {pub} -> {priv}" for priv, pub in t.nat.floating]
                nat += [f"forward {f.proto} {f.public}:{f.port} -> {f.to}:{f.to_port}" for f in t.nat.forwards]
                if t.nat.endpoint_independent_filtering:
                    nat.append("endpoint-independent filtering")
                out.append(f"#   tenant {t.name} NAT: " + "; ".join(nat))
            if t.connection_limit:
                out.append(f"#   tenant {t.name} connection limit: {t.connection_limit}")
        out.append("")
        last = None
        for text, comment in self.groups:
            if comment != last:
                out.append(f"# {comment}")
                last = comment
            out.append(text)
        for text, comment in self.flows:
            if comment != last:
                out.append("")
                out.append(f"# {comment}")
                last = comment
            out.append(text)
        return "\n".join(out) + "\n"

    def as_dict(self) -> Dict[str, Any]:
        """What :meth:`text` lists, as fields (``dpu compile --json``): the ports' roles, each
        tenant's VNI, zone, ports, NAT and connection limit, then the groups and flows split
        into their ovs-ofctl fields, each with the ``section`` comment it is listed under."""
        from ..oftext import flow_fields, group_fields

        topo, u = self.topology, self.topology.uplink
        tenants = []
        for t in topo.tenants.values():
            nat = None
            if t.nat:
                nat = {"snat": [str(a) for a in t.nat.snat],
                       "floating": [{"private": str(priv), "public": str(pub)} for priv, pub in t.nat.floating],
                       "forwards": [{"proto": f.proto, "public": str(f.public), "port": f.port, "to": str(f.to),
                                     "to_port": f.to_port} for f in t.nat.forwards],
                       "endpoint_independent_filtering": t.nat.endpoint_independent_filtering}
            tenants.append({"name": t.name, "vni": t.vni, "zone": t.zone, "ports": list(t.ports), "nat": nat,
                            "connection_limit": t.connection_limit or None})
        return {"source": str(topo.source),
                "uplink": {"port": u.port, "ip": str(u.ip), "vxlan_port": u.vxlan_port, "mtu": u.mtu},
                "tunnel": TUNNEL_PORT, "internet": topo.internet.port if topo.internet else None,
                "tenants": tenants,
                "groups": [{**group_fields(text), "section": c} for text, c in self.groups],
                "flows": [{**flow_fields(text), "section": c} for text, c in self.flows]}


def _arp_reply(mac: str, ip: Any) -> str:
    return (
        "move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
        f"mod_dl_src:{mac},"
        "load:0x2->NXM_OF_ARP_OP[],"
        "move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],"
        "move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],"
        f"set_field:{mac}->arp_sha,"
        f"set_field:{ip}->arp_spa,"
        "in_port"
    )


def compile_topology(topo: Topology) -> Compiled:
    u = topo.uplink
    tun_src_field = "tun_ipv6_src" if u.ipv6 else "tun_src"
    tun_dst_field = "tun_ipv6_dst" if u.ipv6 else "tun_dst"
    ports: List[dict] = [{"name": u.port, "ofport": 0}]
    ports.append(
        {
            "name": TUNNEL_PORT,
            "ofport": 0,
            "tunnel": True,
            "underlay": u.port,
            "local_ip": str(u.ip),
            "local_mac": u.mac,
            "nexthop_mac": u.nexthop_mac or UNRESOLVED_MAC,
            "dst_port": u.vxlan_port,
            "sport_min": u.src_port_range[0],
            "sport_max": u.src_port_range[1],
            "ttl": u.ttl,
            "mtu": u.mtu,
            "strict": u.strict_vxlan,
        }
    )
    groups: List[Tuple[str, str]] = []
    flows: List[Tuple[str, str]] = []
    add = flows.append
    g0 = f"cookie={TOPOLOGY_COOKIE:#x}"

    # Uplink: answer ARP for our VTEP address; anything else that is not VXLAN for
    # us (VXLAN is popped before the tables) is dropped.
    sec = f"table {T_INGRESS}: uplink {u.port}"
    if not u.ipv6 and topo.evpn is None:  # with EVPN the address is the kernel's: it answers
        add((f"table={T_INGRESS},priority=200,{g0},in_port={u.port},arp,arp_op=1,arp_tpa={u.ip},"
             f"actions={_arp_reply(u.mac, u.ip)}", sec))
    add((f"table={T_INGRESS},priority=100,{g0},in_port={u.port},actions=drop(underlay)", sec))
    sec = f"table {T_INGRESS}: decapsulated VXLAN (in_port={TUNNEL_PORT})"
    add((f"table={T_INGRESS},priority=100,{g0},in_port={TUNNEL_PORT},actions=drop(unknown_vni)", sec))
    sec = f"table {T_L3}: default"
    add((f"table={T_L3},priority=0,{g0},actions=goto_table:{T_L2}", sec))

    # Isolation: a destination MAC that belongs to another tenant.
    owners: Dict[str, None] = {}
    local_owners: Dict[str, None] = {}
    for t in topo.tenants.values():
        for ep in t.ports.values():
            owners.setdefault(ep.mac, None)
            local_owners.setdefault(ep.mac, None)
        for ep in t.remote:
            owners.setdefault(ep.mac, None)
    sec = f"table {T_L2}: isolation (MACs of every tenant; a tenant's own entries win)"
    for mac in owners:
        add((f"table={T_L2},priority=50,{g0},dl_dst={mac},actions=drop(isolation)", sec))
    sec = f"table {T_FABRIC}: isolation (local MACs of every tenant; a tenant's own entries win)"
    for mac in local_owners:
        add((f"table={T_FABRIC},priority=50,{g0},dl_dst={mac},actions=drop(isolation)", sec))

    for t in topo.tenants.values():
        _compile_tenant(topo, t, groups, add, tun_src_field, tun_dst_field)
        for p in t.ports:
            ports.append({"name": p, "ofport": 0})

    ct_zones: List[Tuple[int, int, bool]] = []
    nat_static: List[tuple] = []
    if topo.internet:
        ports.append({"name": topo.internet.port, "ofport": 0})
        _compile_internet(topo, add)
    for t in topo.tenants.values():
        if t.nat or t.connection_limit:
            ct_zones.append((t.zone, t.connection_limit, bool(t.nat and t.nat.endpoint_independent_filtering)))
        if t.nat:
            _compile_nat(topo, t, add)
            for f in t.nat.forwards:
                nat_static.append((t.zone, PROTO_NUMBERS[f.proto], str(f.to), f.to_port, str(f.public), f.port))
    tenants = [(t.name, t.vni) for t in topo.tenants.values()]
    return Compiled(ports, groups, flows, tenants, topo, ct_zones, nat_static)


def _compile_tenant(topo: Topology, t: Tenant, groups: List[Tuple[str, str]], add, tun_src_field: str,
                    tun_dst_field: str) -> None:
    """One tenant's flood groups and its flows in tables 0, 10, 20, 30 (and 35 with an L3 VNI)."""
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    wmd = f"write_metadata:{t.vni:#x}"
    flood_id, flood_local_id = 2 * t.index - 1, 2 * t.index
    tname = f"tenant {t.name} (vni {t.vni})"

    # Groups: head-end replication.
    local_buckets = [f"bucket=actions=output:{p}" for p in t.ports]
    vtep_buckets = [
        f"bucket=actions=set_field:{t.vni:#x}->tun_id,set_field:{vt}->{tun_dst_field},output:{TUNNEL_PORT}"
        for vt in t.flood
    ]
    if topo.evpn is not None:
        groups.append((f"group_id={EVPN_FLOOD_GROUP + t.index},type=all",
                       f"{tname}: the flood VTEPs EVPN learns (type-3 routes; filled while dpu runs)"))
        vtep_buckets.append(f"bucket=actions=group:{EVPN_FLOOD_GROUP + t.index}")
    groups.append((",".join([f"group_id={flood_id},type=all"] + local_buckets + vtep_buckets),
                   f"{tname}: broadcast/unknown from local ports -> local ports + flood VTEPs"))
    groups.append((",".join([f"group_id={flood_local_id},type=all"] + local_buckets),
                   f"{tname}: broadcast/unknown from the fabric -> local ports"))

    # Table 0: anti-spoofing for local ports.
    sec = f"table {T_INGRESS}: {tname}: local ports, anti-spoofing"
    ip_next = T_SG if t.security else T_L3   # security groups judge IP first
    for p, ep in t.ports.items():
        own = f"{ck},in_port={p},dl_src={ep.mac},vlan_tci=0x0000"
        go = f"actions={wmd},goto_table:{T_L3}"
        add((f"table={T_INGRESS},priority=200,{own},ip,nw_src={ep.ip},actions={wmd},goto_table:{ip_next}", sec))
        add((f"table={T_INGRESS},priority=200,{own},arp,arp_spa={ep.ip},arp_sha={ep.mac},{go}", sec))
        add((f"table={T_INGRESS},priority=190,{own},arp,arp_spa=0.0.0.0,arp_sha={ep.mac},{go}", sec))
        add((f"table={T_INGRESS},priority=190,{own},udp,nw_src=0.0.0.0,nw_dst=255.255.255.255,"
             f"tp_src=68,tp_dst=67,{go}", sec))
        add((f"table={T_INGRESS},priority=100,{ck},in_port={p},actions={wmd},drop(spoofed)", sec))
    _compile_ipv6_unsupported(t, add)

    # Table 0: VXLAN acceptance.
    sec = f"table {T_INGRESS}: {tname}: VXLAN from its VTEPs"
    tun = f"table={T_INGRESS},{{prio}},{ck},in_port={TUNNEL_PORT},tun_id={t.vni:#x}"
    for vt in t.vteps:
        add((tun.format(prio="priority=200") + f",{tun_src_field}={vt},vlan_tci=0x0000,"
             f"actions={wmd},goto_table:{T_SG if t.security else T_FABRIC}", sec))
        add((tun.format(prio="priority=190") + f",{tun_src_field}={vt},actions={wmd},drop(inner_vlan)", sec))
    # Not from one of its VTEPs: unauthenticated, so not charged to the tenant.
    add((tun.format(prio="priority=150") + ",actions=drop(unknown_vtep)", sec))
    if t.l3vni is not None:  # its VTEPs are learned (dpu.mirror)
        add((f"table={T_INGRESS},priority=150,{ck},in_port={TUNNEL_PORT},tun_id={t.l3vni:#x},"
             "actions=drop(unknown_vtep)", sec))

    # Table 10: ARP suppression and routing.
    sec = f"table {T_L3}: {tname}: ARP suppression and anycast-gateway routing"
    for p, ep in t.ports.items():  # probes / gratuitous ARP for a port's own address are flooded
        add((f"table={T_L3},priority=300,{ck},{md},in_port={p},arp,arp_tpa={ep.ip},actions=goto_table:{T_L2}", sec))
    answers = [(gw, t.gateway_mac) for _, gw in t.subnets]
    answers += [(ep.ip, ep.mac) for ep in t.ports.values()]
    answers += [(ep.ip, ep.mac) for ep in t.remote]
    for ip, mac in answers:
        add((f"table={T_L3},priority=200,{ck},{md},arp,arp_op=1,arp_tpa={ip},actions={_arp_reply(mac, ip)}", sec))
    endpoints = list(t.ports.values()) + t.remote
    for ep in endpoints:
        add((f"table={T_L3},priority=100,{ck},{md},dl_dst={t.gateway_mac},ip,nw_dst={ep.ip},"
             f"actions=mod_dl_src:{t.gateway_mac},mod_dl_dst:{ep.mac},dec_ttl,goto_table:{T_L2}", sec))
    add((f"table={T_L3},priority=50,{ck},{md},dl_dst={t.gateway_mac},actions=drop(unroutable)", sec))
    _compile_gateway_ping(t, add)

    # Table 20: L2 from local ports.
    sec = f"table {T_L2}: {tname}: L2 forwarding from local ports"
    for p, ep in t.ports.items():
        add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
    if t.security:
        delivery_guard(t, T_L2, add, TOPOLOGY_COOKIE, sec)
        add((f"table={T_L2},priority=11,{ck},{md},ip,actions=group:{sg_flood_groups(t)[0]}", sec))
    for ep in t.remote:
        add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=set_field:{t.vni:#x}->tun_id,"
             f"set_field:{ep.vtep}->{tun_dst_field},output:{TUNNEL_PORT}", sec))
    add((f"table={T_L2},priority=10,{ck},{md},actions=group:{flood_id}", sec))

    # Table 30: from the fabric, to local ports only.
    sec = f"table {T_FABRIC}: {tname}: L2 forwarding from the fabric (split horizon)"
    for p, ep in t.ports.items():
        add((f"table={T_FABRIC},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
    if t.security:
        delivery_guard(t, T_FABRIC, add, TOPOLOGY_COOKIE, sec)
        add((f"table={T_FABRIC},priority=11,{ck},{md},ip,actions=group:{sg_flood_groups(t)[1]}", sec))
    add((f"table={T_FABRIC},priority=90,{ck},{md},dl_dst={t.gateway_mac},actions=drop(unroutable)", sec))
    add((f"table={T_FABRIC},priority=10,{ck},{md},actions=group:{flood_local_id}", sec))

    if t.l3vni is not None:
        _compile_l3vni(topo, t, add)
    if t.security:
        compile_security(topo, t, groups, add, TOPOLOGY_COOKIE, T_L3, T_FABRIC, T_L3VNI, TUNNEL_PORT, EVPN_FLOOD_GROUP)


def _compile_ipv6_unsupported(t: Tenant, add) -> None:
    """Table 0: IPv6 from a local port's own MAC, untagged, is dropped as
    ``ipv6_unsupported``, charged to its tenant: tenants carry IPv4 only (the
    schema has no IPv6 addresses), and a VM coming up sends router and
    neighbour solicitations and MLD reports, which are not spoofing. IPv6
    from any other MAC stays ``spoofed``."""
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    sec = f"table {T_INGRESS}: tenant {t.name} (vni {t.vni}): local ports, IPv6 (not carried)"
    for p, ep in t.ports.items():
        add((f"table={T_INGRESS},priority=150,{ck},in_port={p},dl_src={ep.mac},vlan_tci=0x0000,ipv6,"
             f"actions=write_metadata:{t.vni:#x},drop(ipv6_unsupported)", sec))


def _compile_gateway_ping(t: Tenant, add) -> None:
    """Table 10: the anycast gateway answers ICMP echo for its own addresses, as
    a router port does (OVN's, Linux's): the request becomes the reply in place
    (MACs and addresses swapped, type 0, TTL 64; the datapath keeps the IPv4 and
    ICMP checksums right) and goes back out the port it came from. Fragments
    are not answered (they stay unroutable)."""
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    sec = f"table {T_L3}: tenant {t.name} (vni {t.vni}): the gateway answers ping"
    for _, gw in t.subnets:
        add((f"table={T_L3},priority=150,{ck},metadata={t.vni:#x},dl_dst={t.gateway_mac},icmp,nw_dst={gw},"
             "nw_frag=no,icmp_type=8,icmp_code=0,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
             f"mod_dl_src:{t.gateway_mac},move:NXM_OF_IP_SRC[]->NXM_OF_IP_DST[],mod_nw_src:{gw},"
             "set_field:64->nw_ttl,set_field:0->icmp_type,in_port", sec))


def _compile_l3vni(topo: Topology, t: Tenant, add) -> None:
    """Table 35: what another host routed into the tenant's L3 VNI (RFC 9135 symmetric
    IRB: inner destination our router MAC) is routed again here, to a local endpoint."""
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    rmac = topo.evpn.router_mac
    sec = f"table {T_L3VNI}: tenant {t.name} (l3vni {t.l3vni}): routed from the fabric to local endpoints"
    for p, ep in t.ports.items():
        add((f"table={T_L3VNI},priority=100,{ck},{md},dl_dst={rmac},ip,nw_dst={ep.ip},"
             f"actions=mod_dl_src:{t.gateway_mac},mod_dl_dst:{ep.mac},dec_ttl,output:{p}", sec))
    add((f"table={T_L3VNI},priority=0,{ck},{md},actions=drop(unroutable)", sec))


def _compile_internet(topo: Topology, add) -> None:
    """Table 0 on the internet port: ARP for every public address is answered;
    IP to a public address enters its tenant's inbound NAT (table 60);
    anything else is unroutable."""
    inet = topo.internet
    g0 = f"cookie={TOPOLOGY_COOKIE:#x}"
    sec = f"table {T_INGRESS}: internet port {inet.port}"
    for t in topo.tenants.values():
        if not t.nat:
            continue
        ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
        for pub in t.nat.public_addresses:
            add((f"table={T_INGRESS},priority=200,{ck},in_port={inet.port},arp,arp_op=1,arp_tpa={pub},"
                 f"actions={_arp_reply(inet.mac, pub)}", sec))
            add((f"table={T_INGRESS},priority=200,{ck},in_port={inet.port},dl_dst={inet.mac},ip,nw_dst={pub},"
                 f"actions=write_metadata:{t.vni:#x},goto_table:{T_INET_IN}", sec))
    add((f"table={T_INGRESS},priority=100,{g0},in_port={inet.port},actions=drop(unroutable)", sec))


def _compile_nat(topo: Topology, t: Tenant, add) -> None:
    """A tenant's way to the internet and back, through its conntrack zone.

    Out (from its machines, routed by the gateway to an address outside its
    subnets): 40 conntrack with the existing translation; 41 new connections
    committed with the machine's floating address or the SNAT pool; 42 to the
    internet (TTL decremented once), or back in (hairpin) when the
    destination is one of the tenant's own public addresses.
    In (to one of its public addresses): 60 conntrack; 61 new connections are
    forwards, floating addresses, or (endpoint-independent filtering)
    mappings, else dropped; 62 routed to the machine by its private address.
    """
    inet = topo.internet
    nat = t.nat
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    z = f"zone={t.zone}"
    a, b = nat.snat
    pool = f"{a}" + (f"-{b}" if b != a else "")
    tname = f"tenant {t.name} (vni {t.vni}, zone {t.zone})"

    sec = f"table {T_L3}: {tname}: to the internet"
    for net, _ in t.subnets:  # inside its own subnets but not a known endpoint: stays unroutable
        add((f"table={T_L3},priority=60,{ck},{md},dl_dst={t.gateway_mac},ip,nw_dst={net},actions=drop(unroutable)", sec))
    add((f"table={T_L3},priority=55,{ck},{md},dl_dst={t.gateway_mac},ip,actions=goto_table:{T_NAT_OUT}", sec))

    sec = f"table {T_NAT_OUT}: {tname}: conntrack, existing translation"
    add((f"table={T_NAT_OUT},priority=100,{ck},{md},ip,actions=ct({z},nat,table={T_NAT_OUT_CT})", sec))

    sec = f"table {T_NAT_OUT_CT}: {tname}: new connections take the floating address or the SNAT pool"
    add((f"table={T_NAT_OUT_CT},priority=200,{ck},{md},ct_state=+trk+inv,ip,actions=drop(ct_invalid)", sec))
    floating = dict(nat.floating)
    if t.security:
        def commit_for(ep):
            src = floating.get(ep.ip, pool)
            return f"ct(commit,{z},nat(src={src}),table={T_NAT_OUT_ROUTE})"
        nat_egress(t, add, TOPOLOGY_COOKIE, T_NAT_OUT_CT, commit_for,
                   f"table {T_NAT_OUT_CT}: {tname}: security groups: egress rules of the sending port")
    for priv, pub in nat.floating:
        add((f"table={T_NAT_OUT_CT},priority=150,{ck},{md},ct_state=+trk+new,ip,nw_src={priv},"
             f"actions=ct(commit,{z},nat(src={pub}),table={T_NAT_OUT_ROUTE})", sec))
    add((f"table={T_NAT_OUT_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,"
         f"actions=ct(commit,{z},nat(src={pool}),table={T_NAT_OUT_ROUTE})", sec))
    add((f"table={T_NAT_OUT_CT},priority=50,{ck},{md},ct_state=+trk,ip,actions=goto_table:{T_NAT_OUT_ROUTE}", sec))

    sec = f"table {T_NAT_OUT_ROUTE}: {tname}: out the internet port, or back in to its own public addresses"
    for pub in nat.public_addresses:
        # hairpin: in again as if from the internet, with a fresh conntrack lookup
        add((f"table={T_NAT_OUT_ROUTE},priority=100,{ck},{md},ip,nw_dst={pub},actions=ct_clear,goto_table:{T_INET_IN}", sec))
    if inet.nexthop_mac:
        add((f"table={T_NAT_OUT_ROUTE},priority=50,{ck},{md},ip,actions=mod_dl_src:{inet.mac},"
             f"mod_dl_dst:{inet.nexthop_mac},dec_ttl,output:{inet.port}", sec))
    else:  # dpu run resolves it by ARP and reloads
        add((f"table={T_NAT_OUT_ROUTE},priority=50,{ck},{md},ip,actions=drop(nexthop_unresolved)", sec))

    sec = f"table {T_INET_IN}: {tname}: inbound, conntrack"
    add((f"table={T_INET_IN},priority=100,{ck},{md},ip,actions=ct({z},nat,table={T_INET_IN_CT})", sec))

    sec = f"table {T_INET_IN_CT}: {tname}: inbound: replies, forwards, floating addresses; else unsolicited"
    add((f"table={T_INET_IN_CT},priority=200,{ck},{md},ct_state=+trk+inv,ip,actions=drop(ct_invalid)", sec))
    guarded = {ep.ip: ep for ep in t.ports.values() if ep.groups}
    for f in nat.forwards:
        m = f"ct_state=+trk+new,{f.proto},nw_dst={f.public},tp_dst={f.port}"
        commit = f"ct(commit,{z},nat(dst={f.to}:{f.to_port}),table={T_INET_IN_ROUTE})"
        ep = guarded.get(f.to)
        if ep is None:
            add((f"table={T_INET_IN_CT},priority=150,{ck},{md},{m},actions={commit}", sec))
        else:  # judged by the private port's ingress rules, before anything is committed
            judge_port(add, sec, T_INET_IN_CT, md, t, TOPOLOGY_COOKIE, ep.port, False,
                       inbound_rules(t, ep, PROTO_NUMBERS[f.proto], f.to_port),
                       lambda r, src, m=m: m + (f",{src}" if src else ""), commit, m, (150, 149))
    for priv, pub in nat.floating:
        commit = f"ct(commit,{z},nat(dst={priv}),table={T_INET_IN_ROUTE})"
        ep = guarded.get(priv)
        if ep is None:
            add((f"table={T_INET_IN_CT},priority=140,{ck},{md},ct_state=+trk+new,ip,nw_dst={pub},actions={commit}", sec))
        else:
            judge_port(add, sec, T_INET_IN_CT, md, t, TOPOLOGY_COOKIE, ep.port, False, inbound_rules(t, ep),
                       lambda r, m, pub=pub: f"ct_state=+trk+new,{with_dst(f'ip,nw_dst={pub}', m)}", commit,
                       f"ct_state=+trk+new,ip,nw_dst={pub}", (140, 139))
    # A mapping reached under endpoint-independent filtering: committed by the first ct already
    # (with security groups: judged after its translation, on every packet from outside).
    judged = bool(t.security) and nat.endpoint_independent_filtering   # table 63
    eif_next = T_SG_INET if judged else T_INET_IN_ROUTE
    add((f"table={T_INET_IN_CT},priority=130,{ck},{md},ct_state=+trk+new+dnat,ip,actions=goto_table:{eif_next}", sec))
    if judged:
        add((f"table={T_INET_IN_CT},priority=60,{ck},{md},ct_state=+trk-rpl+dnat,ip,actions=goto_table:{T_SG_INET}", sec))
    add((f"table={T_INET_IN_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,actions=drop(nat_unsolicited)", sec))
    add((f"table={T_INET_IN_CT},priority=50,{ck},{md},ct_state=+trk,ip,actions=goto_table:{T_INET_IN_ROUTE}", sec))

    if judged:
        _compile_sg_inet(t, add)

    sec = f"table {T_INET_IN_ROUTE}: {tname}: inbound, routed to the machine"
    for p, ep in t.ports.items():
        # Hairpinned back to the machine it came from (one reaching its own
        # public address or forward): out the port it came in on (in_port),
        # as a Linux NAT router sends it back.
        add((f"table={T_INET_IN_ROUTE},priority=110,{ck},{md},in_port={p},ip,nw_dst={ep.ip},"
             f"actions=mod_dl_src:{t.gateway_mac},mod_dl_dst:{ep.mac},dec_ttl,in_port", sec))
    for ep in list(t.ports.values()) + t.remote:
        add((f"table={T_INET_IN_ROUTE},priority=100,{ck},{md},ip,nw_dst={ep.ip},actions=mod_dl_src:{t.gateway_mac},"
             f"mod_dl_dst:{ep.mac},dec_ttl,resubmit(,{T_L2})", sec))
    add((f"table={T_INET_IN_ROUTE},priority=50,{ck},{md},actions=drop(unroutable)", sec))


def _compile_sg_inet(t: Tenant, add) -> None:
    """Table 63: what endpoint-independent filtering let in, judged by the ingress
    rules of the port it now goes to (after its translation)."""
    md = f"metadata={t.vni:#x}"
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    sec = f"table {T_SG_INET}: tenant {t.name}: security groups: inbound after translation"
    for p, ep in t.ports.items():
        if not ep.groups:
            continue
        judge_port(add, sec, T_SG_INET, md, t, TOPOLOGY_COOKIE, p, False, inbound_rules(t, ep),
                   lambda r, m, ep=ep: with_dst(f"ip,nw_dst={ep.ip}", m), f"resubmit(,{T_INET_IN_ROUTE})",
                   f"ip,nw_dst={ep.ip}")
    add((f"table={T_SG_INET},priority=0,{ck},{md},actions=resubmit(,{T_INET_IN_ROUTE})", sec))
