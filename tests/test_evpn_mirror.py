"""The fabric mirror's dataplane side (issue 28): the evpn: topology section, and what FRR
installed (dpu.fabric.shadow.Learned) compiled into flows and committed as one transaction.

In memory: packets built with scapy go through a Dataplane loaded with an EVPN topology
whose learned entries are given directly; tests/test_fabric_*.py run the kernel side and FRR.
"""
import copy
import json
import os
import subprocess
import sys

import pytest
import yaml
from scapy.all import ARP, IP, Ether
from scapy.layers.vxlan import VXLAN

from dpu import Dataplane
from dpu.errors import TopologyError
from dpu.fabric.shadow import Learned
from dpu.mirror import FabricMirror, evpn_view
from dpu.topology import EVPN_FLOOD_GROUP, compile_topology, load_topology
from helpers.packets import (
    BLUE_REMOTE_IP, BLUE_REMOTE_MAC, GW_MAC, UPLINK_MAC, VM1_IP, VM1_MAC, VM2_IP, VM2_MAC, VM3_IP, VM3_MAC,
    VTEP_BLUE, VTEP_LOCAL, arp_request, udp, vxlan,
)

TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "topology.yaml")
VTEP_X, VTEP_Y = "192.0.2.9", "192.0.2.10"
RMAC_X, RMAC_Y = "02:00:00:00:09:01", "02:00:00:00:0a:01"
MAC_X, IP_X = "02:00:00:00:02:99", "10.0.0.99"          # a blue endpoint behind VTEP_X
RED_MAC_X = "02:00:00:00:03:99"                           # red's, with the same IP, behind VTEP_Y


def evpn_dict():
    with open(TOPO) as f:
        d = yaml.safe_load(f)
    d["evpn"] = {"asn": 65000, "peers": ["172.31.0.2"]}
    d["tenants"]["blue"]["l3vni"] = 4001
    d["tenants"]["red"]["l3vni"] = 4002
    return d


@pytest.fixture
def fabric():
    topo = load_topology(evpn_dict())
    dp = Dataplane.from_topology(topo)
    return dp, FabricMirror(dp, topo)


def blue(**kw):
    return {"blue": Learned(**kw)}


def outs(dp, pkt, port):
    return [(o.port, Ether(o.data)) for o in dp.process(pkt, in_port=port)]


def only(dp, pkt, port, where):
    got = outs(dp, pkt, port)
    assert [p for p, _ in got] == [where], [(p, e.summary()) for p, e in got]
    return got[0][1]


def flow_set(dp):
    return sorted((f.table, f.priority, f.cookie, f.match, f.actions) for f in dp.dump_flows())


# ---- the evpn: section -------------------------------------------------------------------

def test_evpn_defaults_come_from_the_uplink():
    topo = load_topology(evpn_dict())
    ev = topo.evpn
    assert (ev.asn, str(ev.router_id), ev.router_mac, ev.frr) == (65000, VTEP_LOCAL, UPLINK_MAC, "managed")
    assert [str(p.address) for p in ev.peers] == ["172.31.0.2"] and ev.peers[0].remote_asn is None
    assert topo.tenants["blue"].l3vni == 4001


@pytest.mark.parametrize("change, message", [
    (lambda d: d["evpn"].update(asn=0), "evpn.asn: 0 is out of range"),
    (lambda d: d["evpn"].update(peers=[]), "evpn.peers: required with frr: managed"),
    (lambda d: d["evpn"].update(frr="yes"), "evpn.frr: 'yes' is not managed or external"),
    (lambda d: d["evpn"].update(peers=["1.1.1.1", {"address": "1.1.1.1"}]), "evpn.peers[1].address: 1.1.1.1 is already"),
    (lambda d: d["evpn"].update(peers=[VTEP_LOCAL]), "evpn.peers[0].address: 192.0.2.1 is our own VTEP address"),
    (lambda d: d["evpn"].update(peers=[{"address": "1.1.1.1", "remote_asn": -1}]), "evpn.peers[0].remote_asn"),
    (lambda d: d["evpn"].update(color=1), "evpn.color: unknown key"),
    (lambda d: d["evpn"].update(frr_dir="/run/frr"), "evpn.frr_dir: only with frr: external"),
    (lambda d: d["evpn"].update(frr="external", frr_dir="run/frr"),
     "evpn.frr_dir: 'run/frr' is not an absolute directory path"),
    (lambda d: d["evpn"].update(frr="external", frr_dir=7), "evpn.frr_dir: 7 is not an absolute directory path"),
    (lambda d: d["tenants"]["red"].update(l3vni=100), "tenants.red.l3vni: VNI 100 is already tenant blue's L2 VNI"),
    (lambda d: d["tenants"]["red"].update(l3vni=4001), "tenants.red.l3vni: VNI 4001 is already tenant blue's L3"),
    (lambda d: d.pop("evpn"), "tenants.blue.l3vni: an L3 VNI needs the evpn: section"),
    (lambda d: d["tenants"]["blue"]["remote"][0].update(pinned="yes"), "tenants.blue.remote[0].pinned"),
    (lambda d: d["tenants"]["red"].pop("l3vni"), "tenants.red.l3vni: required with evpn:"),
    (lambda d: d["tenants"].update(averyveryverylongname=d["tenants"].pop("red")),
     "tenants.averyveryverylongname: with evpn: a tenant's name is its VRF's"),
])
def test_bad_evpn_is_refused_naming_the_key(change, message):
    d = evpn_dict()
    change(d)
    with pytest.raises(TopologyError) as e:
        load_topology(d)
    assert message in str(e.value)


def test_external_frr_needs_no_peers():
    d = evpn_dict()
    d["evpn"] = {"asn": 65000, "frr": "external"}
    ev = load_topology(d).evpn
    assert ev.peers == [] and ev.frr_dir == "/var/run/frr"       # Debian's FRR run directory
    d["evpn"]["frr_dir"] = "/srv/frr/"
    assert load_topology(d).evpn.frr_dir == "/srv/frr"


def test_external_frr_found_by_its_run_directory(tmp_path):
    """ExternalFrr: alive only with a live pid in each pid file and a vty socket that answers;
    asking a dead one names what is missing and where."""
    import socket

    from dpu.errors import FabricError
    from dpu.fabric.frr import ExternalFrr

    frr = ExternalFrr(str(tmp_path), name="the operator's FRR")
    assert not frr.alive() and frr.pid("zebra") is None
    with pytest.raises(FabricError, match=f"no live zebra or bgpd .* in {tmp_path}"):
        frr.established()
    listeners = []
    for d in ("zebra", "bgpd"):
        (tmp_path / f"{d}.pid").write_text(f"{os.getpid()}\n")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(tmp_path / f"{d}.vty"))
        s.listen(1)
        listeners.append(s)
    try:
        assert frr.alive() and frr.pid("zebra") == os.getpid()
        # connections nobody accepts fill the backlog: a wedged daemon is down, not a hang
        assert not frr.alive() and frr.pid("zebra") is None
        for s in listeners:
            s.close()
        listeners = []
        for d in ("zebra", "bgpd"):
            (tmp_path / f"{d}.vty").unlink()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(tmp_path / f"{d}.vty"))
            s.listen(64)
            listeners.append(s)
        assert frr.alive()
        (tmp_path / "bgpd.pid").write_text("999999999\n")        # no such process
        assert not frr.alive() and frr.pid("zebra") == os.getpid()
    finally:
        for s in listeners:
            s.close()


def test_evpn_topology_leaves_the_underlay_address_to_the_kernel():
    """With EVPN the uplink address lives in the kernel (BGP, ARP, ICMP are its): dpu must
    not answer ARP for it too (nothing answered twice)."""
    plain = compile_topology(load_topology(TOPO)).text()
    evpn = compile_topology(load_topology(evpn_dict())).text()
    assert f"arp_tpa={VTEP_LOCAL}" in plain
    assert f"arp_tpa={VTEP_LOCAL}" not in evpn
    assert f"group_id={EVPN_FLOOD_GROUP + 1},type=all\n" in evpn
    assert f"bucket=actions=group:{EVPN_FLOOD_GROUP + 1}" in evpn


# ---- learned entries forward -------------------------------------------------------------

def test_learned_mac_goes_over_the_l2_vni_to_its_vtep(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}))
    e = only(dp, udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1", "p0")
    assert (e[IP].dst, e[VXLAN].vni) == (VTEP_X, 100)
    assert e[VXLAN].payload.dst == MAC_X, "bridged: the inner frame is the VM's"
    # and VXLAN from that VTEP is accepted on the L2 VNI, to the local port
    assert [p for p, _ in outs(dp, vxlan(udp(MAC_X, VM1_MAC, IP_X, VM1_IP), 100, VTEP_X), "p0")] == ["vm1"]


def test_arp_for_a_learned_neighbour_is_answered_locally(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, neighs={(100, IP_X): MAC_X}))
    e = only(dp, arp_request(VM1_MAC, VM1_IP, IP_X), "vm1", "vm1")
    assert (e[ARP].op, e[ARP].hwsrc, e[ARP].psrc) == (2, MAC_X, IP_X)


def test_routed_traffic_takes_the_l3_vni_with_the_remote_router_mac(fabric):
    """RFC 9135 symmetric IRB: inner source our router MAC, destination the remote VTEP's,
    TTL decremented, the tenant's L3 VNI; a /32 (type 2) and a prefix (type 5) route."""
    dp, m = fabric
    m.apply(blue(rmacs={VTEP_X: RMAC_X}, routes={"10.0.5.7/32": VTEP_X, "10.9.0.0/16": VTEP_X}))
    for dst in ("10.0.5.7", "10.9.3.3"):
        e = only(dp, udp(VM1_MAC, GW_MAC, VM1_IP, dst, ttl=64), "vm1", "p0")
        inner = e[VXLAN].payload
        assert (e[IP].dst, e[VXLAN].vni) == (VTEP_X, 4001)
        assert (inner.src, inner.dst, inner[IP].dst, inner[IP].ttl) == (UPLINK_MAC, RMAC_X, dst, 63)


def test_routed_from_the_fabric_reaches_the_local_endpoint(fabric):
    dp, m = fabric
    m.apply(blue(rmacs={VTEP_X: RMAC_X}, routes={"10.0.5.7/32": VTEP_X}))
    pkt = vxlan(udp(RMAC_X, UPLINK_MAC, "10.0.5.7", VM2_IP, ttl=63), 4001, VTEP_X)
    e = only(dp, pkt, "p0", "vm2")
    assert (e.src, e.dst, e[IP].ttl) == (GW_MAC, VM2_MAC, 62)
    # an L3 VNI frame from a VTEP the fabric did not announce is not the tenant's
    assert outs(dp, vxlan(udp(RMAC_X, UPLINK_MAC, "10.0.5.7", VM2_IP), 4001, VTEP_Y), "p0") == []
    assert dp.stats()["ports"]["p0"]["drops"] == {"unknown_vtep": 1}


def test_learned_flood_vteps_get_broadcast(fabric):
    dp, m = fabric
    m.apply(blue(flood={100: {VTEP_X, VTEP_Y}}))
    got = outs(dp, arp_request(VM1_MAC, VM1_IP, "10.0.0.77"), "vm1")
    vteps = sorted(e[IP].dst for p, e in got if p == "p0")
    assert vteps == sorted([VTEP_BLUE, VTEP_X, VTEP_Y]), "static flood VTEP and both learned ones, once each"
    assert all(e[VXLAN].vni == 100 for p, e in got if p == "p0")
    m.apply(blue(flood={100: {VTEP_Y}}))
    got = outs(dp, arp_request(VM1_MAC, VM1_IP, "10.0.0.77"), "vm1")
    assert sorted(e[IP].dst for p, e in got if p == "p0") == sorted([VTEP_BLUE, VTEP_Y])


def test_a_mac_move_is_one_changed_flow_and_packets_follow(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, flood={100: {VTEP_X, VTEP_Y}}))
    n = m.snapshot()["transactions"]
    r = m.apply(blue(macs={(100, MAC_X): VTEP_Y}, flood={100: {VTEP_X, VTEP_Y}}))
    assert (r["flows_added"], r["flows_deleted"], r["groups_changed"]) == (1, 0, 0)
    assert m.snapshot()["transactions"] == n + 1
    assert only(dp, udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1", "p0")[IP].dst == VTEP_Y


def test_a_change_counts_its_latency_from_its_first_netlink_event(fabric):
    """apply(since=) puts the time from `since` to the commit in the latency histogram; an
    apply that changes nothing, or has no `since`, counts nothing."""
    import time

    from dpu.mirror import LATENCY_BUCKETS, evpn_view
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}), since=time.monotonic() - 0.03)
    m.apply(blue(macs={(100, MAC_X): VTEP_X}), since=time.monotonic() - 9)     # nothing changed
    m.apply(blue(macs={(100, MAC_X): VTEP_Y}))                                  # no since
    m.apply(blue(macs={(100, MAC_X): VTEP_X}), since=time.monotonic() - 7.5)
    lat = m.snapshot()["latency"]
    assert lat["count"] == 2 and 7.5 <= lat["last_s"] < 8.5 and lat["max_s"] == lat["last_s"]
    assert 7.53 <= lat["sum_s"] < 9
    counts = dict((le, n) for le, n in lat["buckets"])
    assert counts[0.05] == 1 and counts[float("inf")] == 1 and sum(counts.values()) == 2
    assert [le for le, _ in lat["buckets"]] == list(LATENCY_BUCKETS) + [float("inf")]
    v = evpn_view(m.topo, m)
    assert v["change_latency"] == {"count": 2, "last_s": lat["last_s"], "max_s": lat["max_s"]}


def test_withdrawn_entries_leave_no_flow_behind(fabric):
    dp, m = fabric
    topology_flows = flow_set(dp)
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, neighs={(100, IP_X): MAC_X}, flood={100: {VTEP_X}},
                 rmacs={VTEP_X: RMAC_X}, routes={"10.0.5.7/32": VTEP_X}))
    assert len(dp.dump_flows()) > len(topology_flows)
    m.apply({})
    assert flow_set(dp) == topology_flows
    got = outs(dp, udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1")
    assert sorted(e[IP].dst for p, e in got if p == "p0") == [VTEP_BLUE], "unknown again: flooded to static only"
    assert outs(dp, udp(VM1_MAC, GW_MAC, VM1_IP, "10.0.5.7"), "vm1") == [], "the route is gone: unroutable"


def test_tenants_with_the_same_addresses_stay_apart(fabric):
    dp, m = fabric
    m.apply({"blue": Learned(macs={(100, MAC_X): VTEP_X}, neighs={(100, IP_X): MAC_X}),
             "red": Learned(macs={(200, RED_MAC_X): VTEP_Y}, neighs={(200, IP_X): RED_MAC_X})})
    assert only(dp, arp_request(VM3_MAC, VM3_IP, IP_X), "vm3", "vm3")[ARP].hwsrc == RED_MAC_X
    assert only(dp, arp_request(VM1_MAC, VM1_IP, IP_X), "vm1", "vm1")[ARP].hwsrc == MAC_X
    e = only(dp, udp(VM3_MAC, RED_MAC_X, VM3_IP, IP_X), "vm3", "p0")
    assert (e[IP].dst, e[VXLAN].vni) == (VTEP_Y, 200)
    # blue sending to red's MAC does not reach red's VTEP on red's VNI
    for p, e in outs(dp, udp(VM1_MAC, RED_MAC_X, VM1_IP, IP_X), "vm1"):
        assert p != "p0" or e[VXLAN].vni == 100
    # red's VNI entries offered under blue are left out
    r = m.apply(blue(macs={(200, RED_MAC_X): VTEP_Y}))
    assert m.snapshot()["skipped"]["other_vni"] == 1 and r["flows_added"] == 0


def test_static_entries_lose_to_learned_unless_pinned():
    d = evpn_dict()
    d["tenants"]["blue"]["remote"].append({"vtep": "192.0.2.7", "mac": MAC_X, "ip": IP_X, "pinned": True})
    topo = load_topology(d)
    dp = Dataplane.from_topology(topo)
    m = FabricMirror(dp, topo)
    m.apply(blue(macs={(100, MAC_X): VTEP_X, (100, BLUE_REMOTE_MAC): VTEP_Y}))
    assert only(dp, udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1", "p0")[IP].dst == "192.0.2.7", "pinned: static wins"
    assert only(dp, udp(VM1_MAC, BLUE_REMOTE_MAC, VM1_IP, BLUE_REMOTE_IP), "vm1", "p0")[IP].dst == VTEP_Y, \
        "not pinned: what the fabric learned wins"
    assert m.snapshot()["skipped"]["local_or_pinned"] == 1


def test_routes_without_a_router_mac_wait_for_it(fabric):
    dp, m = fabric
    m.apply(blue(routes={"10.0.5.7/32": VTEP_X}))
    assert m.snapshot()["skipped"]["no_router_mac"] == 1
    m.apply(blue(routes={"10.0.5.7/32": VTEP_X}, rmacs={VTEP_X: RMAC_X}))
    assert only(dp, udp(VM1_MAC, GW_MAC, VM1_IP, "10.0.5.7"), "vm1", "p0")[VXLAN].vni == 4001


def test_a_topology_reload_keeps_learned_flows(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, flood={100: {VTEP_X}}))
    d = evpn_dict()
    d["tenants"]["blue"]["ports"]["vm9"] = {"mac": "02:00:00:00:01:19", "ip": "10.0.0.19"}
    topo = load_topology(d)
    dp.load_topology(topo)
    assert only(dp, udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1", "p0")[IP].dst == VTEP_X
    got = outs(dp, arp_request(VM1_MAC, VM1_IP, "10.0.0.77"), "vm1")
    assert sorted(e[IP].dst for p, e in got if p == "p0") == sorted([VTEP_BLUE, VTEP_X])
    assert m.retopology(topo)["flows_added"] == 0, "nothing to change: same tenants, same indexes"


def test_learned_flows_do_not_cost_unrelated_megaflows(fabric):
    """A learned change revalidates; cached megaflows of traffic it cannot affect stay
    (no flush of every cache: the dataplane's versioned rules)."""
    dp, m = fabric
    pkt = udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP)
    for _ in range(3):
        dp.process(pkt, in_port="vm1")
    upcalls = dp.stats()["workers"][0]["upcalls"]
    for i in range(50):
        m.apply(blue(macs={(100, f"02:00:00:00:77:{i:02x}"): VTEP_X}))
        dp.process(pkt, in_port="vm1")
    assert dp.stats()["workers"][0]["upcalls"] == upcalls


def test_ten_thousand_macs_and_a_thousand_vteps_apply_in_one_transaction(fabric):
    dp, m = fabric
    vteps = [f"172.30.{i // 250}.{i % 250 + 1}" for i in range(1000)]
    macs = {(100, f"02:01:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}:01"): vteps[i % 1000]
            for i in range(10_000)}
    r = m.apply(blue(macs=macs, flood={100: set(vteps)}))
    assert r["flows_added"] == 10_000 + 2 * 1000 and m.snapshot()["transactions"] == 1
    mac = "02:01:00:27:0f:01"   # i = 9999
    assert only(dp, udp(VM1_MAC, mac, VM1_IP, IP_X), "vm1", "p0")[IP].dst == vteps[9999 % 1000]
    # a burst of 1,000 changes is one more transaction of 1,000 flows
    moved = dict(macs)
    for i in range(1000):
        k = (100, f"02:01:00:{i >> 8 & 255:02x}:{i & 255:02x}:01")
        moved[k] = vteps[(i + 1) % 1000]
    r = m.apply(blue(macs=moved, flood={100: set(vteps)}))
    assert (r["flows_added"], r["flows_deleted"]) == (1000, 0) and m.snapshot()["transactions"] == 2


# ---- dpu evpn ------------------------------------------------------------------------------

def test_evpn_view_lists_vnis_vteps_macs_and_routes(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, neighs={(100, IP_X): MAC_X}, flood={100: {VTEP_X}},
                 rmacs={VTEP_X: RMAC_X}, routes={"10.9.0.0/16": VTEP_X}))
    v = evpn_view(m.topo, m)
    b = v["tenants"]["blue"]
    assert (b["vni"], b["l3vni"]) == (100, 4001)
    assert {"mac": MAC_X, "ip": IP_X, "vtep": VTEP_X, "source": "learned", "route": "type-2 MAC+IP"} in b["macs"]
    assert {"vtep": VTEP_X, "source": "learned", "router_mac": RMAC_X} in b["vteps"]
    assert b["routes"] == [{"prefix": "10.9.0.0/16", "vtep": VTEP_X, "router_mac": RMAC_X, "route": "prefix route"}]
    assert v["learned"]["blue"]["macs"] == 1 and v["transactions"] == 1
    assert v["tenants"]["red"]["macs"][0]["source"] == "local"


def test_dpu_evpn_offline(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(evpn_dict()))
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "evpn", "--config", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "EVPN: AS 65000, router-id 192.0.2.1" in r.stdout
    assert "tenant blue: L2 VNI 100, L3 VNI 4001" in r.stdout
    assert f"{BLUE_REMOTE_MAC}  {BLUE_REMOTE_IP}" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "evpn", "--config", str(path), "--json"],
                       capture_output=True, text=True, timeout=60)
    v = json.loads(r.stdout)
    assert v["evpn"]["peers"] == [{"address": "172.31.0.2", "remote_asn": 65000, "ebgp": False}]
    bad = copy.deepcopy(evpn_dict())
    bad["evpn"]["asn"] = "x"
    path.write_text(yaml.safe_dump(bad))
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "evpn", "--config", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "evpn.asn" in r.stderr and "Traceback" not in r.stderr


def test_trace_names_the_learned_entry_a_packet_used(fabric):
    dp, m = fabric
    m.apply(blue(macs={(100, MAC_X): VTEP_X}, rmacs={VTEP_X: RMAC_X}, routes={"10.9.0.0/16": VTEP_X}))
    text = str(m.annotate(dp.trace(udp(VM1_MAC, GW_MAC, VM1_IP, "10.9.3.3"), "vm1")))
    assert f"learned from the fabric: prefix route 10.9.0.0/16 via {VTEP_X} (rmac {RMAC_X})" in text
    text = str(m.annotate(dp.trace(udp(VM1_MAC, MAC_X, VM1_IP, IP_X), "vm1")))
    assert f"learned from the fabric: type-2 MAC {MAC_X} vni 100 via {VTEP_X}" in text
    text = str(m.annotate(dp.trace(udp(VM1_MAC, VM2_MAC, VM1_IP, VM2_IP), "vm1")))
    assert "learned from the fabric" not in text


def test_fabric_demo_shows_each_learned_entry_at_work():
    r = subprocess.run([sys.executable, "-m", "dpu.cli", "demo", "--fabric", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    got = [st["result"] for st in s["steps"]]
    assert got[0].startswith("VXLAN VNI 100 to 172.31.0.22")
    assert got[1].startswith("VXLAN VNI 200 to 172.31.0.22")
    assert got[2] == "VXLAN VNI 4001 to 172.31.0.23, inner 02:00:00:00:00:21 -> 02:b0:00:00:00:23 ttl 63"
    assert got[3] == "ARP reply out vm1: 10.0.0.21 is at 02:00:00:00:02:21"
    assert got[4] == "dropped" and got[6] == "dropped"
    assert got[5].startswith("VXLAN VNI 100 to 172.31.0.23")
    assert s["commits"]["move"]["flows_added"] == 1 and s["transactions"] == 3


def test_evpn_churn_benchmark_runs_its_changes():
    """dpu bench evpn-churn on a short run: the learned state loads in one transaction and
    the route changes are committed while the traffic runs (the rates are the benchmark's)."""
    from dpu import bench

    r = bench.run("evpn-churn", packets=100_000, repeat=1)
    assert r["initial_flows"] == bench.EVPN_MACS + bench.EVPN_ROUTES + 2 * bench.EVPN_VTEPS + 2 * bench.EVPN_VTEPS
    assert r["route_changes"] >= bench.EVPN_BURST and r["mpps"] > 0 and r["capacity_route_changes_per_s"] > 0
