"""Security groups (issue: stateful per-port policy from the topology), through the API:
examples/security-groups.yaml compiled and fed packets built with scapy. Each semantic of
the issue is checked in both directions and with its drop reason: a port with groups
accepts only what its ingress rules allow, sends only what its egress rules allow (when
it has any), replies and related ICMP errors pass, a port without groups is open; between
ports of a subnet, routed between subnets, from a remote VTEP, to and from the internet
(after DNAT, on the private address and port); ARP and the gateway are never blocked. A
reload applies at once to new connections and cuts the established ones it no longer
allows. Counters per rule and per port, the trace's naming, and the topology's errors."""
import os

import pytest
import yaml
from scapy.all import ARP, ICMP, IP, TCP, UDP, Ether, IPerror, UDPerror

from dpu import Dataplane
from dpu.errors import TopologyError
from dpu.topology import compile_topology, load_topology
from helpers.checksums import assert_checksums
from helpers.packets import (BLUE_REMOTE_IP, BLUE_REMOTE_MAC, BLUE_VNI, GW_MAC, INET_MAC, INET_NEXTHOP_MAC, VM1_IP,
                             VM1_MAC, VM2_IP, VM2_MAC, VTEP_BLUE, from_internet, vxlan)

HERE = os.path.dirname(__file__)
SG_TOPO = os.path.join(HERE, "..", "examples", "security-groups.yaml")
VM4_MAC, VM4_IP = "02:00:00:00:01:14", "10.0.0.14"
VM5_MAC, VM5_IP = "02:00:00:00:01:15", "10.0.0.15"
SNAT, FLOATING = "203.0.113.10", "203.0.113.12"
SERVER = "198.51.100.7"


@pytest.fixture
def dp():
    return Dataplane.from_topology(SG_TOPO)


def l2(src_mac, src_ip, dst_mac, dst_ip, l4, ttl=64):
    return Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, ttl=ttl) / l4


def ports_of(outs):
    return sorted(o.port for o in outs)


def reasons(dp):
    return dp.stats()["tenants"]["blue"]["drops"]


def send(dp, pkt, port):
    before = dict(reasons(dp))
    outs = dp.process(pkt, in_port=port)
    after = reasons(dp)
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return outs, new


def syn(sport, dport, seq=100):
    return TCP(sport=sport, dport=dport, flags="S", seq=seq)


def synack(sport, dport, seq=500, ack=101):
    return TCP(sport=sport, dport=dport, flags="SA", seq=seq, ack=ack)


# ---- the topology ------------------------------------------------------------------------------


def test_groups_load_as_written():
    blue = load_topology(SG_TOPO).tenants["blue"]
    pol = blue.security
    assert list(pol.groups) == ["web", "admin", "dns_only"]
    assert [r.text() for r in pol.groups["web"].ingress] == [
        "tcp 80 from 0.0.0.0/0", "tcp 8000-8100 from group admin", "icmp from 10.0.0.0/8"]
    assert pol.groups["web"].egress is None and pol.groups["dns_only"].egress[0].text() == "udp 53 to 0.0.0.0/0"
    assert pol.port_groups == {"vm1": ["admin"], "vm2": ["web"], "vm5": ["dns_only"]}
    assert [str(a) for a in pol.members["admin"]] == [VM1_IP]
    assert blue.ports["vm4"].groups == []


def test_tenants_without_groups_compile_as_before():
    """A tenant without groups gets no security-group table and no conntrack on its traffic."""
    text = compile_topology(load_topology(SG_TOPO)).text()
    red = [ln for ln in text.splitlines() if "metadata=0xc8" in ln]
    assert red and not any(ln.startswith(("table=2,", "table=3,", "table=4,", "table=5,", "table=6,")) for ln in red)
    assert not any("ct(" in ln for ln in red)
    plain = compile_topology(load_topology(os.path.join(HERE, "..", "examples", "nat-gateway.yaml"))).text()
    assert "security" not in plain and "table=2," not in plain


def test_compiled_flows_are_readable_in_their_own_tables():
    text = compile_topology(load_topology(SG_TOPO)).text()
    for n in (2, 3, 4, 5, 6):
        assert f"# table {n}: tenant blue (vni 100, zone 100): security groups" in text
    assert "tcp,nw_dst=10.0.1.12,tp_dst=80,actions=ct(commit,zone=100),goto_table:6" in text
    # 8000-8100 as the fewest prefixes, from the admin group's one member
    assert [ln.split("tp_dst=")[1].split(",")[0] for ln in text.splitlines()
            if "nw_src=10.0.0.11" in ln and "table=5," in ln] == ["0x1f40/0xffc0", "0x1f80/0xffe0",
                                                                    "0x1fa0/0xfffc", "8100"]


# ---- between ports -------------------------------------------------------------------------------


def test_open_port_reaches_a_web_port_and_the_reply_comes_back(dp):
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(40000, 80)), "vm4")   # routed: 10.0.0 -> 10.0.1
    assert ports_of(outs) == ["vm2"] and not drops
    out = Ether(outs[0].data)
    assert out[IP].ttl == 63 and out.dst == VM2_MAC
    assert_checksums(out)
    # the reply: vm2 has no egress rules, and it is a reply anyway
    outs, drops = send(dp, l2(VM2_MAC, VM2_IP, GW_MAC, VM4_IP, synack(80, 40000)), "vm2")
    assert ports_of(outs) == ["vm4"] and not drops


def test_port_not_allowed_is_dropped_with_its_reason(dp):
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(40001, 22)), "vm4")
    assert outs == [] and drops == {"security_group": 1}
    # the same from a group member: 22 is in no rule either
    outs, drops = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, VM2_IP, syn(40002, 22)), "vm1")
    assert outs == [] and drops == {"security_group": 1}


def test_from_group_admits_its_members_only(dp):
    outs, drops = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, VM2_IP, syn(40003, 8080)), "vm1")
    assert ports_of(outs) == ["vm2"] and not drops
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(40004, 8080)), "vm4")
    assert outs == [] and drops == {"security_group": 1}
    # the range's ends, and one past them
    for port, ok in ((8000, True), (8100, True), (7999, False), (8101, False)):
        outs, _ = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, VM2_IP, syn(41000 + port % 1000, port)), "vm1")
        assert (ports_of(outs) == ["vm2"]) is ok, port


def test_a_port_whose_groups_allow_no_ingress_still_gets_its_replies(dp):
    # vm1 (admin: ingress []) accepts nothing new, on the same subnet (L2) ...
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, VM1_IP, syn(40010, 22)), "vm4")
    assert outs == [] and drops == {"security_group": 1}
    # ... but what it starts is answered, both ways, for the whole connection
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, VM4_MAC, VM4_IP, syn(40011, 22)), "vm1")
    assert ports_of(outs) == ["vm4"]
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, VM1_IP, synack(22, 40011)), "vm4")
    assert ports_of(outs) == ["vm1"] and not drops
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, VM4_MAC, VM4_IP, TCP(sport=40011, dport=22, flags="A", seq=101, ack=501)),
                   "vm1")
    assert ports_of(outs) == ["vm4"]


def test_icmp_rule_and_echo_reply(dp):
    ping = ICMP(type=8, id=7, seq=1)
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, ping), "vm4")
    assert ports_of(outs) == ["vm2"] and not drops
    outs, drops = send(dp, l2(VM2_MAC, VM2_IP, GW_MAC, VM4_IP, ICMP(type=0, id=7, seq=1)), "vm2")
    assert ports_of(outs) == ["vm4"] and not drops
    # vm1 (admin) takes no ping
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, VM1_IP, ping), "vm4")
    assert outs == [] and drops == {"security_group": 1}


def test_icmp_errors_related_to_an_allowed_connection_pass(dp):
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, VM4_MAC, VM4_IP, UDP(sport=5000, dport=6000)), "vm1")
    assert ports_of(outs) == ["vm4"]
    err = ICMP(type=3, code=3) / IPerror(src=VM1_IP, dst=VM4_IP) / UDPerror(sport=5000, dport=6000)
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, VM1_IP, err), "vm4")
    assert ports_of(outs) == ["vm1"] and not drops
    # an error about a connection that never was is not related: vm1 takes nothing new
    err = ICMP(type=3, code=3) / IPerror(src=VM1_IP, dst=VM4_IP) / UDPerror(sport=5001, dport=6001)
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, VM1_IP, err), "vm4")
    assert outs == []


def test_egress_rules_limit_what_a_port_sends(dp):
    outs, drops = send(dp, l2(VM5_MAC, VM5_IP, VM4_MAC, VM4_IP, UDP(sport=5353, dport=53)), "vm5")
    assert ports_of(outs) == ["vm4"] and not drops
    outs, drops = send(dp, l2(VM5_MAC, VM5_IP, VM4_MAC, VM4_IP, syn(40020, 80)), "vm5")
    assert outs == [] and drops == {"security_group": 1}
    # and its answer comes back, though dns_only allows no ingress
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM5_MAC, VM5_IP, UDP(sport=53, dport=5353)), "vm4")
    assert ports_of(outs) == ["vm5"] and not drops


def test_open_ports_between_themselves_are_not_tracked(dp):
    outs, _ = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, BLUE_REMOTE_IP, syn(40030, 9999)), "vm4")
    assert ports_of(outs) == ["p0"]
    assert dp.conntrack(100) == []


def test_l2_to_a_guarded_port_must_be_addressed_to_it(dp):
    """vm1's MAC with another address: not judged as vm1's, so not delivered to vm1."""
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, VM1_MAC, "10.0.0.99", syn(40040, 22)), "vm4")
    assert outs == [] and drops == {"security_group": 1}


def test_flooded_ip_reaches_only_open_ports(dp):
    outs, _ = send(dp, l2(VM4_MAC, VM4_IP, "ff:ff:ff:ff:ff:ff", "10.0.0.255", UDP(sport=1, dport=2)), "vm4")
    assert ports_of(outs) == ["p0"]   # the flood VTEP; vm1 and vm5 have groups
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, "ff:ff:ff:ff:ff:ff", "10.0.0.255", UDP(sport=1, dport=2)), "vm1")
    assert ports_of(outs) == ["p0", "vm4"]


def test_arp_and_the_gateway_are_never_blocked(dp):
    outs = dp.process(Ether(src=VM4_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=VM4_MAC, psrc=VM4_IP, pdst=VM1_IP),
                      in_port="vm4")
    assert ports_of(outs) == ["vm4"] and Ether(outs[0].data)[ARP].hwsrc == VM1_MAC
    outs = dp.process(Ether(src=VM1_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=VM1_MAC, psrc=VM1_IP,
                                                                          pdst="10.0.0.1"), in_port="vm1")
    assert Ether(outs[0].data)[ARP].hwsrc == GW_MAC
    tr = dp.trace(l2(VM1_MAC, VM1_IP, GW_MAC, "10.0.0.1", ICMP(type=8)), "vm1")
    assert "security_group" not in (tr.drop_reason or "") and not any(p.recirc_id for p in tr.passes)


# ---- the fabric -------------------------------------------------------------------------------------


def test_from_a_remote_vtep(dp):
    inner = l2(BLUE_REMOTE_MAC, BLUE_REMOTE_IP, GW_MAC, VM2_IP, syn(40050, 80))
    inner = Ether(src=BLUE_REMOTE_MAC, dst=VM2_MAC) / IP(src=BLUE_REMOTE_IP, dst=VM2_IP) / syn(40050, 80)
    outs, drops = send(dp, vxlan(inner, BLUE_VNI, VTEP_BLUE), "p0")
    assert ports_of(outs) == ["vm2"] and not drops
    outs, _ = send(dp, l2(VM2_MAC, VM2_IP, BLUE_REMOTE_MAC, BLUE_REMOTE_IP, synack(80, 40050)), "vm2")
    assert ports_of(outs) == ["p0"]
    inner = Ether(src=BLUE_REMOTE_MAC, dst=VM2_MAC) / IP(src=BLUE_REMOTE_IP, dst=VM2_IP) / syn(40051, 22)
    outs, drops = send(dp, vxlan(inner, BLUE_VNI, VTEP_BLUE), "p0")
    assert outs == [] and drops == {"security_group": 1}
    inner = Ether(src=BLUE_REMOTE_MAC, dst=VM1_MAC) / IP(src=BLUE_REMOTE_IP, dst=VM1_IP) / syn(40052, 22)
    outs, drops = send(dp, vxlan(inner, BLUE_VNI, VTEP_BLUE), "p0")
    assert outs == [] and drops == {"security_group": 1}
    # what vm1 starts towards the remote machine is answered
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, BLUE_REMOTE_MAC, BLUE_REMOTE_IP, syn(40053, 443)), "vm1")
    assert ports_of(outs) == ["p0"]
    inner = Ether(src=BLUE_REMOTE_MAC, dst=VM1_MAC) / IP(src=BLUE_REMOTE_IP, dst=VM1_IP) / synack(443, 40053)
    outs, drops = send(dp, vxlan(inner, BLUE_VNI, VTEP_BLUE), "p0")
    assert ports_of(outs) == ["vm1"] and not drops


# ---- the internet --------------------------------------------------------------------------------------


def test_forward_is_judged_on_the_private_port(dp):
    outs, drops = send(dp, from_internet(SERVER, SNAT, syn(50000, 8080)), "inet")   # -> vm2:80
    assert ports_of(outs) == ["vm2"] and not drops
    assert Ether(outs[0].data)[TCP].dport == 80
    outs, drops = send(dp, from_internet(SERVER, SNAT, syn(50001, 2222)), "inet")   # -> vm2:22
    assert outs == [] and drops == {"security_group": 1}
    # a denied connection leaves nothing behind
    assert not [c for c in dp.conntrack(100) if c.orig["sport"] == 50001]


def test_floating_address_is_judged_on_the_private_address(dp):
    outs, drops = send(dp, from_internet(SERVER, FLOATING, syn(50010, 80)), "inet")
    assert ports_of(outs) == ["vm2"] and not drops and Ether(outs[0].data)[IP].dst == VM2_IP
    outs, drops = send(dp, from_internet(SERVER, FLOATING, syn(50011, 22)), "inet")
    assert outs == [] and drops == {"security_group": 1}
    # ping from outside 10.0.0.0/8: the icmp rule does not admit it
    outs, drops = send(dp, from_internet(SERVER, FLOATING, ICMP(type=8, id=1)), "inet")
    assert outs == [] and drops == {"security_group": 1}


def test_snat_from_a_port_without_ingress_rules_gets_its_replies(dp):
    outs, drops = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, SERVER, syn(40060, 443)), "vm1")
    assert ports_of(outs) == ["inet"] and not drops
    sport = Ether(outs[0].data)[TCP].sport
    outs, drops = send(dp, from_internet(SERVER, SNAT, synack(443, sport)), "inet")
    assert ports_of(outs) == ["vm1"] and not drops


def test_egress_rules_apply_to_the_internet(dp):
    outs, drops = send(dp, l2(VM5_MAC, VM5_IP, GW_MAC, "9.9.9.9", UDP(sport=5300, dport=53)), "vm5")
    assert ports_of(outs) == ["inet"] and not drops
    assert Ether(outs[0].data)[IP].src == SNAT
    outs, drops = send(dp, l2(VM5_MAC, VM5_IP, GW_MAC, SERVER, syn(40070, 443)), "vm5")
    assert outs == [] and drops == {"security_group": 1}


# ---- counters, trace -------------------------------------------------------------------------------------


def test_hits_per_rule_and_denials_per_port(dp):
    from dpu.topology import TOPOLOGY_COOKIE
    from dpu.topology.security_flows import security_counters

    for i in range(3):
        dp.process(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(42000 + i, 80)), in_port="vm4")
        # established packets are not judged again: the rule counts connections
        dp.process(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, TCP(sport=42000 + i, dport=80, flags="A", seq=101, ack=1)),
                   in_port="vm4")
    dp.process(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(42100, 22)), in_port="vm4")
    dp.process(from_internet(SERVER, SNAT, syn(50100, 8080)), in_port="inet")
    c = security_counters(dp, TOPOLOGY_COOKIE)
    rules = {(r["tenant"], r["group"], r["direction"], r["rule"]): r for r in c["rules"]}
    assert rules[("blue", "web", "ingress", 0)]["hits"] == 4     # 3 from vm4, 1 through the forward
    assert rules[("blue", "web", "ingress", 0)]["text"] == "tcp 80 from 0.0.0.0/0"
    assert rules[("blue", "web", "ingress", 1)]["hits"] == 0
    denied = {(d["tenant"], d["port"], d["direction"]): d["packets"] for d in c["denied"]}
    assert denied[("blue", "vm2", "ingress")] == 1
    assert dp.stats()["tenants"]["blue"]["drops"]["security_group"] == 1


def test_trace_names_the_rule_or_says_none_did(dp):
    tr = str(dp.trace(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(43000, 80)), "vm4"))
    assert "allowed by security group web ingress[0]: tcp 80 from 0.0.0.0/0" in tr
    tr2 = dp.trace(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(43001, 22)), "vm4")
    assert tr2.drop_reason == "security_group"
    assert "denied: no ingress rule of port vm2's groups allowed it" in str(tr2)


# ---- a reload ---------------------------------------------------------------------------------------------


def _without_web_80():
    d = yaml.safe_load(open(SG_TOPO))
    d["tenants"]["blue"]["security_groups"]["web"]["ingress"].pop(0)
    return d


def test_reload_cuts_what_is_no_longer_allowed_and_keeps_the_rest(dp):
    # an established web connection (vm4 -> vm2:80) and an allowed ping-free admin one (vm1 -> vm2:8080)
    dp.process(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(44000, 80)), in_port="vm4")
    dp.process(l2(VM2_MAC, VM2_IP, GW_MAC, VM4_IP, synack(80, 44000)), in_port="vm2")
    dp.process(l2(VM1_MAC, VM1_IP, GW_MAC, VM2_IP, syn(44001, 8080)), in_port="vm1")
    dp.process(l2(VM2_MAC, VM2_IP, GW_MAC, VM1_IP, synack(8080, 44001)), in_port="vm2")
    # and one through the forward from the internet
    dp.process(from_internet(SERVER, SNAT, syn(50200, 8080)), in_port="inet")
    assert len(dp.conntrack(100)) == 3
    res = dp.load_topology(_without_web_80())
    assert res["connections_cut"] == 2
    left = dp.conntrack(100)
    assert len(left) == 1 and left[0].orig["dport"] == 8080 and left[0].orig["src"] == VM1_IP
    # the cut one is dropped both ways; the kept one goes on
    ack = TCP(sport=44000, dport=80, flags="A", seq=101, ack=501)
    assert dp.process(l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, ack), in_port="vm4") == []
    assert dp.process(l2(VM2_MAC, VM2_IP, GW_MAC, VM4_IP, TCP(sport=80, dport=44000, flags="A", seq=501, ack=101)),
                      in_port="vm2") == []
    ack = TCP(sport=44001, dport=8080, flags="A", seq=101, ack=501)
    assert ports_of(dp.process(l2(VM1_MAC, VM1_IP, GW_MAC, VM2_IP, ack), in_port="vm1")) == ["vm2"]
    # new connections see the new rules at once
    outs, drops = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(44002, 80)), "vm4")
    assert outs == [] and drops == {"security_group": 1}


def test_reload_moves_a_port_into_a_group(dp):
    outs, _ = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, VM4_IP, syn(45000, 22)), "vm1")
    assert ports_of(outs) == ["vm4"]
    d = yaml.safe_load(open(SG_TOPO))
    d["tenants"]["blue"]["ports"]["vm4"]["security_groups"] = ["admin"]   # vm4 now takes nothing new
    res = dp.load_topology(d)
    assert res["connections_cut"] == 1
    outs, drops = send(dp, l2(VM1_MAC, VM1_IP, GW_MAC, VM4_IP, syn(45001, 22)), "vm1")
    assert outs == [] and drops == {"security_group": 1}
    # and vm4 is now a member of admin: vm2's 8000-8100 admits it
    outs, _ = send(dp, l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(45002, 8000)), "vm4")
    assert ports_of(outs) == ["vm2"]


# ---- what the topology may not say ----------------------------------------------------------------------


def _with(mutate):
    d = yaml.safe_load(open(SG_TOPO))
    mutate(d["tenants"]["blue"])
    return d


@pytest.mark.parametrize("mutate, path, words", [
    (lambda b: b["ports"]["vm4"].__setitem__("security_groups", ["nope"]),
     "tenants.blue.ports.vm4.security_groups", "unknown security group 'nope'"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "icmp", "ports": 80}),
     "tenants.blue.security_groups.web.ingress[3].ports", "not to icmp"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "icmp", "from": "::/0"}),
     "tenants.blue.security_groups.web.ingress[3].from", "IPv6 network"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "icmpv6", "from": "10.0.0.0/8"}),
     "tenants.blue.security_groups.web.ingress[3].from", "IPv4 network"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "ports": "90-80"}),
     "tenants.blue.security_groups.web.ingress[3].ports", "upside down"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "from_group": "web"}),
     "tenants.blue.security_groups.web.ingress[3].from_group", "refers to itself"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "from_group": "ghosts"}),
     "tenants.blue.security_groups.web.ingress[3].from_group", "unknown security group 'ghosts'"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "to": "0.0.0.0/0"}),
     "tenants.blue.security_groups.web.ingress[3].to", "names `from`"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "gre"}),
     "tenants.blue.security_groups.web.ingress[3].proto", "not a protocol"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "ports": 70000}),
     "tenants.blue.security_groups.web.ingress[3].ports", "out of range"),
    (lambda b: b["security_groups"]["web"]["ingress"].append({"proto": "tcp", "from": "10.0.0.1/8"}),
     "tenants.blue.security_groups.web.ingress[3].from", "not a CIDR"),
])
def test_bad_groups_are_errors_naming_the_path(mutate, path, words):
    with pytest.raises(TopologyError) as e:
        load_topology(_with(mutate))
    msg = str(e.value)
    assert path in msg and words in msg, msg


def test_a_bad_group_changes_nothing_on_reload(dp):
    def flows():
        return sorted((f.table, f.priority, f.cookie, f.match, f.actions) for f in dp.dump_flows())
    before, version = flows(), dp.version
    with pytest.raises(TopologyError):
        dp.load_topology(_with(lambda b: b["ports"]["vm4"].__setitem__("security_groups", ["nope"])))
    assert flows() == before and dp.version == version


# ---- against an independent model, on random groups (helpers/sg_model.py) ------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.sg_model import SgModel  # noqa: E402

PORTS = {"vm1": (VM1_MAC, VM1_IP), "vm2": (VM2_MAC, VM2_IP), "vm4": (VM4_MAC, VM4_IP), "vm5": (VM5_MAC, VM5_IP)}
PEERS = ["0.0.0.0/0", "10.0.0.0/8", "10.0.0.0/24", "10.0.1.0/24", "10.0.0.11/32", "10.0.0.21/32",
         "198.51.100.0/24", "172.16.0.0/12"]
SERVICE_PORTS = [22, 53, 80, 443, 8000, 8080]


@st.composite
def rules(draw, far):
    proto = draw(st.sampled_from(["tcp", "udp", "icmp", "any", 6]))
    r = {"proto": proto}
    if proto in ("tcp", "udp", 6) and draw(st.booleans()):
        lo = draw(st.sampled_from(SERVICE_PORTS + [1, 1000]))
        hi = draw(st.sampled_from([lo, lo + 1, lo + 100, 65535]))
        r["ports"] = lo if lo == hi else f"{lo}-{hi}"
    if proto == "icmp" and draw(st.booleans()):
        r["type"] = draw(st.sampled_from([0, 8]))
    if draw(st.integers(0, 3)) == 0:
        r[f"{far}_group"] = "g0"   # resolved below: never a group's own name
    else:
        r[far] = draw(st.sampled_from(PEERS))
    return r


@st.composite
def sg_topologies(draw):
    d = yaml.safe_load(open(SG_TOPO))
    blue = d["tenants"]["blue"]
    names = [f"g{i}" for i in range(draw(st.integers(1, 3)))]
    groups = {}
    for i, g in enumerate(names):
        body = {"ingress": draw(st.lists(rules("from"), max_size=4))}
        if draw(st.booleans()):
            body["egress"] = draw(st.lists(rules("to"), max_size=3))
        others = [n for n in names if n != g]
        for r in body["ingress"] + body.get("egress", []):
            for k in ("from_group", "to_group"):
                if k in r:
                    if others:
                        r[k] = draw(st.sampled_from(others))
                    else:
                        r[k.split("_")[0]] = "0.0.0.0/0"
                        del r[k]
        groups[g] = body
    blue["security_groups"] = groups
    for p in blue["ports"]:
        blue["ports"][p].pop("security_groups", None)
        chosen = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
        if chosen:
            blue["ports"][p]["security_groups"] = chosen
    return d


@st.composite
def attempts(draw):
    ends = list(PORTS) + ["remote"]
    src = draw(st.sampled_from(ends))
    dst = draw(st.sampled_from([e for e in ends if e != src and not (src == "remote" and e == "remote")]))
    proto = draw(st.sampled_from([6, 17, 1]))
    dport = draw(st.sampled_from(SERVICE_PORTS + [7, 8001, 9999]))
    return src, dst, proto, dport


def _frame(src, dst, l4):
    if src == "remote":
        m, ip = PORTS[dst]
        return vxlan(Ether(src=BLUE_REMOTE_MAC, dst=m) / IP(src=BLUE_REMOTE_IP, dst=ip) / l4, BLUE_VNI, VTEP_BLUE), "p0"
    smac, sip = PORTS[src]
    dip = BLUE_REMOTE_IP if dst == "remote" else PORTS[dst][1]
    dmac = BLUE_REMOTE_MAC if dst == "remote" else PORTS[dst][0]
    same = dip.rsplit(".", 1)[0] == sip.rsplit(".", 1)[0]
    return Ether(src=smac, dst=dmac if same else GW_MAC) / IP(src=sip, dst=dip) / l4, src


def _addr(end):
    return BLUE_REMOTE_IP if end == "remote" else PORTS[end][1]


def _delivered(outs, dst):
    want = "p0" if dst == "remote" else dst
    return [o for o in outs if o.port == want]


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(topo=sg_topologies(), tries=st.lists(attempts(), min_size=1, max_size=12))
def test_random_groups_match_the_model(topo, tries):
    """New connections between random ends (local ports, the remote endpoint through the
    fabric) under random groups: delivered exactly when the model allows them, dropped as
    security_group otherwise; the reply of each allowed one is delivered too."""
    model = SgModel(topo["tenants"]["blue"])
    dp = Dataplane.from_topology(topo)
    for n, (src, dst, proto, dport) in enumerate(tries):
        sport = 20000 + n
        l4 = {6: syn(sport, dport), 17: UDP(sport=sport, dport=dport), 1: ICMP(type=8, id=sport)}[proto]
        frame, port = _frame(src, dst, l4)
        ok = model.allowed(_addr(src), _addr(dst), proto, dport if proto != 1 else 0, 8 if proto == 1 else 0)
        tracked = model.guarded(_addr(src)) or model.guarded(_addr(dst))
        outs, drops = send(dp, frame, port)
        got = _delivered(outs, dst)
        assert bool(got) == ok, (src, dst, proto, dport, topo["tenants"]["blue"]["security_groups"],
                                 {p: v.get("security_groups") for p, v in topo["tenants"]["blue"]["ports"].items()})
        if not ok:
            assert drops == {"security_group": 1}, drops
            continue
        rl4 = {6: synack(dport, sport), 17: UDP(sport=dport, dport=sport), 1: ICMP(type=0, id=sport)}[proto]
        frame, port = _frame(dst, src, rl4)
        outs, drops = send(dp, frame, port)
        assert _delivered(outs, src), ("reply", src, dst, proto, dport, tracked, drops)


def test_endpoint_independent_filtering_is_judged_after_translation():
    """With endpoint-independent filtering, anyone may send to a machine's mapping: what its
    groups do not allow is dropped, on the first packet and on every one after it."""
    d = yaml.safe_load(open(SG_TOPO))
    d["tenants"]["blue"]["nat"]["filtering"] = "endpoint-independent"
    d["tenants"]["blue"]["nat"]["floating"] = []
    d["tenants"]["blue"]["nat"]["forwards"] = []
    dp = Dataplane.from_topology(d)
    # vm2 opens a UDP mapping towards one server ...
    outs = dp.process(l2(VM2_MAC, VM2_IP, GW_MAC, SERVER, UDP(sport=5000, dport=53)), in_port="vm2")
    assert ports_of(outs) == ["inet"]
    mapped = Ether(outs[0].data)[UDP].sport
    # ... whose answer comes back
    outs, drops = send(dp, from_internet(SERVER, SNAT, UDP(sport=53, dport=mapped)), "inet")
    assert ports_of(outs) == ["vm2"] and not drops
    # another host reaches the mapping: filtering lets it in, vm2's group (web: tcp 80, icmp) does not
    for _ in range(2):
        outs, drops = send(dp, from_internet("192.0.2.99", SNAT, UDP(sport=7, dport=mapped)), "inet")
        assert outs == [] and drops == {"security_group": 1}
    # without groups on vm2 the same packet is let in (the filtering itself works)
    del d["tenants"]["blue"]["ports"]["vm2"]["security_groups"]
    dp.load_topology(d)
    dp.process(l2(VM2_MAC, VM2_IP, GW_MAC, SERVER, UDP(sport=5001, dport=53)), in_port="vm2")
    conns = [c for c in dp.conntrack(100) if c.orig["sport"] == 5001]
    outs, _ = send(dp, from_internet("192.0.2.98", SNAT, UDP(sport=7, dport=conns[0].reply["dport"])), "inet")
    assert ports_of(outs) == ["vm2"]


# ---- the L3 VNI, IPv6 rules, the drops file ------------------------------------------------------------

def test_routed_from_the_fabric_over_the_l3_vni_is_judged():
    """EVPN symmetric IRB: what another host routes into the tenant's L3 VNI goes through the
    groups like what arrives on its L2 VNI."""
    from dpu.fabric.shadow import Learned
    from dpu.mirror import FabricMirror
    from helpers.packets import UPLINK_MAC

    d = yaml.safe_load(open(SG_TOPO))
    d.pop("internet")
    d["tenants"]["blue"].pop("nat")
    d["evpn"] = {"asn": 65000, "peers": ["172.31.0.2"]}
    d["tenants"]["blue"]["l3vni"] = 4001
    d["tenants"]["red"]["l3vni"] = 4002
    topo = load_topology(d)
    dp = Dataplane.from_topology(topo)
    vtep, rmac = "192.0.2.9", "02:00:00:00:09:01"
    FabricMirror(dp, topo).apply({"blue": Learned(rmacs={vtep: rmac}, routes={"10.0.5.7/32": vtep})})

    def routed(l4):
        return vxlan(Ether(src=rmac, dst=UPLINK_MAC) / IP(src="10.0.5.7", dst=VM2_IP, ttl=63) / l4, 4001, vtep)
    outs, drops = send(dp, routed(syn(46000, 80)), "p0")
    assert ports_of(outs) == ["vm2"] and not drops
    outs, drops = send(dp, routed(syn(46001, 22)), "p0")
    assert outs == [] and drops == {"security_group": 1}


def test_ipv6_rules_compile():
    d = yaml.safe_load(open(SG_TOPO))
    d["tenants"]["blue"]["security_groups"]["web"]["ingress"].append({"proto": "tcp", "ports": 443, "from": "2001:db8::/32"})
    d["tenants"]["blue"]["security_groups"]["web"]["ingress"].append({"proto": "icmpv6", "type": 128})
    text = compile_topology(load_topology(d)).text()
    assert "tcp6,dl_dst=02:00:00:00:01:12,ipv6_src=2001:db8::/32,tp_dst=443,actions=ct(commit,zone=100)" in text
    assert "icmp6,dl_dst=02:00:00:00:01:12,icmp_type=128,actions=ct(commit,zone=100)" in text
    Dataplane.from_topology(d)   # and the core takes them


def test_denials_are_in_the_drops_file(tmp_path, tshark):
    from scapy.all import wrpcap
    from helpers.tshark import tshark_fields

    dp = Dataplane.from_topology(SG_TOPO)
    src = tmp_path / "vm4.pcap"
    wrpcap(str(src), [l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(47000, 80)), l2(VM4_MAC, VM4_IP, GW_MAC, VM2_IP, syn(47001, 22))])
    s = dp.replay({"vm4": str(src)}, tmp_path / "out", drops_pcap=tmp_path / "drops.pcapng")
    assert s.drops == {"security_group": 1}
    rows = tshark_fields(tshark, tmp_path / "drops.pcapng", ["frame.comment", "tcp.dstport"])
    assert rows == [["drop_reason=security_group in_port=vm4", "22"]]
