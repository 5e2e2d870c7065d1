"""Security groups: a tenant's stateful per-port policy, as its topology writes it.

What it holds: the groups of a tenant (``SecurityGroup``: ingress and egress
allow rules), read and checked from ``tenants.<t>.security_groups`` (``parse``),
the policy a tenant's ports get from them (``Policy``: which port may send
what and receive what), and each rule as the flow matches that decide it
(``Rule.matches``). The flows themselves are ``security_flows``'s; this module
is also what a reload asks about the connections it finds (``Policy.allows``),
so the two read one set of rules.

Semantics (OpenStack and AWS): rules are allow rules and a port's groups'
rules are a union. A port with groups accepts only the ingress they allow; its
egress is open unless one of its groups has an ``egress`` list (then only what
those lists allow; ``egress: []`` allows none). A port without groups is open.
The replies of an allowed connection, and ICMP errors related to it, pass.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

PROTOS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58}
PROTO_NAMES = {v: k for k, v in PROTOS.items()}
PORT_PROTOS = (6, 17, 132)          # protocols with ports: TCP, UDP, SCTP
Network = Any  # ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rule:
    """One allow rule. ``peer`` is the far end: ``from`` of an ingress rule,
    ``to`` of an egress rule; ``group`` instead names a group of the tenant,
    whose members' addresses are the far end."""

    direction: str                  # "ingress" | "egress"
    index: int                      # its place in the group's list
    proto: Optional[int]            # None: any
    ports: Optional[Tuple[int, int]]
    peer: Optional[Network]         # a CIDR; None with ``group``
    group: Optional[str]
    icmp_type: Optional[int] = None
    icmp_code: Optional[int] = None

    @property
    def version(self) -> int:
        if self.proto == 58:
            return 6
        return self.peer.version if self.peer is not None else 4

    def text(self) -> str:
        """As the topology writes it: ``tcp 8000-8100 from group admin``."""
        parts = [PROTO_NAMES.get(self.proto, str(self.proto)) if self.proto is not None else "any"]
        if self.ports:
            a, b = self.ports
            parts.append(str(a) if a == b else f"{a}-{b}")
        if self.icmp_type is not None:
            parts.append(f"type {self.icmp_type}" + (f" code {self.icmp_code}" if self.icmp_code is not None else ""))
        way = "from" if self.direction == "ingress" else "to"
        parts.append(f"{way} group {self.group}" if self.group else f"{way} {self.peer}")
        return " ".join(parts)

    def admits(self, proto: int, dport: int, icmp_type: int, icmp_code: int, peer: Any,
               members: Dict[str, List[Any]]) -> bool:
        """Whether a new connection (protocol, destination port or ICMP type and
        code, the far end's address) is one this rule allows."""
        if self.proto is not None and proto != self.proto:
            return False
        if self.ports and not self.ports[0] <= dport <= self.ports[1]:
            return False
        if self.icmp_type is not None and icmp_type != self.icmp_type:
            return False
        if self.icmp_code is not None and icmp_code != self.icmp_code:
            return False
        if self.group is not None:
            return peer in members.get(self.group, ())
        return peer.version == self.peer.version and peer in self.peer

    def matches(self, members: Dict[str, List[Any]]) -> Iterator[str]:
        """The flow matches (ovs-ofctl syntax) that together say what the rule
        allows, without the port it applies to: one per far-end address or
        CIDR and per port prefix. ``nw_src``/``ipv6_src`` for ingress,
        ``nw_dst``/``ipv6_dst`` for egress."""
        v6 = self.version == 6
        end = ("src" if self.direction == "ingress" else "dst")
        addr_field = f"ipv6_{end}" if v6 else f"nw_{end}"
        if self.proto is None:
            base = "ipv6" if v6 else "ip"
        elif self.proto in (6, 17) or (self.proto == 1 and not v6) or (self.proto == 58 and v6):
            base = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp6"}[self.proto] + ("6" if v6 and self.proto in (6, 17) else "")
        else:
            base = f"{'ipv6' if v6 else 'ip'},nw_proto={self.proto}"
        if self.icmp_type is not None:
            base += f",icmp_type={self.icmp_type}"
        if self.icmp_code is not None:
            base += f",icmp_code={self.icmp_code}"
        peers = [str(a) for a in members.get(self.group, ())] if self.group else [cidr_match(self.peer)]
        ports = port_prefixes(*self.ports) if self.ports else [None]
        for p in peers:
            addr = f",{addr_field}={p}" if p is not None else ""
            for tp in ports:
                yield base + addr + (f",tp_dst={tp}" if tp is not None else "")


def cidr_match(net: Network) -> Optional[str]:
    if net.prefixlen == 0:
        return None  # any address: no match on it
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def port_prefixes(lo: int, hi: int) -> List[str]:
    """The range lo..hi as the fewest value/mask matches (``80``, ``0x1f40/0xffc0``)."""
    if (lo, hi) == (0, 65535):
        return [None]  # type: ignore[list-item]
    out: List[str] = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size >>= 1
        out.append(str(lo) if size == 1 else f"{lo:#x}/{0xffff & ~(size - 1):#x}")
        lo += size
    return out


@dataclass
class SecurityGroup:
    name: str
    index: int                       # 1-based, in the order written (the flows' cookies)
    ingress: List[Rule]
    egress: Optional[List[Rule]]     # None: the group says nothing about egress


@dataclass
class Policy:
    """A tenant's groups and which of its ports are in which."""

    groups: Dict[str, SecurityGroup] = field(default_factory=dict)
    port_groups: Dict[str, List[str]] = field(default_factory=dict)   # port -> its groups, as written
    members: Dict[str, List[Any]] = field(default_factory=dict)        # group -> its ports' addresses

    def __bool__(self) -> bool:
        return any(self.port_groups.values())

    def ingress(self, port: str) -> List[Tuple[SecurityGroup, Rule]]:
        return [(self.groups[g], r) for g in self.port_groups.get(port, ()) for r in self.groups[g].ingress]

    def egress(self, port: str) -> Optional[List[Tuple[SecurityGroup, Rule]]]:
        """The egress rules of a port, or None when its egress is open."""
        gs = [self.groups[g] for g in self.port_groups.get(port, ())]
        if not any(g.egress is not None for g in gs):
            return None
        return [(g, r) for g in gs for r in (g.egress or [])]

    def allows(self, src_port: Optional[str], dst_port: Optional[str], src: Any, dst: Any, proto: int,
               dport: int = 0, icmp_type: int = 0, icmp_code: int = 0) -> bool:
        """Whether a new connection from ``src`` (the tenant's port ``src_port``,
        or None for an address that is no port of the tenant's here) to ``dst``
        (``dst_port`` likewise) is allowed: the sender's egress and the
        receiver's ingress."""
        if src_port is not None:
            rules = self.egress(src_port)
            if rules is not None and not any(r.admits(proto, dport, icmp_type, icmp_code, dst, self.members)
                                             for _, r in rules):
                return False
        if dst_port is not None and self.port_groups.get(dst_port):
            if not any(r.admits(proto, dport, icmp_type, icmp_code, src, self.members)
                       for _, r in self.ingress(dst_port)):
                return False
        return True


# ---- reading the topology ----------------------------------------------------------------

def parse_groups(v: Any, raw: Any, tp: str) -> Dict[str, SecurityGroup]:
    """``tenants.<t>.security_groups``: name -> {ingress: [rules], egress: [rules]}.
    ``v`` is the topology's validator (schema._V); errors name their path."""
    path = f"{tp}.security_groups"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        v.fail(path, "expected a mapping of group name to {ingress, egress}")
    names = list(raw)
    groups: Dict[str, SecurityGroup] = {}
    for i, (gname, g) in enumerate(raw.items(), 1):
        gp = f"{path}.{gname}"
        with v.guard:
            v.name(gname, gp)
            v.mapping({} if g is None else g, gp, [], ["ingress", "egress"])
            g = g or {}
            ingress = _rules(v, g.get("ingress"), f"{gp}.ingress", "ingress", gname, names)
            egress = None
            if "egress" in g:
                egress = _rules(v, g.get("egress"), f"{gp}.egress", "egress", gname, names)
            groups[gname] = SecurityGroup(gname, i, ingress, egress)
    return groups


def _rules(v: Any, raw: Any, path: str, direction: str, gname: str, names: Sequence[str]) -> List[Rule]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        v.fail(path, "expected a list of rules ({proto, ports, from|from_group})")
    out: List[Rule] = []
    for i, r in enumerate(raw):
        with v.guard:
            out.append(_rule(v, r, f"{path}[{i}]", direction, i, gname, names))
    return out


def _rule(v: Any, r: Any, rp: str, direction: str, index: int, gname: str, names: Sequence[str]) -> Rule:
    way = "from" if direction == "ingress" else "to"
    other = "to" if way == "from" else "from"
    v.mapping(r, rp, [], ["proto", "ports", way, f"{way}_group", "type", "code"],
              {other: f"an {direction} rule names `{way}`, not `{other}`",
               f"{other}_group": f"an {direction} rule names `{way}_group`, not `{other}_group`"})
    proto = _proto(v, r.get("proto", "any"), f"{rp}.proto")
    ports = None
    if r.get("ports") is not None:
        if proto not in PORT_PROTOS:
            v.fail(f"{rp}.ports", f"ports apply to tcp, udp and sctp, not to {_proto_name(proto)}")
        ports = _ports(v, r["ports"], f"{rp}.ports")
    icmp_type = icmp_code = None
    for k in ("type", "code"):
        if r.get(k) is not None:
            if proto not in (1, 58):
                v.fail(f"{rp}.{k}", f"an ICMP {k} applies to icmp and icmpv6, not to {_proto_name(proto)}")
            val = v.integer(r[k], f"{rp}.{k}", 0, 255)
            icmp_type, icmp_code = (val, icmp_code) if k == "type" else (icmp_type, val)
    if icmp_code is not None and icmp_type is None:
        v.fail(f"{rp}.code", "an ICMP code needs its type")
    peer, group = None, None
    if r.get(way) is not None and r.get(f"{way}_group") is not None:
        v.fail(rp, f"give `{way}` or `{way}_group`, not both")
    if r.get(f"{way}_group") is not None:
        group = r[f"{way}_group"]
        gpath = f"{rp}.{way}_group"
        if group == gname:
            v.fail(gpath, f"group {gname} refers to itself")
        if group not in names:
            v.fail(gpath, f"unknown security group {group!r} (groups: {', '.join(map(str, names))})")
        if proto == 58:
            v.fail(gpath, "a group's addresses are its ports' IPv4 addresses: icmpv6 cannot reach them")
    else:
        peer = _network(v, r.get(way, "0.0.0.0/0" if proto != 58 else "::/0"), f"{rp}.{way}")
        if proto == 1 and peer.version == 6:
            v.fail(f"{rp}.{way}", f"{peer} is an IPv6 network: icmp is IPv4's (use icmpv6)")
        if proto == 58 and peer.version == 4:
            v.fail(f"{rp}.{way}", f"{peer} is an IPv4 network: icmpv6 is IPv6's (use icmp)")
    return Rule(direction, index, proto, ports, peer, group, icmp_type, icmp_code)


def _proto_name(proto: Optional[int]) -> str:
    return "any protocol" if proto is None else PROTO_NAMES.get(proto, f"protocol {proto}")


def _proto(v: Any, p: Any, path: str) -> Optional[int]:
    if p == "any":
        return None
    if isinstance(p, str) and p in PROTOS:
        return PROTOS[p]
    if isinstance(p, int) and not isinstance(p, bool):
        return v.integer(p, path, 0, 255)
    v.fail(path, f"{p!r} is not a protocol (tcp, udp, icmp, icmpv6, any, or a number 0..255)")
    raise AssertionError  # not reached


def _ports(v: Any, p: Any, path: str) -> Tuple[int, int]:
    if isinstance(p, int) and not isinstance(p, bool):
        n = v.integer(p, path, 1, 65535)
        return n, n
    if isinstance(p, str) and p.count("-") == 1:
        a, b = p.split("-")
        if a.strip().isdigit() and b.strip().isdigit():
            lo, hi = int(a), int(b)
            for n in (lo, hi):
                v.integer(n, path, 1, 65535)
            if lo > hi:
                v.fail(path, f"port range {p} is upside down ({lo} is above {hi})")
            return lo, hi
    v.fail(path, f"{p!r} is not a port or a range A-B")
    raise AssertionError  # not reached


def _network(v: Any, n: Any, path: str) -> Network:
    if not isinstance(n, str):
        v.fail(path, f"{n!r} is not a CIDR (a string like 10.0.0.0/8 or 2001:db8::/32)")
    try:
        return ipaddress.ip_network(n, strict=True)
    except ValueError as e:
        v.fail(path, f"{n!r} is not a CIDR ({e})")
    raise AssertionError  # not reached


def port_groups(v: Any, p: dict, pp: str, groups: Dict[str, SecurityGroup]) -> List[str]:
    """A port's ``security_groups: [names]``, each a group of its tenant."""
    raw = p.get("security_groups")
    if raw is None:
        return []
    path = f"{pp}.security_groups"
    if not isinstance(raw, list) or not all(isinstance(g, str) for g in raw):
        v.fail(path, "expected a list of security group names")
    for g in raw:
        if g not in groups:
            known = ", ".join(groups) or "none: the tenant has no security_groups"
            v.fail(path, f"unknown security group {g!r} (groups: {known})")
    return list(dict.fromkeys(raw))
