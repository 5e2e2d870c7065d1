"""The topology's schema: its types, and the validation that builds them.

What it does: checks the data the reader hands on (or a dict from the API)
against the schema in the README ("Tenant topology"): what a valid uplink,
internet port, conntrack section, tenant, port, remote endpoint, flood list,
subnet and NAT section are, and what must be unique across tenants (VNIs,
ports, conntrack zones, public addresses). Each field checks its type
(``strict_vxlan: 'false'`` is not a boolean); every error names its key path
(``tenants.red.ports.vm3.ip: ...``) and goes to ``_V`` (an ``_Errors`` of the
reader), which places it at the file's line and column. One item's first error
ends that item (``with v.guard:``), so independent mistakes are all reported.

What it reads: plain dicts, lists and scalars (``reader``). What it hands on:
a ``Topology`` of the dataclasses below, only when nothing was wrong; the
compiler turns it into flows and never meets a bad value.
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import _core
from .reader import _Abort, _child, _clip, _Errors, _read_source, _read_yaml, _short
from .security import Policy, SecurityGroup, parse_groups, port_groups

TUNNEL_PORT = "vxlan0"

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
# OVS's reserved port names (and drop), in any case, and the tunnel port's.
_RESERVED = {"in_port", "flood", "all", "drop", "local", "normal", "controller", "table", "any", "none",
             TUNNEL_PORT}


# A tunnel port's settings as the core lists them (tunnel_params.def):
# member -> (default, least, most). The uplink: section's defaults and bounds.
_TUNNEL = {m: (d, lo, hi) for m, d, lo, hi, _api, _help in _core.TUNNEL_PARAMS}


@dataclass
class Uplink:
    port: str
    ip: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
    mac: str
    nexthop_mac: Optional[str]       # None: resolved by ARP for `nexthop` (dpu run)
    mtu: int = _TUNNEL["mtu"][0]
    vxlan_port: int = _TUNNEL["dst_port"][0]
    ttl: int = _TUNNEL["ttl"][0]
    src_port_range: Tuple[int, int] = (_TUNNEL["sport_min"][0], _TUNNEL["sport_max"][0])
    strict_vxlan: bool = _TUNNEL["strict"][0]
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
    pinned: bool = False        # remote: wins over what the fabric (EVPN) learns for its MAC and IP
    groups: List[str] = field(default_factory=list)  # local: its security groups (none: open)


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
    l3vni: Optional[int] = None      # EVPN: the VNI routed traffic between hosts takes (symmetric IRB)
    security: Policy = field(default_factory=Policy)  # security groups (security.py)

    @property
    def vteps(self) -> List[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
        seen: Dict[Any, None] = {}
        for ep in self.remote:
            seen.setdefault(ep.vtep, None)
        for v in self.flood:
            seen.setdefault(v, None)
        return list(seen)


@dataclass(frozen=True)
class Peer:
    address: ipaddress.IPv4Address
    remote_asn: Optional[int] = None   # None: iBGP (our own AS)


@dataclass
class Evpn:
    """The fabric: BGP EVPN spoken by FRRouting (docs/fabric.md)."""
    asn: int
    router_id: ipaddress.IPv4Address  # default: the uplink's address
    router_mac: str                   # default: the uplink's MAC; inner source of routed VXLAN
    peers: List[Peer]
    frr: str = "managed"              # managed: dpu run starts FRR; external: an operator's FRR
    graceful_restart: bool = False
    frr_dir: str = "/var/run/frr"     # external: where the operator's FRR keeps its pid files and vty sockets


@dataclass
class Topology:
    uplink: Uplink
    tenants: Dict[str, Tenant]
    source: str = "<topology>"
    internet: Optional[Internet] = None
    ct_timeouts: Dict[str, float] = field(default_factory=dict)
    ct_max_connections: Optional[int] = None
    evpn: Optional[Evpn] = None


# ---- validation --------------------------------------------------------------------------

_BAD = object()      # a field that failed validation (its error is recorded)


class _V(_Errors):
    """Validation helpers: the checks of one field each, on top of the load's
    errors (``fail``, ``note``, ``guard``: see _Errors)."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._ips: Dict[Optional[int], Dict[str, Any]] = {None: {}, 4: {}, 6: {}}  # good ones, by version

    # -- one field each: fail() with a message naming the value, or return it --

    def mapping(self, v: Any, path: str, required: Sequence[str], optional: Sequence[str],
                elsewhere: Optional[Dict[str, str]] = None) -> dict:
        """``v`` itself; unknown keys and missing required ones are recorded
        (read required ones with ``req``, which skips them). ``elsewhere``: keys valid
        only in another setting, each with the message that says which."""
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {type(v).__name__}")
        for k in v:
            if elsewhere and k in elsewhere:
                self.note(_child(path, k), elsewhere[k], at_key=True, blocking=False)
            elif k not in required and k not in optional:
                known = ", ".join(list(required) + list(optional))
                self.note(_child(path, k), f"unknown key (expected one of: {known})",
                          at_key=True, blocking=False)
        for k in required:
            if k not in v or v[k] is None:
                self.note(_child(path, k), "required")
        return v

    def req(self, m: dict, key: str, path: str, check, *args) -> Any:
        """check(m[key], path, *args), or _BAD (missing: ``mapping`` said so; or failed)."""
        value = m.get(key)
        if value is None:
            return _BAD
        try:
            return check(value, path, *args)
        except _Abort:
            return _BAD

    def opt(self, m: dict, key: str, path: str, check, *args, default: Any = None) -> Any:
        """check(m[key], path, *args) if the key is written (even as null), else default."""
        if key not in m:
            return default
        try:
            return check(m[key], path, *args)
        except _Abort:
            return _BAD

    def collection(self, m: dict, key: str, path: str, kind: type, what: str) -> Any:
        """The optional list or mapping ``m[key]``: empty when it is absent or
        written as nothing (null, [] or {}); None, with the error recorded, when
        it is something else."""
        value = m.get(key)
        if value is None or (isinstance(value, (dict, list)) and not value):
            return kind()
        if not isinstance(value, kind):
            self.note(path, f"expected {what}")
            return None
        return value

    def mac(self, v: Any, path: str, unicast: bool = True) -> str:
        if not isinstance(v, str) or not _MAC_RE.match(v):
            hint = ""
            if isinstance(v, int) and not isinstance(v, bool):
                hint = "; YAML read it as a number: put the MAC in quotes"
            self.fail(path, f"{_short(v)} is not a MAC address (xx:xx:xx:xx:xx:xx){hint}")
        if unicast and int(v[0:2], 16) & 1:
            self.fail(path, f"{v} is a multicast MAC address")
        if unicast and v.replace(":", "") == "000000000000":
            self.fail(path, "00:00:00:00:00:00 is not a usable MAC address")
        return v.lower()

    def ip(self, v: Any, path: str, version: Optional[int] = None):
        if isinstance(v, str):
            key = v
        elif isinstance(v, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            key = str(v)
        else:
            self.fail(path, f"{_short(v)} is not an IP address")
        good = self._ips[version]
        a = good.get(key)  # 100k endpoints reuse few distinct strings across tenants
        if a is not None:
            return a
        try:
            a = ipaddress.ip_address(key)
        except ValueError:
            self.fail(path, f"{_short(v)} is not an IP address")
        if version and a.version != version:
            self.fail(path, f"{a} is not an IPv{version} address")
        if a.is_multicast or a.is_unspecified:
            self.fail(path, f"{a} is not a unicast address")
        good[key] = a
        return a

    def network(self, v: Any, path: str) -> ipaddress.IPv4Network:
        if isinstance(v, ipaddress.IPv4Network):
            return v
        if not isinstance(v, str):
            self.fail(path, f"{_short(v)} is not an IPv4 network (a string like 10.0.0.0/24)")
        try:
            return ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            self.fail(path, f"{_short(v)} is not an IPv4 network ({_clip(str(e), 120)})")
        raise AssertionError  # not reached

    def integer(self, v: Any, path: str, lo: int, hi: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(path, f"{_short(v)} is not an integer")
        if not lo <= v <= hi:
            self.fail(path, f"{_short(v)} is out of range ({lo}..{hi})")
        return v

    def boolean(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            self.fail(path, f"{_short(v)} is not a boolean (write true or false, without quotes)")
        return v

    def name(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not _NAME_RE.match(v) or v.lower() in _RESERVED:
            self.fail(path, f"{_short(v)} is not a valid name (letters, digits, _ . -; not a reserved word)")
        return v

    def directory(self, v: Any, path: str) -> str:
        """An absolute directory path (it need not exist yet), normalised."""
        if not isinstance(v, str) or not v.startswith("/") or "\0" in v:
            self.fail(path, f"{_short(v)} is not an absolute directory path")
        return os.path.normpath(v)

    def choice(self, v: Any, path: str, choices: Sequence[str], what: str) -> str:
        if not isinstance(v, str) or v not in choices:
            self.fail(path, f"{_short(v)} is not {what}")
        return v


def load_topology(src: Any) -> Topology:
    """Parses and validates a topology: a YAML file (a path), YAML text, or a dict.

    Raises TopologyError for a bad one, naming every mistake (at most
    MAX_ERRORS; ``errors`` lists them), each with its key path and, for YAML,
    its file, line and column."""
    data, text, where = _read_source(src)
    v = _V(where)
    if text is not None:
        data = _read_yaml(text, v)
    topo = _validate(v, data)
    if v.errors:
        v.raise_errors()
    return topo


def _validate(v: _V, data: Any) -> Optional[Topology]:
    if not isinstance(data, dict):
        got = "nothing (the document is empty)" if data is None else type(data).__name__
        v.note("", f"expected a mapping (uplink:, tenants:), got {got}")
        return None
    v.mapping(data, "", ["uplink", "tenants"], ["internet", "conntrack", "evpn"])
    uplink = None
    if data.get("uplink") is not None:
        with v.guard:
            uplink = _uplink_section(v, data["uplink"])
    internet = None
    if data.get("internet") is not None:
        with v.guard:
            internet = _internet_section(v, data["internet"], uplink)
    ct_timeouts: Dict[str, float] = {}
    ct_max = None
    with v.guard:
        ct_timeouts, ct_max = _conntrack_section(v, data.get("conntrack"))
    evpn = None
    if data.get("evpn") is not None:
        with v.guard:
            evpn = _evpn_section(v, data["evpn"], uplink)
    tenants: Dict[str, Tenant] = {}
    if data.get("tenants") is not None:
        with v.guard:
            tenants = _tenants_section(v, data["tenants"], uplink, internet, data.get("internet") is not None,
                                       "evpn" in data)
    if v.errors or uplink is None:
        return None
    return Topology(uplink, tenants, v.source, internet, ct_timeouts, ct_max, evpn)


def _evpn_section(v: _V, e: Any, uplink: Optional[Uplink]) -> Optional[Evpn]:
    """evpn: {asn, router_id, router_mac, peers: [{address, remote_asn}], frr: managed|external,
    frr_dir, graceful_restart}"""
    bad = v.bad
    v.mapping(e, "evpn", ["asn"], ["router_id", "router_mac", "peers", "frr", "frr_dir", "graceful_restart"])
    asn = v.req(e, "asn", "evpn.asn", v.integer, 1, (1 << 32) - 1)
    if uplink is not None and uplink.ipv6:
        v.note("uplink.ip", "EVPN needs an IPv4 underlay (the VTEP address FRR advertises)")
    router_id = v.opt(e, "router_id", "evpn.router_id", v.ip, 4,
                      default=uplink.ip if uplink is not None and not uplink.ipv6 else None)
    if router_id is None and uplink is not None:
        v.note("evpn.router_id", "required (the uplink's address is not IPv4)")
    router_mac = v.opt(e, "router_mac", "evpn.router_mac", v.mac, default=uplink.mac if uplink else None)
    frr = v.opt(e, "frr", "evpn.frr", v.choice, ("managed", "external"),
                "managed or external", default="managed")
    frr_dir = v.opt(e, "frr_dir", "evpn.frr_dir", v.directory, default=Evpn.frr_dir)
    if "frr_dir" in e and frr != "external":
        v.note("evpn.frr_dir", "only with frr: external (a managed FRR keeps its state beside dpu's control socket)")
    gr = False if e.get("graceful_restart") is None else v.opt(e, "graceful_restart", "evpn.graceful_restart",
                                                               v.boolean)
    peers: List[Peer] = []
    seen: Dict[Any, int] = {}
    raw_peers = v.collection(e, "peers", "evpn.peers", list, "a list of {address, remote_asn}")
    for i, raw in enumerate(raw_peers or []):
        pp = f"evpn.peers[{i}]"
        with v.guard:
            if isinstance(raw, str):
                raw = {"address": raw}
            v.mapping(raw, pp, ["address"], ["remote_asn"])
            addr = v.req(raw, "address", f"{pp}.address", v.ip, 4)
            ras = v.opt(raw, "remote_asn", f"{pp}.remote_asn", v.integer, 1, (1 << 32) - 1)
            if addr is _BAD or ras is _BAD:
                raise _Abort()
            if uplink is not None and addr == uplink.ip:
                v.fail(f"{pp}.address", f"{addr} is our own VTEP address")
            if addr in seen:
                v.fail(f"{pp}.address", f"{addr} is already evpn.peers[{seen[addr]}]")
            seen[addr] = i
            peers.append(Peer(addr, ras))
    if frr == "managed" and raw_peers == []:
        v.note("evpn.peers", "required with frr: managed (the BGP neighbours FRR is configured with)")
    if v.bad > bad:
        return None
    return Evpn(asn=asn, router_id=router_id, router_mac=router_mac, peers=peers, frr=frr, graceful_restart=gr,
                frr_dir=frr_dir)


def _uplink_section(v: _V, u: Any) -> Optional[Uplink]:
    bad = v.bad
    v.mapping(u, "uplink", ["port", "ip", "mac"],
              ["nexthop_mac", "nexthop", "mtu", "vxlan_port", "ttl", "src_port_range", "strict_vxlan"])
    port = v.req(u, "port", "uplink.port", v.name)
    ip = v.req(u, "ip", "uplink.ip", v.ip)
    mac = v.req(u, "mac", "uplink.mac", v.mac)
    nexthop_mac = v.opt(u, "nexthop_mac", "uplink.nexthop_mac", v.mac)
    mtu = v.opt(u, "mtu", "uplink.mtu", v.integer, *_TUNNEL["mtu"][1:], default=_TUNNEL["mtu"][0])
    vxlan_port = v.opt(u, "vxlan_port", "uplink.vxlan_port", v.integer, *_TUNNEL["dst_port"][1:],
                       default=_TUNNEL["dst_port"][0])
    ttl = v.opt(u, "ttl", "uplink.ttl", v.integer, *_TUNNEL["ttl"][1:], default=_TUNNEL["ttl"][0])
    strict = (_TUNNEL["strict"][0] if u.get("strict_vxlan") is None
              else v.opt(u, "strict_vxlan", "uplink.strict_vxlan", v.boolean))
    ipv6 = ip is not _BAD and ip.version == 6
    nexthop = v.opt(u, "nexthop", "uplink.nexthop", v.ip, None if ip is _BAD else ip.version)
    if nexthop_mac is None:
        if ipv6:
            v.note("uplink.nexthop_mac", "required over an IPv6 underlay (next hops are resolved by ARP, IPv4 only)")
        elif nexthop is None:
            v.note("uplink", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
    if ipv6 and mtu is not _BAD and mtu < _core.TUNNEL_MTU_MIN_IPV6:
        v.note("uplink.mtu", f"an IPv6 underlay needs an MTU of at least {_core.TUNNEL_MTU_MIN_IPV6}")
    port_range = v.opt(u, "src_port_range", "uplink.src_port_range", _port_range, v,
                       default=(_TUNNEL["sport_min"][0], _TUNNEL["sport_max"][0]))
    if v.bad > bad:
        return None
    return Uplink(port=port, ip=ip, mac=mac, nexthop_mac=nexthop_mac, mtu=mtu, vxlan_port=vxlan_port, ttl=ttl,
                  src_port_range=port_range, strict_vxlan=strict, nexthop=nexthop)


def _port_range(r: Any, path: str, v: _V) -> Tuple[int, int]:
    if not isinstance(r, (list, tuple)) or len(r) != 2:
        v.fail(path, "expected [min, max]")
    lo = v.opt({"min": r[0]}, "min", f"{path}[0]", v.integer, *_TUNNEL["sport_min"][1:])
    hi = v.opt({"max": r[1]}, "max", f"{path}[1]", v.integer, *_TUNNEL["sport_max"][1:])
    if lo is _BAD or hi is _BAD:
        raise _Abort()
    if lo > hi:
        v.fail(path, f"min {lo} is above max {hi}")
    return lo, hi


def _internet_section(v: _V, i: Any, uplink: Optional[Uplink]) -> Optional[Internet]:
    bad = v.bad
    v.mapping(i, "internet", ["port", "mac"], ["nexthop_mac", "nexthop", "ip"])
    port = v.req(i, "port", "internet.port", v.name)
    mac = v.req(i, "mac", "internet.mac", v.mac)
    nexthop_mac = v.opt(i, "nexthop_mac", "internet.nexthop_mac", v.mac)
    nexthop = v.opt(i, "nexthop", "internet.nexthop", v.ip, 4)
    ip = v.opt(i, "ip", "internet.ip", v.ip, 4)
    if nexthop_mac is None and nexthop is None:
        v.note("internet", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
    if uplink is not None and port == uplink.port:
        v.note("internet.port", f"{port} is the uplink port")
    if v.bad > bad:
        return None
    return Internet(port=port, mac=mac, nexthop_mac=nexthop_mac, nexthop=nexthop, ip=ip)


# the core's timeout names (ct_timeouts.def; tests/test_seam.py holds them equal), in the docs' order
_TIMEOUTS = ("tcp_established", "tcp_transitory", "udp", "icmp")


def _conntrack_section(v: _V, c: Any) -> Tuple[Dict[str, float], Optional[int]]:
    """conntrack: {max_connections: N, timeouts: {tcp_established: s, ...}}"""
    if c is None:
        return {}, None
    v.mapping(c, "conntrack", [], ["max_connections", "timeouts"])
    max_conns = None
    if c.get("max_connections") is not None:
        max_conns = v.opt(c, "max_connections", "conntrack.max_connections", v.integer,
                          *_core.CT_MAX_CONNECTIONS_RANGE)  # the core's bounds (conntrack.h)
    timeouts: Dict[str, float] = {}
    if c.get("timeouts") is not None:
        t = v.mapping(c["timeouts"], "conntrack.timeouts", [], list(_TIMEOUTS))
        for k in _TIMEOUTS:
            if k in t:
                timeouts[k] = v.opt(t, k, f"conntrack.timeouts.{k}", v.integer, 1,
                                    int(_core.CT_TIMEOUT_RANGE[1]))  # whole seconds, up to the core's most
    return timeouts, max_conns


def _tenants_section(v: _V, raw: Any, uplink: Optional[Uplink], internet: Optional[Internet],
                     internet_given: bool, evpn_given: bool = False) -> Dict[str, Tenant]:
    if not isinstance(raw, dict) or not raw:
        v.fail("tenants", "expected a mapping of tenant name to tenant")
    tenants: Dict[str, Tenant] = {}
    vnis: Dict[int, str] = {}
    port_owner: Dict[str, str] = {}
    for index, (tname, t) in enumerate(raw.items(), 1):
        with v.guard:
            tenant = _tenant(v, index, tname, t, uplink, internet, internet_given, vnis, port_owner, evpn_given)
            if tenant is not None:
                tenants[tname] = tenant
    _check_l3vnis(v, raw, tenants, vnis, evpn_given)
    _check_public_addresses(v, tenants)
    zones: Dict[int, str] = {}
    for tname, tenant in tenants.items():
        if not tenant.nat and not tenant.connection_limit and not tenant.security:
            continue  # no conntrack: its zone is never used
        if tenant.zone > 65535:
            v.note(f"tenants.{tname}.zone",
                   f"VNI {tenant.vni} does not fit a 16-bit conntrack zone: set tenants.{tname}.zone")
        elif tenant.zone in zones:
            v.note(f"tenants.{tname}.zone",
                   f"conntrack zone {tenant.zone} is already used by tenant {zones[tenant.zone]}")
        else:
            zones[tenant.zone] = tname
    return tenants


def _tenant(v: _V, index: int, tname: Any, t: Any, uplink: Optional[Uplink], internet: Optional[Internet],
            internet_given: bool, vnis: Dict[int, str], port_owner: Dict[str, str],
            evpn_given: bool = False) -> Optional[Tenant]:
    """One tenant, or None when it has errors (recorded in ``v``)."""
    tp = _child("tenants", tname)
    v.name(tname, tp)
    bad = v.bad
    optional = ["ports", "remote", "flood", "zone", "nat", "limits", "security_groups"]
    v.mapping(t, tp, ["vni", "gateway_mac", "subnets"], optional + (["l3vni"] if evpn_given else []),
              None if evpn_given else {"l3vni": "an L3 VNI needs the evpn: section (it is advertised by BGP EVPN)"})
    vni = v.req(t, "vni", f"{tp}.vni", v.integer, 1, (1 << 24) - 1)
    if vni is not _BAD:
        if vni in vnis:
            v.note(f"{tp}.vni", f"VNI {vni} is already used by tenant {vnis[vni]}")
        else:
            vnis[vni] = tname
    gw_mac = v.req(t, "gateway_mac", f"{tp}.gateway_mac", v.mac)
    subnets, gw_ips, subnets_ok = _subnets(v, t.get("subnets"), tp)
    nets = [n for n, _ in subnets] if subnets_ok else None   # None: incomplete, "inside" is not checked
    seen_ip: Dict[Any, str] = {}
    seen_mac: Dict[str, str] = {} if gw_mac is _BAD else {gw_mac: f"{tp}.gateway_mac"}

    groups: Dict[str, SecurityGroup] = {}
    with v.guard:
        groups = parse_groups(v, t.get("security_groups"), tp)
    ports: Dict[str, Endpoint] = {}
    ports_raw = v.collection(t, "ports", f"{tp}.ports", dict, "a mapping of port name to {mac, ip}")
    for pname, p in (ports_raw or {}).items():
        pp = _child(f"{tp}.ports", pname)
        with v.guard:
            v.name(pname, pp)
            if uplink is not None and pname == uplink.port:
                v.fail(pp, f"{pname} is the uplink port")
            if internet is not None and pname == internet.port:
                v.fail(pp, f"{pname} is the internet port")
            if pname in port_owner:
                v.fail(pp, f"port {pname} already belongs to tenant {port_owner[pname]}")
            port_owner[pname] = tname
            ep = _endpoint(v, p, pp, tname, nets, seen_ip, seen_mac, gw_ips, ["mac", "ip"], None,
                           ["security_groups"])
            ep.port = pname
            ep.groups = port_groups(v, p, pp, groups)
            ports[pname] = ep

    remote: List[Endpoint] = []
    remote_raw = v.collection(t, "remote", f"{tp}.remote", list, "a list of {vtep, mac, ip}")
    for i, r in enumerate(remote_raw or []):
        with v.guard:
            remote.append(_endpoint(v, r, f"{tp}.remote[{i}]", tname, nets, seen_ip, seen_mac, gw_ips,
                                    ["vtep", "mac", "ip"], uplink, ["pinned"]))
    # every endpoint is known: NAT may say that an address is none of them
    endpoints_ok = (ports_raw is not None and remote_raw is not None
                    and len(ports) == len(ports_raw) and len(remote) == len(remote_raw))

    flood: List[Any] = []
    for i, f in enumerate(v.collection(t, "flood", f"{tp}.flood", list, "a list of VTEP addresses") or []):
        with v.guard:
            a = v.ip(f, f"{tp}.flood[{i}]", uplink.ip.version if uplink else None)
            if uplink is not None and a == uplink.ip:
                v.fail(f"{tp}.flood[{i}]", f"{a} is our own VTEP address")
            if a not in flood:
                flood.append(a)

    zone = vni
    if t.get("zone") is not None:
        zone = v.opt(t, "zone", f"{tp}.zone", v.integer, 1, 65535)
    connection_limit = 0
    if t.get("limits") is not None:
        with v.guard:
            lim = v.mapping(t["limits"], f"{tp}.limits", [], ["connections"])
            if lim.get("connections") is not None:
                connection_limit = v.opt(lim, "connections", f"{tp}.limits.connections", v.integer, 1,
                                         _core.CT_MAX_CONNECTIONS_RANGE[1])  # the core's (conntrack.h)
    nat = None
    if t.get("nat") is not None:
        with v.guard:
            if not internet_given:
                v.fail(f"{tp}.nat", "NAT needs the internet: section (port, mac, nexthop_mac)")
            endpoints = {ep.ip: ep for ep in list(ports.values()) + remote} if endpoints_ok else None
            nat = _nat_section(v, t["nat"], f"{tp}.nat", tname, [n for n, _ in subnets], endpoints)
    if v.bad > bad:
        return None
    l3vni = v.opt(t, "l3vni", f"{tp}.l3vni", v.integer, 1, (1 << 24) - 1) if evpn_given else None
    if v.bad > bad:
        return None
    tenant = Tenant(tname, vni, gw_mac, subnets, ports, remote, flood, index)
    tenant.zone, tenant.connection_limit, tenant.nat, tenant.l3vni = zone, connection_limit, nat, l3vni
    tenant.security = Policy(groups, {p: ep.groups for p, ep in ports.items() if ep.groups},
                             {g: [ep.ip for ep in ports.values() if g in ep.groups] for g in groups})
    return tenant


def _subnets(v: _V, raw: Any, tp: str) -> Tuple[List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]],
                                               Dict[Any, int], bool]:
    """The tenant's good subnets, their gateways (to the subnet's index), and
    whether all of its subnets are good."""
    if raw is None:
        return [], {}, False     # required: recorded by mapping()
    if not isinstance(raw, list) or not raw:
        v.note(f"{tp}.subnets", "expected a non-empty list of {cidr, gateway}")
        return [], {}, False
    subnets: List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]] = []
    gateways: Dict[Any, int] = {}
    for i, s in enumerate(raw):
        sp = f"{tp}.subnets[{i}]"
        with v.guard:
            v.mapping(s, sp, ["cidr", "gateway"], [])
            net = v.req(s, "cidr", f"{sp}.cidr", v.network)
            gw = v.req(s, "gateway", f"{sp}.gateway", v.ip, 4)
            if net is _BAD or gw is _BAD:
                raise _Abort()
            if gw not in net:
                v.fail(f"{sp}.gateway", f"{gw} is outside its subnet {net}")
            if net.prefixlen <= 30 and gw in (net.network_address, net.broadcast_address):
                v.fail(f"{sp}.gateway", f"{gw} is the network or broadcast address of {net}")
            for (other, other_gw) in subnets:
                if net.overlaps(other):
                    j = gateways[other_gw]
                    v.fail(f"{sp}.cidr", f"{net} overlaps {other} (subnets[{j}]) in the same tenant")
            gateways[gw] = i
            subnets.append((net, gw))
    return subnets, gateways, len(subnets) == len(raw)


def _endpoint(v: _V, r: Any, rp: str, tname: Any, nets: Optional[List[ipaddress.IPv4Network]],
              seen_ip: Dict[Any, str], seen_mac: Dict[str, str], gw_ips: Dict[Any, int],
              keys: List[str], uplink: Optional[Uplink], optional: Sequence[str] = ()) -> Endpoint:
    """A local port's {mac, ip} or a remote endpoint's {vtep, mac, ip, pinned} (with ``uplink``)."""
    bad = v.bad
    v.mapping(r, rp, keys, optional)
    pinned = False if r.get("pinned") is None else v.opt(r, "pinned", f"{rp}.pinned", v.boolean)
    vtep = None
    if "vtep" in keys:
        vtep = v.req(r, "vtep", f"{rp}.vtep", v.ip, uplink.ip.version if uplink else None)
        if uplink is not None and vtep == uplink.ip:
            v.note(f"{rp}.vtep", f"{vtep} is our own VTEP address")
    mac_path, ip_path = f"{rp}.mac", f"{rp}.ip"
    mac = v.req(r, "mac", mac_path, v.mac)
    ip = v.req(r, "ip", ip_path, v.ip, 4)
    if ip is not _BAD:
        with v.guard:
            if nets is not None:
                _inside(v, ip, ip_path, nets, tname)
            _unique(v, seen_ip, ip, ip_path, gw_ips)
    if mac is not _BAD:
        with v.guard:
            _unique(v, seen_mac, mac, mac_path, None)
    if v.bad > bad:
        raise _Abort()
    return Endpoint(mac=mac, ip=ip, vtep=vtep, pinned=pinned)


def _check_l3vnis(v: _V, raw: dict, tenants: Dict[str, Tenant], vnis: Dict[int, str], evpn_given: bool) -> None:
    """An L3 VNI is a tenant's own: no other tenant's L2 or L3 VNI, and only with evpn:."""
    l3: Dict[int, str] = {}
    for tname, t in tenants.items():
        if evpn_given and (len(tname) > 15 or tname == "default" or not tname[0].isalpha()):
            v.note(f"tenants.{tname}", "with evpn: a tenant's name is its VRF's (FRR, the kernel): 1 to 15 "
                   "characters, beginning with a letter, not 'default'")
        if t.l3vni is None:
            if evpn_given:
                v.note(f"tenants.{tname}.l3vni", "required with evpn: (the VNI the tenant's routed traffic takes "
                       "between hosts)")
            continue
        path = f"tenants.{tname}.l3vni"
        if t.l3vni in vnis:
            v.note(path, f"VNI {t.l3vni} is already tenant {vnis[t.l3vni]}'s L2 VNI")
        elif t.l3vni in l3:
            v.note(path, f"VNI {t.l3vni} is already tenant {l3[t.l3vni]}'s L3 VNI")
        else:
            l3[t.l3vni] = tname


def _inside(v: _V, ip: Any, path: str, nets: List[ipaddress.IPv4Network], tname: Any) -> None:
    for n in nets:
        if ip in n:
            if n.prefixlen <= 30 and ip in (n.network_address, n.broadcast_address):
                v.fail(path, f"{ip} is the network or broadcast address of {n}")
            return
    v.fail(path, f"{ip} is not inside any subnet of tenant {tname}")


def _ipv4(v: _V, value: Any, path: str) -> ipaddress.IPv4Address:
    return v.ip(value, path, 4)


# Ranges no public address may be in (RFC 6890): an address there cannot be
# reached from the internet, and the internet port would answer ARP for it.
_NOT_PUBLIC = [(ipaddress.IPv4Network(n), what) for n, what in (
    ("0.0.0.0/8", "in 'this network' (0.0.0.0/8)"), ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"), ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address (240.0.0.0/4, the broadcast address included)"))]


def _public_kind(v: _V, lo: ipaddress.IPv4Address, hi: ipaddress.IPv4Address, path: str) -> None:
    """Refuses a public address (or pool lo-hi) in a range no public address may be in."""
    for net, what in _NOT_PUBLIC:
        if int(lo) <= int(net.broadcast_address) and int(net.network_address) <= int(hi):
            first = max(int(lo), int(net.network_address))
            v.fail(path, f"{ipaddress.IPv4Address(first)} is {what}, not a public address")


def _snat_pool(snat: Any, path: str, v: _V) -> Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    if isinstance(snat, ipaddress.IPv4Address):
        snat = str(snat)
    if not isinstance(snat, str):
        v.fail(path, f"{_short(snat)} is not an IPv4 address or a pool (first-last)")
    if "-" in snat:
        lo_s, hi_s = snat.split("-", 1)
        lo, hi = _ipv4(v, lo_s.strip(), path), _ipv4(v, hi_s.strip(), path)
        if int(lo) > int(hi):
            v.fail(path, f"pool {lo}-{hi} is reversed (first address above the last)")
        if int(hi) - int(lo) >= 65536:
            v.fail(path, f"pool {lo}-{hi} has more than 65,536 addresses")
    else:
        lo = hi = _ipv4(v, snat, path)
    return lo, hi


def _nat_section(v: _V, n: Any, np: str, tname: Any, nets: List[ipaddress.IPv4Network],
                 endpoints: Optional[Dict[Any, Endpoint]]) -> Nat:
    """A tenant's nat: section; ``endpoints`` None when its ports or remote have
    errors (then "not an endpoint" is not checked)."""
    bad = v.bad
    v.mapping(n, np, ["snat"], ["floating", "forwards", "filtering"])

    def public(addr, path):
        if any(addr in net for net in nets):
            v.fail(path, f"{addr} is inside tenant {tname}'s own subnets, not a public address")
        _public_kind(v, addr, addr, path)
        return addr

    pool = v.req(n, "snat", f"{np}.snat", _snat_pool, v)
    if pool is not _BAD:
        with v.guard:
            _public_kind(v, pool[0], pool[1], f"{np}.snat")
    if pool is not _BAD:   # the pool's first address inside one of the tenant's subnets
        lo, hi = int(pool[0]), int(pool[1])
        inside = [max(lo, int(net.network_address)) for net in nets
                  if lo <= int(net.broadcast_address) and int(net.network_address) <= hi]
        if inside:
            with v.guard:
                public(ipaddress.IPv4Address(min(inside)), f"{np}.snat")
    floating = []
    seen_private: Dict[Any, str] = {}
    seen_public: Dict[Any, str] = {}
    for i, f in enumerate(v.collection(n, "floating", f"{np}.floating", list, "a list of {private, public}") or []):
        fp = f"{np}.floating[{i}]"
        with v.guard:
            v.mapping(f, fp, ["private", "public"], [])
            priv = v.req(f, "private", f"{fp}.private", v.ip, 4)
            pub = v.req(f, "public", f"{fp}.public", lambda a, p: public(_ipv4(v, a, p), p))
            if priv is _BAD or pub is _BAD:
                raise _Abort()
            if endpoints is not None and priv not in endpoints:
                v.fail(f"{fp}.private", f"{priv} is not an endpoint of tenant {tname} (ports or remote)")
            if priv in seen_private:
                v.fail(f"{fp}.private", f"{priv} already has a floating address ({seen_private[priv]})")
            seen_private[priv] = fp
            if pub in seen_public:
                v.fail(f"{fp}.public", f"{pub} is already the floating address of {seen_public[pub]}")
            seen_public[pub] = f"{priv} ({fp})"
            if pool is not _BAD and int(pool[0]) <= int(pub) <= int(pool[1]):
                v.fail(f"{fp}.public", f"{pub} is in the tenant's snat pool; a floating address needs its own")
            floating.append((priv, pub))
    forwards: List[Forward] = []
    fw = v.collection(n, "forwards", f"{np}.forwards", list, "a list of {proto, public, port, to, to_port}") or []
    seen_fw: Dict[Any, str] = {}
    float_pubs = {pub for _, pub in floating}
    for i, f in enumerate(fw):
        fp = f"{np}.forwards[{i}]"
        with v.guard:
            v.mapping(f, fp, ["proto", "public", "port", "to"], ["to_port"])
            proto = v.req(f, "proto", f"{fp}.proto", v.choice, ("tcp", "udp"), "tcp or udp")
            pub = v.req(f, "public", f"{fp}.public", lambda a, p: public(_ipv4(v, a, p), p))
            if pub is not _BAD and pub in float_pubs:
                v.note(f"{fp}.public", f"{pub} is a floating address (all its ports go to its machine)")
            port = v.req(f, "port", f"{fp}.port", v.integer, 1, 65535)
            to = v.req(f, "to", f"{fp}.to", v.ip, 4)
            if to is not _BAD and endpoints is not None and to not in endpoints:
                v.note(f"{fp}.to", f"{to} is not an endpoint of tenant {tname} (ports or remote)")
            to_port = v.opt(f, "to_port", f"{fp}.to_port", v.integer, 1, 65535, default=port)
            if _BAD in (proto, pub, port, to, to_port):
                raise _Abort()
            key = (proto, pub, port)
            if key in seen_fw:
                v.fail(fp, f"{proto} {pub}:{port} is already forwarded by {seen_fw[key]}")
            seen_fw[key] = fp
            forwards.append(Forward(proto, pub, port, to, to_port))
    filterings = ("endpoint-independent", "address-and-port-dependent")
    filtering = v.opt(n, "filtering", f"{np}.filtering", v.choice, filterings, " or ".join(filterings),
                      default="address-and-port-dependent")
    if v.bad > bad:
        raise _Abort()
    return Nat(pool, floating, forwards, filtering == "endpoint-independent")


def _check_public_addresses(v: _V, tenants: Dict[str, "Tenant"]) -> None:
    owner: Dict[Any, str] = {}
    for tname, t in tenants.items():
        if not t.nat:
            continue
        with v.guard:
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
