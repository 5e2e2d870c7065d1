"""The native/Python seam keeps each fact once (issue 27, part 3): the error
codes, conntrack's timeouts and limits, the tunnel port's settings, the queue
counters, the backends, the replay's outputs and the typed transaction that
carries every change, validated in the core and committed whole or not at all.

Each test fails if one side drifts from the other or if a bad item of a
transaction leaves anything applied."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpu import _core, errors

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "native" / "include" / "dpu"


# ---- error codes: errors.def feeds C++, the binding, Cython and Python ---------------------------


def test_error_codes_are_one_list():
    listed = re.findall(r"^DPU_ERR\((\w+), (\w+), \"", (INCLUDE / "errors.def").read_text(), re.M)
    assert listed and [(c, k) for c, k, _ in _core.errors()] == listed
    assert {c: k.__name__ for c, k in errors.NATIVE_ERRORS.items()} == dict(listed)
    for code, cls, meaning in _core.errors():
        assert issubclass(errors.NATIVE_ERRORS[code], errors.DpuError) and meaning
    # nobody else declares the codes: the enum and the Cython side read the list
    status_h = (INCLUDE / "status.h").read_text()
    enum = status_h.split("enum class Err", 1)[1].split("};", 1)[0]
    assert not set(re.findall(r"^\s*([A-Z_]+)\s*,", enum, re.M)) & {c for c, _ in listed}
    gen_pyx = (ROOT / "dpu" / "_gen.pyx").read_text()
    assert not re.search(r"^\s+(PARSE|UNKNOWN_PORT|INVALID)\s*$", gen_pyx, re.M)


def test_each_native_code_raises_its_class():
    from dpu import Dataplane, gen

    dp = Dataplane(ports=["a"])
    cases = {"PARSE": lambda: dp.add_flow("actions=output(a"),
             "UNKNOWN_PORT": lambda: dp.add_flow("in_port=nope,actions=drop"),
             "UNKNOWN_GROUP": lambda: dp.add_flow("actions=group:7"),
             "UNKNOWN_FIELD": lambda: dp.add_flow("nw_dsst=1,actions=drop"),
             "CONFLICT": lambda: dp.add_port("a"),
             "IO": lambda: gen.read_pcap("/nonexistent/x.pcap")}
    for code, call in cases.items():
        with pytest.raises(errors.NATIVE_ERRORS[code]):
            call()


# ---- one transaction for all configuration ---------------------------------------------------------

from dpu import Dataplane  # noqa: E402
from dpu.errors import ConflictError, InvalidArgumentError, TopologyError  # noqa: E402

TCP, UDP = 6, 17
TOPO = ROOT / "examples" / "nat-gateway.yaml"


def nat(zone=5, proto=TCP, internal_ip="10.0.0.2", internal_port=80, public_ip="198.51.100.1", public_port=8080):
    return _core.NatMapping(zone, proto, internal_ip, internal_port, public_ip, public_port)


def state(dp: Dataplane) -> dict:
    """Everything a transaction can change, as the core reports it."""
    zones, mappings = dp._core.ct_settings()
    return {"flows": sorted(f.spec for f in dp.dump_flows()), "groups": [g.text for g in dp.dump_groups()],
            "ports": dp.port_info(), "tenants": dp._core.tenants(),
            "zones": [(z.zone, z.limit, z.eif) for z in zones],
            "nat": [(m.zone, m.proto, m.internal_ip, m.internal_port, m.public_ip, m.public_port) for m in mappings],
            "ct": dp.ct_config(), "version": dp.version}


def configured() -> Dataplane:
    dp = Dataplane(ports=["in", "out", "up"], flows=["in_port=in,actions=ct(commit,zone=5),output:out"])
    with dp.transaction() as t:
        t.add_group("group_id=1,type=all,bucket=actions=output:out")
        t.set_tenants([("blue", 100)])
        t.set_ct_zones([(5, 10, False), (6, 0, True)])
        t.set_nat_static([(5, TCP, "10.0.0.2", 80, "198.51.100.1", 8080)])
        t.set_ct_config(timeouts={"udp": 10}, max_connections=1000)
    return dp


def every_kind_of_change() -> "_core.Txn":
    """A transaction touching everything: valid as it is."""
    txn = _core.Txn()
    port = _core.PortSpec()
    port.name = "new"
    txn.add_port(port)
    vx = _core.PortSpec()
    vx.name, vx.tunnel, vx.underlay = "vx", True, "up"
    vx.local_ip, vx.local_mac, vx.nexthop_mac = "192.0.2.1", "02:00:00:00:00:01", "02:00:00:00:00:02"
    txn.add_port(vx)
    txn.del_port("out")
    txn.add_ops([(_core.OpKind.DEL_FLOWS, ""), (_core.OpKind.DEL_GROUPS, ""),
                 (_core.OpKind.ADD_FLOW, "in_port=in,actions=output:new")])
    txn.set_tenants([("red", 200)])
    txn.set_ct_zones([_core.CtZone(7, 3, True)])
    txn.set_nat_static([nat(zone=7, public_port=9090)])
    txn.set_ct_timeouts([_core.CtTimeout("icmp", 20), _core.CtTimeout("tcp_established", 3600.5)])
    txn.ct_max_connections = 5000
    return txn


def plain(name, ofport=0):
    p = _core.PortSpec()
    p.name, p.ofport = name, ofport
    return p


def spoil_tunnel(txn, **bad):
    vx = _core.PortSpec()
    vx.name, vx.tunnel, vx.underlay = "vx2", True, "up"
    vx.local_ip, vx.local_mac, vx.nexthop_mac = "192.0.2.9", "02:00:00:00:00:01", "02:00:00:00:00:02"
    for k, v in bad.items():
        setattr(vx, k, v)
    txn.add_port(vx)


# (what, how to spoil the valid transaction, class, message)
BAD_ITEMS = [
    ("zone above 65535", lambda t: t.set_ct_zones([_core.CtZone(70000)]), InvalidArgumentError,
     r"conntrack zone 70000 is out of range \(0..65535\)"),
    ("negative zone", lambda t: t.set_ct_zones([_core.CtZone(-1)]), InvalidArgumentError,
     "conntrack zone -1 is out of range"),
    ("zone given twice", lambda t: t.set_ct_zones([_core.CtZone(7, 1), _core.CtZone(7, 2)]), ConflictError,
     "conntrack zone 7 is given twice"),
    ("zone limit", lambda t: t.set_ct_zones([_core.CtZone(7, -1)]), InvalidArgumentError,
     r"conntrack zone 7: the connection limit must be 0 \(none\) or 1..1073741824, got -1"),
    ("zone limit above the most connections", lambda t: t.set_ct_zones([_core.CtZone(7, 1 << 31)]),
     InvalidArgumentError, "conntrack zone 7: the connection limit"),
    ("NAT zone", lambda t: t.set_nat_static([nat(zone=65536)]), InvalidArgumentError,
     r"NAT mapping 1 \(zone 65536, tcp 198.51.100.1:8080 -> 10.0.0.2:80\): zone out of range"),
    ("NAT protocol", lambda t: t.set_nat_static([nat(), nat(proto=1, public_port=1)]), InvalidArgumentError,
     r"NAT mapping 2 \(zone 5, protocol 1 198.51.100.1:1 -> 10.0.0.2:80\): the protocol must be tcp \(6\) or udp"),
    ("NAT internal address 0", lambda t: t.set_nat_static([nat(internal_ip="0.0.0.0")]), InvalidArgumentError,
     "the internal address must be a unicast IPv4 address, not '0.0.0.0'"),
    ("NAT public address not an address", lambda t: t.set_nat_static([nat(public_ip="198.51.100.300")]),
     InvalidArgumentError, "the public address must be a unicast IPv4 address, not '198.51.100.300'"),
    ("NAT public address multicast", lambda t: t.set_nat_static([nat(public_ip="224.0.0.1")]),
     InvalidArgumentError, "the public address must be a unicast IPv4 address"),
    ("NAT public address broadcast", lambda t: t.set_nat_static([nat(public_ip="255.255.255.255")]),
     InvalidArgumentError, "the public address must be a unicast IPv4 address"),
    ("NAT IPv6", lambda t: t.set_nat_static([nat(internal_ip="2001:db8::1")]), InvalidArgumentError,
     "the internal address must be a unicast IPv4 address"),
    ("NAT internal port 0", lambda t: t.set_nat_static([nat(internal_port=0)]), InvalidArgumentError,
     "the internal port must be 1..65535"),
    ("NAT public port 0", lambda t: t.set_nat_static([nat(public_port=0)]), InvalidArgumentError,
     "the public port must be 1..65535"),
    ("NAT public port above 65535", lambda t: t.set_nat_static([nat(public_port=65536)]), InvalidArgumentError,
     "the public port must be 1..65535"),
    ("NAT public endpoint twice, other zones", lambda t: t.set_nat_static([nat(zone=5), nat(zone=6, internal_port=81)]),
     ConflictError, r"NAT mapping 2 .*: its public endpoint is already NAT mapping 1 \(zone 5, .*\)'s"),
    ("NAT internal endpoint twice", lambda t: t.set_nat_static([nat(public_port=1), nat(public_port=2)]),
     ConflictError, "NAT mapping 2 .*: its internal endpoint already goes out through 198.51.100.1 in NAT mapping 1"),
    ("timeout name", lambda t: t.set_ct_timeouts([_core.CtTimeout("udp_stream", 5)]), InvalidArgumentError,
     r"unknown conntrack timeout 'udp_stream' \(tcp_transitory, tcp_established, udp, icmp\)"),
    ("timeout 0", lambda t: t.set_ct_timeouts([_core.CtTimeout("udp", 0)]), InvalidArgumentError,
     r"ct timeout 'udp' must be a number of seconds, above 0 and at most 2592000 \(30 days\), got 0"),
    ("timeout below a nanosecond", lambda t: t.set_ct_timeouts([_core.CtTimeout("udp", 1e-10)]),
     InvalidArgumentError, "ct timeout 'udp' must be"),
    ("timeout negative", lambda t: t.set_ct_timeouts([_core.CtTimeout("icmp", -5)]), InvalidArgumentError,
     "ct timeout 'icmp' must be"),
    ("timeout over 30 days", lambda t: t.set_ct_timeouts([_core.CtTimeout("tcp_established", 30 * 86400 + 1)]),
     InvalidArgumentError, "ct timeout 'tcp_established' must be"),
    ("timeout not a number", lambda t: t.set_ct_timeouts([_core.CtTimeout("udp", float("nan"))]),
     InvalidArgumentError, "got nan"),
    ("max_connections 0", lambda t: setattr(t, "ct_max_connections", 0), InvalidArgumentError,
     "max_connections must be 1..1073741824, got 0"),
    ("max_connections 2^31", lambda t: setattr(t, "ct_max_connections", 1 << 31), InvalidArgumentError,
     "max_connections must be 1..1073741824"),
    ("tunnel ttl", lambda t: spoil_tunnel(t, ttl=0), InvalidArgumentError,
     "tunnel port 'vx2': ttl must be 1..255, got 0"),
    ("tunnel source ports", lambda t: spoil_tunnel(t, sport_max=70000), InvalidArgumentError,
     "tunnel port 'vx2': src_port_range must be 1..65535, got 70000"),
    ("tunnel local_ip", lambda t: spoil_tunnel(t, local_ip="192.0.2"), InvalidArgumentError,
     "tunnel port 'vx2': bad local_ip '192.0.2'"),
    ("tunnel mac", lambda t: spoil_tunnel(t, nexthop_mac="02:00:00:00:00:0g"), InvalidArgumentError,
     "tunnel port 'vx2': bad nexthop_mac"),
    ("port name", lambda t: t.add_port(_core.PortSpec()), InvalidArgumentError, "bad port name ''"),
    ("ofport", lambda t: t.add_port(plain("p", 70000)), InvalidArgumentError,
     r"port 'p': ofport must be 0 \(the next free\) or 1..65279, got 70000"),
    ("a flow", lambda t: t.add_ops([(_core.OpKind.ADD_FLOW, "in_port=nowhere,actions=drop")]), errors.UnknownPortError,
     "nowhere"),
]


@pytest.mark.parametrize("what,spoil,cls,message", BAD_ITEMS, ids=[b[0] for b in BAD_ITEMS])
def test_the_core_refuses_a_bad_item_and_applies_nothing(what, spoil, cls, message):
    dp = configured()
    before = state(dp)
    txn = every_kind_of_change()
    spoil(txn)
    with pytest.raises(cls, match=message):
        dp._core.apply(txn)
    assert state(dp) == before, what
    # the same transaction without the bad item goes through, all of it
    dp._core.apply(every_kind_of_change())
    after = state(dp)
    assert after["version"] == before["version"] + 1
    assert after["flows"] == ["table=0,in_port=in,actions=output:new"] and after["groups"] == []
    assert sorted(p["name"] for p in after["ports"]) == ["in", "new", "up", "vx"]
    assert after["zones"] == [(7, 3, True)] and after["nat"] == [(7, TCP, "10.0.0.2", 80, "198.51.100.1", 9090)]
    assert after["ct"]["timeouts"] == {"tcp_transitory": 240.0, "tcp_established": 3600.5, "udp": 10.0, "icmp": 20.0}
    assert after["ct"]["max_connections"] == 5000 and [t[0] for t in after["tenants"]] == ["red"]


def test_a_bad_item_through_the_api_applies_nothing():
    """The Python API's own checks (types) and the core's (values) both leave
    everything as it was, each naming the item."""
    cases = [
        (lambda t: t.set_ct_zones([(5, 1, False), (70000, 0, False)]), InvalidArgumentError,
         "conntrack zone 70000 is out of range"),
        (lambda t: t.set_ct_zones([(5, "many", False)]), InvalidArgumentError,
         "conntrack zone 5: the connection limit must be 0 .none. or 1..1073741824, got 'many'"),
        (lambda t: t.set_ct_zones([(2 ** 70, 1, False)]), InvalidArgumentError,
         "conntrack zone setting 1: the zone must be 0..65535"),
        (lambda t: t.set_nat_static([(5, TCP, "10.0.0.3", 0, "198.51.100.2", 80)]), InvalidArgumentError,
         "NAT mapping 1 .*: the internal port must be 1..65535"),
        (lambda t: t.set_nat_static([(5, TCP, "10.0.0.3", 80, None, 80)]), InvalidArgumentError,
         "NAT mapping 1: the public ip is a string, not NoneType"),
        (lambda t: t.set_ct_config(timeouts={"udp": 0}), InvalidArgumentError, "ct timeout 'udp' must be"),
        (lambda t: t.set_ct_config(timeouts={"udp": "5"}), InvalidArgumentError,
         "ct timeout 'udp' must be a number of seconds, above 0 and at most 2592000"),
        (lambda t: t.add_tunnel_port("vx", underlay="up", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01",
                                     nexthop_mac="02:00:00:00:00:02", mtu="big"), InvalidArgumentError,
         "tunnel port 'vx': mtu must be 576..10000, got 'big'"),
    ]
    for spoil, cls, message in cases:
        dp = configured()
        before = state(dp)
        t = dp.transaction()
        t.add_flow("priority=7,actions=drop")
        t.set_ct_config(timeouts={"icmp": 5}, max_connections=9)
        t.set_nat_static([])
        with pytest.raises(cls, match=message):  # when it is set, or when it is committed
            spoil(t)
            t.commit()
        assert state(dp) == before, message


def test_ct_config_is_a_transaction():
    dp = configured()
    v = dp.version
    cfg = dp.ct_config(timeouts={"tcp_transitory": 0.25}, max_connections=4096)
    assert cfg["timeouts"]["tcp_transitory"] == 0.25 and cfg["max_connections"] == 4096
    assert dp.version == v + 1  # committed as one transaction
    with pytest.raises(InvalidArgumentError, match="unknown conntrack timeout 'tcp'"):  # the core's check
        dp.ct_config(timeouts={"udp": 1, "tcp": 2}, max_connections=10)
    assert dp.ct_config() == cfg and dp.version == v + 1  # udp and the limit unchanged too
    assert dp.ct_config() is not cfg and dp.ct_config(timeouts={}) == cfg and dp.version == v + 1  # nothing asked


def test_load_topology_is_one_transaction_with_its_conntrack_settings():
    from dpu.topology import load_topology

    dp = Dataplane()
    topo = load_topology(TOPO)
    topo.ct_timeouts, topo.ct_max_connections = {"udp": 30, "icmp": 7}, 50_000
    v = dp.version
    dp.load_topology(topo)
    assert dp.version == v + 1  # flows, ports, zones, forwards, timeouts and limit: one commit
    cfg = dp.ct_config()
    assert cfg["timeouts"]["udp"] == 30 and cfg["timeouts"]["icmp"] == 7 and cfg["max_connections"] == 50_000
    before = state(dp)
    assert before["zones"] == [(100, 100_000, False)]
    assert before["nat"] == [(100, TCP, "10.0.1.12", 80, "203.0.113.10", 8080)]
    # A reload whose conntrack settings the core refuses changes nothing at all:
    # before, its flows were committed and the timeouts refused afterwards.
    bad = load_topology(TOPO)
    bad.tenants["blue"].ports.pop("vm2")  # a change of flows and ports...
    bad.ct_timeouts = {"udp": 0}          # ...with a timeout out of range
    with pytest.raises(InvalidArgumentError, match="ct timeout 'udp' must be"):
        dp.load_topology(bad)
    assert state(dp) == before
    bad.ct_timeouts, bad.ct_max_connections = {}, 0
    with pytest.raises(InvalidArgumentError, match="max_connections must be"):
        dp.load_topology(bad)
    assert state(dp) == before


def test_a_topology_with_a_bad_timeout_or_zone_is_refused_and_nothing_changes():
    import yaml

    dp = Dataplane.from_topology(TOPO)
    before = state(dp)
    base = yaml.safe_load(TOPO.read_text())
    hi = int(_core.CT_TIMEOUT_RANGE[1])
    for bad, where in (({"conntrack": {"timeouts": {"udp": hi + 1}}}, "conntrack.timeouts.udp"),
                       ({"conntrack": {"timeouts": {"udp": 0}}}, "conntrack.timeouts.udp"),
                       ({"conntrack": {"max_connections": _core.CT_MAX_CONNECTIONS_RANGE[1] + 1}},
                        "conntrack.max_connections")):
        with pytest.raises(TopologyError, match=re.escape(where)):
            dp.load_topology({**base, **bad})
        assert state(dp) == before
    topo = {**base, "tenants": {**base["tenants"], "blue": {**base["tenants"]["blue"], "zone": 70000}}}
    with pytest.raises(TopologyError, match="tenants.blue.zone"):
        dp.load_topology(topo)
    assert state(dp) == before
