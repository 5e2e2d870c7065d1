"""Connection tracking and NAT (docs/conntrack.md) through the Python API, with
real scapy packets: ct_state bits, TCP window tracking, ct_* fields,
recirculation, NAT mappings and checksums, ICMP errors, filtering, limits,
timeouts, force, dumps, syntax, concurrency and trace.

Packets are compared as exact bytes against what scapy builds (so every
checksum is checked by scapy's own computation). Behaviour the core gets
wrong is asserted as documented and marked xfail(strict=True) with the reason.
"""
import json
import threading
import types

import pytest
from scapy.all import ARP, ICMP, IP, SCTP, TCP, UDP, Dot1Q, Ether, IPOption_RR, IPv6, IPv6ExtHdrFragment, Raw
from scapy.layers.inet6 import ICMPv6EchoReply, ICMPv6EchoRequest, ICMPv6ND_NS, ICMPv6PacketTooBig

from helpers.ctpackets import (CLIENT, CLIENT2, CLIENT6, E, PUBLIC, PUBLIC2, ROUTER, SEC, SERVER, SERVER2, SERVER3,
                       SERVER6, T0, UDP_ANSWER, UDP_QUERY, echo, fast_udp, frame, icmp_error, ip_bytes, tcp, udp)
from dpu import Dataplane
from dpu.errors import DpuError

# ---- helpers ---------------------------------------------------------------------------------

BITS = ("new", "est", "rel", "rpl", "inv", "trk", "snat", "dnat")


def probe(table, then=None):
    """Flows that make table `table` report ct_state: a copy of the packet goes
    to the port named after each bit that is set (in BITS order), then the
    packet goes on in table `then`."""
    acts = ",".join(f"resubmit(,{200 + i})" for i in range(len(BITS)))
    if then is not None:
        acts += f",resubmit(,{then})"
    flows = [f"table={table},priority=65535,actions={acts}"]
    flows += [f"table={200 + i},ct_state=+{b},actions=output:{b}" for i, b in enumerate(BITS)]
    return flows


def state(outs):
    """ct_state as the probe saw it, e.g. '+est+rpl+trk' (BITS order), '' if never probed."""
    seen = {o.port for o in outs if o.port in BITS}
    return "".join("+" + b for b in BITS if b in seen)


def forwarded(outs):
    """(port, bytes) of the outputs that are not state-probe copies."""
    return [(o.port, o.data) for o in outs if o.port not in BITS]


def show(data):
    return Ether(data).show2(dump=True)


def assert_frames(got, want, what=""):
    """got: [(port, bytes)]; want: [(port, scapy packet)] compared as exact bytes."""
    assert [p for p, _ in got] == [p for p, _ in want], f"{what}: ports {got} != {[p for p, _ in want]}"
    for (port, g), (_, w) in zip(got, want):
        wb = bytes(frame(w))
        assert g == wb, f"{what} on {port}\n--- expected\n{show(wb)}\n--- got\n{show(g)}"


def send(dp, pkt, port, t=None, worker=0):
    """Processes one packet (at T0 + t seconds when t is given)."""
    ts = None if t is None else [T0 + int(t * SEC)]
    return dp.process(pkt, in_port=port, timestamps=ts, worker=worker)


def drops(dp, port):
    return dp.stats()["ports"][port]["drops"]


def _ids(cases):
    return [getattr(c, "values", c)[0] for c in cases]


# Regression: a packet that follows an ICMP error in the same slot of the
# conntrack stage (the next batch) was still taken for an ICMP error.


# The tracking pipeline of the state tests: every packet goes through
# ct(zone=1,table=1); table 1 reports the state; +new packets are committed.
TRACK_FLOWS = ["table=0,actions=ct(zone=1,table=1)"] + probe(1, then=2) + [
    "table=2,ct_state=+new+trk,actions=ct(commit,zone=1)",
]


def tracking_dp(flows=TRACK_FLOWS, workers=1):
    dp = Dataplane(ports=["a", "b", *BITS], workers=workers)
    dp.add_flows(flows)
    return dp


# Source NAT in one ct per direction: inside packets are committed with
# nat(src=PUBLIC) (an existing connection is translated as it was set up),
# outside packets only translated. Table 1 reports the state, table 2 forwards.
def snat_flows(nat="nat(src=203.0.113.10)", zone=5, probe_states=False):
    flows = [
        f"table=0,in_port=in,ip,actions=ct(commit,zone={zone},{nat},table=1)",
        f"table=0,in_port=out,ip,actions=ct(zone={zone},nat,table=1)",
        "table=2,in_port=in,ct_state=+trk-inv,actions=output:out",
        "table=2,in_port=out,ct_state=+trk+est,actions=output:in",
        "table=2,in_port=out,ct_state=+trk+rel,actions=output:in",
        "table=2,in_port=out,ct_state=+trk+new+dnat,actions=output:in",  # endpoint-independent filtering
    ]
    if probe_states:
        return flows + probe(1, then=2)
    return flows + ["table=1,actions=resubmit(,2)"]


def snat_dp(nat="nat(src=203.0.113.10)", zone=5, workers=1, probe_states=False):
    dp = Dataplane(ports=["in", "out", *BITS], workers=workers)
    dp.add_flows(snat_flows(nat, zone, probe_states))
    return dp


def translated(dp, pkt, port, **kw):
    """The one packet `pkt` turned into, parsed; asserts exactly one non-probe output."""
    outs = forwarded(send(dp, pkt, port, **kw))
    assert len(outs) == 1, f"expected one output, got {outs}"
    return outs[0][0], Ether(outs[0][1])


# The pipeline of the conntrack brief (and of OVS's usual NAT pattern): a first
# ct(nat) translates packets of known connections, +new ones are committed with
# nat(src=...). A UDP packet before the first reply, or a retransmitted SYN, is
# +new (docs) although its connection exists and was translated by the first
# ct: the second ct must find that connection (docs/conntrack.md: looked up by
# the reverse of its translated tuple, as OVS does).
TWO_STAGE = """
table=0,in_port=in,ip,actions=ct(zone=5,nat,table=1)
table=0,in_port=out,ip,actions=ct(zone=5,nat,table=2)
table=1,ct_state=+trk+new,ip,actions=ct(commit,zone=5,nat(src=203.0.113.10),table=2)
table=1,ct_state=+trk+est,ip,actions=output:out
table=2,ct_state=+trk+new+snat,in_port=in,ip,actions=output:out
table=2,ct_state=+trk+est,in_port=out,ip,actions=output:in
table=2,ct_state=+trk+est,in_port=in,ip,actions=output:out
"""


def _inside(i):
    """The i-th of many inside hosts (10.1.0.1, 10.1.0.2, ...)."""
    return f"10.1.{i // 250}.{i % 250 + 1}"


# ---- 1. ct_state bits ------------------------------------------------------------------------------

def test_ct_state_is_untracked_before_ct():
    dp = Dataplane(ports=["a", "p1", "p2"])
    dp.add_flows(["table=0,priority=10,ct_state=-trk,actions=output:p1", "table=0,priority=1,actions=output:p2",
                  "table=0,priority=20,ct_state=+trk,actions=drop"])
    for pkt in (UDP_QUERY, tcp(CLIENT, 1, SERVER, 2, "S"), E / ARP(psrc=CLIENT, pdst=SERVER)):
        assert [o.port for o in dp.process(pkt, in_port="a")] == ["p1"]


def _udp6(src, sport, dst, dport):
    return E / IPv6(src=src, dst=dst) / UDP(sport=sport, dport=dport) / Raw(b"six")


QUOTE_UDP = IP(src=CLIENT, dst=SERVER, ttl=1) / UDP(sport=5000, dport=53) / Raw(b"query")
QUOTE_UDP_REPLY = IP(src=SERVER, dst=CLIENT) / UDP(sport=53, dport=5000) / Raw(b"answer")

# name, [(in_port, packet, expected ct_state at the first ct)]; a is the inside, b the outside.
STATE_CASES = [
    ("udp: +new until answered, then +est, replies +rpl", [
        ("a", UDP_QUERY, "+new+trk"),
        ("a", UDP_QUERY, "+new+trk"),
        ("b", UDP_ANSWER, "+est+rpl+trk"),
        ("a", UDP_QUERY, "+est+trk"),
        ("b", UDP_ANSWER, "+est+rpl+trk"),
    ]),
    ("icmp echo: +new until the reply", [
        ("a", echo(CLIENT, SERVER, 9), "+new+trk"),
        ("a", echo(CLIENT, SERVER, 9, seq=2), "+new+trk"),
        ("b", echo(SERVER, CLIENT, 9, type=0), "+est+rpl+trk"),
        ("a", echo(CLIENT, SERVER, 9, seq=3), "+est+trk"),
    ]),
    ("icmp timestamp request is a query", [
        ("a", E / IP(src=CLIENT, dst=SERVER) / ICMP(type=13, id=4), "+new+trk"),
        ("b", E / IP(src=SERVER, dst=CLIENT) / ICMP(type=14, id=4), "+est+rpl+trk"),
    ]),
    ("tcp: SYN new, SYN-ACK est+rpl", [
        ("a", tcp(CLIENT, 40000, SERVER, 80, "S", seq=1000), "+new+trk"),
        ("a", tcp(CLIENT, 40000, SERVER, 80, "S", seq=1000), "+new+trk"),  # retransmitted before the SYN-ACK
        ("b", tcp(SERVER, 80, CLIENT, 40000, "SA", seq=5000, ack=1001), "+est+rpl+trk"),
        ("a", tcp(CLIENT, 40000, SERVER, 80, "A", seq=1001, ack=5001), "+est+trk"),
    ]),
    ("ipv6 udp", [
        ("a", _udp6(CLIENT6, 1000, SERVER6, 53), "+new+trk"),
        ("b", _udp6(SERVER6, 53, CLIENT6, 1000), "+est+rpl+trk"),
    ]),
    ("icmpv6 echo", [
        ("a", E / IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6EchoRequest(id=5), "+new+trk"),
        ("b", E / IPv6(src=SERVER6, dst=CLIENT6) / ICMPv6EchoReply(id=5), "+est+rpl+trk"),
        ("b", E / IPv6(src=SERVER6, dst=CLIENT6) / ICMPv6EchoReply(id=6), "+inv+trk"),
    ]),
    pytest.param("icmp errors quoting a tracked connection are related", [
        ("a", UDP_QUERY, "+new+trk"),
        ("b", icmp_error(ROUTER, CLIENT, 11, 0, QUOTE_UDP), "+rel+rpl+trk"),
        ("b", icmp_error(SERVER, CLIENT, 3, 3, QUOTE_UDP), "+rel+rpl+trk"),
        ("b", icmp_error(ROUTER, CLIENT, 3, 4, QUOTE_UDP, cut=28, nexthopmtu=1400), "+rel+rpl+trk"),
        ("b", icmp_error(ROUTER, CLIENT, 12, 0, QUOTE_UDP), "+rel+rpl+trk"),  # parameter problem
        ("b", icmp_error(ROUTER, CLIENT, 4, 0, QUOTE_UDP), "+rel+rpl+trk"),   # source quench
        ("b", icmp_error(ROUTER, CLIENT, 5, 1, QUOTE_UDP), "+rel+rpl+trk"),   # redirect
        ("b", UDP_ANSWER, "+est+rpl+trk"),
        # the inside host answers the answer with an error: original direction
        ("a", icmp_error(CLIENT, SERVER, 3, 3, QUOTE_UDP_REPLY), "+rel+trk"),
    ]),
    ("icmpv6 packet too big quoting a tracked connection", [
        ("a", _udp6(CLIENT6, 1000, SERVER6, 53), "+new+trk"),
        ("b", E / IPv6(src="2001:db8:2::1", dst=CLIENT6) / ICMPv6PacketTooBig(mtu=1280)
         / IPv6(src=CLIENT6, dst=SERVER6) / UDP(sport=1000, dport=53) / Raw(b"six"), "+rel+rpl+trk"),
    ]),
    ("invalid: not IP, fragments, no connection, odd flags, cut headers", [
        ("a", E / ARP(psrc=CLIENT, pdst=SERVER), "+inv+trk"),
        ("a", E / IP(src=CLIENT, dst=SERVER, flags="MF") / UDP(sport=1, dport=2) / Raw(b"x" * 16), "+inv+trk"),
        ("a", E / IP(src=CLIENT, dst=SERVER, frag=3, proto=17) / Raw(b"x" * 16), "+inv+trk"),
        ("a", E / IPv6(src=CLIENT6, dst=SERVER6) / IPv6ExtHdrFragment() / UDP(sport=1, dport=2), "+inv+trk"),
        ("a", tcp(CLIENT, 1, SERVER, 2, "A", seq=5, ack=9), "+inv+trk"),        # not a SYN, no connection
        ("a", tcp(CLIENT, 1, SERVER, 2, "PA", seq=5, ack=9, payload=b"d"), "+inv+trk"),
        ("a", tcp(CLIENT, 1, SERVER, 2, "SA", seq=5, ack=9), "+inv+trk"),
        ("a", tcp(CLIENT, 1, SERVER, 3, "SF"), "+inv+trk"),                      # SYN+FIN
        ("a", tcp(CLIENT, 1, SERVER, 3, "SR"), "+inv+trk"),                      # SYN+RST
        ("a", tcp(CLIENT, 1, SERVER, 3, ""), "+inv+trk"),                        # null scan
        ("a", echo(CLIENT, SERVER, 9, type=0), "+inv+trk"),                      # unsolicited echo reply
        ("a", E / IP(src=CLIENT, dst=SERVER) / ICMP(type=14, id=4), "+inv+trk"), # unsolicited timestamp reply
        ("b", icmp_error(SERVER, CLIENT, 3, 3, QUOTE_UDP), "+inv+trk"),          # error quoting nothing tracked
        ("a", E / IP(src=CLIENT, dst=SERVER) / ICMP(type=9), "+inv+trk"),        # neither query nor error
        ("a", E / IP(src=CLIENT, dst=SERVER) / ICMP(type=15, id=1), "+inv+trk"),
        ("a", E / IPv6(src=CLIENT6, dst=SERVER6) / ICMPv6ND_NS(tgt=SERVER6), "+inv+trk"),
        ("a", E / IP(src=CLIENT, dst=SERVER, proto=47) / Raw(b"gre!" * 4), "+inv+trk"),
        ("a", E / IP(src=CLIENT, dst=SERVER) / SCTP(sport=1, dport=2), "+inv+trk"),
        ("a", Ether(bytes(UDP_QUERY)[:14 + 20 + 4]), "+inv+trk"),               # UDP header cut short
        ("a", Ether(bytes(echo(CLIENT, SERVER, 1))[:14 + 20 + 6]), "+inv+trk"),  # ICMP header cut short
        ("a", E / IP(src=CLIENT, dst=SERVER) / TCP(sport=1, dport=2, flags="S", dataofs=4), "+inv+trk"),  # bad offset
    ]),
]


@pytest.mark.parametrize("name,steps", STATE_CASES, ids=_ids(STATE_CASES))
def test_ct_state(name, steps):
    dp = tracking_dp()
    for i, (port, pkt, want) in enumerate(steps):
        got = state(dp.process(pkt, in_port=port))
        assert got == want, f"step {i} ({pkt.summary()}): ct_state {got}, expected {want}"


def test_invalid_packets_create_nothing():
    dp = tracking_dp()
    for port, pkt, _ in STATE_CASES[-1][1]:
        dp.process(pkt, in_port=port)
    assert dp.conntrack() == [] and dp.stats()["conntrack"]["connections"] == 0


def test_without_commit_nothing_is_remembered():
    dp = tracking_dp(["table=0,actions=ct(zone=1,table=1)"] + probe(1))
    for port, pkt, want in [("a", UDP_QUERY, "+new+trk"), ("b", UDP_ANSWER, "+new+trk"), ("a", UDP_QUERY, "+new+trk")]:
        assert state(dp.process(pkt, in_port=port)) == want
    assert dp.conntrack() == []


# name, flows (ct to table 1 reports), [(port, packet, state)]
NAT_STATE_CASES = [
    pytest.param("snat: +snat out, replies +dnat, related errors +dnat", snat_flows(probe_states=True), [
        ("in", UDP_QUERY, "+new+trk+snat"),
        ("out", udp(SERVER, 53, PUBLIC, 5000), "+est+rpl+trk+dnat"),
        ("in", UDP_QUERY, "+est+trk+snat"),
        ("out", icmp_error(ROUTER, PUBLIC, 11, 0, IP(src=PUBLIC, dst=SERVER) / UDP(sport=5000, dport=53)),
         "+rel+rpl+trk+dnat"),
        ("out", udp(SERVER2, 53, PUBLIC, 5000), "+new+trk"),  # another remote: not this connection
    ]),
    ("dnat: +dnat in, replies +snat", [
        "table=0,in_port=out,ip,actions=ct(commit,zone=5,nat(dst=10.0.1.12),table=1)",
        "table=0,in_port=in,ip,actions=ct(zone=5,nat,table=1)"] + probe(1), [
        ("out", udp(SERVER, 999, PUBLIC, 80), "+new+trk+dnat"),
        ("in", udp(CLIENT2, 80, SERVER, 999), "+est+rpl+trk+snat"),
        ("out", udp(SERVER, 999, PUBLIC, 80), "+est+trk+dnat"),
    ]),
    ("ct without nat on a NATed connection translates nothing", [
        "table=0,in_port=in,ip,actions=ct(commit,zone=5,nat(src=203.0.113.10),table=1)",
        "table=0,in_port=out,ip,actions=ct(zone=5,table=1)"] + probe(1), [
        ("in", UDP_QUERY, "+new+trk+snat"),
        ("out", udp(SERVER, 53, PUBLIC, 5000), "+est+rpl+trk"),
    ]),
    ("nat(src=...) on a new connection without commit translates nothing", [
        "table=0,in_port=in,ip,actions=ct(zone=5,nat(src=203.0.113.10),table=1)"] + probe(1), [
        ("in", UDP_QUERY, "+new+trk"),
        ("in", UDP_QUERY, "+new+trk"),
    ]),
    ("ipv6 through ct(nat) is tracked, not translated", [
        "table=0,in_port=in,ipv6,actions=ct(commit,zone=5,nat(src=203.0.113.10),table=1)",
        "table=0,in_port=out,ipv6,actions=ct(zone=5,nat,table=1)"] + probe(1), [
        ("in", _udp6(CLIENT6, 1000, SERVER6, 53), "+new+trk"),
        ("out", _udp6(SERVER6, 53, CLIENT6, 1000), "+est+rpl+trk"),
    ]),
]


@pytest.mark.parametrize("name,flows,steps", NAT_STATE_CASES, ids=_ids(NAT_STATE_CASES))
def test_nat_state_bits(name, flows, steps):
    dp = Dataplane(ports=["in", "out", *BITS])
    dp.add_flows(flows)
    for i, (port, pkt, want) in enumerate(steps):
        got = state(dp.process(pkt, in_port=port))
        assert got == want, f"step {i} ({pkt.summary()}): ct_state {got}, expected {want}"


# ---- 2. TCP ----------------------------------------------------------------------------------

def _c2s(flags, seq, ack=0, payload=b"", **kw):
    return tcp(CLIENT, 40000, SERVER, 80, flags, seq, ack, payload, **kw)


def _s2c(flags, seq, ack=0, payload=b"", **kw):
    return tcp(SERVER, 80, CLIENT, 40000, flags, seq, ack, payload, **kw)


HANDSHAKE = [
    ("a", _c2s("S", 1000), "+new+trk", "SYN_SENT"),
    ("b", _s2c("SA", 5000, 1001), "+est+rpl+trk", "ESTABLISHED"),
    ("a", _c2s("A", 1001, 5001), "+est+trk", "ESTABLISHED"),
]

TCP_CASES = [
    ("data both ways, FIN/FIN close, then the tuple is reused", HANDSHAKE + [
        ("a", _c2s("PA", 1001, 5001, b"x" * 100), "+est+trk", "ESTABLISHED"),
        ("b", _s2c("PA", 5001, 1101, b"y" * 50), "+est+rpl+trk", "ESTABLISHED"),
        ("a", _c2s("A", 1101, 5051), "+est+trk", "ESTABLISHED"),
        ("a", _c2s("FA", 1101, 5051), "+est+trk", "CLOSING"),
        ("b", _s2c("FA", 5051, 1102), "+est+rpl+trk", "TIME_WAIT"),
        ("a", _c2s("A", 1102, 5052), "+est+trk", "TIME_WAIT"),
        ("a", _c2s("S", 900000), "+new+trk", "SYN_SENT"),          # a new connection on the same tuple
        ("b", _s2c("SA", 70000, 900001), "+est+rpl+trk", "ESTABLISHED"),
    ]),
    ("RST puts the connection in TIME_WAIT", HANDSHAKE + [
        ("a", _c2s("R", 1001), "+est+trk", "TIME_WAIT"),
        ("a", _c2s("S", 3000), "+new+trk", "SYN_SENT"),
    ]),
    ("RST with a wrong sequence number is invalid and changes nothing", HANDSHAKE + [
        ("b", _s2c("R", 5001 + 3000), "+inv+trk", "ESTABLISHED"),
        ("b", _s2c("RA", 5000, 1001), "+est+rpl+trk", "TIME_WAIT"),  # one off is accepted
    ]),
    ("out-of-window segments are invalid and change nothing", HANDSHAKE + [
        ("a", _c2s("PA", 1001 + 10**9, 5001, b"x" * 10), "+inv+trk", "ESTABLISHED"),   # seq far ahead
        ("a", _c2s("PA", 1001 - 100000, 5001, b"x" * 10), "+inv+trk", "ESTABLISHED"),  # far behind
        ("a", _c2s("PA", 1001 + 8192, 5001, b"x" * 10), "+inv+trk", "ESTABLISHED"),    # just past the window
        ("a", _c2s("PA", 1001, 5001 + 200000, b"x"), "+inv+trk", "ESTABLISHED"),       # acks unsent data
        ("a", _c2s("PA", 1001 + 8182, 5001, b"x" * 10), "+est+trk", "ESTABLISHED"),    # ends on the window edge
        ("a", _c2s("PA", 1001, 5001, b"x" * 10), "+est+trk", "ESTABLISHED"),           # a retransmission
    ]),
    ("a segment without ACK that is neither SYN nor RST is invalid", HANDSHAKE + [
        ("a", _c2s("F", 1001), "+inv+trk", "ESTABLISHED"),
        ("a", _c2s("P", 1001, 0, b"x"), "+inv+trk", "ESTABLISHED"),
    ]),
]


@pytest.mark.parametrize("name,steps", TCP_CASES, ids=[c[0] for c in TCP_CASES])
def test_tcp(name, steps):
    dp = tracking_dp()
    for i, (port, pkt, want, tcp_state) in enumerate(steps):
        before = list(dp.conntrack())
        got = state(dp.process(pkt, in_port=port))
        assert got == want, f"step {i} ({pkt.summary()}): ct_state {got}, expected {want}"
        conns = dp.conntrack()
        assert len(conns) == 1 and conns[0].state == tcp_state, f"step {i}: {conns}"
        assert conns[0].endswith(f",zone=1,protoinfo=(state={tcp_state})")
        if want == "+inv+trk":
            assert conns == before, "an invalid segment changes nothing"


@pytest.mark.parametrize("scaled", [True, False], ids=["wscale", "no-wscale"])
def test_tcp_window_scaling(scaled):
    """Both SYNs carry wscale=7: a window of 1000 means 128000 bytes, so data
    100000 bytes ahead fits; without the option it is out of the window."""
    opt = [("WScale", 7)] if scaled else []
    dp = tracking_dp()
    for port, pkt in [("a", _c2s("S", 1000, window=1000, options=opt)),
                      ("b", _s2c("SA", 5000, 1001, window=1000, options=opt)),
                      ("a", _c2s("A", 1001, 5001, window=1000)),
                      ("b", _s2c("A", 5001, 1001, window=1000))]:
        assert "+inv" not in state(dp.process(pkt, in_port=port))
    far = _c2s("PA", 1001 + 100000, 5001, b"x" * 100, window=1000)
    assert state(dp.process(far, in_port="a")) == ("+est+trk" if scaled else "+inv+trk")


def test_tcp_loose_segments_do_not_refresh():
    """Before the other side answered, a segment beyond the window is accepted
    (+est) but does not refresh the timeout (tcp_transitory, 240 s from the SYN)."""
    dp = tracking_dp()
    assert state(send(dp, _c2s("S", 1000), "a", t=0)) == "+new+trk"
    assert state(send(dp, _c2s("PA", 1001, 0, b"x" * 100), "a", t=200)) == "+est+trk"
    assert dp.conntrack()[0].expires_in == pytest.approx(40, abs=0.01)
    assert state(send(dp, _c2s("PA", 1101, 0, b"x" * 100), "a", t=250)) == "+inv+trk"
    assert dp.conntrack() == []


# ---- 3. ct fields ----------------------------------------------------------------------------

# name, flows, [(port, packet)], expected output ports of each packet
FIELD_CASES = [
    ("ct_mark and ct_label set by exec, matched in a later pass", [
        "table=0,ip,actions=ct(zone=7,table=1)",
        "table=1,in_port=a,ct_state=+new+trk,actions=ct(commit,zone=7,exec(set_field:0x5->ct_mark,"
        "set_field:0x1/0x1->ct_label)),output:p1",
        "table=1,ct_state=+est+trk,ct_zone=7,ct_mark=5,ct_label=0x1/0x1,actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY), ("b", UDP_ANSWER), ("a", UDP_QUERY), ("b", UDP_ANSWER)], [["p1"], ["p2"], ["p2"], ["p2"]]),
    ("the committing packet sees its new mark; masked writes on an existing connection", [
        "table=0,in_port=a,ip,actions=ct(commit,zone=1,exec(set_field:0x10/0xf0->ct_mark),table=1)",
        "table=0,in_port=b,ip,actions=ct(commit,zone=1,exec(set_field:0x1/0x0f->ct_mark,"
        "set_field:0x80000000000000000000000000000001->ct_label),table=1)",
        "table=1,ct_mark=0x10,actions=output:p1",
        "table=1,ct_mark=0x11,ct_label=0x80000000000000000000000000000000/0x80000000000000000000000000000000,"
        "actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY), ("b", UDP_ANSWER), ("a", UDP_QUERY)], [["p1"], ["p2"], ["p2"]]),
    ("load:->NXM_NX_CT_MARK[] inside exec", [
        "table=0,ip,actions=ct(commit,zone=1,exec(load:0xab->NXM_NX_CT_MARK[8..15]),table=1)",
        "table=1,ct_mark=0xab00,actions=output:p1", "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY)], [["p1"]]),
    ("a reply matches the original direction's tuple", [
        "table=0,ip,actions=ct(zone=7,table=1)",
        "table=1,in_port=a,ct_state=+new+trk,actions=ct(commit,zone=7),output:p1",
        "table=1,ct_state=+est+rpl+trk,ct_nw_src=10.0.1.11,ct_nw_dst=198.51.100.1,ct_nw_proto=17,"
        "ct_tp_src=5000,ct_tp_dst=53,actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY), ("b", UDP_ANSWER), ("b", udp(SERVER, 53, CLIENT, 5001))], [["p1"], ["p2"], ["p3"]]),
    ("an uncommitted +new packet has its own tuple", [
        "table=0,ip,actions=ct(zone=7,table=1)",
        "table=1,ct_state=+new+trk,ct_nw_src=10.0.1.11,ct_nw_dst=198.51.100.1,ct_nw_proto=17,"
        "ct_tp_src=5000,ct_tp_dst=53,actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY), ("a", udp(CLIENT, 5001, SERVER, 53))], [["p2"], ["p3"]]),
    ("icmp: type and code in ct_tp_src/ct_tp_dst", [
        "table=0,ip,actions=ct(commit,zone=7,table=1)",
        "table=1,ct_state=+est+rpl+trk,ct_nw_proto=1,ct_tp_src=8,ct_tp_dst=0,actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", echo(CLIENT, SERVER, 3)), ("b", echo(SERVER, CLIENT, 3, type=0))], [["p3"], ["p2"]]),
    ("ipv6: ct_ipv6_src/ct_ipv6_dst of the original direction", [
        "table=0,ipv6,actions=ct(zone=7,table=1)",
        "table=1,in_port=a,ct_state=+new+trk,actions=ct(commit,zone=7),output:p1",
        "table=1,ct_state=+est+trk,ct_ipv6_src=2001:db8::11,ct_ipv6_dst=2001:db8:1::1,actions=output:p2",
        "table=1,priority=1,actions=output:p3"],
     [("a", _udp6(CLIENT6, 1, SERVER6, 2)), ("b", _udp6(SERVER6, 2, CLIENT6, 1))], [["p1"], ["p2"]]),
    ("ct_clear makes the packet untracked again", [
        "table=0,ip,actions=ct(zone=7,table=1)",
        "table=1,ct_state=+trk,actions=ct_clear,resubmit(,2)",
        "table=2,ct_state=-trk,ct_zone=0,actions=output:p2", "table=2,priority=1,actions=output:p3"],
     [("a", UDP_QUERY)], [["p2"]]),
    ("after a ct without table the pipeline's own view is untracked", [
        "table=0,ip,actions=ct(commit,zone=7),resubmit(,1)",
        "table=1,ct_state=-trk,actions=output:p2", "table=1,priority=1,actions=output:p3"],
     [("a", UDP_QUERY)], [["p2"]]),
    ("ct_zone is the zone of the ct action, even for +inv", [
        "table=0,actions=ct(zone=513,table=1)",
        "table=1,ct_state=+inv+trk,ct_zone=513,actions=output:p2", "table=1,priority=1,actions=output:p3"],
     [("a", E / ARP(psrc=CLIENT, pdst=SERVER))], [["p2"]]),
]


@pytest.mark.parametrize("name,flows,pkts,want", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_ct_fields(name, flows, pkts, want):
    dp = Dataplane(ports=["a", "b", "p1", "p2", "p3"])
    dp.add_flows(flows)
    got = [[o.port for o in dp.process(pkt, in_port=port)] for port, pkt in pkts]
    assert got == want


def test_mark_and_label_in_the_dump_and_caches_follow_changes():
    """The resumed pass's caches must not keep a stale ct_mark: change the mark
    of a connection and the next reply (same flow, cache warm) sees it."""
    dp = Dataplane(ports=["a", "b", "p1", "p2", "p3"])
    dp.add_flows([
        "table=0,in_port=a,udp,tp_src=5000,actions=ct(commit,zone=1,exec(set_field:0x5->ct_mark)),output:b",
        "table=0,in_port=a,udp,tp_src=5001,actions=ct(commit,zone=1,exec(set_field:0x1/0x1->ct_label)),output:b",
        "table=0,in_port=b,ip,actions=ct(zone=1,table=1)",
        "table=1,priority=10,ct_mark=5,actions=output:p1",
        "table=1,priority=10,ct_mark=6,actions=output:p2",
        "table=1,priority=9,ct_label=0x1/0x1,actions=output:p3"])
    dp.process([udp(CLIENT, 5000, SERVER, 53), udp(CLIENT, 5001, SERVER, 53)], in_port="a")
    replies = [udp(SERVER, 53, CLIENT, 5000), udp(SERVER, 53, CLIENT, 5001)]
    for _ in range(3):
        assert [o.port for o in dp.process(replies, in_port="b")] == ["p1", "p3"]
    assert [c.mark for c in dp.conntrack()] == [5, 0] and [c.label for c in dp.conntrack()] == [0, 1]
    assert dp.conntrack()[0].endswith(",zone=1,mark=5") and dp.conntrack()[1].endswith(",zone=1,labels=0x1")
    dp.add_flow("table=0,priority=40000,in_port=a,udp,tp_src=5000,"
                "actions=ct(commit,zone=1,exec(set_field:0x6->ct_mark)),output:b")
    dp.process(udp(CLIENT, 5000, SERVER, 53), in_port="a")
    for _ in range(2):
        assert [o.port for o in dp.process(replies, in_port="b")] == ["p2", "p3"]


# ---- 4. ct and the rest of the action list ---------------------------------------------------------

CONT_CASES = [
    ("ct(table) not last: the original goes on untracked and untranslated, the copy to table 1", [
        "table=0,in_port=a,ip,actions=ct(commit,zone=1,nat(src=203.0.113.10),table=1),output:p2",
        "table=1,ct_state=+new+trk+snat,actions=output:p1"],
     UDP_QUERY, [("p2", UDP_QUERY), ("p1", udp(PUBLIC, 5000, SERVER, 53, b"query"))]),
    ("ct without table: the packet itself is translated and goes on", [
        "table=0,in_port=a,ip,actions=ct(commit,zone=1,nat(src=203.0.113.10)),output:p2"],
     UDP_QUERY, [("p2", udp(PUBLIC, 5000, SERVER, 53, b"query"))]),
    ("ct without table, then a rewrite of the translated packet", [
        "table=0,in_port=a,ip,actions=ct(commit,zone=1,nat(src=203.0.113.10)),mod_tp_dst:5353,output:p2"],
     UDP_QUERY, [("p2", udp(PUBLIC, 5000, SERVER, 5353, b"query"))]),
    ("a header rewrite before ct is what conntrack sees", [
        "table=0,in_port=a,ip,actions=mod_nw_dst:192.0.2.99,ct(commit,zone=1,table=1)",
        "table=1,ct_state=+new+trk,ct_nw_dst=192.0.2.99,actions=output:p1"],
     UDP_QUERY, [("p1", udp(CLIENT, 5000, "192.0.2.99", 53, b"query"))]),
    ("registers and metadata survive the recirculation", [
        "table=0,ip,actions=load:5->NXM_NX_REG3[],write_metadata:0x42,ct(zone=1,table=1)",
        "table=1,reg3=5,metadata=0x42,actions=output:p1", "table=1,priority=1,actions=output:p3"],
     UDP_QUERY, [("p1", UDP_QUERY)]),
    ("ct inside a group bucket", [
        "table=0,in_port=a,ip,actions=group:1", "table=1,ct_state=+new+trk,actions=output:p1"],
     UDP_QUERY, [("p2", UDP_QUERY), ("p1", UDP_QUERY)]),
    ("NAT keeps VLAN tags, IP options and checksums", [
        "table=0,in_port=a,ip,actions=ct(commit,zone=1,nat(src=203.0.113.10)),output:p2"],
     E / Dot1Q(vlan=5) / IP(src=CLIENT, dst=SERVER, options=[IPOption_RR()]) / TCP(sport=1, dport=2, flags="S") / Raw(b"abc"),
     [("p2", E / Dot1Q(vlan=5) / IP(src=PUBLIC, dst=SERVER, options=[IPOption_RR()]) / TCP(sport=1, dport=2, flags="S")
       / Raw(b"abc"))]),
]
CONT_GROUPS = {"ct inside a group bucket":
               ["group_id=1,type=all,bucket=actions=ct(commit,zone=1,table=1),bucket=actions=output:p2"]}


@pytest.mark.parametrize("name,flows,pkt,want", CONT_CASES, ids=[c[0] for c in CONT_CASES])
def test_ct_and_following_actions(name, flows, pkt, want):
    dp = Dataplane(ports=["a", "b", "p1", "p2", "p3"])
    for g in CONT_GROUPS.get(name, []):
        dp.add_group(g)
    dp.add_flows(flows)
    assert_frames([(o.port, o.data) for o in dp.process(pkt, in_port="a")], want, name)


def test_zone_from_a_register():
    dp = Dataplane(ports=["a", "b", "p1", "p2"])
    dp.add_flows([
        "table=0,in_port=a,ip,actions=load:33->NXM_NX_REG1[],ct(zone=1,table=1)",
        "table=0,in_port=b,ip,actions=load:34->NXM_NX_REG1[],ct(zone=1,table=1)",
        "table=1,actions=ct(commit,zone=NXM_NX_REG1[0..15],table=2)",   # one rule, two zones
        "table=2,ct_zone=33,actions=output:p1", "table=2,ct_zone=34,actions=output:p2"])
    got = [[o.port for o in dp.process(UDP_QUERY, in_port=p)] for p in ("a", "b", "a", "b")]
    assert got == [["p1"], ["p2"], ["p1"], ["p2"]]
    assert [c.zone for c in dp.conntrack()] == [33, 34]


def test_in_port_after_the_recirculation_is_the_packets_own():
    """resubmit(p2,1) changes in_port for its lookup only (as Open vSwitch): the frozen
    state after ct(table=2) has the packet's own in_port (checked against OVS 3.1)."""
    dp = Dataplane(ports=["a", "p2", "p3", "p4"])
    dp.add_flows(["table=0,in_port=a,actions=resubmit(p2,1)", "table=1,in_port=p2,ip,actions=ct(zone=1,table=2)",
                  "table=2,in_port=p2,actions=output:p3", "table=2,in_port=a,actions=output:p4"])
    assert [o.port for o in dp.process(UDP_QUERY, in_port="a")] == ["p4"]


def test_more_than_six_passes_is_recirc_limit():
    dp = Dataplane(ports=["a", "p1"])
    dp.add_flows(["table=0,ip,actions=ct(zone=1,table=1)"] +
                 [f"table={i},actions=ct(zone=1,table={i + 1})" for i in range(1, 10)] + ["table=10,actions=output:p1"])
    assert dp.process(UDP_QUERY, in_port="a") == []
    assert drops(dp, "a") == {"recirc_limit": 1}


# ---- 5. NAT --------------------------------------------------------------------------------------

# protocol, inside packet, as it leaves, answer from outside, as it arrives inside
SNAT_ROUND_TRIPS = [
    ("udp", UDP_QUERY, udp(PUBLIC, 5000, SERVER, 53, b"query"),
     udp(SERVER, 53, PUBLIC, 5000, b"answer"), UDP_ANSWER),
    ("udp checksum 0 stays 0",
     E / IP(src=CLIENT, dst=SERVER) / UDP(sport=6000, dport=53, chksum=0) / Raw(b"zz"),
     E / IP(src=PUBLIC, dst=SERVER) / UDP(sport=6000, dport=53, chksum=0) / Raw(b"zz"),
     E / IP(src=SERVER, dst=PUBLIC) / UDP(sport=53, dport=6000, chksum=0) / Raw(b"yy"),
     E / IP(src=SERVER, dst=CLIENT) / UDP(sport=53, dport=6000, chksum=0) / Raw(b"yy")),
    ("tcp", tcp(CLIENT, 40000, SERVER, 80, "S", seq=1000), tcp(PUBLIC, 40000, SERVER, 80, "S", seq=1000),
     tcp(SERVER, 80, PUBLIC, 40000, "SA", seq=5000, ack=1001), tcp(SERVER, 80, CLIENT, 40000, "SA", seq=5000, ack=1001)),
    ("icmp echo", echo(CLIENT, SERVER, 77), echo(PUBLIC, SERVER, 77),
     echo(SERVER, PUBLIC, 77, type=0), echo(SERVER, CLIENT, 77, type=0)),
    ("low source port kept", udp(CLIENT, 53, SERVER, 53), udp(PUBLIC, 53, SERVER, 53),
     udp(SERVER, 53, PUBLIC, 53), udp(SERVER, 53, CLIENT, 53)),
]


@pytest.mark.parametrize("name,out,out_nat,back,back_nat", SNAT_ROUND_TRIPS, ids=[c[0] for c in SNAT_ROUND_TRIPS])
def test_snat_round_trip(name, out, out_nat, back, back_nat):
    dp = snat_dp()
    for _ in range(2):  # the connection's first packet, then a cached one
        assert_frames(forwarded(dp.process(out, in_port="in")), [("out", out_nat)], f"{name} out")
        assert_frames(forwarded(dp.process(back, in_port="out")), [("in", back_nat)], f"{name} back")
    (c,) = dp.conntrack()
    assert c.snat and not c.dnat


def test_udp_checksum_that_comes_to_zero_is_sent_as_ffff():
    # a payload chosen so that the translated datagram's checksum computes to 0
    c0 = IP(bytes(IP(src=PUBLIC, dst=SERVER) / UDP(sport=5000, dport=53) / Raw(b"\0\0")))[UDP].chksum
    payload = c0.to_bytes(2, "big")
    want = udp(PUBLIC, 5000, SERVER, 53, payload)
    assert frame(want)[UDP].chksum == 0xFFFF
    dp = snat_dp()
    assert_frames(forwarded(dp.process(udp(CLIENT, 5000, SERVER, 53, payload), in_port="in")), [("out", want)])


def test_endpoint_independent_mapping_and_port_preservation():
    dp = snat_dp()
    first = [translated(dp, udp(CLIENT, 5000, dst, 53), "in")[1] for dst in (SERVER, SERVER2)]
    assert [(p[IP].src, p[UDP].sport) for p in first] == [(PUBLIC, 5000)] * 2, "same mapping, source port kept"
    second = [translated(dp, udp(CLIENT2, 5000, dst, 53), "in")[1] for dst in (SERVER, SERVER2)]
    port2 = second[0][UDP].sport
    assert port2 != 5000 and 1024 <= port2 <= 65535 and second[1][UDP].sport == port2
    # each mapping leads back to its own inside endpoint
    assert translated(dp, udp(SERVER2, 53, PUBLIC, 5000), "out")[1][IP].dst == CLIENT
    back = translated(dp, udp(SERVER2, 53, PUBLIC, port2), "out")[1]
    assert (back[IP].dst, back[UDP].dport) == (CLIENT2, 5000)
    assert len(dp.conntrack()) == 4


def test_icmp_identifier_is_mapped_like_a_port():
    dp = snat_dp()
    assert translated(dp, echo(CLIENT, SERVER, 77), "in")[1][ICMP].id == 77
    other = translated(dp, echo(CLIENT2, SERVER, 77), "in")[1]
    ident = other[ICMP].id
    assert ident != 77 and 1 <= ident <= 65535
    assert other[ICMP].chksum == frame(echo(PUBLIC, SERVER, ident))[ICMP].chksum
    assert_frames(forwarded(dp.process(echo(SERVER, PUBLIC, ident, type=0), in_port="out")),
                  [("in", echo(SERVER, CLIENT2, 77, type=0))])
    assert_frames(forwarded(dp.process(echo(SERVER, PUBLIC, 77, type=0), in_port="out")),
                  [("in", echo(SERVER, CLIENT, 77, type=0))])


def test_pool_is_paired():
    """nat(src=A-B): an inside address always leaves from one public address,
    whatever its port and destination; the pool is used."""
    dp = snat_dp("nat(src=203.0.113.10-203.0.113.13)")
    pool = {f"203.0.113.{i}" for i in range(10, 14)}
    used = set()
    for h in range(1, 17):
        src = f"10.0.1.{h}"
        addrs = {translated(dp, udp(src, sport, dst, 53), "in")[1][IP].src
                 for sport in (1000, 2000, 3000) for dst in (SERVER, SERVER2)}
        assert len(addrs) == 1 and addrs <= pool, f"{src} left from {addrs}"
        used |= addrs
    assert len(used) > 1, "16 inside addresses all hashed to one public address"


def test_pool_of_every_address_is_spread_too():
    """0.0.0.0-255.255.255.255 holds 2**32 addresses: its size once wrapped to
    0 and every inside address left from 0.0.0.0."""
    dp = snat_dp("nat(src=0.0.0.0-255.255.255.255)")
    used = {translated(dp, udp(f"10.0.1.{h}", 5000, SERVER, 53), "in")[1][IP].src for h in range(1, 9)}
    assert len(used) > 1 and "0.0.0.0" not in used, used


def test_port_range_exhaustion():
    dp = snat_dp("nat(src=203.0.113.10:2000-2003)")
    ports = [translated(dp, udp(f"10.0.1.{h}", 5000, SERVER, 53), "in")[1][UDP].sport for h in range(1, 5)]
    assert sorted(ports) == [2000, 2001, 2002, 2003]
    assert forwarded(dp.process(udp("10.0.1.5", 5000, SERVER, 53), in_port="in")) == []
    assert drops(dp, "in") == {"nat_no_port": 1}
    for h, port in zip(range(1, 5), ports):  # the first four keep working, both ways
        assert translated(dp, udp(f"10.0.1.{h}", 5000, SERVER, 53), "in")[1][UDP].sport == port
        back = translated(dp, udp(SERVER, 53, PUBLIC, port), "out")[1]
        assert (back[IP].dst, back[UDP].dport) == (f"10.0.1.{h}", 5000)
    # an inside port within the range is kept when free
    dp = snat_dp("nat(src=203.0.113.10:2000-2003)")
    assert translated(dp, udp(CLIENT, 2002, SERVER, 53), "in")[1][UDP].sport == 2002
    assert drops(dp, "in") == {}


def test_port_bitmap_hands_out_every_port_of_a_range_once():
    """8,192 inside endpoints that all want port 5000 (outside the range) fill
    1024-9215 (three summary words of the bitmap) exactly; the next is refused."""
    dp = snat_dp("nat(src=203.0.113.10:1024-9215)")
    n = 8192
    outs = dp.process([fast_udp(_inside(i), 5000, SERVER, 53) for i in range(n + 1)], in_port="in")
    assert len(outs) == n and drops(dp, "in") == {"nat_no_port": 1}
    assert sorted(c.reply["dport"] for c in dp.conntrack()) == list(range(1024, 9216))


def test_random_does_not_keep_the_inside_port():
    dp = snat_dp("nat(src=203.0.113.10,random)")
    ports = [translated(dp, udp(f"10.0.1.{h}", 5000 + h, SERVER, 53), "in")[1][UDP].sport for h in range(1, 9)]
    assert all(1024 <= p <= 65535 for p in ports) and len(set(ports)) == 8
    assert sum(p == 5000 + h for h, p in zip(range(1, 9), ports)) <= 1


def test_dnat():
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows(["table=0,in_port=out,ip,actions=ct(commit,zone=5,nat(dst=10.0.1.12:80),table=1)",
                  "table=0,in_port=in,ip,actions=ct(zone=5,nat,table=2)",
                  "table=1,ct_state=+trk-inv,actions=output:in",
                  "table=2,ct_state=+trk+est,actions=output:out"])
    cases = [
        ("out", tcp(SERVER, 33333, PUBLIC, 80, "S", seq=1), "in", tcp(SERVER, 33333, CLIENT2, 80, "S", seq=1)),
        ("in", tcp(CLIENT2, 80, SERVER, 33333, "SA", seq=9, ack=2), "out", tcp(PUBLIC, 80, SERVER, 33333, "SA", seq=9, ack=2)),
        ("out", tcp(SERVER, 33334, PUBLIC, 8080, "S", seq=1), "in", tcp(SERVER, 33334, CLIENT2, 80, "S", seq=1)),
        ("out", udp(SERVER, 7, PUBLIC, 80), "in", udp(SERVER, 7, CLIENT2, 80)),
        ("in", udp(CLIENT2, 80, SERVER, 7), "out", udp(PUBLIC, 80, SERVER, 7)),
    ]
    for port, pkt, out_port, want in cases:
        assert_frames([(o.port, o.data) for o in dp.process(pkt, in_port=port)], [(out_port, want)], pkt.summary())
    assert all(c.dnat and not c.snat for c in dp.conntrack())


def test_dnat_keeps_the_port_without_a_range():
    dp = Dataplane(ports=["in", "out"])
    dp.add_flow("table=0,in_port=out,ip,actions=ct(commit,zone=5,nat(dst=10.0.1.12)),output:in")
    assert_frames([(o.port, o.data) for o in dp.process(udp(SERVER, 1, PUBLIC, 4444), in_port="out")],
                  [("in", udp(SERVER, 1, CLIENT2, 4444))])


def test_nat_collision_is_a_named_drop():
    """A DNAT whose reply tuple is an existing connection's original tuple."""
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows(["table=0,in_port=in,ip,actions=ct(commit,zone=5),output:out",
                  "table=0,in_port=out,ip,actions=ct(commit,zone=5,nat(dst=10.0.1.11)),output:in"])
    assert len(dp.process(UDP_QUERY, in_port="in")) == 1
    assert dp.process(udp(SERVER, 53, PUBLIC, 5000), in_port="out") == []
    assert drops(dp, "out") == {"nat_collision": 1} and len(dp.conntrack()) == 1


def test_ipv6_is_tracked_and_never_translated():
    dp = snat_dp()
    dp.add_flows(["table=0,in_port=in,ipv6,actions=ct(commit,zone=5,nat(src=203.0.113.10),table=1)",
                  "table=0,in_port=out,ipv6,actions=ct(zone=5,nat,table=1)"])
    out, back = _udp6(CLIENT6, 1000, SERVER6, 53), _udp6(SERVER6, 53, CLIENT6, 1000)
    assert_frames(forwarded(dp.process(out, in_port="in")), [("out", out)])
    assert_frames(forwarded(dp.process(back, in_port="out")), [("in", back)])
    (c,) = dp.conntrack()
    assert not c.snat and not c.dnat and dp.stats()["conntrack"]["nat_mappings"] == 0


def test_static_mapping_is_the_endpoints_mapping_and_reserves_its_port():
    dp = snat_dp()
    with dp.transaction() as t:
        t.set_nat_static([(5, 17, CLIENT2, 53, PUBLIC, 5353)])
    assert translated(dp, udp("10.0.1.13", 5353, SERVER, 53), "in")[1][UDP].sport != 5353, "reserved"
    for dst in (SERVER, SERVER2):
        assert translated(dp, udp(CLIENT2, 53, dst, 53), "in")[1][UDP].sport == 5353
    back = translated(dp, udp(SERVER, 53, PUBLIC, 5353), "out")[1]
    assert (back[IP].dst, back[UDP].dport) == (CLIENT2, 53)


def test_nat_mappings_counter():
    dp = snat_dp()
    for src in (CLIENT, CLIENT2):
        for dst in (SERVER, SERVER2):
            send(dp, udp(src, 5000, dst, 53), "in", t=0)
    assert dp.stats()["conntrack"]["nat_mappings"] == 2   # one per inside endpoint, whatever the destinations
    send(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=301)
    assert dp.stats()["conntrack"]["nat_mappings"] == 0


# ---- 6. ICMP errors through NAT ------------------------------------------------------------------

def _tcp_conn(dp):
    """An established TCP connection CLIENT:40000 -> SERVER:80 through SNAT; returns
    a segment as it left the NAT, and a later answer as it arrives and as it goes in."""
    dp.process(tcp(CLIENT, 40000, SERVER, 80, "S", seq=1000), in_port="in")
    dp.process(tcp(SERVER, 80, PUBLIC, 40000, "SA", seq=5000, ack=1001), in_port="out")
    dp.process(tcp(CLIENT, 40000, SERVER, 80, "A", seq=1001, ack=5001), in_port="in")
    return (tcp(PUBLIC, 40000, SERVER, 80, "PA", seq=1001, ack=5001, payload=b"GET / HTTP/1.0\r\n"),
            tcp(SERVER, 80, PUBLIC, 40000, "PA", seq=5001, ack=1001, payload=b"HTTP/1.0 200"),
            tcp(SERVER, 80, CLIENT, 40000, "PA", seq=5001, ack=1001, payload=b"HTTP/1.0 200"))


def _udp_conn(dp):
    dp.process(UDP_QUERY, in_port="in")
    long = b"answer with a few records " * 3
    return udp(PUBLIC, 5000, SERVER, 53, b"query"), udp(SERVER, 53, PUBLIC, 5000, long), udp(SERVER, 53, CLIENT, 5000, long)


def _echo_conn(dp):
    dp.process(echo(CLIENT, SERVER, 77), in_port="in")
    long = b"0123456789abcdef" * 4
    return (echo(PUBLIC, SERVER, 77), echo(SERVER, PUBLIC, 77, type=0, payload=long),
            echo(SERVER, CLIENT, 77, type=0, payload=long))


# name, connection setup (returns the packet as it left the NAT), error source,
# type, code, quote length (None: all), extra ICMP fields
ERROR_CASES = [
    ("udp time exceeded", _udp_conn, ROUTER, 11, 0, None, {}),
    ("udp port unreachable", _udp_conn, SERVER, 3, 3, None, {}),
    ("udp frag needed, 8-byte quote", _udp_conn, ROUTER, 3, 4, 28, {"nexthopmtu": 1400}),
    ("tcp host unreachable", _tcp_conn, ROUTER, 3, 1, None, {}),
    ("tcp time exceeded, 8-byte quote", _tcp_conn, ROUTER, 11, 0, 28, {}),
    ("tcp frag needed, header quote", _tcp_conn, ROUTER, 3, 4, 40, {"nexthopmtu": 1280}),
    ("icmp echo time exceeded", _echo_conn, ROUTER, 11, 0, None, {}),
]


@pytest.mark.parametrize("name,setup,src,type_,code,cut,extra", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_icmp_error_translated_back(name, setup, src, type_, code, cut, extra):
    """RFC 5508: outer destination, quoted source address and port, quoted IP
    and L4 checksums and the ICMP checksum all as the inside host sent them."""
    dp = snat_dp()
    left, answer, answer_in = setup(dp)
    before = list(dp.conntrack())
    seen = ip_bytes(left, ttl=1)                                  # what the router quotes
    sent = ip_bytes(left, ttl=1, src=CLIENT)                      # what the inside host had sent
    assert seen != sent
    err = icmp_error(src, PUBLIC, type_, code, seen, cut=cut, **extra)
    want = icmp_error(src, CLIENT, type_, code, sent, cut=cut, **extra)
    assert_frames(forwarded(dp.process(err, in_port="out")), [("in", want)], name)
    assert list(dp.conntrack()) == before, "an error neither ends nor changes the connection"


@pytest.mark.parametrize("name,setup,src,type_,code,cut,extra", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_answers_after_an_icmp_error_pass(name, setup, src, type_, code, cut, extra):
    """The error does not end the connection: a later answer is translated (and not mangled)."""
    dp = snat_dp()
    left, answer, answer_in = setup(dp)
    err = icmp_error(src, PUBLIC, type_, code, ip_bytes(left, ttl=1), cut=cut, **extra)
    assert len(forwarded(dp.process(err, in_port="out"))) == 1
    assert_frames(forwarded(dp.process(answer, in_port="out")), [("in", answer_in)], "a later answer")


def test_icmp_error_from_the_inside_host_is_translated_out():
    """The inside host answers an answer with port unreachable: the outer source
    and the quoted destination become the public endpoint."""
    dp = snat_dp()
    dp.process(UDP_QUERY, in_port="in")
    dp.process(udp(SERVER, 53, PUBLIC, 5000, b"answer"), in_port="out")
    err = icmp_error(CLIENT, SERVER, 3, 3, udp(SERVER, 53, CLIENT, 5000, b"answer"))
    want = icmp_error(PUBLIC, SERVER, 3, 3, udp(SERVER, 53, PUBLIC, 5000, b"answer"))
    assert_frames(forwarded(dp.process(err, in_port="in")), [("out", want)])


def test_packets_after_an_icmp_error_are_not_taken_for_errors():
    dp = tracking_dp()
    assert state(dp.process(UDP_QUERY, in_port="a")) == "+new+trk"
    assert state(dp.process(icmp_error(ROUTER, CLIENT, 11, 0, QUOTE_UDP), in_port="b")) == "+rel+rpl+trk"
    assert state(dp.process(UDP_ANSWER, in_port="b")) == "+est+rpl+trk"
    assert state(dp.process(tcp(CLIENT, 1, SERVER, 2, "S"), in_port="a")) == "+new+trk"


def test_icmp_errors_do_not_end_or_refresh_connections():
    dp = snat_dp()
    send(dp, UDP_QUERY, "in", t=0)
    quote = ip_bytes(udp(PUBLIC, 5000, SERVER, 53, b"query"), ttl=1)
    for t in (100, 200, 299):
        assert len(forwarded(send(dp, icmp_error(ROUTER, PUBLIC, 11, 0, quote), "out", t=t))) == 1
    assert dp.conntrack()[0].expires_in == pytest.approx(1, abs=0.01)
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=299.5)[1][IP].dst == CLIENT
    assert forwarded(send(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=800)) == []


# ---- 7. Filtering --------------------------------------------------------------------------------

def test_filtering_is_address_and_port_dependent_by_default():
    dp = snat_dp(probe_states=True)
    send(dp, UDP_QUERY, "in")
    for pkt in (udp(SERVER2, 53, PUBLIC, 5000), udp(SERVER, 54, PUBLIC, 5000)):
        outs = dp.process(pkt, in_port="out")
        assert state(outs) == "+new+trk" and forwarded(outs) == []
    assert len(dp.conntrack()) == 1


def test_endpoint_independent_filtering():
    dp = snat_dp(probe_states=True)
    with dp.transaction() as t:
        t.set_ct_zones([(5, 0, True)])
    send(dp, UDP_QUERY, "in")
    outs = dp.process(udp(SERVER2, 99, PUBLIC, 5000, b"hi"), in_port="out")
    assert state(outs) == "+new+trk+dnat"
    assert_frames(forwarded(outs), [("in", udp(SERVER2, 99, CLIENT, 5000, b"hi"))])
    # the inside endpoint answers from its mapping
    assert_frames(forwarded(dp.process(udp(CLIENT, 5000, SERVER2, 99, b"yo"), in_port="in")),
                  [("out", udp(PUBLIC, 5000, SERVER2, 99, b"yo"))])
    # a public port that is nobody's mapping stays closed
    assert forwarded(dp.process(udp(SERVER2, 99, PUBLIC, 5001), in_port="out")) == []
    # another zone's settings are not this zone's
    with dp.transaction() as t:
        t.set_ct_zones([(6, 0, True)])
    assert forwarded(dp.process(udp(SERVER3, 99, PUBLIC, 5000), in_port="out")) == []


def test_endpoint_independent_filtering_applies_to_existing_mappings():
    dp = snat_dp()
    send(dp, UDP_QUERY, "in")
    with dp.transaction() as t:
        t.set_ct_zones([(5, 0, True)])
    assert_frames(forwarded(dp.process(udp(SERVER2, 99, PUBLIC, 5000, b"hi"), in_port="out")),
                  [("in", udp(SERVER2, 99, CLIENT, 5000, b"hi"))])


def test_mapping_lasts_while_an_endpoint_independent_connection_uses_it():
    dp = snat_dp()
    with dp.transaction() as t:
        t.set_ct_zones([(5, 0, True)])
    send(dp, UDP_QUERY, "in", t=0)                                      # makes PUBLIC:5000 -> CLIENT:5000
    assert translated(dp, udp(SERVER2, 99, PUBLIC, 5000), "out", t=200)[1][IP].dst == CLIENT
    assert translated(dp, udp(SERVER2, 99, PUBLIC, 5000), "out", t=400)[1][IP].dst == CLIENT  # query's conn gone
    assert translated(dp, udp(CLIENT2, 5000, SERVER, 53), "in", t=401)[1][UDP].sport != 5000
    assert translated(dp, udp(CLIENT, 5000, SERVER3, 53), "in", t=402)[1][UDP].sport == 5000


# ---- 8. Limits -----------------------------------------------------------------------------------

def _two_zone_dp(**kw):
    """SNAT in zone 5 (inside 10.0.1.0/24, PUBLIC) and zone 6 (10.0.2.0/24, PUBLIC2)."""
    dp = snat_dp(**kw)
    dp.add_flows(["table=0,priority=40000,in_port=in,ip,nw_src=10.0.2.0/24,"
                  "actions=ct(commit,zone=6,nat(src=203.0.113.20),table=1)",
                  "table=0,priority=40000,in_port=out,ip,nw_dst=203.0.113.20,actions=ct(zone=6,nat,table=1)"])
    return dp


def test_zone_quota():
    dp = _two_zone_dp()
    with dp.transaction() as t:
        t.set_ct_zones([(5, 3, False)])
    for i in range(3):
        assert len(forwarded(dp.process(udp(CLIENT, 5000 + i, SERVER, 53), in_port="in"))) == 1
    for i in range(3, 5):
        assert forwarded(dp.process(udp(CLIENT, 5000 + i, SERVER, 53), in_port="in")) == []
    assert drops(dp, "in") == {"ct_quota": 2}
    for i in range(3):  # established ones keep working both ways
        assert translated(dp, udp(CLIENT, 5000 + i, SERVER, 53), "in")[1][UDP].sport == 5000 + i
        assert translated(dp, udp(SERVER, 53, PUBLIC, 5000 + i), "out")[1][IP].dst == CLIENT
    for i in range(5):  # another zone is not limited
        assert translated(dp, udp("10.0.2.1", 5000 + i, SERVER, 53), "in")[1][IP].src == PUBLIC2
    assert dp.stats()["conntrack"]["zones"] == {5: 3, 6: 5}


def test_zone_quota_frees_expired_connections_before_refusing():
    dp = snat_dp()
    with dp.transaction() as t:
        t.set_ct_zones([(5, 3, False)])
    for i in range(3):
        send(dp, udp(CLIENT, 5000 + i, SERVER, 53), "in", t=i)
    assert forwarded(send(dp, udp(CLIENT, 6000, SERVER, 53), "in", t=100)) == []
    assert len(forwarded(send(dp, udp(CLIENT, 6001, SERVER, 53), "in", t=303))) == 1
    assert drops(dp, "in") == {"ct_quota": 1}


def test_global_connection_limit():
    dp = snat_dp()
    dp.ct_config(max_connections=2)
    assert dp.ct_config()["max_connections"] == 2
    for i in range(2):
        assert len(forwarded(dp.process(udp(CLIENT, 5000 + i, SERVER, 53), in_port="in"))) == 1
    assert forwarded(dp.process(udp(CLIENT, 5002, SERVER, 53), in_port="in")) == []
    assert drops(dp, "in") == {"ct_table_full": 1}
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5001), "out")[1][IP].dst == CLIENT


def test_table_full_to_its_limit_finds_every_connection():
    """1,024 connections in the smallest table (512 buckets of seven entries
    for 2,048 keys: some buckets overflow into their chains). Every reply
    finds its connection and is translated back, the dump lists each once,
    the next connection is refused, and after a flush none is left."""
    dp = snat_dp()
    dp.ct_config(max_connections=1024)
    outs = dp.process([udp(CLIENT, 1024 + i, SERVER, 53) for i in range(1024)], in_port="in")
    sports = sorted(Ether(o.data)[UDP].sport for o in outs if o.port == "out")
    assert sports == list(range(1024, 2048))  # each kept its port
    assert forwarded(send(dp, udp(CLIENT, 3000, SERVER, 53), "in")) == []
    assert drops(dp, "in") == {"ct_table_full": 1}
    replies = dp.process([udp(SERVER, 53, PUBLIC, 1024 + i) for i in range(1024)], in_port="out")
    back = sorted((Ether(o.data)[IP].dst, Ether(o.data)[UDP].dport) for o in replies if o.port == "in")
    assert back == [(CLIENT, 1024 + i) for i in range(1024)]
    entries = dp.conntrack()
    assert len(entries) == 1024 and len({str(e.orig) for e in entries}) == 1024
    assert dp.ct_flush() == 1024
    assert dp.conntrack() == [] and dp.stats()["conntrack"]["connections"] == 0
    assert [o for o in dp.process([udp(SERVER, 53, PUBLIC, 1024 + i) for i in range(8)], in_port="out")
            if o.port == "in"] == []


def test_syn_flood_in_one_zone_leaves_another_alone():
    dp = _two_zone_dp()
    with dp.transaction() as t:
        t.set_ct_zones([(5, 50, False), (6, 50, False)])
    # zone 6 has an established connection
    b_syn = tcp("10.0.2.1", 40000, SERVER, 80, "S", seq=1)
    assert translated(dp, b_syn, "in")[1][IP].src == PUBLIC2
    dp.process(tcp(SERVER, 80, PUBLIC2, 40000, "SA", seq=100, ack=2), in_port="out")
    # zone 5 is flooded far beyond its quota
    flood = [tcp(f"10.0.1.{1 + i % 200}", 1024 + i, SERVER, 80, "S", seq=i) for i in range(1000)]
    dp.process(flood, in_port="in")
    assert dp.stats()["conntrack"]["zones"][5] == 50
    assert drops(dp, "in") == {"ct_quota": 950}
    # zone 6: established data both ways and new connections still pass
    assert translated(dp, tcp("10.0.2.1", 40000, SERVER, 80, "PA", seq=2, ack=101, payload=b"x"), "in")[1][IP].src == PUBLIC2
    assert translated(dp, tcp(SERVER, 80, PUBLIC2, 40000, "PA", seq=101, ack=3, payload=b"y"), "out")[1][IP].dst == "10.0.2.1"
    for i in range(10):
        assert translated(dp, tcp("10.0.2.2", 2000 + i, SERVER, 80, "S", seq=1), "in")[1][IP].src == PUBLIC2
    assert drops(dp, "in") == {"ct_quota": 950}


def test_zone_quota_frees_expired_connections_of_another_worker():
    dp = snat_dp(workers=2)
    with dp.transaction() as t:
        t.set_ct_zones([(5, 3, False)])
    for i in range(3):
        send(dp, udp(CLIENT, 5000 + i, SERVER, 53), "in", t=i, worker=1)
    assert len(forwarded(send(dp, udp(CLIENT, 6001, SERVER, 53), "in", t=303, worker=0))) == 1
    assert dp.stats()["conntrack"]["connections"] == 1


def test_nat_port_of_expired_connection_of_another_worker_is_free_again():
    dp = snat_dp("nat(src=203.0.113.10:2000-2001)", workers=2)
    for h in (1, 2):
        send(dp, udp(f"10.0.1.{h}", 5000, SERVER, 53), "in", t=h, worker=1)
    assert dp.conntrack() != []
    assert len(forwarded(send(dp, udp("10.0.1.9", 5000, SERVER, 53), "in", t=400, worker=0))) == 1
    assert drops(dp, "in") == {}


# ---- 9. Timeouts -----------------------------------------------------------------------------

def test_udp_timeout_follows_packet_time():
    dp = snat_dp(probe_states=True)
    send(dp, UDP_QUERY, "in", t=0)
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=240)[1][IP].dst == CLIENT  # 4 min: alive
    assert dp.conntrack()[0].expires_in == pytest.approx(300, abs=0.01)                     # refreshed
    outs = send(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=240 + 360)                     # 6 min idle: gone
    assert state(outs) == "+new+trk" and forwarded(outs) == []
    assert dp.conntrack() == [] and dp.stats()["conntrack"]["connections"] == 0
    # the mapping went with its connection: another inside host gets the port
    assert translated(dp, udp(CLIENT2, 5000, SERVER, 53), "in", t=601)[1][UDP].sport == 5000


def test_tcp_established_timeout():
    for idle, alive in ((2 * 3600, True), (2 * 3600 + 300, False)):
        dp = tracking_dp()
        for port, pkt, _, _ in HANDSHAKE:
            send(dp, pkt, port, t=0)
        got = state(send(dp, _c2s("PA", 1001, 5001, b"x" * 10), "a", t=idle))
        assert got == ("+est+trk" if alive else "+inv+trk"), f"after {idle} s"
        assert len(dp.conntrack()) == (1 if alive else 0)


def test_each_packet_of_a_batch_is_tracked_at_its_own_time():
    """One process() call over hours of capture time: the handshake's ACK,
    2 ms after the SYN-ACK, shares a burst with the data sent after the idle
    time (one input port per burst). It is tracked at its own time, so the
    connection (240 s transitory until then) is alive for it; the data finds
    it alive after 2 hours idle and gone after 2 h 5 min, as one packet per
    call would."""
    for idle, alive in ((2 * 3600, True), (2 * 3600 + 300, False)):
        dp = tracking_dp()
        pkts = [(port, pkt) for port, pkt, _, _ in HANDSHAKE] + [("a", _c2s("PA", 1001, 5001, b"x" * 10))]
        ts = [T0 + i * SEC // 1000 for i in range(3)] + [T0 + int((0.002 + idle) * SEC)]
        outs = dp.process(pkts, timestamps=ts)
        got = [state([o for o in outs if o.index == i]) for i in range(4)]
        assert got == [s for _, _, s, _ in HANDSHAKE] + ["+est+trk" if alive else "+inv+trk"], f"after {idle} s"
        assert len(dp.conntrack()) == (1 if alive else 0)


def test_tcp_transitory_timeout_after_close():
    dp = tracking_dp()
    for port, pkt, _, _ in HANDSHAKE:
        send(dp, pkt, port, t=0)
    send(dp, _c2s("R", 1001), "a", t=10)
    assert dp.conntrack()[0].expires_in == pytest.approx(240, abs=0.01)


def test_ct_config_timeouts():
    dp = snat_dp()
    cfg = dp.ct_config(timeouts={"udp": 10})
    assert cfg["timeouts"] == {"tcp_transitory": 240.0, "tcp_established": 7440.0, "udp": 10.0, "icmp": 60.0}
    send(dp, UDP_QUERY, "in", t=0)
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=9.5)[1][IP].dst == CLIENT
    assert forwarded(send(dp, udp(SERVER, 53, PUBLIC, 5000), "out", t=20)) == []
    with pytest.raises(DpuError):
        dp.ct_config(timeouts={"udp_stream": 5})
    with pytest.raises(DpuError):
        dp.ct_config(timeouts={"udp": 0})


def test_icmp_timeout():
    dp = snat_dp()
    send(dp, echo(CLIENT, SERVER, 5), "in", t=0)
    assert translated(dp, echo(SERVER, PUBLIC, 5, type=0), "out", t=59)[1][IP].dst == CLIENT
    assert forwarded(send(dp, echo(SERVER, PUBLIC, 5, type=0), "out", t=59 + 61)) == []


def test_warp_drives_the_monotonic_clock():
    dp = snat_dp()
    dp.ct_config(timeouts={"udp": 10})
    send(dp, UDP_QUERY, "in")
    dp.warp(5)
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5000), "out")[1][IP].dst == CLIENT
    dp.warp(11)
    assert forwarded(send(dp, udp(SERVER, 53, PUBLIC, 5000), "out")) == []
    assert dp.conntrack() == [] and dp.stats()["conntrack"]["connections"] == 0


def test_expired_connections_leave_dumps_and_counters_after_the_next_batch():
    dp = snat_dp()
    for i in range(3):
        send(dp, udp(CLIENT, 5000 + i, SERVER, 53), "in", t=0)
    st = dp.stats()["conntrack"]
    assert (st["connections"], st["created"], st["expired"]) == (3, 3, 0)
    send(dp, udp(CLIENT, 7000, SERVER, 53), "in", t=301)
    st = dp.stats()["conntrack"]
    assert (st["connections"], st["created"], st["expired"], st["zones"]) == (1, 4, 3, {5: 1})
    assert [c.orig["sport"] for c in dp.conntrack()] == [7000]


def test_clock_jump_does_not_stall_the_worker(run_python):
    """A packet timestamped decades after the monotonic clock (a capture's clock) expires
    the connection at once; the wheel is not walked tick by tick over the jump (~10^11
    ticks of 8 ms: a hung worker, not a slow one). The scenario runs in a child whose CPU
    time the kernel limits to far more than it needs (a bound on work, whatever the load)."""
    code = f"""
import json, resource
resource.setrlimit(resource.RLIMIT_CPU, (30, resource.RLIM_INFINITY))
from dpu import Dataplane
dp = Dataplane(ports={["in", "out", *BITS]!r}, workers=1)
dp.add_flows({snat_flows()!r})
dp.process({bytes(UDP_QUERY)!r}, in_port="in")  # files a connection on the monotonic clock
outs = dp.process({bytes(udp(SERVER, 53, PUBLIC, 5000))!r}, in_port="out", timestamps=[{T0}])
print(json.dumps([[o.port, o.data.hex()] for o in outs]))
print(dp.stats()["conntrack"]["connections"])
"""
    out, connections = run_python(code).splitlines()
    outs = [types.SimpleNamespace(port=p, data=bytes.fromhex(d)) for p, d in json.loads(out)]
    # a capture's clock: the connection has expired and goes, the wheel is empty
    assert forwarded(outs) == []
    assert int(connections) == 0


# ---- 10. force -------------------------------------------------------------------------------

def test_force_replaces_a_connection_committed_the_other_way():
    dp = tracking_dp(["table=0,in_port=a,ip,actions=ct(commit,zone=1,table=1)",
                      "table=0,in_port=b,ip,actions=ct(commit,force,zone=1,table=1)"] + probe(1))
    assert state(dp.process(UDP_QUERY, in_port="a")) == "+new+trk"
    assert state(dp.process(UDP_ANSWER, in_port="b")) == "+new+trk"
    (c,) = dp.conntrack()
    assert c.orig == {"src": SERVER, "dst": CLIENT, "sport": 53, "dport": 5000}
    assert state(dp.process(UDP_QUERY, in_port="a")) == "+est+rpl+trk"
    assert state(dp.process(UDP_ANSWER, in_port="b")) == "+est+trk"  # force leaves its own direction alone
    st = dp.stats()["conntrack"]
    assert (st["connections"], st["created"], st["removed"]) == (1, 2, 1)


def test_force_on_a_nat_connection_releases_its_mapping():
    dp = snat_dp()
    dp.add_flow("table=0,priority=40000,in_port=out,ip,actions=ct(commit,force,zone=5),output:in")
    send(dp, UDP_QUERY, "in")
    assert translated(dp, udp(CLIENT2, 5000, SERVER2, 53), "in")[1][UDP].sport != 5000
    send(dp, udp(SERVER, 53, PUBLIC, 5000), "out")
    conns = dp.conntrack()
    assert conns[0].orig == {"src": CLIENT2, "dst": SERVER2, "sport": 5000, "dport": 53}
    assert conns[1].orig == {"src": SERVER, "dst": PUBLIC, "sport": 53, "dport": 5000} and not conns[1].snat
    # PUBLIC:5000 is free again
    assert translated(dp, udp("10.0.1.13", 5000, SERVER3, 53), "in")[1][UDP].sport == 5000


# ---- 11. Dumps -------------------------------------------------------------------------------

def test_dump_text_zone_filter_and_flush():
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows([
        "table=0,in_port=in,udp,tp_dst=123,actions=ct(commit),output:out",
        "table=0,in_port=in,tcp,actions=ct(commit,zone=5,nat(src=203.0.113.10)),output:out",
        "table=0,in_port=in,icmp,actions=ct(commit,zone=5,nat(src=203.0.113.10),exec(set_field:0x2a->ct_mark)),output:out",
        "table=0,in_port=in,udp,tp_dst=53,actions=ct(commit,zone=9,exec(set_field:0xff00/0xff00->ct_label)),output:out",
        "table=0,in_port=out,ip,nw_dst=203.0.113.10,actions=ct(zone=5,nat),output:in",
    ])
    dp.process([udp(CLIENT, 123, SERVER, 123), tcp(CLIENT, 40000, SERVER, 80, "S", seq=7), echo(CLIENT, SERVER, 7),
                UDP_QUERY], in_port="in")
    dp.process(tcp(SERVER, 80, PUBLIC, 40000, "SA", seq=70, ack=8), in_port="out")
    want = [
        "udp,orig=(src=10.0.1.11,dst=198.51.100.1,sport=123,dport=123),"
        "reply=(src=198.51.100.1,dst=10.0.1.11,sport=123,dport=123)",
        "icmp,orig=(src=10.0.1.11,dst=198.51.100.1,id=7,type=8,code=0),"
        "reply=(src=198.51.100.1,dst=203.0.113.10,id=7,type=0,code=0),zone=5,mark=42",
        "tcp,orig=(src=10.0.1.11,dst=198.51.100.1,sport=40000,dport=80),"
        "reply=(src=198.51.100.1,dst=203.0.113.10,sport=80,dport=40000),zone=5,protoinfo=(state=ESTABLISHED)",
        "udp,orig=(src=10.0.1.11,dst=198.51.100.1,sport=5000,dport=53),"
        "reply=(src=198.51.100.1,dst=10.0.1.11,sport=53,dport=5000),zone=9,labels=0xff00",
    ]
    conns = dp.conntrack()
    assert [str(c) for c in conns] == want
    assert [(c.proto, c.zone, c.mark, c.label, c.state, c.snat) for c in conns] == [
        (17, 0, 0, 0, None, False), (1, 5, 42, 0, None, True), (6, 5, 0, 0, "ESTABLISHED", True),
        (17, 9, 0, 0xff00, None, False)]
    assert conns[1].orig == {"src": CLIENT, "dst": SERVER, "id": 7, "type": 8, "code": 0}
    assert conns[2].reply == {"src": SERVER, "dst": PUBLIC, "sport": 80, "dport": 40000}
    assert conns[0].expires_in == pytest.approx(300, abs=5) and conns[1].expires_in == pytest.approx(60, abs=5)
    assert [str(c) for c in dp.conntrack(zone=5)] == want[1:3]
    assert [str(c) for c in dp.conntrack(zone=0)] == want[:1]
    assert dp.conntrack(zone=6) == []
    assert dp.ct_flush(5) == 2
    assert [str(c) for c in dp.conntrack()] == [want[0], want[3]]
    assert dp.stats()["conntrack"]["zones"] == {0: 1, 9: 1}
    # the flushed connection's reply is no longer translated
    assert_frames([(o.port, o.data) for o in dp.process(tcp(SERVER, 80, PUBLIC, 40000, "A", seq=71, ack=8), in_port="out")],
                  [("in", tcp(SERVER, 80, PUBLIC, 40000, "A", seq=71, ack=8))])
    assert dp.ct_flush(5) == 0 and dp.ct_flush() == 2 and dp.conntrack() == []
    ct = dp.stats()["conntrack"]
    assert ct["connections"] == 0
    assert (ct["created"], ct["expired"], ct["removed"]) == (4, 0, 4)  # the flushes count as removals
    # the flushed connections' mappings are gone: another inside host gets their port and identifier
    out = dp.process([tcp(CLIENT2, 40000, SERVER2, 80, "S"), echo(CLIENT2, SERVER2, 7)], in_port="in")
    assert [(Ether(o.data)[IP].src, Ether(o.data)[IP].payload.sport if TCP in Ether(o.data) else Ether(o.data)[ICMP].id)
            for o in out] == [(PUBLIC, 40000), (PUBLIC, 7)]


def test_flush_then_reply_is_not_translated():
    dp = snat_dp()
    dp.add_flows(["table=2,priority=1,in_port=out,actions=output:in"])   # show what comes through untranslated
    send(dp, UDP_QUERY, "in")
    assert translated(dp, udp(SERVER, 53, PUBLIC, 5000), "out")[1][IP].dst == CLIENT
    assert dp.ct_flush(5) == 1
    assert_frames(forwarded(dp.process(udp(SERVER, 53, PUBLIC, 5000), in_port="out")),
                  [("in", udp(SERVER, 53, PUBLIC, 5000))])


# ---- 12. Syntax ------------------------------------------------------------------------------

ROUND_TRIP = [
    "ip,actions=ct(commit,table=2,zone=5,nat(src=203.0.113.10-203.0.113.13:1024-2000,random),"
    "exec(set_field:0x1->ct_mark))",
    "udp,actions=ct(commit,zone=NXM_NX_REG1[0..15],nat(dst=10.0.1.12:80),"
    "exec(set_field:0x5/0xff->ct_mark,set_field:0x1/0x1->ct_label)),output:p",
    "tcp,actions=ct(table=3,zone=7,nat)",
    "actions=ct(commit,force,zone=1,exec(load:0x3->NXM_NX_CT_MARK[0..7]))",
    "actions=ct_clear,ct(table=4)",
    "ip,actions=ct(commit,nat(src=203.0.113.10:5000,persistent,hash))",
    "ct_state=+est-rpl+trk,ct_zone=5,ct_mark=0x5/0xff,ct_label=0x1/0x1,ip,actions=output:p",
    "ct_state=+new+trk,ct_nw_src=10.0.0.0/8,ct_nw_proto=6,ct_tp_dst=80,tcp,actions=output:p",
    "ct_state=+est+trk,ct_ipv6_src=2001:db8::1,ipv6,actions=output:p",
    "actions=ct(commit,exec(set_field:0xffffffffffffffffffffffffffffffff->ct_label))",
]


@pytest.mark.parametrize("flow", ROUND_TRIP)
def test_ct_syntax_round_trips(flow):
    dp = Dataplane(ports=["p"])
    dp.add_flow(flow)
    (printed,) = dp.dump_flows()
    assert printed.spec == "table=0," + flow
    again = Dataplane(ports=["p"])
    again.add_flow(printed.spec)
    assert again.dump_flows()[0].spec == printed.spec


# flow, offending token (or the tokens that would do), message fragment
SYNTAX_ERRORS = [
    ("actions=ct(force)", "ct(force)", "force needs commit"),
    ("actions=ct(exec(set_field:1->ct_mark))", "ct(exec(set_field:1->ct_mark))", "exec needs commit"),
    ("actions=ct(commit,exec(output:1))", ("exec(output:1)", "output:1"), "only set_field or load"),
    ("actions=set_field:1->ct_mark", "ct_mark", "ct(commit,exec("),
    ("actions=load:1->NXM_NX_CT_MARK[]", "NXM_NX_CT_MARK[]", "ct(commit,exec("),
    ("ip,actions=ct(commit,nat(src=10.0.0.5-10.0.0.1))", "10.0.0.5-10.0.0.1", "reversed"),
    ("ip,actions=ct(commit,nat(src=10.0.0.1:2000-1000))", "2000-1000", "reversed"),
    ("actions=ct(zone=NXM_NX_REG0[0..31])", "NXM_NX_REG0[0..31]", "at most 16"),
    ("actions=ct(zone=70000)", "70000", "0..65535"),
    ("actions=ct(alg=ftp)", "alg=ftp", "not supported"),
    ("actions=ct(bogus=1)", "bogus=1", "unknown"),
    ("actions=ct(commit,nat(foo=1.1.1.1))", "foo=1.1.1.1", "unknown"),
    ("actions=ct(commit,nat(src=[2001:db8::1]))", "[2001:db8::1]", "IPv6"),
    ("actions=ct(table=300)", "300", "out of range"),
]


@pytest.mark.parametrize("flow,token,message", SYNTAX_ERRORS, ids=[getattr(s, "values", s)[0] for s in SYNTAX_ERRORS])
def test_ct_syntax_errors(flow, token, message):
    dp = Dataplane(ports=["p"])
    with pytest.raises(DpuError) as ei:
        dp.add_flow(flow)
    e = ei.value
    assert flow[e.position:].startswith(e.token), f"position {e.position} does not point at {e.token!r}"
    assert e.token in (token if isinstance(token, tuple) else (token,)), (e.token, e.position, str(e))
    assert message in str(e) and f"column {e.position + 1}" in str(e)
    assert dp.dump_flows() == []


# ---- 13. Concurrency -------------------------------------------------------------------------

def test_fast_builder_matches_scapy():
    for args in [(CLIENT, 5000, SERVER, 53, b"q"), (PUBLIC, 65535, SERVER2, 1, b"odd"), (SERVER, 53, "10.1.0.1", 10001, b"")]:
        assert fast_udp(*args) == bytes(frame(udp(*args)))


def test_both_directions_on_two_workers_concurrently():
    """Worker 0 sends the originals of 500 connections while worker 1 sends their
    replies: every reply that comes out is translated right, all do once their
    connection exists, and there are exactly 500 connections."""
    n = 500
    dp = snat_dp(workers=2)
    orig = [fast_udp(_inside(i), 10000 + i, SERVER, 53, b"q") for i in range(n)]
    orig_nat = [fast_udp(PUBLIC, 10000 + i, SERVER, 53, b"q") for i in range(n)]
    reply = [fast_udp(SERVER, 53, PUBLIC, 10000 + i, b"r") for i in range(n)]
    reply_nat = [fast_udp(SERVER, 53, _inside(i), 10000 + i, b"r") for i in range(n)]
    errors, seen = [], [0]

    def originals():
        for _ in range(4):
            for k in range(0, n, 50):
                for o in dp.process(orig[k:k + 50], in_port="in", worker=0):
                    if (o.port, o.data) != ("out", orig_nat[k + o.index]):
                        errors.append(("orig", k + o.index))

    def replies():
        for _ in range(8):
            for k in range(0, n, 50):
                for o in dp.process(reply[k:k + 50], in_port="out", worker=1):
                    seen[0] += 1
                    if (o.port, o.data) != ("in", reply_nat[k + o.index]):
                        errors.append(("reply", k + o.index))

    threads = [threading.Thread(target=originals), threading.Thread(target=replies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    outs = dp.process(reply, in_port="out", worker=1)
    assert [(o.port, o.data) for o in outs] == [("in", r) for r in reply_nat]
    assert dp.stats()["conntrack"]["connections"] == n == len(dp.conntrack())


def test_commit_storm_on_two_workers():
    """Both workers commit overlapping sets of connections at the same time, the
    shared ones first and in the same order (one process() call each, so both
    are in the core together): each connection exists once, with one mapping,
    and every packet left translated."""
    m = 1200
    pkts = [fast_udp(_inside(i), 20000 + i, SERVER, 53) for i in range(m)]
    want = [fast_udp(PUBLIC, 20000 + i, SERVER, 53) for i in range(m)]
    order = {0: list(range(400, 800)) + list(range(0, 400)), 1: list(range(400, 800)) + list(range(800, 1200))}
    for attempt in range(4):
        dp = snat_dp(workers=2)
        results = {}
        go = threading.Barrier(2)

        def worker(w):
            batch = [pkts[i] for i in order[w]]
            go.wait()
            results[w] = [(o.port, o.data) for o in dp.process(batch, in_port="in", worker=w)]

        threads = [threading.Thread(target=worker, args=(w,)) for w in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in (0, 1):
            assert results[w] == [("out", want[i]) for i in order[w]], f"attempt {attempt}, worker {w}"
        st = dp.stats()["conntrack"]
        assert (st["connections"], st["created"]) == (m, m), f"attempt {attempt}: {st}"
        assert len(dp.conntrack()) == m
        # both workers see every connection: replies on either are translated back
        replies = [fast_udp(SERVER, 53, PUBLIC, 20000 + i) for i in range(m)]
        back = [fast_udp(SERVER, 53, _inside(i), 20000 + i) for i in range(m)]
        for w in (0, 1):
            assert [(o.port, o.data) for o in dp.process(replies, in_port="out", worker=w)] == [("in", b) for b in back]


# ---- 14. trace -------------------------------------------------------------------------------

def _state_snapshot(dp):
    st = dp.stats()
    ct = dict(st["conntrack"])
    ct.pop("recirc_ids")  # a trace may name a continuation the datapath would use
    return ([str(c) for c in dp.conntrack()], [(f.n_packets, f.n_bytes) for f in dp.dump_flows()],
            st["ports"], st["tables"], ct)


def test_trace_shows_recirculations_and_conntrack_and_changes_nothing():
    dp = snat_dp()
    send(dp, UDP_QUERY, "in")
    before = _state_snapshot(dp)
    reply = str(dp.trace(udp(SERVER, 53, PUBLIC, 5000), "out"))
    assert "recirc(0x" in reply and "resume conntrack" in reply
    assert ("conntrack zone 5: ct_state=+est+rpl+trk+dnat udp 198.51.100.1:53 > 203.0.113.10:5000, "
            "translated to udp 198.51.100.1:53 > 10.0.1.11:5000") in reply
    assert reply.splitlines()[-1] == "Output: in (43 bytes)"
    new = dp.trace(udp(CLIENT, 5002, SERVER, 53), "in")
    assert "ct_state=+new+trk+snat udp 10.0.1.11:5002 > 198.51.100.1:53" in str(new)
    assert "translated to udp 203.0.113.10:5002 > 198.51.100.1:53" in str(new)
    assert new.outputs[0][0] == "out" and Ether(new.outputs[0][1])[IP].src == PUBLIC
    inv = str(dp.trace(tcp(CLIENT, 1, SERVER, 2, "A"), "in"))
    assert "ct_state=+inv+trk" in inv
    assert _state_snapshot(dp) == before


def test_trace_shows_every_recirculation():
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows(TWO_STAGE)
    text = str(dp.trace(UDP_QUERY, "in"))
    heads = [line for line in text.splitlines() if line.startswith("recirc(0x")]
    assert len(heads) == 2 and all("resume conntrack" in h for h in heads)
    assert [line.strip() for line in text.splitlines() if "conntrack zone 5:" in line] == [
        "conntrack zone 5: ct_state=+new+trk udp 10.0.1.11:5000 > 198.51.100.1:53; recirculate (recirc_id=1)",
        "conntrack zone 5: ct_state=+new+trk+snat udp 10.0.1.11:5000 > 198.51.100.1:53, new connection committed "
        "(a trace commits nothing), translated to udp 203.0.113.10:5000 > 198.51.100.1:53; recirculate (recirc_id=2)",
    ]
    assert text.splitlines()[-1] == "Output: out (47 bytes)" and dp.conntrack() == []


def test_trace_does_not_advance_tcp_state():
    dp = snat_dp()
    send(dp, tcp(CLIENT, 1, SERVER, 2, "S", seq=10), "in")
    before = [str(c) for c in dp.conntrack()]
    assert before[0].endswith("protoinfo=(state=SYN_SENT)")
    t = dp.trace(tcp(SERVER, 2, PUBLIC, 1, "SA", seq=99, ack=11), "out")
    assert "+est+rpl+trk+dnat" in str(t) and t.outputs[0][0] == "in"
    assert [str(c) for c in dp.conntrack()] == before


# ---- The two-stage NAT pipeline (TWO_STAGE) and a second ct on a translated packet ------------------

def test_two_stage_nat_pipeline_first_packet():
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows(TWO_STAGE)
    assert_frames([(o.port, o.data) for o in dp.process(UDP_QUERY, in_port="in")],
                  [("out", udp(PUBLIC, 5000, SERVER, 53, b"query"))])
    assert_frames([(o.port, o.data) for o in dp.process(udp(SERVER, 53, PUBLIC, 5000, b"answer"), in_port="out")],
                  [("in", UDP_ANSWER)])


@pytest.mark.parametrize("again,want", [
    (UDP_QUERY, udp(PUBLIC, 5000, SERVER, 53, b"query")),
    (tcp(CLIENT, 40000, SERVER, 80, "S", seq=1000), tcp(PUBLIC, 40000, SERVER, 80, "S", seq=1000)),
], ids=["udp-before-reply", "tcp-syn-retransmit"])
def test_two_stage_nat_pipeline_repeated_new_packet(again, want):
    """Regression: the second ct used to NAT the packet again and commit a second connection."""
    dp = Dataplane(ports=["in", "out"])
    dp.add_flows(TWO_STAGE)
    for _ in range(3):
        assert_frames([(o.port, o.data) for o in dp.process(again, in_port="in")], [("out", want)])
    assert len(dp.conntrack()) == 1


# the action of table 1 after a first ct(commit,zone=5,nat(src=PUBLIC)) (inside) or
# ct(zone=5,nat) (outside), and the states table 2 then sees for: query, query
# again, answer, query after the answer
SECOND_CT_CASES = [
    ("ct(zone=5,nat,table=2)", ["+new+trk+snat", "+new+trk+snat", "+est+rpl+trk+dnat", "+est+trk+snat"]),
    ("ct(zone=5,table=2)", ["+new+trk+snat", "+new+trk+snat", "+est+rpl+trk+dnat", "+est+trk+snat"]),
    ("ct(commit,zone=5,nat(src=203.0.113.20),table=2)",
     ["+new+trk+snat", "+new+trk+snat", "+est+rpl+trk+dnat", "+est+trk+snat"]),
    ("ct(zone=6,nat,table=2)", ["+new+trk"] * 4),          # another zone: looked up as it is
    ("ct_clear,ct(zone=5,nat,table=2)", ["+new+trk"] * 4),  # after ct_clear: as it is
]


@pytest.mark.parametrize("second,states", SECOND_CT_CASES, ids=[c[0] for c in SECOND_CT_CASES])
def test_second_ct_on_a_translated_packet(second, states):
    """docs: a packet an earlier ct of the same zone translated is found by the
    reverse of its translated tuple, not translated again, and keeps its bits."""
    dp = Dataplane(ports=["in", "out", *BITS])
    dp.add_flows(["table=0,in_port=in,ip,actions=ct(commit,zone=5,nat(src=203.0.113.10),table=1)",
                  "table=0,in_port=out,ip,actions=ct(zone=5,nat,table=1)",
                  f"table=1,actions={second}"] + probe(2, then=3) +
                 ["table=3,in_port=in,actions=output:out", "table=3,in_port=out,actions=output:in"])
    left, answer = udp(PUBLIC, 5000, SERVER, 53, b"query"), udp(SERVER, 53, PUBLIC, 5000, b"answer")
    steps = [("in", UDP_QUERY, "out", left), ("in", UDP_QUERY, "out", left),
             ("out", answer, "in", UDP_ANSWER), ("in", UDP_QUERY, "out", left)]
    for (port, pkt, out_port, want), want_state in zip(steps, states):
        outs = dp.process(pkt, in_port=port)
        assert state(outs) == want_state, pkt.summary()
        assert_frames(forwarded(outs), [(out_port, want)], pkt.summary())
    assert len(dp.conntrack()) == 1
