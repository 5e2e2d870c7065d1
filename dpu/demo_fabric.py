"""``dpu demo --fabric``: the EVPN fabric scene, offline.

Two tenants with the same addresses on one dpu host, and what FRRouting would have
installed in their kernel shadows after hearing two other hosts (type-2 MACs and MAC+IPs,
type-3 flood lists, type-5 prefixes, router MACs): the mirror commits it as one
transaction, then packets show where each learned entry sends them (the L2 VNI for the same
subnet, the L3 VNI with the remote router MAC for another subnet, ARP answered locally),
then a MAC moves to another host (one flow changes) and the fabric withdraws everything.
Live, ``dpu run`` gets these entries from its own FRR (docs/fabric.md).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

from scapy.all import ARP, IP, UDP, Ether  # type: ignore
from scapy.layers.vxlan import VXLAN  # type: ignore

from .dataplane import Dataplane
from .fabric.shadow import Learned
from .mirror import FabricMirror, evpn_text, evpn_view
from .topology import load_topology

TOPOLOGY = """\
uplink: {port: p0, ip: 172.31.0.21, mac: 02:00:00:00:00:21, nexthop_mac: 02:00:00:00:00:fe}
evpn:
  asn: 65000
  peers: [172.31.0.2]          # the route reflector
tenants:
  blue:
    vni: 100
    l3vni: 4001
    gateway_mac: 02:a0:00:00:00:01
    subnets: [{cidr: 10.0.0.0/24, gateway: 10.0.0.1}]
    ports: {vm1: {mac: 02:00:00:00:01:11, ip: 10.0.0.11}}
  red:
    vni: 200
    l3vni: 4002
    gateway_mac: 02:a0:00:00:00:01
    subnets: [{cidr: 10.0.0.0/24, gateway: 10.0.0.1}]
    ports: {vm3: {mac: 02:00:00:00:03:11, ip: 10.0.0.11}}
"""
H2, H3 = "172.31.0.22", "172.31.0.23"
RMAC = {H2: "02:b0:00:00:00:22", H3: "02:b0:00:00:00:23"}
GW = "02:a0:00:00:00:01"


def installed() -> Dict[str, Learned]:
    """What FRR would install in each tenant's shadow: h2 has an endpoint in each tenant's
    10.0.0.0/24 (the same address), h3 one in blue's 10.0.2.0/24, announced as type 5."""
    return {
        "blue": Learned(macs={(100, "02:00:00:00:02:21"): H2}, flood={100: {H2, H3}},
                        neighs={(100, "10.0.0.21"): "02:00:00:00:02:21"}, rmacs=dict(RMAC),
                        routes={"10.0.0.21/32": H2, "10.0.2.0/24": H3}),
        "red": Learned(macs={(200, "02:00:00:00:03:21"): H2}, flood={200: {H2}},
                       neighs={(200, "10.0.0.21"): "02:00:00:00:03:21"}, rmacs={H2: RMAC[H2]},
                       routes={"10.0.0.21/32": H2}),
    }


def _send(dp: Dataplane, pkt: Any, port: str) -> str:
    outs = dp.process(bytes(pkt), in_port=port)
    if not outs:
        return "dropped"
    parts = []
    for o in outs:
        e = Ether(o.data)
        if VXLAN in e:
            inner = e[VXLAN].payload
            parts.append(f"VXLAN VNI {e[VXLAN].vni} to {e[IP].dst}, inner {inner.src} -> {inner.dst}"
                         + (f" ttl {inner[IP].ttl}" if IP in inner else ""))
        elif ARP in e:
            parts.append(f"ARP reply out {o.port}: {e[ARP].psrc} is at {e[ARP].hwsrc}")
        else:
            parts.append(f"out {o.port}")
    return "; ".join(parts)


def scene() -> Dict[str, Any]:
    topo = load_topology(TOPOLOGY)
    dp = Dataplane.from_topology(topo)
    mirror = FabricMirror(dp, topo)
    steps: List[Dict[str, Any]] = []

    def step(what: str, pkt: Any, port: str) -> None:
        steps.append({"what": what, "result": _send(dp, pkt, port)})

    vm1, vm3 = "02:00:00:00:01:11", "02:00:00:00:03:11"
    first = mirror.apply(installed())
    view = evpn_view(topo, mirror)
    udp = UDP(sport=4000, dport=80)
    step("blue vm1 -> 10.0.0.21 (same subnet, on h2): bridged over the L2 VNI",
         Ether(src=vm1, dst="02:00:00:00:02:21") / IP(src="10.0.0.11", dst="10.0.0.21") / udp, "vm1")
    step("red vm3 -> 10.0.0.21 (the same address, red's endpoint on h2)",
         Ether(src=vm3, dst="02:00:00:00:03:21") / IP(src="10.0.0.11", dst="10.0.0.21") / udp, "vm3")
    step("blue vm1 -> 10.0.2.31 (another subnet, on h3): routed into the L3 VNI (symmetric IRB)",
         Ether(src=vm1, dst=GW) / IP(src="10.0.0.11", dst="10.0.2.31") / udp, "vm1")
    step("blue vm1 asks ARP for 10.0.0.21: answered here from the type-2 MAC+IP route",
         Ether(src=vm1, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=vm1, psrc="10.0.0.11", pdst="10.0.0.21"), "vm1")
    step("red vm3 -> 10.0.2.31: red has no such route (blue's never leak)",
         Ether(src=vm3, dst=GW) / IP(src="10.0.0.11", dst="10.0.2.31") / udp, "vm3")
    moved = installed()
    moved["blue"].macs[(100, "02:00:00:00:02:21")] = H3
    move = mirror.apply(moved)
    step("after 02:00:00:00:02:21 moved to h3 (higher MAC mobility sequence): blue vm1 -> 10.0.0.21",
         Ether(src=vm1, dst="02:00:00:00:02:21") / IP(src="10.0.0.11", dst="10.0.0.21") / udp, "vm1")
    gone = mirror.apply({})
    step("after the fabric withdrew everything: blue vm1 -> 10.0.2.31",
         Ether(src=vm1, dst=GW) / IP(src="10.0.0.11", dst="10.0.2.31") / udp, "vm1")
    return {"view": view, "commits": {"learned": first, "move": move, "withdraw": gone}, "steps": steps,
            "transactions": mirror.snapshot()["transactions"]}


def run_fabric_demo(as_json: bool = False) -> int:
    s = scene()
    if as_json:
        print(json.dumps(s, sort_keys=True, default=str))
        return 0
    print("dpu demo --fabric: one dpu host of an EVPN fabric, offline (live, its FRR installs these)\n")
    print(evpn_text(s["view"]))
    c = s["commits"]
    print(f"what FRR installed: one transaction, {c['learned']['flows_added']} flows, "
          f"{c['learned']['groups_changed']} flood groups")
    for st in s["steps"]:
        print(f"\n  {st['what']}\n    -> {st['result']}")
    print(f"\nthe MAC move: {c['move']['flows_added']} flow changed; the withdrawal: "
          f"{c['withdraw']['flows_deleted']} flows deleted; {s['transactions']} transactions in all")
    return 0
