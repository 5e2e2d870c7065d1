"""An independent reference model of security groups (README "Security groups"), written
from the contract, not from dpu/topology/security*.py: it reads the topology as YAML data
and says whether a new connection between two of a tenant's addresses is allowed.

A port with groups accepts only new connections one of its groups' ingress rules allows;
its egress is open unless one of its groups has an `egress` list, then only what those
lists allow. A port without groups is open. Rules: proto (tcp, udp, icmp, icmpv6, any or a
number), ports (one or A-B, inclusive), type/code (ICMP), from/to (a CIDR, default any) or
from_group/to_group (the addresses of the tenant's ports in the group)."""
from __future__ import annotations

import ipaddress
from typing import Optional

PROTOS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58}


class SgModel:
    def __init__(self, tenant: dict):
        self.groups = tenant.get("security_groups") or {}
        self.ports = tenant.get("ports") or {}
        self.port_of = {ipaddress.ip_address(p["ip"]): name for name, p in self.ports.items()}

    def groups_of(self, port: Optional[str]) -> list:
        if port is None:
            return []
        return list(self.ports[port].get("security_groups") or [])

    def _members(self, group: str) -> set:
        return {ipaddress.ip_address(p["ip"]) for p in self.ports.values() if group in (p.get("security_groups") or [])}

    def _rule_admits(self, rule: dict, far: str, peer, proto: int, dport: int, itype: int, icode: int) -> bool:
        want = rule.get("proto", "any")
        if want != "any":
            if PROTOS.get(want, want) != proto:
                return False
        ports = rule.get("ports")
        if ports is not None:
            lo, hi = (ports, ports) if isinstance(ports, int) else map(int, str(ports).split("-"))
            if not lo <= dport <= hi:
                return False
        if rule.get("type") is not None and rule["type"] != itype:
            return False
        if rule.get("code") is not None and rule["code"] != icode:
            return False
        if rule.get(f"{far}_group") is not None:
            return peer in self._members(rule[f"{far}_group"])
        net = ipaddress.ip_network(rule.get(far, "0.0.0.0/0"))
        return peer.version == net.version and peer in net

    def allowed(self, src, dst, proto: int, dport: int = 0, itype: int = 0, icode: int = 0) -> bool:
        """Whether a new connection from address ``src`` to ``dst`` passes (either may be an
        address that is no port of the tenant's here: a remote endpoint or the internet)."""
        src, dst = ipaddress.ip_address(src), ipaddress.ip_address(dst)
        sport, dport_name = self.port_of.get(src), self.port_of.get(dst)
        sgroups = [self.groups[g] for g in self.groups_of(sport)]
        if any("egress" in g for g in sgroups):
            rules = [r for g in sgroups for r in (g.get("egress") or [])]
            if not any(self._rule_admits(r, "to", dst, proto, dport, itype, icode) for r in rules):
                return False
        dgroups = [self.groups[g] for g in self.groups_of(dport_name)]
        if dgroups:
            rules = [r for g in dgroups for r in (g.get("ingress") or [])]
            if not any(self._rule_admits(r, "from", src, proto, dport, itype, icode) for r in rules):
                return False
        return True

    def guarded(self, addr) -> bool:
        return bool(self.groups_of(self.port_of.get(ipaddress.ip_address(addr))))
