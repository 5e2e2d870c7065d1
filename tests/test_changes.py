"""Rule changes without stopping the world (docs/design.md, "Changes without
stopping the world"): a commit never waits for a worker, a change is in force
for every batch that starts after it returns, no packet sees half of one, and
a worker drops only the cached megaflows a change can affect."""
import threading

import numpy as np
import pytest
from scapy.all import IP, TCP, UDP, Ether

from dpu import Dataplane

E = Ether(src="02:00:00:00:00:aa", dst="02:00:00:00:00:bb")
PORTS = ["p1", "p2", "p3", "p4"]


def udp(dst, sport=1000, dport=53, **ip):
    return bytes(E / IP(dst=dst, **ip) / UDP(sport=sport, dport=dport))


def routes(n=8):
    return [f"table=0,priority=100,in_port=p1,ip,nw_dst=10.0.0.{i},actions=mod_dl_dst:02:00:00:00:01:{i:02x},"
            f"output:p{2 + i % 3}" for i in range(n)]


def worker(dp):
    return dp.stats()["workers_total"]


def warm(dp, pkts, times=3):
    for _ in range(times):
        dp.process(pkts, in_port="p1")


# ---- what a change costs the caches ----------------------------------------------------------

def test_rules_no_packet_reaches_cost_no_upcall():
    dp = Dataplane(ports=PORTS, flows=routes())
    pkts = [udp(f"10.0.0.{i}") for i in range(8)]
    warm(dp, pkts)
    before = worker(dp)
    for j in range(50):  # the traffic's own table, a higher priority, destinations it never has
        dp.add_flow(f"table=0,priority=200,in_port=p1,ip,nw_dst=10.200.0.{j},actions=output:p4")
        dp.del_flows(f"table=0,priority=200,in_port=p1,ip,nw_dst=10.200.0.{j}", strict=True)
        dp.add_flow(f"table=7,ip,actions=output:p4")  # a table it never looks up
    warm(dp, pkts, 1)
    after = worker(dp)
    assert after["upcalls"] == before["upcalls"]
    assert after["megaflows_revalidated"] == before["megaflows_revalidated"] == 0
    assert after["revalidations"] - before["revalidations"] == 150
    assert after["cache_flushes"] == before["cache_flushes"]


def test_a_change_drops_only_the_megaflows_it_affects():
    dp = Dataplane(ports=PORTS, flows=routes())
    pkts = [udp(f"10.0.0.{i}") for i in range(8)]
    warm(dp, pkts)
    before = worker(dp)
    dp.add_flow("table=0,priority=100,in_port=p1,ip,nw_dst=10.0.0.3,actions=output:p4")  # replaces route 3
    out = dp.process(pkts, in_port="p1")
    assert [o.port for o in out] == ["p2", "p3", "p4", "p4", "p3", "p4", "p2", "p3"]
    after = worker(dp)
    assert after["megaflows_revalidated"] - before["megaflows_revalidated"] == 1
    assert after["upcalls"] - before["upcalls"] == 1


def test_a_rule_of_higher_priority_that_covers_the_traffic_is_in_force_for_the_next_packet():
    dp = Dataplane(ports=PORTS, flows=routes())
    pkts = [udp(f"10.0.0.{i}") for i in range(8)]
    warm(dp, pkts)
    dp.add_flow("table=0,priority=150,in_port=p1,ip,nw_dst=10.0.0.0/30,actions=output:p4")  # a mask new to the table
    assert [o.port for o in dp.process(pkts, in_port="p1")] == ["p4"] * 4 + ["p3", "p4", "p2", "p3"]
    dp.del_flows("table=0,priority=150,in_port=p1,ip,nw_dst=10.0.0.0/30", strict=True)
    assert [o.port for o in dp.process(pkts, in_port="p1")] == ["p2", "p3", "p4", "p2", "p3", "p4", "p2", "p3"]


def test_a_rule_of_lower_priority_keeps_the_megaflows_of_higher_rules():
    dp = Dataplane(ports=PORTS, flows=routes())
    pkts = [udp(f"10.0.0.{i}") for i in range(8)]
    warm(dp, pkts)
    before = worker(dp)
    dp.add_flow("table=0,priority=10,ip,actions=output:p4")  # matches everything, wins nothing
    assert [o.port for o in dp.process(pkts, in_port="p1")] == ["p2", "p3", "p4", "p2", "p3", "p4", "p2", "p3"]
    assert worker(dp)["upcalls"] == before["upcalls"]
    # a packet that missed before does find it
    assert [o.port for o in dp.process(udp("10.9.9.9"), in_port="p1")] == ["p4"]


def test_a_group_change_drops_the_megaflows_that_used_a_group():
    dp = Dataplane(ports=PORTS)
    with dp.transaction() as t:
        t.add_group("group_id=1,type=all,bucket=actions=output:p2")
        t.add_flow("in_port=p1,ip,nw_dst=10.0.0.1,actions=group:1")
        t.add_flow("in_port=p1,ip,nw_dst=10.0.0.2,actions=output:p3")
    pkts = [udp("10.0.0.1"), udp("10.0.0.2")]
    warm(dp, pkts)
    before = worker(dp)
    dp.mod_group("group_id=1,type=all,bucket=actions=output:p4")
    assert [o.port for o in dp.process(pkts, in_port="p1")] == ["p4", "p3"]
    after = worker(dp)
    assert after["megaflows_revalidated"] - before["megaflows_revalidated"] == 1
    assert after["upcalls"] - before["upcalls"] == 1


def test_replace_flows_keeps_what_is_unchanged():
    """What a topology reload does: the flows it selects are replaced; those
    added again unchanged keep their counters and cached megaflows; the
    others go or change, and only their megaflows go."""
    dp = Dataplane(ports=PORTS, flows=routes() + ["table=0,priority=1,cookie=0x1,actions=output:p4"])
    pkts = [udp(f"10.0.0.{i}") for i in range(8)]
    warm(dp, pkts)
    before = worker(dp)
    new_routes = routes()
    new_routes[5] = new_routes[5].replace("output:p4", "output:p2")
    with dp.transaction() as t:
        t.replace_flows("cookie=0/-1")  # the routes (cookie 0), not the user's flow
        t.add_flows(new_routes[:7])     # route 7 is gone
    out = dp.process(pkts, in_port="p1")
    assert [o.port for o in out] == ["p2", "p3", "p4", "p2", "p3", "p2", "p2", "p4"]
    after = worker(dp)
    assert after["megaflows_revalidated"] - before["megaflows_revalidated"] == 2
    assert after["upcalls"] - before["upcalls"] == 2
    counts = {f.match: f.n_packets for f in dp.dump_flows()}
    assert counts["priority=100,ip,in_port=p1,nw_dst=10.0.0.0"] == 4
    assert counts["priority=100,ip,in_port=p1,nw_dst=10.0.0.5"] == 1  # a new rule
    assert "priority=100,ip,in_port=p1,nw_dst=10.0.0.7" not in counts


def test_del_and_add_in_one_transaction_is_a_new_flow():
    """Outside replace_flows, a deleted flow is gone, as in Open vSwitch: added
    back in the same transaction it starts its counters again."""
    dp = Dataplane(ports=PORTS, flows=routes())
    warm(dp, [udp("10.0.0.1")])
    with dp.transaction() as t:
        t.del_flows("")
        t.add_flows(routes())
    assert [f.n_packets for f in dp.dump_flows()] == [0] * 8


def test_a_port_change_flushes_everything():
    dp = Dataplane(ports=PORTS, flows=routes() + ["table=0,priority=1,actions=flood"])
    pkts = [udp(f"10.0.0.{i}") for i in range(8)] + [udp("10.9.9.9")]
    warm(dp, pkts)
    before = worker(dp)
    dp.add_port("p5")  # flood reaches it now
    out = dp.process(pkts, in_port="p1")
    assert sorted(o.port for o in out if o.index == 8) == ["p2", "p3", "p4", "p5"]
    after = worker(dp)
    assert after["cache_flushes"] - before["cache_flushes"] == 1
    assert after["upcalls"] - before["upcalls"] == 9


# ---- what the revalidation must not miss: lookups that did not see the packet ---------------

UNSEEN = [
    # table 1 is looked up with nw_dst already rewritten: a rule for the
    # rewritten address affects a megaflow whose key has another one
    ("after a rewrite", ["table=0,in_port=p1,ip,actions=mod_nw_dst:10.5.5.5,resubmit(,1)",
                         "table=1,priority=1,actions=output:p2"],
     udp("10.0.0.1"), "table=1,priority=9,ip,nw_dst=10.5.5.5,actions=output:p3"),
    ("with another in_port", ["table=0,in_port=p1,ip,actions=resubmit(p4,1)", "table=1,priority=1,actions=output:p2"],
     udp("10.0.0.1"), "table=1,priority=9,in_port=p4,actions=output:p3"),
    ("of a fragment, whose ports read as 0", ["table=0,priority=1,actions=output:p2"],
     bytes(E / IP(dst="10.0.0.1", flags="MF", proto=17) / (b"\x04\x00\x00\x35" + b"x" * 20)),
     "table=0,priority=9,udp,tp_dst=0,actions=output:p3"),
]


@pytest.mark.parametrize("what,flows,pkt,rule", UNSEEN, ids=[c[0] for c in UNSEEN])
def test_a_lookup_that_did_not_see_the_packet_sees_a_new_rule(what, flows, pkt, rule):
    dp = Dataplane(ports=PORTS, flows=flows)
    warm(dp, [pkt])
    dp.add_flow(rule)
    assert [o.port for o in dp.process(pkt, in_port="p1")] == ["p3"]


def test_the_pass_after_conntrack_follows_a_change():
    """An established connection's packets skip their second pass through the
    cached megaflow (ct_resumed): a change to the rule that pass found is in
    force for the next packet."""
    dp = Dataplane(ports=["lan", "wan"], flows=[
        "table=0,in_port=lan,ip,actions=ct(zone=1,table=1)",
        "table=0,in_port=wan,ip,actions=ct(zone=1,table=2)",
        "table=1,ct_state=+trk+new,ip,actions=ct(commit,zone=1),output:wan",
        "table=1,ct_state=+trk+est,ip,actions=mod_dl_dst:02:00:00:00:0e:01,output:wan",
        "table=2,ct_state=+trk+est,ip,actions=output:lan"])
    dp._core.set_emc_insert_inv_prob(1)  # every megaflow hit goes into the EMC
    syn = bytes(E / IP(src="10.0.0.1", dst="192.0.2.9") / TCP(sport=4000, dport=80, flags="S", seq=1))
    synack = bytes(E / IP(src="192.0.2.9", dst="10.0.0.1") / TCP(sport=80, dport=4000, flags="SA", seq=7, ack=2))
    ack = bytes(E / IP(src="10.0.0.1", dst="192.0.2.9") / TCP(sport=4000, dport=80, flags="A", seq=2, ack=8))
    dp.process(syn, in_port="lan")
    dp.process(synack, in_port="wan")
    for _ in range(20):
        (o,) = dp.process(ack, in_port="lan")
    assert Ether(o.data).dst == "02:00:00:00:0e:01"
    assert worker(dp)["ct_resumed"] > 0
    dp.mod_flows("table=1,ct_state=+trk+est,ip,actions=mod_dl_dst:02:00:00:00:0e:02,output:wan", strict=True)
    for _ in range(3):
        (o,) = dp.process(ack, in_port="lan")
        assert Ether(o.data).dst == "02:00:00:00:0e:02"


# ---- no packet sees half a change; a commit never waits for a worker ----------------------------

def test_no_packet_sees_half_a_transaction_while_another_thread_commits():
    """churn-hit-1k's check on a short run: every output of the benchmark loop
    carries, in both MAC addresses, the stamp its route's two rules had at the
    version its batch ran at, while another thread restamps routes."""
    from dpu import bench

    dp, pkts, ports, info, change = bench._churn_hit_1k()
    base, n_routes = info["check"]
    data = pkts.data.tobytes()
    dp._core.bench(data, pkts.offsets, pkts.lengths, ports, 50_000)
    with bench._Churn(dp, change, 2000, dp.version + 1) as churn:
        checked = wrong = 0
        while churn.k < 300:
            n, secs, c, w = dp._core.bench(data, pkts.offsets, pkts.lengths, ports, 200_000, 128, (base, n_routes))
            checked += c
            wrong += w
    assert churn.k >= 300 and checked > 0
    assert wrong == 0


def test_a_commit_does_not_wait_for_a_batch_in_flight():
    """A replay holds worker 0 for its whole burst loop; commits from another
    thread go through meanwhile (before, each waited for the worker's lock)."""
    dp = Dataplane(ports=PORTS, flows=routes())
    pkts = [udp(f"10.0.0.{i % 8}", sport=1000 + i) for i in range(4096)]
    data = b"".join(pkts)
    lens = np.array([len(p) for p in pkts], dtype=np.uint32)
    offs = np.zeros(len(pkts), dtype=np.uint64)
    offs[1:] = np.cumsum(lens[:-1])
    ports = np.full(len(pkts), dp.port_number("p1"), dtype=np.uint32)
    done = threading.Event()
    commits = []

    def churn():
        j = 0
        while not done.is_set():
            dp.add_flow(f"table=3,priority=1,ip,nw_dst=10.99.{j >> 8 & 255}.{j & 255},actions=drop")
            commits.append(j)
            j += 1

    t = threading.Thread(target=churn)
    t.start()
    try:
        dp._core.bench(data, offs, lens, ports, 3_000_000)
    finally:
        done.set()
        t.join()
    assert len(commits) > 10
    assert dp.version >= len(commits) + 1
