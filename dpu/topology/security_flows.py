"""Security groups as flows: tables 2-6 and 63, and what they change elsewhere.

A tenant whose ports have security groups (``Tenant.security``) sends its IP
traffic through its conntrack zone wherever one end is a port with groups, and
decides each connection once, on its first packet:

  2   which IP packets are judged: to a gateway address never (what the
      gateway answers is never blocked); between the tenant's addresses when
      one end is a port with groups: conntrack (zone = the tenant's); the rest
      goes on untouched (to the internet: table 41 judges it with its NAT).
  3   after conntrack: invalid dropped (ct_invalid); established and related
      (replies, ICMP errors) go on; new ones are judged.
  4   a new connection's sender: a port with egress rules needs one of them.
  5   its receiver: a port with groups needs one of its ingress rules; then
      the connection is committed, so its replies pass both ways.
  6   on to where the packet was going: table 10 from a local port, 30 or 35
      from the fabric.
  41  (NAT out) a new connection to the internet from a port with egress
      rules needs one of them before it takes its address.
  61  (NAT in) a new connection to a forward or floating address of a port
      with groups needs one of its ingress rules on the private address and
      port, before it is committed (a denied one leaves nothing behind).
  63  (NAT in) what endpoint-independent filtering lets in is judged after
      its translation, on every packet from outside (its connection exists
      from the first packet on).

L2 delivery to a port with groups takes only IP addressed to it, and IP that
is flooded (broadcast, unknown unicast) reaches only ports without groups.

Every rule's flows carry the rule's cookie (``rule_cookie``), every port's
"none allowed" flow the port's (``deny_cookie``): `dpu stats` sums their
counts into hits per rule and denials per port, and `dpu trace` names them.
A reload cuts what its new rules no longer allow (``cut_connections``).
"""
from __future__ import annotations

import ipaddress
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .security import Policy, Rule, SecurityGroup, cidr_match

T_SG, T_SG_CT, T_SG_EGRESS, T_SG_INGRESS, T_SG_NEXT = 2, 3, 4, 5, 6
T_SG_INET = 63
SG_FLOOD_GROUP = 0x20000            # + 2 * tenant index - 1 (from local ports) or 2 * index (from the fabric)

SG_COOKIE = 1 << 50                 # below the topology's top byte: a security-group flow
SG_DENY = 1 << 49                   # a port's "no rule allowed it"
SG_EGRESS = 1 << 48
_GROUP_SHIFT, _RULE_SHIFT, _TENANT_BITS = 36, 20, 20

PRIO_ALLOW, PRIO_DENY = 200, 100


def rule_cookie(base: int, t: Any, g: SecurityGroup, r: Rule) -> int:
    return (base | SG_COOKIE | (SG_EGRESS if r.direction == "egress" else 0) | g.index << _GROUP_SHIFT
            | r.index << _RULE_SHIFT | t.index)


def deny_cookie(base: int, t: Any, port_index: int, egress: bool) -> int:
    return base | SG_COOKIE | SG_DENY | (SG_EGRESS if egress else 0) | port_index << _RULE_SHIFT | t.index


def describe_cookie(cookie: int, tenants: List[Any]) -> Optional[Tuple[str, str, str, Optional[int], str]]:
    """(tenant, group or port, direction, rule index or None, text) of a
    security-group flow's cookie, None for any other cookie."""
    if not cookie & SG_COOKIE:
        return None
    ti = cookie & ((1 << _TENANT_BITS) - 1)
    t = next((t for t in tenants if t.index == ti), None)
    if t is None:
        return None
    direction = "egress" if cookie & SG_EGRESS else "ingress"
    if cookie & SG_DENY:
        pi = (cookie >> _RULE_SHIFT) & 0xFFFF
        ports = list(t.ports)
        port = ports[pi] if pi < len(ports) else f"#{pi}"
        return t.name, port, direction, None, f"no {direction} rule of port {port}'s groups allowed it"
    gi, ri = (cookie >> _GROUP_SHIFT) & 0xFFF, (cookie >> _RULE_SHIFT) & 0xFFFF
    g = next((g for g in t.security.groups.values() if g.index == gi), None)
    rules = (g.ingress if direction == "ingress" else g.egress or []) if g else []
    if g is None or ri >= len(rules):
        return None
    return t.name, g.name, direction, ri, f"security group {g.name} {direction}[{ri}]: {rules[ri].text()}"


def _tagged(rules: List[Tuple[SecurityGroup, Rule]], pol: Policy) -> Iterator[Tuple[SecurityGroup, Rule, str]]:
    for g, r in rules:
        for m in r.matches(pol.members):
            yield g, r, m


def judge_port(add: Callable[[Tuple[str, str]], None], sec: str, table: int, md: str, t: Any, base: int,
               port: str, egress: bool, tagged: Any, match_for: Callable[[Rule, str], str], allow: str,
               deny_match: str, prios: Tuple[int, int] = (PRIO_ALLOW, PRIO_DENY)) -> None:
    """One port's judgement in ``table``: a flow per rule match (``match_for(rule,
    match)``, the rule's cookie, ``allow`` actions), then what none allowed
    (``deny_match``, the port's cookie) dropped as security_group."""
    for g, r, m in tagged:
        add((f"table={table},priority={prios[0]},cookie={rule_cookie(base, t, g, r):#x},{md},"
             f"{match_for(r, m)},actions={allow}", sec))
    add((f"table={table},priority={prios[1]},cookie={deny_cookie(base, t, port_index(t, port), egress):#x},{md},"
         f"{deny_match},actions=drop(security_group)", sec))


def compile_security(topo: Any, t: Any, groups: List[Tuple[str, str]], add: Callable[[Tuple[str, str]], None],
                     base: int, t_l3: int, t_fabric: int, t_l3vni: int, tunnel_port: str,
                     evpn_flood_group: int) -> None:
    """Tables 2-6 of a tenant with security groups, and its flood groups for IP."""
    pol: Policy = t.security
    ck = f"cookie={base | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    z = f"zone={t.zone}"
    tname = f"tenant {t.name} (vni {t.vni}, zone {t.zone})"
    guarded = [(p, ep) for p, ep in t.ports.items() if ep.groups]

    sec = f"table {T_SG}: {tname}: security groups: which IP is judged"
    for _, gw in t.subnets:
        add((f"table={T_SG},priority=300,{ck},{md},ip,nw_dst={gw},actions=goto_table:{T_SG_NEXT}", sec))
    for p, _ in guarded:
        for net, _ in t.subnets:
            add((f"table={T_SG},priority=200,{ck},{md},in_port={p},ip,nw_dst={net},"
                 f"actions=ct({z},table={T_SG_CT})", sec))
    for _, ep in guarded:
        add((f"table={T_SG},priority=190,{ck},{md},ip,nw_dst={ep.ip},actions=ct({z},table={T_SG_CT})", sec))
    add((f"table={T_SG},priority=0,{ck},{md},actions=goto_table:{T_SG_NEXT}", sec))

    sec = f"table {T_SG_CT}: {tname}: security groups: replies and related pass, new connections are judged"
    add((f"table={T_SG_CT},priority=200,{ck},{md},ct_state=+trk+inv,ip,actions=drop(ct_invalid)", sec))
    add((f"table={T_SG_CT},priority=190,{ck},{md},ct_state=+trk+est,ip,actions=goto_table:{T_SG_NEXT}", sec))
    add((f"table={T_SG_CT},priority=190,{ck},{md},ct_state=+trk+rel,ip,actions=goto_table:{T_SG_NEXT}", sec))
    add((f"table={T_SG_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,actions=goto_table:{T_SG_EGRESS}", sec))

    sec = f"table {T_SG_EGRESS}: {tname}: security groups: egress rules of the sending port"
    for p in t.ports:
        rules = pol.egress(p)
        if rules is not None:
            judge_port(add, sec, T_SG_EGRESS, md, t, base, p, True, _tagged(rules, pol),
                       lambda r, m, p=p: f"in_port={p},{m}", f"goto_table:{T_SG_INGRESS}", f"in_port={p}")
    add((f"table={T_SG_EGRESS},priority=0,{ck},{md},actions=goto_table:{T_SG_INGRESS}", sec))

    sec = f"table {T_SG_INGRESS}: {tname}: security groups: ingress rules of the receiving port, then commit"
    commit = f"ct(commit,{z}),goto_table:{T_SG_NEXT}"
    for p, ep in t.ports.items():
        if ep.groups:
            judge_port(add, sec, T_SG_INGRESS, md, t, base, p, False, _tagged(pol.ingress(p), pol),
                       lambda r, m, ep=ep: with_dst(f"ipv6,dl_dst={ep.mac}" if r.version == 6 else f"ip,nw_dst={ep.ip}", m),
                       commit, f"ip,nw_dst={ep.ip}")
    add((f"table={T_SG_INGRESS},priority=0,{ck},{md},actions={commit}", sec))

    sec = f"table {T_SG_NEXT}: {tname}: security groups: on to where the packet was going"
    add((f"table={T_SG_NEXT},priority=100,{ck},{md},in_port={tunnel_port},tun_id={t.vni:#x},"
         f"actions=goto_table:{t_fabric}", sec))
    if t.l3vni is not None:
        add((f"table={T_SG_NEXT},priority=100,{ck},{md},in_port={tunnel_port},tun_id={t.l3vni:#x},"
             f"actions=goto_table:{t_l3vni}", sec))
    add((f"table={T_SG_NEXT},priority=0,{ck},{md},actions=goto_table:{t_l3}", sec))

    # Flooded IP reaches only the ports without groups (and the flood VTEPs).
    flood_id, flood_local_id = sg_flood_groups(t)
    open_ports = [f"bucket=actions=output:{p}" for p, ep in t.ports.items() if not ep.groups]
    groups.append((",".join([f"group_id={flood_id},type=all"] + open_ports + _vtep_buckets(topo, t, tunnel_port, evpn_flood_group)),
                   f"tenant {t.name} (vni {t.vni}): flooded IP from local ports -> ports without security groups"
                   " + flood VTEPs"))
    groups.append((",".join([f"group_id={flood_local_id},type=all"] + open_ports),
                   f"tenant {t.name} (vni {t.vni}): flooded IP from the fabric -> ports without security groups"))


def _vtep_buckets(topo: Any, t: Any, tunnel_port: str, evpn_flood_group: int) -> List[str]:
    tun_dst = "tun_ipv6_dst" if topo.uplink.ipv6 else "tun_dst"
    out = [f"bucket=actions=set_field:{t.vni:#x}->tun_id,set_field:{vt}->{tun_dst},output:{tunnel_port}"
           for vt in t.flood]
    if topo.evpn is not None:
        out.append(f"bucket=actions=group:{evpn_flood_group + t.index}")
    return out


def with_dst(a: str, b: str) -> str:
    """Two matches as one: the rule's protocol keyword (tcp, udp6...) says ip/ipv6 already."""
    proto, _, rest = b.partition(",")
    if proto in ("tcp", "udp", "icmp", "tcp6", "udp6", "icmp6", "ip", "ipv6"):
        fam, _, addr = a.partition(",")
        return ",".join(x for x in (proto, addr, rest) if x)
    return ",".join(x for x in (a, b) if x)


def sg_flood_groups(t: Any) -> Tuple[int, int]:
    return SG_FLOOD_GROUP + 2 * t.index - 1, SG_FLOOD_GROUP + 2 * t.index


def delivery_guard(t: Any, table: int, add: Callable[[Tuple[str, str]], None], base: int, sec: str) -> None:
    """In an L2 table: IP to a port with groups only when addressed to it; flooded IP to open ports only."""
    ck = f"cookie={base | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    for p, ep in t.ports.items():
        if ep.groups:
            add((f"table={table},priority=102,{ck},{md},dl_dst={ep.mac},ip,nw_dst={ep.ip},actions=output:{p}", sec))
            add((f"table={table},priority=101,{ck},{md},dl_dst={ep.mac},ip,actions=drop(security_group)", sec))


def nat_egress(t: Any, add: Callable[[Tuple[str, str]], None], base: int, table: int, commit_for: Callable[[Any], str],
               sec: str) -> None:
    """Table 41: a new connection to the internet from a port with egress rules needs one of them."""
    pol: Policy = t.security
    md = f"metadata={t.vni:#x}"
    for p, ep in t.ports.items():
        rules = pol.egress(p)
        if rules is None:
            continue
        # the internet is never a group's address
        tagged = [(g, r, m) for g, r, m in _tagged(rules, pol) if r.version == 4 and r.group is None]
        judge_port(add, sec, table, md, t, base, p, True, tagged,
                   lambda r, m, p=p: f"ct_state=+trk+new,in_port={p},{m}", commit_for(ep),
                   f"ct_state=+trk+new,in_port={p},ip", (170, 165))


def inbound_rules(t: Any, ep: Any, proto: Optional[int] = None, port: Optional[int] = None
                  ) -> Iterator[Tuple[SecurityGroup, Rule, str]]:
    """The ingress rules of local port ``ep`` that may admit connections from
    the internet, each with its match; with ``proto`` and ``port`` (a forward's
    private port), only those that admit it, matched on the source alone."""
    pol: Policy = t.security
    for g, r in pol.ingress(ep.port):
        if r.version != 4 or r.group is not None:
            continue  # the internet's addresses are never a group's (its ports' private ones)
        if proto is None:
            for m in r.matches(pol.members):
                yield g, r, m
            continue
        if (r.proto is not None and r.proto != proto) or (r.ports and not r.ports[0] <= port <= r.ports[1]):
            continue
        if r.icmp_type is not None:
            continue
        peer = cidr_match(r.peer)
        yield g, r, f"nw_src={peer}" if peer else ""


def port_index(t: Any, pname: str) -> int:
    return list(t.ports).index(pname)


# ---- a reload cuts what the new rules no longer allow ----------------------------------------

def cut_connections(dp: Any, topo: Any) -> int:
    """Removes every tracked connection of a tenant with security groups that
    its rules no longer allow (each judged as its first packet was: from its
    original source to its destination after DNAT); returns how many."""
    victims: List[bytes] = []
    for t in topo.tenants.values():
        if not t.security:
            continue
        pol: Policy = t.security
        by_ip = {ep.ip: p for p, ep in t.ports.items()}
        for c in dp.conntrack(t.zone):
            if not _allowed(pol, by_ip, c):
                victims.append(c.key)
    return dp.ct_flush(keys=victims) if victims else 0


def _allowed(pol: Policy, by_ip: Dict[Any, str], c: Any) -> bool:
    o, r = c.orig, c.reply
    try:
        src, dst = ipaddress.ip_address(o["src"]), ipaddress.ip_address(r["src"])
    except ValueError:
        return True
    if c.proto in (1, 58):
        dport, itype, icode = 0, o.get("type", 0), o.get("code", 0)
    else:
        dport, itype, icode = r.get("sport", 0), 0, 0
    return pol.allows(by_ip.get(src), by_ip.get(dst), src, dst, c.proto, dport, itype, icode)


def annotate_trace(trace: Any, tenants: List[Any]) -> Any:
    """``trace`` with a line after each security-group flow it went through,
    naming the group and rule that allowed the connection, or the port none
    of whose rules did."""
    for p in trace.passes:
        events = []
        for ev in p.events:
            events.append(ev)
            if ev.get("kind") == "table" and ev.get("cookie"):
                d = describe_cookie(ev["cookie"], tenants)
                if d is not None:
                    verdict = "denied: " if d[3] is None else "allowed by "
                    events.append({"kind": "note", "depth": ev["depth"], "table": ev["table"], "priority": 0,
                                   "cookie": 0, "text": verdict + d[4]})
        p.events = events
    return trace


def security_counters(dp: Any, base: int) -> Dict[str, List[dict]]:
    """Hits per group rule (new connections it allowed: its flows' packets, summed)
    and denials per port, from the flows of the tenants with security groups."""
    comp = dp.topology
    tenants = [t for t in comp.topology.tenants.values() if t.security] if comp is not None else []
    if not tenants:
        return {"rules": [], "denied": []}
    counts: Dict[int, int] = {}
    for f in dp.dump_flows(f"cookie={SG_COOKIE:#x}/{SG_COOKIE:#x}"):
        counts[f.cookie] = counts.get(f.cookie, 0) + f.n_packets
    rules, denied = [], []
    for t in tenants:
        for g in t.security.groups.values():
            for r in g.ingress + (g.egress or []):
                rules.append({"tenant": t.name, "group": g.name, "direction": r.direction, "rule": r.index,
                              "text": r.text(), "hits": counts.get(rule_cookie(base, t, g, r), 0)})
        for i, (p, ep) in enumerate(t.ports.items()):
            if not ep.groups:
                continue
            for egress in (False, True):
                if egress and t.security.egress(p) is None:
                    continue
                denied.append({"tenant": t.name, "port": p, "direction": "egress" if egress else "ingress",
                               "packets": counts.get(deny_cookie(base, t, i, egress), 0)})
    return {"rules": rules, "denied": denied}
