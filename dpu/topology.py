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
T_NAT_OUT, T_NAT_OUT_CT, T_NAT_OUT_ROUTE = 40, 41, 42
T_INET_IN, T_INET_IN_CT, T_INET_IN_ROUTE = 60, 61, 62
PROTO_NUMBERS = {"tcp": 6, "udp": 17}

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
UNRESOLVED_MAC = "00:00:00:00:00:00"  # a tunnel port's next hop before ARP answers: output drops
_RESERVED = {"in_port", "flood", "all", "drop", "local", "normal", "controller", TUNNEL_PORT}


@dataclass
class Uplink:
    port: str
    ip: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
    mac: str
    nexthop_mac: Optional[str]       # None: resolved by ARP for `nexthop` (dpu run)
    mtu: int = 1500
    vxlan_port: int = 4789
    ttl: int = 64
    src_port_range: Tuple[int, int] = (49152, 65535)
    strict_vxlan: bool = False
    nexthop: Optional[ipaddress.IPv4Address] = None  # the underlay router, when its MAC is resolved by ARP

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
class Forward:
    proto: str                       # tcp | udp
    public: ipaddress.IPv4Address
    port: int
    to: ipaddress.IPv4Address
    to_port: int


@dataclass
class Nat:
    snat: Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]   # pool, first..last
    floating: List[Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]]  # (private, public)
    forwards: List[Forward]
    endpoint_independent_filtering: bool = False

    @property
    def public_addresses(self) -> List[ipaddress.IPv4Address]:
        seen: Dict[Any, None] = {}
        a, b = self.snat
        for i in range(int(a), int(b) + 1):
            seen.setdefault(ipaddress.IPv4Address(i), None)
        for _, pub in self.floating:
            seen.setdefault(pub, None)
        for f in self.forwards:
            seen.setdefault(f.public, None)
        return list(seen)


@dataclass
class Internet:
    port: str
    mac: str
    nexthop_mac: Optional[str]       # None: resolved by ARP for `nexthop` (dpu run)
    nexthop: Optional[ipaddress.IPv4Address] = None
    ip: Optional[ipaddress.IPv4Address] = None  # source of ARP requests (default: first public address)


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
    zone: int = 0                    # conntrack zone
    nat: Optional[Nat] = None
    connection_limit: int = 0        # 0: none

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
    internet: Optional[Internet] = None
    ct_timeouts: Dict[str, float] = field(default_factory=dict)
    ct_max_connections: Optional[int] = None


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
    v.mapping(data, "", ["uplink", "tenants"], ["internet", "conntrack"])
    u = v.mapping(data["uplink"], "uplink", ["port", "ip", "mac"],
                  ["nexthop_mac", "nexthop", "mtu", "vxlan_port", "ttl", "src_port_range", "strict_vxlan"])
    uplink = Uplink(
        port=v.name(u["port"], "uplink.port"),
        ip=v.ip(u["ip"], "uplink.ip"),
        mac=v.mac(u["mac"], "uplink.mac"),
        nexthop_mac=v.mac(u["nexthop_mac"], "uplink.nexthop_mac") if "nexthop_mac" in u else None,
        mtu=v.integer(u.get("mtu", 1500), "uplink.mtu", 576, 10000),
        vxlan_port=v.integer(u.get("vxlan_port", 4789), "uplink.vxlan_port", 1, 65535),
        ttl=v.integer(u.get("ttl", 64), "uplink.ttl", 1, 255),
        strict_vxlan=bool(u.get("strict_vxlan", False)),
    )
    if "nexthop" in u:
        uplink.nexthop = v.ip(u["nexthop"], "uplink.nexthop", uplink.ip.version)
    if uplink.nexthop_mac is None:
        if uplink.ipv6:
            v.fail("uplink.nexthop_mac", "required over an IPv6 underlay (next hops are resolved by ARP, IPv4 only)")
        if uplink.nexthop is None:
            v.fail("uplink", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
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

    internet = None
    if data.get("internet") is not None:
        i = v.mapping(data["internet"], "internet", ["port", "mac"], ["nexthop_mac", "nexthop", "ip"])
        internet = Internet(port=v.name(i["port"], "internet.port"), mac=v.mac(i["mac"], "internet.mac"),
                            nexthop_mac=v.mac(i["nexthop_mac"], "internet.nexthop_mac") if "nexthop_mac" in i else None,
                            nexthop=v.ip(i["nexthop"], "internet.nexthop", 4) if "nexthop" in i else None,
                            ip=v.ip(i["ip"], "internet.ip", 4) if "ip" in i else None)
        if internet.nexthop_mac is None and internet.nexthop is None:
            v.fail("internet", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
        if internet.port == uplink.port:
            v.fail("internet.port", f"{internet.port} is the uplink port")
    ct_timeouts, ct_max = _conntrack_section(v, data.get("conntrack"))

    tenants_raw = data["tenants"]
    if not isinstance(tenants_raw, dict) or not tenants_raw:
        v.fail("tenants", "expected a mapping of tenant name to tenant")
    tenants: Dict[str, Tenant] = {}
    vnis: Dict[int, str] = {}
    port_owner: Dict[str, str] = {}
    for index, (tname, t) in enumerate(tenants_raw.items(), 1):
        tp = f"tenants.{tname}"
        v.name(tname, tp)
        v.mapping(t, tp, ["vni", "gateway_mac", "subnets"], ["ports", "remote", "flood", "zone", "nat", "limits"])
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
            if internet and pname == internet.port:
                v.fail(pp, f"{pname} is the internet port")
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
        tenant = Tenant(tname, vni, gw_mac, subnets, ports, remote, flood, index)
        tenant.zone = v.integer(t["zone"], f"{tp}.zone", 1, 65535) if t.get("zone") is not None else vni
        if t.get("limits") is not None:
            lim = v.mapping(t["limits"], f"{tp}.limits", [], ["connections"])
            if lim.get("connections") is not None:
                tenant.connection_limit = v.integer(lim["connections"], f"{tp}.limits.connections", 1, 1 << 30)
        if t.get("nat") is not None:
            if internet is None:
                v.fail(f"{tp}.nat", "NAT needs the internet: section (port, mac, nexthop_mac)")
            tenant.nat = _nat_section(v, t["nat"], f"{tp}.nat", tenant)
        tenants[tname] = tenant
    _check_public_addresses(v, tenants)
    zones: Dict[int, str] = {}
    for tname, tenant in tenants.items():
        if not tenant.nat and not tenant.connection_limit:
            continue  # no conntrack: its zone is never used
        if tenant.zone > 65535:
            v.fail(f"tenants.{tname}.zone",
                   f"VNI {tenant.vni} does not fit a 16-bit conntrack zone: set tenants.{tname}.zone")
        if tenant.zone in zones:
            v.fail(f"tenants.{tname}.zone", f"conntrack zone {tenant.zone} is already used by tenant {zones[tenant.zone]}")
        zones[tenant.zone] = tname
    return Topology(uplink, tenants, where, internet, ct_timeouts, ct_max)


_TIMEOUTS = ("tcp_established", "tcp_transitory", "udp", "icmp")


def _conntrack_section(v: _V, c: Any) -> Tuple[Dict[str, float], Optional[int]]:
    """conntrack: {max_connections: N, timeouts: {tcp_established: s, ...}}"""
    if c is None:
        return {}, None
    v.mapping(c, "conntrack", [], ["max_connections", "timeouts"])
    max_conns = None
    if c.get("max_connections") is not None:
        max_conns = v.integer(c["max_connections"], "conntrack.max_connections", 1, 1 << 30)
    timeouts: Dict[str, float] = {}
    if c.get("timeouts") is not None:
        v.mapping(c["timeouts"], "conntrack.timeouts", [], list(_TIMEOUTS))
        for k, val in c["timeouts"].items():
            timeouts[k] = v.integer(val, f"conntrack.timeouts.{k}", 1, 30 * 24 * 3600)
    return timeouts, max_conns


def _ipv4(v: _V, value: Any, path: str) -> ipaddress.IPv4Address:
    return v.ip(value, path, 4)


def _nat_section(v: _V, n: Any, np: str, tenant: Tenant) -> Nat:
    v.mapping(n, np, ["snat"], ["floating", "forwards", "filtering"])
    snat = n["snat"]
    text = str(snat)
    if "-" in text:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = _ipv4(v, lo_s.strip(), f"{np}.snat"), _ipv4(v, hi_s.strip(), f"{np}.snat")
        if int(lo) > int(hi):
            v.fail(f"{np}.snat", f"pool {lo}-{hi} is reversed (first address above the last)")
        if int(hi) - int(lo) >= 65536:
            v.fail(f"{np}.snat", f"pool {lo}-{hi} has more than 65,536 addresses")
    else:
        lo = hi = _ipv4(v, text, f"{np}.snat")
    nets = [net for net, _ in tenant.subnets]
    endpoints = {ep.ip: ep for ep in list(tenant.ports.values()) + tenant.remote}

    def public(addr, path):
        if any(addr in net for net in nets):
            v.fail(path, f"{addr} is inside tenant {tenant.name}'s own subnets, not a public address")
        return addr

    for i in range(int(lo), int(hi) + 1):
        public(ipaddress.IPv4Address(i), f"{np}.snat")
    floating = []
    seen_private: Dict[Any, str] = {}
    fl = n.get("floating") or []
    if not isinstance(fl, list):
        v.fail(f"{np}.floating", "expected a list of {private, public}")
    for i, f in enumerate(fl):
        fp = f"{np}.floating[{i}]"
        v.mapping(f, fp, ["private", "public"], [])
        priv = _ipv4(v, f["private"], f"{fp}.private")
        pub = public(_ipv4(v, f["public"], f"{fp}.public"), f"{fp}.public")
        if priv not in endpoints:
            v.fail(f"{fp}.private", f"{priv} is not an endpoint of tenant {tenant.name} (ports or remote)")
        if priv in seen_private:
            v.fail(f"{fp}.private", f"{priv} already has a floating address ({seen_private[priv]})")
        seen_private[priv] = fp
        if int(lo) <= int(pub) <= int(hi):
            v.fail(f"{fp}.public", f"{pub} is in the tenant's snat pool; a floating address needs its own")
        floating.append((priv, pub))
    forwards: List[Forward] = []
    fw = n.get("forwards") or []
    if not isinstance(fw, list):
        v.fail(f"{np}.forwards", "expected a list of {proto, public, port, to, to_port}")
    seen_fw: Dict[Any, str] = {}
    float_pubs = {pub for _, pub in floating}
    for i, f in enumerate(fw):
        fp = f"{np}.forwards[{i}]"
        v.mapping(f, fp, ["proto", "public", "port", "to"], ["to_port"])
        proto = f["proto"]
        if proto not in ("tcp", "udp"):
            v.fail(f"{fp}.proto", f"{proto!r} is not tcp or udp")
        pub = public(_ipv4(v, f["public"], f"{fp}.public"), f"{fp}.public")
        if pub in float_pubs:
            v.fail(f"{fp}.public", f"{pub} is a floating address (all its ports go to its machine)")
        port = v.integer(f["port"], f"{fp}.port", 1, 65535)
        to = _ipv4(v, f["to"], f"{fp}.to")
        if to not in endpoints:
            v.fail(f"{fp}.to", f"{to} is not an endpoint of tenant {tenant.name} (ports or remote)")
        to_port = v.integer(f.get("to_port", port), f"{fp}.to_port", 1, 65535)
        key = (proto, pub, port)
        if key in seen_fw:
            v.fail(fp, f"{proto} {pub}:{port} is already forwarded by {seen_fw[key]}")
        seen_fw[key] = fp
        forwards.append(Forward(proto, pub, port, to, to_port))
    filtering = n.get("filtering", "address-and-port-dependent")
    if filtering not in ("endpoint-independent", "address-and-port-dependent"):
        v.fail(f"{np}.filtering", f"{filtering!r} is not endpoint-independent or address-and-port-dependent")
    return Nat((lo, hi), floating, forwards, filtering == "endpoint-independent")


def _check_public_addresses(v: _V, tenants: Dict[str, "Tenant"]) -> None:
    owner: Dict[Any, str] = {}
    for tname, t in tenants.items():
        if not t.nat:
            continue
        for addr in t.nat.public_addresses:
            if addr in owner and owner[addr] != tname:
                v.fail(f"tenants.{tname}.nat", f"public address {addr} is already used by tenant {owner[addr]}")
            owner[addr] = tname


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
    for f in nat.forwards:
        add((f"table={T_INET_IN_CT},priority=150,{ck},{md},ct_state=+trk+new,{f.proto},nw_dst={f.public},"
             f"tp_dst={f.port},actions=ct(commit,{z},nat(dst={f.to}:{f.to_port}),table={T_INET_IN_ROUTE})", sec))
    for priv, pub in nat.floating:
        add((f"table={T_INET_IN_CT},priority=140,{ck},{md},ct_state=+trk+new,ip,nw_dst={pub},"
             f"actions=ct(commit,{z},nat(dst={priv}),table={T_INET_IN_ROUTE})", sec))
    # A mapping reached under endpoint-independent filtering: committed by the first ct already.
    add((f"table={T_INET_IN_CT},priority=130,{ck},{md},ct_state=+trk+new+dnat,ip,actions=goto_table:{T_INET_IN_ROUTE}", sec))
    add((f"table={T_INET_IN_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,actions=drop(nat_unsolicited)", sec))
    add((f"table={T_INET_IN_CT},priority=50,{ck},{md},ct_state=+trk,ip,actions=goto_table:{T_INET_IN_ROUTE}", sec))

    sec = f"table {T_INET_IN_ROUTE}: {tname}: inbound, routed to the machine"
    for ep in list(t.ports.values()) + t.remote:
        add((f"table={T_INET_IN_ROUTE},priority=100,{ck},{md},ip,nw_dst={ep.ip},actions=mod_dl_src:{t.gateway_mac},"
             f"mod_dl_dst:{ep.mac},dec_ttl,resubmit(,{T_L2})", sec))
    add((f"table={T_INET_IN_ROUTE},priority=50,{ck},{md},actions=drop(unroutable)", sec))
