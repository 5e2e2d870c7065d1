"""Tenant topology files: validation and compilation into flows.

A topology (YAML; schema in the README, "Tenant topology") describes the uplink
(our VTEP), and per tenant a VNI, an anycast gateway, subnets, local ports and
remote endpoints (EVPN type-2) and flood VTEPs (type-3). It compiles into
ordinary ovs-ofctl flows and groups, which users can print (``dpu compile``)
and extend with flows of their own.

Pipeline (tables):

  0   ingress: a local port's own MAC/IP (anti-spoofing) sets ``metadata`` to
      the tenant's VNI; decapsulated frames are accepted only for configured
      VNIs from VTEPs named for them; everything else is dropped with a reason.
  10  local ingress, L3: ARP suppression (answers for gateways and known
      endpoints of the same tenant), routing via the anycast gateway MAC.
  20  local ingress, L2: to local ports, VXLAN to remote endpoints, isolation
      drops for other tenants' MACs, flood group for broadcast/unknown.
  30  from the fabric, L2: to local ports only (split horizon).

Every compiled flow carries a cookie with TOPOLOGY_COOKIE in its top byte, so
a reload replaces exactly the compiled flows and keeps the user's own.
Validation happens before anything is applied; errors name the path in the
file (``tenants.red.ports.vm3.ip: ...``).
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .errors import TopologyError

TOPOLOGY_COOKIE = 0xD9 << 56
TOPOLOGY_COOKIE_MASK = 0xFF << 56
TUNNEL_PORT = "vxlan0"

T_INGRESS, T_L3, T_L2, T_FABRIC = 0, 10, 20, 30

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_RESERVED = {"in_port", "flood", "all", "drop", "local", "normal", "controller", TUNNEL_PORT}


@dataclass
class Uplink:
    port: str
    ip: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
    mac: str
    nexthop_mac: str
    mtu: int = 1500
    vxlan_port: int = 4789
    ttl: int = 64
    src_port_range: Tuple[int, int] = (49152, 65535)
    strict_vxlan: bool = False

    @property
    def ipv6(self) -> bool:
        return self.ip.version == 6


@dataclass
class Endpoint:
    mac: str
    ip: ipaddress.IPv4Address
    port: Optional[str] = None  # local port name
    vtep: Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]] = None  # remote


@dataclass
class Tenant:
    name: str
    vni: int
    gateway_mac: str
    subnets: List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]]
    ports: Dict[str, Endpoint]
    remote: List[Endpoint]
    flood: List[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]
    index: int = 0

    @property
    def vteps(self) -> List[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
        seen: Dict[Any, None] = {}
        for ep in self.remote:
            seen.setdefault(ep.vtep, None)
        for v in self.flood:
            seen.setdefault(v, None)
        return list(seen)


@dataclass
class Topology:
    uplink: Uplink
    tenants: Dict[str, Tenant]
    source: str = "<topology>"


# ---- loading and validation --------------------------------------------------------


class _V:
    """Validation helpers that raise TopologyError with the key path."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._ips: Dict[str, Any] = {}

    def fail(self, path: str, msg: str) -> None:
        raise TopologyError(f"{path}: {msg}", path=path, file=self.source)

    def mapping(self, v: Any, path: str, required: Sequence[str], optional: Sequence[str]) -> dict:
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {type(v).__name__}")
        for k in v:
            if k not in required and k not in optional:
                self.fail(f"{path}.{k}" if path else str(k), f"unknown key (expected one of: {', '.join(list(required) + list(optional))})")
        for k in required:
            if k not in v or v[k] is None:
                self.fail(f"{path}.{k}" if path else k, "required")
        return v

    def mac(self, v: Any, path: str, unicast: bool = True) -> str:
        if not isinstance(v, str) or not _MAC_RE.match(v):
            self.fail(path, f"{v!r} is not a MAC address (xx:xx:xx:xx:xx:xx)")
        if unicast and int(v[0:2], 16) & 1:
            self.fail(path, f"{v} is a multicast MAC address")
        if unicast and v.replace(":", "") == "000000000000":
            self.fail(path, "00:00:00:00:00:00 is not a usable MAC address")
        return v.lower()

    def ip(self, v: Any, path: str, version: Optional[int] = None):
        key = v if isinstance(v, str) else str(v)
        a = self._ips.get(key)  # 100k endpoints reuse few distinct strings across tenants
        if a is None:
            try:
                a = ipaddress.ip_address(key)
            except ValueError:
                self.fail(path, f"{v!r} is not an IP address")
            self._ips[key] = a
        if version and a.version != version:
            self.fail(path, f"{a} is not an IPv{version} address")
        if a.is_multicast or a.is_unspecified:
            self.fail(path, f"{a} is not a unicast address")
        return a

    def integer(self, v: Any, path: str, lo: int, hi: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(path, f"{v!r} is not an integer")
        if not lo <= v <= hi:
            self.fail(path, f"{v} is out of range ({lo}..{hi})")
        return v

    def name(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not _NAME_RE.match(v) or v in _RESERVED:
            self.fail(path, f"{v!r} is not a valid name (letters, digits, _ . -; not a reserved word)")
        return v


def _read_source(src: Any) -> Tuple[Any, str]:
    import yaml

    if isinstance(src, dict):
        return src, "<dict>"
    if isinstance(src, (str, os.PathLike)) and os.path.exists(str(src)):
        with open(src, encoding="utf-8") as f:
            text = f.read()
        where = str(src)
    elif isinstance(src, str) and ("\n" in src or ":" in src):
        text, where = src, "<string>"
    else:
        raise TopologyError(f"{src}: no such topology file", file=str(src))
    try:
        return yaml.safe_load(text), where
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise TopologyError(f"{where}: line {line}: invalid YAML: {getattr(e, 'problem', e)}", file=where, line=line)


def load_topology(src: Any) -> Topology:
    """Parses and validates a topology (a YAML path, YAML text, or a dict)."""
    data, where = _read_source(src)
    v = _V(where)
    v.mapping(data, "", ["uplink", "tenants"], [])
    u = v.mapping(data["uplink"], "uplink", ["port", "ip", "mac", "nexthop_mac"],
                  ["mtu", "vxlan_port", "ttl", "src_port_range", "strict_vxlan"])
    uplink = Uplink(
        port=v.name(u["port"], "uplink.port"),
        ip=v.ip(u["ip"], "uplink.ip"),
        mac=v.mac(u["mac"], "uplink.mac"),
        nexthop_mac=v.mac(u["nexthop_mac"], "uplink.nexthop_mac"),
        mtu=v.integer(u.get("mtu", 1500), "uplink.mtu", 576, 9216),
        vxlan_port=v.integer(u.get("vxlan_port", 4789), "uplink.vxlan_port", 1, 65535),
        ttl=v.integer(u.get("ttl", 64), "uplink.ttl", 1, 255),
        strict_vxlan=bool(u.get("strict_vxlan", False)),
    )
    if uplink.ipv6 and uplink.mtu < 1280:
        v.fail("uplink.mtu", "an IPv6 underlay needs an MTU of at least 1280")
    if "src_port_range" in u:
        r = u["src_port_range"]
        if not isinstance(r, (list, tuple)) or len(r) != 2:
            v.fail("uplink.src_port_range", "expected [min, max]")
        lo = v.integer(r[0], "uplink.src_port_range[0]", 1, 65535)
        hi = v.integer(r[1], "uplink.src_port_range[1]", 1, 65535)
        if lo > hi:
            v.fail("uplink.src_port_range", f"min {lo} is above max {hi}")
        uplink.src_port_range = (lo, hi)

    tenants_raw = data["tenants"]
    if not isinstance(tenants_raw, dict) or not tenants_raw:
        v.fail("tenants", "expected a mapping of tenant name to tenant")
    tenants: Dict[str, Tenant] = {}
    vnis: Dict[int, str] = {}
    port_owner: Dict[str, str] = {}
    for index, (tname, t) in enumerate(tenants_raw.items(), 1):
        tp = f"tenants.{tname}"
        v.name(tname, tp)
        v.mapping(t, tp, ["vni", "gateway_mac", "subnets"], ["ports", "remote", "flood"])
        vni = v.integer(t["vni"], f"{tp}.vni", 1, (1 << 24) - 1)
        if vni in vnis:
            v.fail(f"{tp}.vni", f"VNI {vni} is already used by tenant {vnis[vni]}")
        vnis[vni] = tname
        gw_mac = v.mac(t["gateway_mac"], f"{tp}.gateway_mac")
        subnets: List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]] = []
        if not isinstance(t["subnets"], list) or not t["subnets"]:
            v.fail(f"{tp}.subnets", "expected a non-empty list of {cidr, gateway}")
        for i, s in enumerate(t["subnets"]):
            sp = f"{tp}.subnets[{i}]"
            v.mapping(s, sp, ["cidr", "gateway"], [])
            try:
                net = ipaddress.IPv4Network(str(s["cidr"]), strict=True)
            except ValueError as e:
                v.fail(f"{sp}.cidr", f"{s['cidr']!r} is not an IPv4 network ({e})")
            gw = v.ip(s["gateway"], f"{sp}.gateway", 4)
            if gw not in net:
                v.fail(f"{sp}.gateway", f"{gw} is outside its subnet {net}")
            if net.prefixlen <= 30 and gw in (net.network_address, net.broadcast_address):
                v.fail(f"{sp}.gateway", f"{gw} is the network or broadcast address of {net}")
            for j, (other, _) in enumerate(subnets):
                if net.overlaps(other):
                    v.fail(f"{sp}.cidr", f"{net} overlaps {other} (subnets[{j}]) in the same tenant")
            subnets.append((net, gw))
        nets = [n for n, _ in subnets]
        gw_ips = {gw: i for i, (_, gw) in enumerate(subnets)}

        def inside(ip, path):
            for n in nets:
                if ip in n:
                    if n.prefixlen <= 30 and ip in (n.network_address, n.broadcast_address):
                        v.fail(path, f"{ip} is the network or broadcast address of {n}")
                    return
            v.fail(path, f"{ip} is not inside any subnet of tenant {tname}")

        seen_ip: Dict[Any, str] = {}
        seen_mac: Dict[str, str] = {gw_mac: f"{tp}.gateway_mac"}
        ports: Dict[str, Endpoint] = {}
        ports_raw = t.get("ports") or {}
        if not isinstance(ports_raw, dict):
            v.fail(f"{tp}.ports", "expected a mapping of port name to {mac, ip}")
        for pname, p in ports_raw.items():
            pp = f"{tp}.ports.{pname}"
            v.name(pname, pp)
            if pname == uplink.port:
                v.fail(pp, f"{pname} is the uplink port")
            if pname in port_owner:
                v.fail(pp, f"port {pname} already belongs to tenant {port_owner[pname]}")
            port_owner[pname] = tname
            v.mapping(p, pp, ["mac", "ip"], [])
            mac = v.mac(p["mac"], f"{pp}.mac")
            ip = v.ip(p["ip"], f"{pp}.ip", 4)
            inside(ip, f"{pp}.ip")
            _unique(v, seen_ip, ip, f"{pp}.ip", gw_ips)
            _unique(v, seen_mac, mac, f"{pp}.mac", None)
            ports[pname] = Endpoint(mac=mac, ip=ip, port=pname)
        remote: List[Endpoint] = []
        remote_raw = t.get("remote") or []
        if not isinstance(remote_raw, list):
            v.fail(f"{tp}.remote", "expected a list of {vtep, mac, ip}")
        for i, r in enumerate(remote_raw):
            rp = f"{tp}.remote[{i}]"
            v.mapping(r, rp, ["vtep", "mac", "ip"], [])
            vtep = v.ip(r["vtep"], f"{rp}.vtep", uplink.ip.version)
            if vtep == uplink.ip:
                v.fail(f"{rp}.vtep", f"{vtep} is our own VTEP address")
            mac = v.mac(r["mac"], f"{rp}.mac")
            ip = v.ip(r["ip"], f"{rp}.ip", 4)
            inside(ip, f"{rp}.ip")
            _unique(v, seen_ip, ip, f"{rp}.ip", gw_ips)
            _unique(v, seen_mac, mac, f"{rp}.mac", None)
            remote.append(Endpoint(mac=mac, ip=ip, vtep=vtep))
        flood: List[Any] = []
        flood_raw = t.get("flood") or []
        if not isinstance(flood_raw, list):
            v.fail(f"{tp}.flood", "expected a list of VTEP addresses")
        for i, f in enumerate(flood_raw):
            a = v.ip(f, f"{tp}.flood[{i}]", uplink.ip.version)
            if a == uplink.ip:
                v.fail(f"{tp}.flood[{i}]", f"{a} is our own VTEP address")
            if a not in flood:
                flood.append(a)
        tenants[tname] = Tenant(tname, vni, gw_mac, subnets, ports, remote, flood, index)
    return Topology(uplink, tenants, where)


def _unique(v: _V, seen: Dict[Any, str], key: Any, path: str, gateways: Optional[dict]) -> None:
    if gateways is not None and key in gateways:
        v.fail(path, f"{key} is the gateway address of subnets[{gateways[key]}]")
    if key in seen:
        v.fail(path, f"{key} is already used by {seen[key]}")
    seen[key] = path


# ---- compilation ----------------------------------------------------------------------


@dataclass
class Compiled:
    """What a topology compiles to: ports, groups and flows, each with a comment."""

    ports: List[dict]
    groups: List[Tuple[str, str]]            # (group text, comment)
    flows: List[Tuple[str, str]]             # (flow text, section comment)
    tenants: List[Tuple[str, int]]           # (name, metadata)
    topology: Topology

    @property
    def port_names(self) -> List[str]:
        return [p["name"] for p in self.ports]

    def text(self) -> str:
        """The `dpu compile` listing: a flows file (groups as group_id= lines)."""
        u = self.topology.uplink
        out = [f"# dpu compile {self.topology.source}"]
        out.append(f"# ports: {u.port} (uplink), {TUNNEL_PORT} (VTEP {u.ip} udp/{u.vxlan_port} over {u.port}, mtu {u.mtu})")
        for t in self.topology.tenants.values():
            if t.ports:
                out.append(f"#   tenant {t.name} (vni {t.vni}): " + ", ".join(t.ports))
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
            "nexthop_mac": u.nexthop_mac,
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
    if not u.ipv6:
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
        groups.append((",".join([f"group_id={flood_id},type=all"] + local_buckets + vtep_buckets),
                       f"{tname}: broadcast/unknown from local ports -> local ports + flood VTEPs"))
        groups.append((",".join([f"group_id={flood_local_id},type=all"] + local_buckets),
                       f"{tname}: broadcast/unknown from the fabric -> local ports"))

        # Table 0: anti-spoofing for local ports.
        sec = f"table {T_INGRESS}: {tname}: local ports, anti-spoofing"
        for p, ep in t.ports.items():
            own = f"{ck},in_port={p},dl_src={ep.mac},vlan_tci=0x0000"
            go = f"actions={wmd},goto_table:{T_L3}"
            add((f"table={T_INGRESS},priority=200,{own},ip,nw_src={ep.ip},{go}", sec))
            add((f"table={T_INGRESS},priority=200,{own},arp,arp_spa={ep.ip},arp_sha={ep.mac},{go}", sec))
            add((f"table={T_INGRESS},priority=190,{own},arp,arp_spa=0.0.0.0,arp_sha={ep.mac},{go}", sec))
            add((f"table={T_INGRESS},priority=190,{own},udp,nw_src=0.0.0.0,nw_dst=255.255.255.255,"
                 f"tp_src=68,tp_dst=67,{go}", sec))
            add((f"table={T_INGRESS},priority=100,{ck},in_port={p},actions={wmd},drop(spoofed)", sec))

        # Table 0: VXLAN acceptance.
        sec = f"table {T_INGRESS}: {tname}: VXLAN from its VTEPs"
        tun = f"table={T_INGRESS},{{prio}},{ck},in_port={TUNNEL_PORT},tun_id={t.vni:#x}"
        for vt in t.vteps:
            add((tun.format(prio="priority=200") + f",{tun_src_field}={vt},vlan_tci=0x0000,"
                 f"actions={wmd},goto_table:{T_FABRIC}", sec))
            add((tun.format(prio="priority=190") + f",{tun_src_field}={vt},actions={wmd},drop(inner_vlan)", sec))
        # Not from one of its VTEPs: unauthenticated, so not charged to the tenant.
        add((tun.format(prio="priority=150") + ",actions=drop(unknown_vtep)", sec))

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

        # Table 20: L2 from local ports.
        sec = f"table {T_L2}: {tname}: L2 forwarding from local ports"
        for p, ep in t.ports.items():
            add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
        for ep in t.remote:
            add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=set_field:{t.vni:#x}->tun_id,"
                 f"set_field:{ep.vtep}->{tun_dst_field},output:{TUNNEL_PORT}", sec))
        add((f"table={T_L2},priority=10,{ck},{md},actions=group:{flood_id}", sec))

        # Table 30: from the fabric, to local ports only.
        sec = f"table {T_FABRIC}: {tname}: L2 forwarding from the fabric (split horizon)"
        for p, ep in t.ports.items():
            add((f"table={T_FABRIC},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
        add((f"table={T_FABRIC},priority=90,{ck},{md},dl_dst={t.gateway_mac},actions=drop(unroutable)", sec))
        add((f"table={T_FABRIC},priority=10,{ck},{md},actions=group:{flood_local_id}", sec))

        for p in t.ports:
            ports.append({"name": p, "ofport": 0})

    tenants = [(t.name, t.vni) for t in topo.tenants.values()]
    return Compiled(ports, groups, flows, tenants, topo)


def apply_topology(dp, src: Any, extra_flows: Union[None, str, Iterable[str]] = None) -> dict:
    """Loads (or reloads) a topology into ``dp`` in one atomic transaction.

    The previously compiled flows and groups are replaced; flows the user added
    (other cookies) stay, and ``extra_flows`` are added on top. Ports that the
    new topology no longer has are removed; a changed uplink is reconfigured.
    """
    import gc

    from .dataplane import _flow_lines

    # Compiling 100k endpoints allocates millions of short-lived objects and no
    # cycles: the cyclic collector would only rescan them over and over.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _apply_topology(dp, src, extra_flows, _flow_lines)
    finally:
        if gc_was_enabled:
            gc.enable()


def _apply_topology(dp, src, extra_flows, _flow_lines) -> dict:
    topo = src if isinstance(src, Topology) else load_topology(src)
    comp = compile_topology(topo)
    old: Optional[Compiled] = getattr(dp, "topology", None)
    existing = {p["name"]: p for p in dp.port_info()}
    t = dp.transaction()
    wanted = {p["name"] for p in comp.ports}
    if old is not None:
        for name in old.port_names:
            if name not in wanted and name in existing:
                t.del_port(name)
    for p in comp.ports:
        cur = existing.get(p["name"])
        if cur is None:
            t.add_ports.append(p)
        elif p.get("tunnel") or cur.get("tunnel"):
            if any(cur.get(k) != v for k, v in p.items() if k != "ofport"):
                t.del_port(p["name"])
                t.add_ports.append(dict(p, ofport=cur["ofport"]))
    t.del_flows(f"cookie={TOPOLOGY_COOKIE:#x}/{TOPOLOGY_COOKIE_MASK:#x}")
    if old is not None:
        for text, _ in old.groups:
            t.del_groups(text.split(",", 1)[0])
    for text, _ in comp.groups:
        t.add_group(text)
    for text, _ in comp.flows:
        t.add_flow(text)
    if extra_flows:
        t.add_flows(_flow_lines(extra_flows))
    t.set_tenants(comp.tenants)
    result = t.commit()
    dp.topology = comp
    return result
