"""The native/Python seam keeps each fact once (issue 27, part 3): the error
codes, conntrack's timeouts and limits, the tunnel port's settings, the queue
counters, the backends, the replay's outputs and the typed transaction that
carries every change, validated in the core and committed whole or not at all.

Each test fails if one side drifts from the other or if a bad item of a
transaction leaves anything applied."""
from __future__ import annotations

import os
import re
import shutil
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


# ---- conntrack's and the tunnel port's facts: once, in the core ----------------------------------------


def test_ct_timeouts_are_the_cores():
    from dpu import dataplane
    from dpu.topology import schema as topology

    fresh = Dataplane().ct_config()
    assert fresh["timeouts"] == {name: default for name, default, _ in _core.CT_TIMEOUTS} == dataplane.CT_TIMEOUTS
    assert fresh["max_connections"] == _core.CT_MAX_CONNECTIONS_DEFAULT
    lo, hi = _core.CT_TIMEOUT_RANGE
    assert 0 < lo < 1e-6 and hi == 30 * 86400
    assert set(topology._TIMEOUTS) == {name for name, _, _ in _core.CT_TIMEOUTS}
    # the docs' table says the same
    doc = (ROOT / "docs" / "conntrack.md").read_text()
    for name, default, _ in _core.CT_TIMEOUTS:
        assert re.search(rf"\| `{name}` \| {default:.0f} s\b", doc), name
    # the API's bounds are the core's, at both ends
    dp = Dataplane()
    assert dp.ct_config(timeouts={"udp": hi})["timeouts"]["udp"] == hi
    assert dp.ct_config(timeouts={"udp": 1e-9})["timeouts"]["udp"] == 1e-9
    cmin, cmax = _core.CT_MAX_CONNECTIONS_RANGE
    assert dp.ct_config(max_connections=cmax)["max_connections"] == cmax
    assert dp.ct_config(max_connections=cmin)["max_connections"] == cmin
    for bad in (dict(timeouts={"udp": hi * (1 + 1e-9)}), dict(max_connections=cmax + 1),
                dict(max_connections=cmin - 1)):
        with pytest.raises(InvalidArgumentError):
            dp.ct_config(**bad)


def test_the_topologys_conntrack_bounds_are_the_cores():
    import yaml

    base = yaml.safe_load(TOPO.read_text())
    hi = int(_core.CT_TIMEOUT_RANGE[1])
    cmin, cmax = _core.CT_MAX_CONNECTIONS_RANGE
    dp = Dataplane.from_topology({**base, "conntrack": {"timeouts": {"icmp": hi}, "max_connections": cmax}})
    assert dp.ct_config()["timeouts"]["icmp"] == hi and dp.ct_config()["max_connections"] == cmax
    dp.load_topology({**base, "conntrack": {"timeouts": {"icmp": 1}, "max_connections": cmin}})
    assert dp.ct_config()["timeouts"]["icmp"] == 1 and dp.ct_config()["max_connections"] == cmin


# topology uplink key -> (tunnel_params member, in add_tunnel_port)
UPLINK_KEYS = {"vxlan_port": "dst_port", "ttl": "ttl", "mtu": "mtu", "strict_vxlan": "strict"}


def test_tunnel_defaults_are_the_cores():
    from dpu.dataplane import TUNNEL_PARAMS
    from dpu.topology import Uplink

    dp = Dataplane(ports=["up"])
    dp.add_tunnel_port("vx", underlay="up", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01",
                       nexthop_mac="02:00:00:00:00:02")
    info = next(p for p in dp.port_info() if p["name"] == "vx")
    assert {m: info[m] for m in TUNNEL_PARAMS} == {m: d for m, (d, _, _, _) in TUNNEL_PARAMS.items()}
    # the topology's uplink: defaults, and what a compiled topology's tunnel port gets
    up = Uplink(port="p0", ip=None, mac="02:00:00:00:00:01", nexthop_mac=None)
    assert {m: getattr(up, k) for k, m in UPLINK_KEYS.items()} == {m: TUNNEL_PARAMS[m][0] for m in UPLINK_KEYS.values()}
    assert up.src_port_range == (TUNNEL_PARAMS["sport_min"][0], TUNNEL_PARAMS["sport_max"][0])
    vx = next(p for p in Dataplane.from_topology(TOPO).port_info() if p["tunnel"])
    assert {m: vx[m] for m in TUNNEL_PARAMS} == {m: d for m, (d, _, _, _) in TUNNEL_PARAMS.items()}


def test_tunnel_bounds_are_the_cores_in_the_api_and_the_topology():
    import yaml

    from dpu.dataplane import TUNNEL_PARAMS

    base = yaml.safe_load(TOPO.read_text())
    ends = {m: (lo, hi) for m, (d, lo, hi, _) in TUNNEL_PARAMS.items() if not isinstance(d, bool)}
    assert ends == {"dst_port": (1, 65535), "sport_min": (1, 65535), "sport_max": (1, 65535), "ttl": (1, 255),
                    "mtu": (576, 10000)}
    for m, (lo, hi) in ends.items():
        for v, ok in ((lo - 1, False), (lo, True), (hi, True), (hi + 1, False)):
            # the core, through a transaction of its own
            spec = dict(underlay="p0", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01",
                        nexthop_mac="02:00:00:00:00:02")
            if m.startswith("sport"):
                spec["src_port_range"] = (v, max(v, 1)) if m == "sport_min" else (min(v, 65535), v)
            else:
                spec[m] = v
            dp = Dataplane(ports=["p0"])
            if ok:
                dp.add_tunnel_port("vx", **spec)
            else:
                with pytest.raises(InvalidArgumentError, match=f"tunnel port 'vx': {TUNNEL_PARAMS[m][3]} must be "
                                                               f"{lo}..{hi}, got {v}"):
                    dp.add_tunnel_port("vx", **spec)
            # the topology's uplink: section accepts and refuses the same values
            uplink = dict(base["uplink"])
            if m.startswith("sport"):
                uplink["src_port_range"] = list(spec["src_port_range"])
            else:
                uplink[next(k for k, mm in UPLINK_KEYS.items() if mm == m)] = v
            if ok:
                Dataplane.from_topology({**base, "uplink": uplink})
            else:
                with pytest.raises(TopologyError, match="uplink"):
                    Dataplane.from_topology({**base, "uplink": uplink})
    # an IPv6 underlay's least mtu
    dp = Dataplane(ports=["p0"])
    six = dict(underlay="p0", local_ip="2001:db8::1", local_mac="02:00:00:00:00:01", nexthop_mac="02:00:00:00:00:02")
    with pytest.raises(InvalidArgumentError, match=f"mtu must be {_core.TUNNEL_MTU_MIN_IPV6}..10000"):
        dp.add_tunnel_port("vx", **six, mtu=_core.TUNNEL_MTU_MIN_IPV6 - 1)
    dp.add_tunnel_port("vx", **six, mtu=_core.TUNNEL_MTU_MIN_IPV6)


# ---- queue counters: counters.def's DPU_QUEUE_COUNTER group ---------------------------------------------


def test_queue_counters_are_one_list():
    from dpu import report

    listed = re.findall(r"^DPU_QUEUE_COUNTER\((\w+), \"", (INCLUDE / "counters.def").read_text(), re.M)
    assert listed == [name for name, _ in _core.queue_counters()] == report.QUEUE_COUNTERS
    assert "rx_too_long" in listed and "rx_truncated" not in listed  # a port's rx_truncated means the opposite
    # nobody writes them out by hand any more (as a key, or a member in C++)
    names = "|".join(n for n in listed if n != "rx_too_long")  # which the binding's alias rx_truncated reads
    for path in ("native/src/live.cc", "native/bindings/module.cc", "dpu/live.py", "dpu/metrics.py", "dpu/cli.py",
                 "dpu/control.py"):
        src = (ROOT / path).read_text()
        assert not re.search(rf"[\"'](?:{names})[\"']|\.(?:{names})\b", src), path


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root (a veth pair in namespaces)")
def test_a_frame_too_long_is_counted_by_its_queue_as_rx_too_long():
    """A frame longer than any packet buffer, on a live AF_PACKET port: the
    queue counts it as rx_too_long (its old key, rx_truncated, says the same),
    the port as an oversize drop; the port's own rx_truncated (a frame cut
    short inside a header) stays 0."""
    import socket
    import time

    from netns import HostPair, in_netns, ip, socket_in

    with HostPair("10.9.0.1", "10.9.0.2", "02:00:00:00:09:01", "02:00:00:00:09:02") as hp:
        for ns, dev in ((hp.a, "veth-a"), (hp.b, "veth-b")):
            ip(ns, "link", "set", dev, "mtu", "12000")
        dp = Dataplane(ports=["p"], flows=["actions=drop"])
        with in_netns(hp.a):
            live = dp._core.live([(dp.port_number("p"), "veth-a")])
            live.start()
        try:
            s = socket_in(hp.b, socket.AF_PACKET, socket.SOCK_RAW)
            s.bind(("veth-b", 0))
            frame = bytes.fromhex("02000000090102000000090288b5") + bytes(11_000)  # 11,014 bytes > 10,112
            deadline = time.monotonic() + 30
            q = None
            while time.monotonic() < deadline:  # sends until counted (a frame may arrive before the ring)
                s.send(frame)
                q = live.queue_stats()[0]
                if q["rx_too_long"]:
                    break
                time.sleep(0.05)
            s.close()
        finally:
            live.stop()
        assert q["rx_too_long"] >= 1 and q["rx_truncated"] == q["rx_too_long"], q
        port = dp.stats()["ports"]["p"]
        assert port["drops"].get("oversize", 0) >= 1 and port["rx_truncated"] == 0, port


# ---- what the ways in decide, once: in the core ------------------------------------------------------------


def test_input_ports_outputs_and_replay_names_are_decided_by_the_core(tmp_path):
    """The words "unknown input port N", "an output may not be an input" and the
    replay's file names are the core's: Python's ways in (process, trace,
    replay, the CLI's and dpu run's output checks) ask it and get its
    answer."""
    from scapy.all import Ether, wrpcap

    from dpu.errors import UnknownPortError
    from dpu.replay import replay

    frame = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / (b"x" * 50))
    pcap = tmp_path / "in.pcap"
    wrpcap(str(pcap), [Ether(frame)])
    dp = Dataplane(ports=["a", "b"], flows=["actions=output:b"])
    dp.add_tunnel_port("vx", underlay="b", local_ip="192.0.2.1", local_mac="02:00:00:00:00:01",
                       nexthop_mac="02:00:00:00:00:02")
    for call in (lambda: dp.process([frame], in_port=99), lambda: dp.trace(frame, 99),
                 lambda: replay(dp, {99: pcap}, tmp_path / "out99")):
        with pytest.raises(UnknownPortError, match=r"^(packet 0: )?unknown input port 99$"):
            call()
    with pytest.raises(UnknownPortError, match=r"^packet 1: unknown input port 99$"):  # which packet, too
        dp.process([(dp.port_number("a"), frame), (99, frame)])
    assert not (tmp_path / "out99").exists() or not os.listdir(tmp_path / "out99")
    # the replay writes the files the core names: one per port that is not a tunnel
    out = tmp_path / "out"
    replay(dp, {"a": pcap}, out)
    named = dp._core.replay_outputs(str(out))
    assert [port for port, _ in named] == ["a", "b"]
    assert sorted(os.listdir(out)) == sorted(os.path.basename(path) for _, path in named) == ["a.pcap", "b.pcap"]
    # the same file by another name is that file; a file not there yet is no input
    (tmp_path / "hard.pcap").hardlink_to(pcap)
    (tmp_path / "soft.pcap").symlink_to(pcap)
    spelled = str(tmp_path / "out" / ".." / "in.pcap")
    ins = [b"/nonexistent/x", os.fsencode(pcap)]
    for other in ("hard.pcap", "soft.pcap"):
        assert _core.find_overwrite([b"/nonexistent/y", os.fsencode(tmp_path / other)], ins) == (1, 1)
    assert _core.find_overwrite([os.fsencode(spelled)], ins) == (0, 1)
    assert _core.find_overwrite([os.fsencode(tmp_path / "new.pcap"), b"bad\0name"], ins) is None
    # and each way in refuses it, the input intact
    kept = pcap.read_bytes()
    os.symlink(pcap, out / "c.pcap")  # an out_dir where port c's output is the input
    dp.add_port("c")
    with pytest.raises(InvalidArgumentError, match="this input is also the output of port c"):
        replay(dp, {"a": pcap}, out)
    assert pcap.read_bytes() == kept


# ---- the live I/O backends: the build's list, exported once ------------------------------------------------


def test_the_cli_offers_the_backends_the_build_has(capsys, monkeypatch):
    """dpu run's --io choices and dpu bench's --io check are the binding's
    IO_BACKENDS: a build without AF_XDP (as IO_BACKENDS says it) offers
    afpacket only."""
    from dpu import cli, live

    def run_io_choices():
        sub = next(a for a in cli._parser()._actions if isinstance(getattr(a, "choices", None), dict))
        return tuple({a.dest: a for a in sub.choices["run"]._actions}["io"].choices)

    assert run_io_choices() == _core.IO_BACKENDS and "afpacket" in _core.IO_BACKENDS
    assert live.IO_BACKENDS is _core.IO_BACKENDS
    monkeypatch.setattr(_core, "IO_BACKENDS", ("afpacket",))  # as a build without libxdp has it
    assert run_io_choices() == ("afpacket",)
    for cmd in (["run", "--port", "a=lo", "--flows", "f", "--io", "afxdp"],
                ["bench", "live-l3", "--io", "afpacket,afxdp"]):
        with pytest.raises(SystemExit) as e:
            cli.main(cmd)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "afxdp" in err and "afpacket" in err, err


# ---- _core.pyi: generated from the binding ----------------------------------------------------------------


def test_the_stub_is_what_the_binding_says():
    """tools/gen_core_pyi.py regenerates dpu/_core.pyi from the built
    module: any difference (a new function, a changed parameter) fails here
    with the diff."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_core_pyi.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_stub_names_every_class_function_and_parameter():
    """Read back with ast, independently of the generator: every public name
    of dpu._core and of each of its classes is in the stub, and a function
    takes the parameters its binding takes (apply: the dataplane and one Txn)."""
    import ast

    tree = ast.parse((ROOT / "dpu" / "_core.pyi").read_text())
    top = {n.name if hasattr(n, "name") else n.target.id: n for n in tree.body
           if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))}
    assert set(top) == {n for n in dir(_core) if not n.startswith("_")}

    def arity(doc: str) -> int:  # parameters of "name(a: T, b: U = x) -> R", brackets and quotes aside
        inner = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"'[^']*'", "", doc.splitlines()[0]))
        while "[" in inner:
            inner = re.sub(r"\[[^\[\]]*\]", "", inner)
        params = inner[inner.index("(") + 1:inner.rindex(") ->")]
        return len([p for p in params.split(",") if p.strip() and p.strip() not in ("/", "*")])

    for name, node in top.items():
        obj = getattr(_core, name)
        if isinstance(node, ast.FunctionDef):
            assert len(node.args.args) == arity(obj.__doc__), name
        if isinstance(node, ast.ClassDef):
            members = {n.name if hasattr(n, "name") else n.target.id: n for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
            public = {k for k, v in vars(obj).items() if not k.startswith("_")
                      or (k == "__init__" and type(v).__name__ == "instancemethod")}  # a constructor it binds
            assert public <= set(members), (name, public - set(members))
            for k, n in members.items():
                if isinstance(n, ast.FunctionDef) and not any(isinstance(d, ast.Name) and d.id == "property"
                                                               for d in n.decorator_list):
                    assert len(n.args.args) + len(n.args.posonlyargs) == arity(getattr(obj, k).__doc__), (name, k)
    apply = next(n for n in top["Dataplane"].body if isinstance(n, ast.FunctionDef) and n.name == "apply")
    assert [a.arg for a in apply.args.args] == ["self", "txn"] and ast.unparse(apply.args.args[1].annotation) == "Txn"
