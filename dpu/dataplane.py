"""The Python control shim: :class:`Dataplane`.

A thin layer over ``dpu._core``: it names things (ports by name, flows as
ovs-ofctl text), batches packets into buffers for the native core, and turns
results into small Python objects. Every change goes through one
validate-then-commit call in the core (:meth:`Dataplane.transaction`), which
the CLI and the topology compiler use too.
"""
from __future__ import annotations

import codecs
import io
import ipaddress
import numbers
import os
import re
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from .errors import (DpuError, DpuIOError, FlowParseError, InvalidArgumentError, UnknownPortError, from_os_error,
                     show_path)
from .oftext import group_fields

if TYPE_CHECKING:
    from .flowdiff import FlowTable

PacketLike = Union[bytes, bytearray, memoryview, Any]  # Any: a scapy packet

DROP_REASONS: Dict[str, str] = dict(_core.drop_reasons()[1:])


class Flow(str):
    """One line of :meth:`Dataplane.dump_flows`: the ovs-ofctl text, with fields."""

    table: int
    priority: int
    cookie: int
    n_packets: int
    n_bytes: int
    duration: float
    match: str
    actions: str

    def __new__(cls, table, priority, cookie, n_packets, n_bytes, duration, match, actions):
        text = (
            f"cookie={cookie:#x}, duration={duration:.3f}s, table={table}, "
            f"n_packets={n_packets}, n_bytes={n_bytes}, "
            + (f"{match} " if match else "")
            + f"actions={actions}"
        )
        self = super().__new__(cls, text)
        self.table, self.priority, self.cookie = table, priority, cookie
        self.n_packets, self.n_bytes, self.duration = n_packets, n_bytes, duration
        self.match, self.actions = match, actions
        return self

    @property
    def spec(self) -> str:
        """The flow as it would be added again (table, cookie, match, actions)."""
        parts = [f"table={self.table}"]
        if self.cookie:
            parts.append(f"cookie={self.cookie:#x}")
        if self.match:
            parts.append(self.match)
        return ",".join(parts) + f",actions={self.actions}"

    def as_dict(self) -> Dict[str, Any]:
        """The line's fields under the names it shows them by (``dpu dump-flows --json``): the
        cookie in hex as printed, the match without its ``priority=``, which has its own field."""
        match = ",".join(x for x in self.match.split(",") if x and not x.startswith("priority="))
        return {"cookie": f"{self.cookie:#x}", "duration": round(self.duration, 3), "table": self.table,
                "n_packets": self.n_packets, "n_bytes": self.n_bytes, "priority": self.priority,
                "match": match, "actions": self.actions}


class Megaflow(str):
    """One line of :meth:`Dataplane.dump_megaflows`, in ``ovs-appctl dpctl/dump-flows``'
    shape (``MATCH, packets:N, bytes:N, used:0.120s, actions:ACTIONS``), with fields."""

    worker: int
    match: str
    n_packets: int
    n_bytes: int
    actions: str
    used: Optional[float]  # seconds since a packet last hit it (as of the last stats push); None: never

    def __new__(cls, worker, match, n_packets, n_bytes, actions, used):
        used = None if used < 0 else used
        text = ((f"{match}, " if match else "") + f"packets:{n_packets}, bytes:{n_bytes}, "
                + f"used:{'never' if used is None else f'{used:.3f}s'}, actions:{actions}")
        self = super().__new__(cls, text)
        self.worker, self.match, self.n_packets, self.n_bytes = worker, match, n_packets, n_bytes
        self.actions, self.used = actions, used
        return self

    def as_dict(self) -> dict:
        return {"worker": self.worker, "match": self.match, "n_packets": self.n_packets, "n_bytes": self.n_bytes,
                "used": self.used, "actions": self.actions}


class Group(str):
    """One line of :meth:`Dataplane.dump_groups`."""

    group_id: int
    n_packets: int
    n_bytes: int

    def __new__(cls, group_id, text, n_packets, n_bytes):
        self = super().__new__(cls, f"{text} (n_packets={n_packets}, n_bytes={n_bytes})")
        self.group_id, self.n_packets, self.n_bytes, self.text = group_id, n_packets, n_bytes, text
        return self

    def as_dict(self) -> Dict[str, Any]:
        """The line's fields (``dpu dump-groups --json``): group_id, type, buckets (each with
        bucket_id, weight for a select group, actions) and the counters."""
        return {**group_fields(self.text), "n_packets": self.n_packets, "n_bytes": self.n_bytes}


class Connection(str):
    """One line of :meth:`Dataplane.conntrack`, in the shape of
    ``ovs-appctl dpctl/dump-conntrack``, with its fields."""

    proto: int
    zone: int
    orig: dict    # src, dst, sport, dport (ICMP: id, type, code)
    reply: dict
    mark: int
    label: int
    state: Optional[str]  # TCP state (ESTABLISHED, TIME_WAIT...), None for UDP/ICMP
    expires_in: float     # seconds until it expires if idle
    snat: bool
    dnat: bool
    key: bytes            # the original direction's key, for Dataplane.ct_flush(keys=...)

    def __new__(cls, d: dict):
        self = super().__new__(cls, d["text"])
        for k in ("proto", "zone", "orig", "reply", "mark", "label", "state", "expires_in", "snat", "dnat", "key"):
            setattr(self, k, d[k])
        return self

    def as_dict(self) -> Dict[str, Any]:
        """The line's fields under dump-conntrack's names (``dpu ct dump --json``): the protocol
        as the line starts, orig, reply, zone, mark, labels (hex) and protoinfo ({"state": ...},
        null without one), with what the line leaves out: expires_in (seconds) and snat, dnat."""
        return {"proto": self.split(",", 1)[0], "orig": self.orig, "reply": self.reply, "zone": self.zone,
                "mark": self.mark, "labels": f"{self.label:#x}",
                "protoinfo": {"state": self.state} if self.state else None,
                "expires_in": round(self.expires_in, 3), "snat": self.snat, "dnat": self.dnat}


@dataclass
class Output:
    """A packet the dataplane sent: to ``port``, descended from input number ``index``."""

    port: str
    data: bytes
    index: int
    timestamp_ns: int = 0


@dataclass
class TracePass:
    in_port: str
    flow: str
    events: List[dict]
    final_flow: str
    megaflow: str
    datapath_actions: str
    drop_reason: Optional[str]
    recirc_id: int = 0
    conntrack: List[str] = field(default_factory=list)  # what the conntrack stage did after this pass


@dataclass
class Trace:
    """What :meth:`Dataplane.trace` found: one pass per lookup (a tunnel pop or a
    conntrack recirculation adds one), the packets the datapath really emitted,
    and the drop reason if none."""

    passes: List[TracePass]
    outputs: List[Tuple[str, bytes]]
    drop_reason: Optional[str]

    def __str__(self) -> str:
        from .trace_format import render_trace

        return render_trace(self)


# The seam's facts as the core keeps them (dpu._core exports them; see
# native/include/dpu/ct_timeouts.def and tunnel_params.def).
CT_TIMEOUTS: Dict[str, float] = {name: default for name, default, _ in _core.CT_TIMEOUTS}  # name -> default (s)
CT_TIMEOUT_RANGE: Tuple[float, float] = tuple(_core.CT_TIMEOUT_RANGE)  # seconds: above 0, at most 30 days
CT_MAX_CONNECTIONS_RANGE: Tuple[int, int] = tuple(_core.CT_MAX_CONNECTIONS_RANGE)
# tunnel port settings: member -> (default, min, max, name in add_tunnel_port)
TUNNEL_PARAMS: Dict[str, Tuple[Any, int, int, str]] = {m: (d, lo, hi, api) for m, d, lo, hi, api, _ in
                                                        _core.TUNNEL_PARAMS}
_OP = _core.OpKind


class Transaction:
    """Changes collected and committed atomically (all or nothing).

    Use as ``with dp.transaction() as t: t.add_flow(...); t.del_flows(...)``.
    Nothing is visible to packets until the block ends without an exception.
    The commit hands the core one typed transaction (``dpu._core.Txn``):
    ports, flows, groups, tenants, conntrack zones, NAT port forwards and
    conntrack's timeouts and limit, checked there as a whole before any of
    it is applied.
    """

    def __init__(self, dp: "Dataplane", create_ports: bool = False) -> None:
        self._dp = dp
        self.add_ports: List[dict] = []
        self.del_ports: List[str] = []
        self.ops: List[Tuple[_core.OpKind, str]] = []
        self.tenants: Optional[List[Tuple[str, int]]] = None
        self.ct_zones: Optional[List[Tuple[int, int, bool]]] = None
        self.nat_static: Optional[List[tuple]] = None
        self.ct_timeouts: Optional[Dict[str, float]] = None
        self.ct_max_connections: Optional[int] = None
        self.create_ports = create_ports
        self.result: Optional[dict] = None
        # (first op, (line, text) in op order, file) of each add_numbered()
        self._numbered: List[Tuple[int, List[Tuple[int, str]], str]] = []

    # ports
    def add_port(self, name: str, ofport: int = 0) -> None:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"a port name is a string, not {type(name).__name__}")
        self.add_ports.append({"name": name, "ofport": ofport})

    def add_tunnel_port(self, name: str, **cfg: Any) -> None:
        self.add_ports.append(_tunnel_spec(name, **cfg))

    def del_port(self, name: str) -> None:
        self.del_ports.append(name)

    # flows
    def add_flow(self, flow: str) -> None:
        self.ops.append((_OP.ADD_FLOW, flow))

    def add_flows(self, flows: Union[str, Iterable[str]]) -> int:
        """Flows from a multi-line string or a list (``#`` comments, blank
        lines; ``group_id=`` lines are groups, added first); an error names
        the line of the text, or the place in the list, counted from 1.
        Returns the number of flows."""
        return self.add_numbered(_numbered_lines(flows), "")

    def add_numbered(self, numbered: Sequence[Tuple[int, str]], path: Optional[str] = None) -> int:
        """The groups, then the flows, of (line number, text) pairs read from
        ``path`` (a flows file: read_flows_file()); an error about one of them
        names the file and its line. Returns the number of flows."""
        order = [(n, f) for n, f in numbered if f.startswith("group_id=")]
        n_groups = len(order)
        order += [(n, f) for n, f in numbered if not f.startswith("group_id=")]
        if path is not None:  # "": lines of the caller's text, no file
            self._numbered.append((len(self.ops) + 1, order, path))
        for _, f in order:
            self.ops.append((_OP.ADD_GROUP if f.startswith("group_id=") else _OP.ADD_FLOW, f))
        return len(order) - n_groups

    def mod_flows(self, flow: str, strict: bool = False) -> None:
        self.ops.append((_OP.MOD_FLOWS_STRICT if strict else _OP.MOD_FLOWS, flow))

    def del_flows(self, match: str = "", strict: bool = False) -> None:
        self.ops.append((_OP.DEL_FLOWS_STRICT if strict else _OP.DEL_FLOWS, match))

    def replace_flows(self, match: str = "") -> None:
        """The flows `match` selects (as del_flows) are replaced by the flows
        this transaction adds after it: one added unchanged (same table,
        match, priority, cookie and actions) stays as it was, with its
        counters, age and cached megaflows (ovs-ofctl replace-flows)."""
        self.ops.append((_OP.REPLACE_FLOWS, match))

    # groups
    def add_group(self, group: str) -> None:
        self.ops.append((_OP.ADD_GROUP, group))

    def mod_group(self, group: str) -> None:
        self.ops.append((_OP.MOD_GROUP, group))

    def del_groups(self, group: str = "") -> None:
        self.ops.append((_OP.DEL_GROUPS, group))

    def set_tenants(self, tenants: Sequence[Tuple[str, int]]) -> None:
        """Names the tenants: per-tenant counters follow the ``metadata`` value
        a packet carries at the end of its pipeline walk."""
        self.tenants = [(n, int(m)) for n, m in tenants]

    # conntrack
    def set_ct_zones(self, zones: Sequence[Tuple[int, int, bool]]) -> None:
        """Conntrack zone settings, replacing all others: (zone, connection
        limit or 0, endpoint-independent filtering)."""
        self.ct_zones = [tuple(z) for z in zones]

    def set_nat_static(self, mappings: Sequence[tuple]) -> None:
        """Static NAT mappings (port forwards), replacing all others:
        (zone, protocol number, internal ip, internal port, public ip, public port)."""
        self.nat_static = [tuple(m) for m in mappings]

    def set_ct_config(self, timeouts: Optional[Dict[str, float]] = None,
                      max_connections: Optional[int] = None) -> None:
        """Conntrack timeouts in seconds by name (:data:`CT_TIMEOUTS`; those
        not named stay as they are) and the connection limit (None: as it is)."""
        if timeouts is not None and not isinstance(timeouts, dict):
            raise InvalidArgumentError(f"ct timeouts are a dict of name: seconds, not {type(timeouts).__name__}")
        lo, hi = CT_TIMEOUT_RANGE
        for k, v in (timeouts or {}).items():
            if not isinstance(k, str):
                raise InvalidArgumentError(f"a ct timeout is named by a string, not {k!r}")
            if not _is_number(v):
                raise InvalidArgumentError(f"ct timeout {k!r} must be a number of seconds, above 0 and at most "
                                           f"{hi:.0f} ({hi / 86400:.0f} days), got {v!r}")
        cmin, cmax = CT_MAX_CONNECTIONS_RANGE
        if max_connections is not None and (not _is_int(max_connections) or not cmin <= max_connections <= cmax):
            raise InvalidArgumentError(f"max_connections must be {cmin}..{cmax}, got {max_connections!r}")
        if timeouts:
            self.ct_timeouts = {**(self.ct_timeouts or {}), **timeouts}
        if max_connections is not None:
            self.ct_max_connections = int(max_connections)

    def _native(self) -> "_core.Txn":
        """The typed transaction the core applies: Python types are checked
        here (so that a wrong one is named, not a failed cast); values, by the
        core."""
        txn = _core.Txn()
        for p in self.add_ports:
            txn.add_port(_port_spec(p))
        for name in self.del_ports:
            if not isinstance(name, str):
                raise InvalidArgumentError(f"a port name is a string, not {type(name).__name__}")
            txn.del_port(name)
        txn.add_ops(self.ops)
        if self.tenants is not None:
            txn.set_tenants(self.tenants)
        if self.ct_zones is not None:
            txn.set_ct_zones([_ct_zone(i, z) for i, z in enumerate(self.ct_zones, 1)])
        if self.nat_static is not None:
            txn.set_nat_static([_nat_mapping(i, m) for i, m in enumerate(self.nat_static, 1)])
        if self.ct_timeouts:
            txn.set_ct_timeouts([_core.CtTimeout(k, float(v)) for k, v in self.ct_timeouts.items()])
        txn.ct_max_connections = self.ct_max_connections
        txn.create_ports = bool(self.create_ports)
        return txn

    def commit(self) -> dict:
        txn = self._native()
        try:
            self.result = self._dp._core.apply(txn)
        except DpuError as e:
            # e.line: the op that failed (1-based); a lone op's error may not say
            # (when nothing else in the transaction could have failed).
            lone = len(self.ops) == 1 and not (self.add_ports or self.del_ports or self.tenants is not None
                                               or self.ct_zones is not None or self.nat_static is not None
                                               or self.ct_timeouts or self.ct_max_connections is not None)
            index = e.line if e.line is not None else (1 if lone else None)
            for first, order, path in self._numbered:
                if index is not None and first <= index < first + len(order):
                    e.line = order[index - first][0]
                    if path:
                        e.file = path
                    e.message = _relocate(e, path)
                    e.args = (e.message,)
            raise
        return self.result

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()


def _tunnel_spec(
    name: str,
    *,
    underlay: str,
    local_ip: str,
    local_mac: str,
    nexthop_mac: str,
    dst_port: int = TUNNEL_PARAMS["dst_port"][0],
    src_port_range: Tuple[int, int] = (TUNNEL_PARAMS["sport_min"][0], TUNNEL_PARAMS["sport_max"][0]),
    ttl: int = TUNNEL_PARAMS["ttl"][0],
    mtu: int = TUNNEL_PARAMS["mtu"][0],
    strict: bool = TUNNEL_PARAMS["strict"][0],
    ofport: int = 0,
) -> dict:
    """A tunnel port as a port dict; the defaults and the ranges are the core's
    (TUNNEL_PARAMS), which checks the values when the transaction commits."""
    if not isinstance(src_port_range, (tuple, list)) or len(src_port_range) != 2:
        raise InvalidArgumentError(f"tunnel port '{name}': src_port_range is (min, max), got {src_port_range!r}")
    return {
        "name": name,
        "ofport": ofport,
        "tunnel": True,
        "underlay": underlay,
        "local_ip": str(local_ip),
        "local_mac": local_mac,
        "nexthop_mac": nexthop_mac,
        "dst_port": dst_port,
        "sport_min": src_port_range[0],
        "sport_max": src_port_range[1],
        "ttl": ttl,
        "mtu": mtu,
        "strict": bool(strict),
    }


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int64(v: Any, what: str, expect: str) -> int:
    """An integer for a typed field of the core's transaction (which checks its
    range); anything else is refused here, by name: ``{what} must be {expect},
    got {v!r}``."""
    if not _is_int(v) or not _INT64[0] <= v <= _INT64[1]:
        raise InvalidArgumentError(f"{what} must be {expect}, got {v!r}")
    return int(v)


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise InvalidArgumentError(f"{what} is a string, not {type(v).__name__}")
    return v


def _address(v: Any, what: str) -> str:
    return str(v) if isinstance(v, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else _text(v, what)


def _port_spec(d: dict) -> "_core.PortSpec":
    """A port dict (Transaction.add_ports, compiled topologies) as the core's PortSpec."""
    if not isinstance(d, dict):
        raise InvalidArgumentError(f"a port is a dict (name, ofport, ...), not {type(d).__name__}")
    ps = _core.PortSpec()
    name = ps.name = _text(d.get("name"), "a port name")
    ps.ofport = _int64(d.get("ofport", 0), f"port '{name}': ofport",
                       f"0 (the next free) or 1..{_core.MAX_OFPORT}")
    if not d.get("tunnel"):
        return ps
    ps.tunnel = True
    for k in ("underlay", "local_ip", "local_mac", "nexthop_mac"):
        setattr(ps, k, _text(d.get(k), f"tunnel port '{name}': {k}"))
    for m, (default, lo, hi, api) in TUNNEL_PARAMS.items():
        v = d.get(m, default)
        setattr(ps, m, bool(v) if isinstance(default, bool) else
                _int64(v, f"tunnel port '{name}': {api}", f"{lo}..{hi}"))
    return ps


def _ct_zone(i: int, z: Any) -> "_core.CtZone":
    if not isinstance(z, (tuple, list)) or len(z) != 3:
        raise InvalidArgumentError(f"conntrack zone setting {i} is (zone, limit, endpoint-independent), got {z!r}")
    zone = _int64(z[0], f"conntrack zone setting {i}: the zone", "0..65535")
    limit = _int64(z[1], f"conntrack zone {zone}: the connection limit",
                   f"0 (none) or 1..{CT_MAX_CONNECTIONS_RANGE[1]}")
    return _core.CtZone(zone, limit, bool(z[2]))


def _nat_mapping(i: int, m: Any) -> "_core.NatMapping":
    if not isinstance(m, (tuple, list)) or len(m) != 6:
        raise InvalidArgumentError(f"NAT mapping {i} is (zone, protocol, internal ip, internal port, public ip, "
                                   f"public port), got {m!r}")
    what = f"NAT mapping {i}"
    return _core.NatMapping(_int64(m[0], f"{what}: the zone", "0..65535"),
                            _int64(m[1], f"{what}: the protocol", "tcp (6) or udp (17)"),
                            _address(m[2], f"{what}: the internal ip"),
                            _int64(m[3], f"{what}: the internal port", "1..65535"),
                            _address(m[4], f"{what}: the public ip"),
                            _int64(m[5], f"{what}: the public port", "1..65535"))


# The first line of ovs-ofctl's dump-flows/dump-groups output, e.g.
# "OFPST_FLOW reply (OF1.3) (xid=0x2):" or "NXST_FLOW reply (xid=0x4):".
_REPLY_HEADER = re.compile(r"^(?:OFPST|NXST)_[A-Z_]+ reply\b")


def _is_flow_line(line: str) -> bool:
    return bool(line) and not line.startswith("#") and not _REPLY_HEADER.match(line)


def _is_int(v: Any) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _numbered_lines(flows: Union[str, Iterable[str]]) -> List[Tuple[int, str]]:
    """(line, flow) of a multi-line string's flow lines, or (position, flow)
    of a list's, counted from 1 (comments and blank lines count too)."""
    if isinstance(flows, (bytes, bytearray)) or not isinstance(flows, (str, Iterable)):
        raise InvalidArgumentError(f"flows are a string or a list of strings, not {type(flows).__name__}")
    items = flows.splitlines() if isinstance(flows, str) else list(flows)
    for i, line in enumerate(items):
        if not isinstance(line, str):
            raise InvalidArgumentError(f"flow {i + 1} is a {type(line).__name__}, not a string")
    return [(i + 1, line.strip()) for i, line in enumerate(items) if _is_flow_line(line.strip())]


def read_flows_file(path: Union[str, os.PathLike]) -> List[Tuple[int, str]]:
    """(line number, flow) for each flow in a file: one per line, # comments,
    blank lines; UTF-8, a byte-order mark at the start skipped (as YAML does).

    A file that cannot be read (missing, a directory, no permission) raises
    DpuIOError with the OS reason; bytes that are not UTF-8 raise
    FlowParseError naming the line and column."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):  # /dev/zero would be read forever
                raise DpuIOError(f"{show_path(name)}: is a device, not a flows file", file=str(name),
                                 reason="is a device")
            data = f.read()
    except OSError as e:
        if isinstance(e, DpuError):
            raise
        raise from_os_error(e, name, "cannot read flows file") from None
    except ValueError as e:  # a NUL in the name
        raise DpuIOError(f"{name!r}: not a file name: {e}", file=str(name)) from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[start:e.start].decode("utf-8", "replace")) + 1
        raise FlowParseError(f"{show_path(name)}:{line}: column {col}: byte {data[e.start]:#04x} is not UTF-8 "
                             "(flows files are UTF-8 text)", file=str(name), line=line, position=col - 1,
                             reason="not UTF-8") from None
    out = []
    for no, line in enumerate(io.StringIO(text, newline=None), 1):
        line = line.strip()
        if _is_flow_line(line):
            out.append((no, line))
    return out


def _to_bytes(pkt: PacketLike) -> bytes:
    if isinstance(pkt, (bytes, bytearray, memoryview)):
        return bytes(pkt)
    # A scapy packet builds itself, with the fields it left unset given fixed
    # defaults rather than taken from this host's interfaces, routes or ARP
    # (dpu.packet_expr): an offline call neither varies by machine nor sends.
    from .packet_expr import offline_defaults

    if hasattr(pkt, "fields_desc"):
        return bytes(offline_defaults(pkt.copy()))
    try:  # anything with the buffer protocol (a numpy array of bytes, ...); not bytes(123), 123 zeros
        return bytes(memoryview(pkt))
    except TypeError:
        raise InvalidArgumentError(f"a packet is bytes or a scapy packet, not {type(pkt).__name__}") from None


class Dataplane:
    """A dataplane: ports, OpenFlow-style tables, groups, caches, counters.

    >>> dp = Dataplane(ports=["vm1", "vm2"])
    >>> dp.add_flow("in_port=vm1,actions=output:vm2")
    >>> [o.port for o in dp.process(b"\\x00" * 60, in_port="vm1")]
    ['vm2']
    """

    def __init__(self, ports: Iterable[str] = (), flows: Union[None, str, Iterable[str]] = None,
                 workers: int = 1) -> None:
        if not _is_int(workers) or not 1 <= workers <= 64:
            raise InvalidArgumentError(f"workers must be 1..64, got {workers!r}")
        if isinstance(ports, (str, bytes)):  # list("vm1") would be three ports
            raise InvalidArgumentError(f"ports is a list of port names, not one string ({ports!r})")
        self._core = _core.Dataplane(int(workers))
        self.topology = None
        self._groups_replaced = False  # replace_flows changed groups after the last topology load
        names = list(ports)
        if names or flows:
            with self.transaction() as t:
                for n in names:
                    t.add_port(n)
                if flows:
                    t.add_flows(flows)

    # ---- construction from a topology --------------------------------------------
    @classmethod
    def from_topology(cls, topology: Any, flows: Union[None, str, Iterable[str]] = None) -> "Dataplane":
        """A dataplane configured from a tenant topology (a YAML path, text, or dict)."""
        dp = cls()
        dp.load_topology(topology, flows=flows)
        return dp

    def load_topology(self, topology: Any, flows: Union[None, str, Iterable[str]] = None,
                      flows_file: Union[None, str, os.PathLike] = None) -> dict:
        """Loads (or reloads) a topology (a YAML path, text, dict, or a loaded
        Topology) in one atomic transaction. The previously compiled flows and
        groups are replaced; flows the user added (other cookies) stay, and
        ``flows`` are added on top, then the flows and groups of ``flows_file``
        (as :meth:`load_flows` reads it: its errors name the file and line).
        Ports the new topology no longer has are removed; a changed uplink is
        reconfigured; conntrack zones (quotas, filtering) and port forwards are
        replaced with the flows, and the topology's conntrack timeouts and
        connection limit set, in the same transaction: a mistake anywhere
        leaves all of it as it was."""
        import gc

        from .topology import Topology, compile_topology, load_topology

        # Compiling 100k endpoints allocates millions of short-lived objects and no
        # cycles: the cyclic collector would only rescan them over and over.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            numbered = read_flows_file(flows_file) if flows_file is not None else []
            topo = topology if isinstance(topology, Topology) else load_topology(topology)
            return self._apply_compiled(compile_topology(topo), flows, numbered,
                                        os.fspath(flows_file) if flows_file is not None else None)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _apply_compiled(self, comp: Any, extra_flows: Union[None, str, Iterable[str]],
                        numbered: Sequence[Tuple[int, str]] = (), path: Optional[str] = None) -> dict:
        from .topology import TOPOLOGY_COOKIE, TOPOLOGY_COOKIE_MASK

        old = self.topology
        existing = {p["name"]: p for p in self.port_info()}
        t = self.transaction()
        wanted = {p["name"] for p in comp.ports}
        if old is not None:
            for name in old.port_names:
                if name not in wanted and name in existing:
                    t.del_port(name)
        for p in comp.ports:
            cur = existing.get(p["name"])
            if cur is None:
                t.add_ports.append(p)
            elif p.get("tunnel") or cur.get("tunnel"):
                if any(cur.get(k) != v for k, v in p.items() if k != "ofport"):
                    t.del_port(p["name"])
                    t.add_ports.append(dict(p, ofport=cur["ofport"]))
        # Only what differs changes: unchanged flows and groups keep their
        # counters and the workers their cached megaflows.
        t.replace_flows(f"cookie={TOPOLOGY_COOKIE:#x}/{TOPOLOGY_COOKIE_MASK:#x}")
        was = {text.split(",", 1)[0]: text for text, _ in old.groups} if old is not None else {}
        now = {text.split(",", 1)[0]: text for text, _ in comp.groups}
        if self._groups_replaced:  # replace_flows changed groups since: those there now, their text unknown
            have = {f"group_id={g.group_id}" for g in self.dump_groups()}
            was = {gid: None for gid in list(was) + list(now) if gid in have}
        for gid in was:
            if gid not in now:
                t.del_groups(gid)
        for gid, text in now.items():
            if gid not in was:
                t.add_group(text)
            elif was[gid] != text:
                t.mod_group(text)
        for text, _ in comp.flows:
            t.add_flow(text)
        if extra_flows:
            t.add_flows(extra_flows)
        t.add_numbered(numbered, path)
        t.set_tenants(comp.tenants)
        t.set_ct_zones(comp.ct_zones)
        t.set_nat_static(comp.nat_static)
        t.set_ct_config(timeouts=comp.topology.ct_timeouts, max_connections=comp.topology.ct_max_connections)
        result = t.commit()  # all of it, or (an error) none of it
        self.topology = comp
        self._groups_replaced = False
        if any(x.security for x in comp.topology.tenants.values()):
            from .topology.security_flows import cut_connections
            # what the new security groups no longer allow is cut now, not when it idles out
            cut = cut_connections(self, comp.topology)
            if isinstance(result, dict):
                result["connections_cut"] = cut
        return result

    # ---- transactions ----------------------------------------------------------------
    def transaction(self, create_ports: bool = False) -> Transaction:
        """A set of changes committed atomically when the ``with`` block ends."""
        return Transaction(self, create_ports=create_ports)

    # ---- ports -------------------------------------------------------------------------
    def add_port(self, name: str, ofport: int = 0) -> int:
        with self.transaction() as t:
            t.add_port(name, ofport)
        return self.port_number(name)

    def add_tunnel_port(self, name: str, **cfg: Any) -> int:
        """A VXLAN port bound to ``underlay``; see :func:`_tunnel_spec` for options."""
        with self.transaction() as t:
            t.add_tunnel_port(name, **cfg)
        return self.port_number(name)

    def del_port(self, name: str) -> None:
        with self.transaction() as t:
            t.del_port(name)

    @property
    def ports(self) -> Dict[str, int]:
        """Port name -> OpenFlow port number."""
        return {p["name"]: p["ofport"] for p in self._core.ports()}

    def port_info(self) -> List[dict]:
        return list(self._core.ports())

    def port_number(self, name: Union[str, int]) -> int:
        if isinstance(name, int):
            if not self._core.port_name(name):
                raise UnknownPortError(f"unknown port {name}", token=str(name))
            return name
        n = self._core.port_number(name)
        if not n:
            raise UnknownPortError(f"unknown port '{name}'", token=name)
        return n

    def _input_port(self, port: Union[str, int]) -> int:
        """A port an API call takes packets from, as its number: a name is
        looked up here, a number is the core's to judge ("unknown input port
        N", as process, trace, bench and replay say it)."""
        if _is_int(port):
            if not 0 <= port <= 0xFFFFFFFF:
                raise UnknownPortError(f"unknown input port {port}", token=str(port))
            return int(port)
        return self.port_number(port)

    def port_name(self, number: int) -> str:
        return self._core.port_name(number) or str(number)

    # ---- flows ---------------------------------------------------------------------------
    def add_flow(self, flow: str) -> None:
        """Adds one flow in ovs-ofctl syntax (replacing one with the same match and priority)."""
        with self.transaction() as t:
            t.add_flow(flow)

    def add_flows(self, flows: Union[str, Iterable[str]], create_ports: bool = False) -> int:
        """Adds flows atomically: all of them, or none (the error names the line)."""
        with self.transaction(create_ports=create_ports) as t:
            n = t.add_flows(flows)
        return n

    def load_flows(self, path: Union[str, os.PathLike], create_ports: bool = False) -> int:
        """Adds the flows of a file, all or nothing: one flow per line, ``#``
        comments, blank lines. A line starting with ``group_id=`` is a group
        (added before the flows, so flows may use it). Errors name the file's line.
        """
        return self.load_numbered_flows(read_flows_file(path), str(path), create_ports)

    def load_numbered_flows(self, numbered: Sequence[Tuple[int, str]], path: Optional[str] = None,
                            create_ports: bool = False) -> int:
        """:meth:`load_flows` for (line number, text) pairs already read from
        ``path`` (named in errors; the control socket's add-flows)."""
        t = self.transaction(create_ports=create_ports)
        n = t.add_numbered(numbered, path)
        t.commit()
        return n

    def mod_flows(self, flow: str, strict: bool = False) -> int:
        with self.transaction() as t:
            t.mod_flows(flow, strict)
        return t.result["flows_modified"]

    def del_flows(self, match: str = "", strict: bool = False) -> int:
        """Deletes flows: non-strict (every flow the match covers) unless strict=True
        (exactly this match and priority), as ovs-ofctl del-flows."""
        with self.transaction() as t:
            t.del_flows(match, strict)
        return t.result["flows_deleted"]

    def dump_flows(self, match: str = "", strict: bool = False) -> List[Flow]:
        """The flows (optionally those a match selects), with their counters."""
        return [Flow(*row) for row in self._core.dump_flows(match, strict)]

    def replace_flows(self, flows: Union[str, Iterable[str]]) -> dict:
        """Makes the flows and groups exactly these (a multi-line string or a list, as
        add_flows takes them), as ``ovs-ofctl replace-flows``: in one transaction, only
        the difference changes; a flow the text has unchanged (table, priority, match,
        cookie, actions) keeps its counters, age and cached megaflows, one whose cookie
        or actions differ is modified in place (counters kept). Returns the counts of
        flows and groups added, modified, deleted and unchanged, and the version."""
        return self.replace_numbered_flows(_numbered_lines(flows), "")

    def replace_flows_file(self, path: Union[str, os.PathLike]) -> dict:
        """:meth:`replace_flows` with a flows file's (errors name its lines)."""
        return self.replace_numbered_flows(read_flows_file(path), os.fspath(path))

    def replace_numbered_flows(self, numbered: Sequence[Tuple[int, str]], path: Optional[str] = None) -> dict:
        """:meth:`replace_flows` for (line, text) pairs read from ``path``."""
        from . import flowdiff

        r = flowdiff.replace(self, flowdiff.read_table(Dataplane(), numbered, path, self.port_info()))
        if r["groups_added"] or r["groups_modified"] or r["groups_deleted"]:
            self._groups_replaced = True  # a topology reload no longer knows which compiled groups are there
        return r

    def flow_table(self) -> "FlowTable":
        """The flows and groups as :mod:`dpu.flowdiff` compares them (diff-flows)."""
        from .flowdiff import table_of

        return table_of(self)

    def dump_megaflows(self) -> List["Megaflow"]:
        """Every worker's megaflows (``ovs-appctl dpctl/dump-flows``): masked match,
        datapath actions, packets, bytes and when last used; their counts are pushed
        to the rules first, as dump_flows does."""
        return [Megaflow(*row) for row in self._core.dump_megaflows()]

    # ---- groups ----------------------------------------------------------------------------
    def add_group(self, group: str) -> None:
        """``group_id=N,type=select|all|indirect,bucket=weight:W,actions=...,bucket=...``"""
        with self.transaction() as t:
            t.add_group(group)

    def mod_group(self, group: str) -> None:
        with self.transaction() as t:
            t.mod_group(group)

    def del_groups(self, group: str = "") -> int:
        """Deletes one group (``group_id=N``) or all; flows using them go too."""
        with self.transaction() as t:
            t.del_groups(group)
        return t.result["groups_deleted"]

    def dump_groups(self) -> List[Group]:
        return [Group(*row) for row in self._core.dump_groups()]

    # ---- packets ---------------------------------------------------------------------------
    def process(
        self,
        packets: Union[PacketLike, Sequence[PacketLike], Sequence[Tuple[str, PacketLike]]],
        in_port: Optional[str] = None,
        timestamps: Optional[Sequence[int]] = None,
        worker: int = 0,
    ) -> List[Output]:
        """Runs packets through the pipeline and returns what came out, in order.

        ``packets`` is one packet, a list of packets (all from ``in_port``), or a
        list of ``(in_port, packet)`` pairs. ``timestamps`` (ns, one per packet)
        are carried to the outputs and drive the conntrack clock. ``worker``
        picks the worker (the GIL is released: calls on different workers run
        in parallel)."""
        if isinstance(packets, (bytes, bytearray, memoryview)) or not isinstance(packets, (list, tuple)):
            packets = [packets]
        datas: List[bytes] = []
        ports: List[int] = []
        cache: Dict[str, int] = {}
        for item in packets:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (str, int)):
                port, pkt = item
            else:
                if in_port is None:
                    raise UnknownPortError("process() needs in_port= or (in_port, packet) pairs")
                port, pkt = in_port, item
            if port not in cache:
                cache[port] = self._input_port(port)
            ports.append(cache[port])
            datas.append(_to_bytes(pkt))
        lens = np.fromiter((len(d) for d in datas), dtype=np.uint32, count=len(datas))
        offsets = np.zeros(len(datas), dtype=np.uint64)
        if len(datas) > 1:
            offsets[1:] = np.cumsum(lens[:-1], dtype=np.uint64)
        ts = None if timestamps is None else np.asarray(timestamps, dtype=np.uint64)
        blob, o_port, o_index, o_off, o_len, o_ts = self._core.process(
            b"".join(datas), offsets, lens, np.asarray(ports, dtype=np.uint32), ts, worker
        )
        names: Dict[int, str] = {}
        out = []
        for p, i, off, ln, t in zip(o_port.tolist(), o_index.tolist(), o_off.tolist(), o_len.tolist(), o_ts.tolist()):
            if p not in names:
                names[p] = self.port_name(p)
            out.append(Output(names[p], blob[off : off + ln], i, t))
        return out

    def trace(self, packet: PacketLike, in_port: Union[str, int]) -> Trace:
        """Like ovs-appctl ofproto/trace: tables visited, rules, actions, megaflow,
        datapath actions, and what the datapath then emitted. Counters are untouched."""
        r = self._core.trace(_to_bytes(packet), self._input_port(in_port))
        passes = [TracePass(**p) for p in r["passes"]]
        tr = Trace(passes, list(r["outputs"]), r["drop_reason"])
        tenants = list(self.topology.topology.tenants.values()) if self.topology is not None else []
        if any(t.security for t in tenants):
            from .topology.security_flows import annotate_trace
            annotate_trace(tr, tenants)
        return tr

    def replay(
        self,
        inputs: Union[Dict[str, str], Sequence[Tuple[str, str]]],
        out_dir: Union[str, os.PathLike],
        progress: Any = None,
        chunk: int = 1_000_000,
        drops_pcap: Optional[Union[str, os.PathLike]] = None,
    ) -> "ReplaySummary":
        """Replays pcap/pcapng files (port -> file) and writes one pcap per port
        into ``out_dir`` (and, with ``drops_pcap``, every dropped packet with its
        reason to that pcapng file); see :mod:`dpu.replay`."""
        from .replay import replay

        return replay(self, inputs, out_dir, progress=progress, chunk=chunk, drops_pcap=drops_pcap)

    # ---- counters ---------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The configuration version in force: each committed transaction
        makes the next one (docs/design.md, "Changes without stopping the world")."""
        return self._core.version()

    def stats(self, sync: bool = True) -> dict:
        """Counters: per port, per table, per tenant, per worker (pmd-stats-show:
        ``workers``, and their sum ``workers_total``, also under its old name
        ``pmd``). Every counter is read as it stands, with relaxed loads: no
        worker's lock is taken and nothing expires (a read never changes what
        it measures). Table counters come from the workers' megaflow counts,
        which an API call (process, replay, bench) credits before it returns
        and a live worker at its housekeeping (every 50 ms). ``sync`` is
        accepted for scripts that pass it and changes nothing."""
        raw = self._core.stats()
        names = {p["ofport"]: p["name"] for p in self._core.ports()}
        ports = {names.get(n, str(n)): c for n, c in raw["ports"].items()}
        tenants = {name: raw["tenants"][slot] for name, _, slot in self._core.tenants() if slot < len(raw["tenants"])}
        tables = []
        for t, (lookups, matches, active) in enumerate(self._core.tables(False)):
            if lookups or active:
                tables.append(
                    {"table": t, "active": active, "lookups": lookups, "matches": matches, "misses": lookups - matches}
                )
        # workers_total: the sum of the workers' counters; "pmd" is its old name, kept for scripts
        st = {"ports": ports, "tables": tables, "tenants": tenants, "workers_total": raw["workers_total"],
              "pmd": raw["pmd"], "workers": raw["workers"], "conntrack": self._core.ct_stats()}
        if self.topology is not None and any(t.security for t in self.topology.topology.tenants.values()):
            from .topology import TOPOLOGY_COOKIE
            from .topology.security_flows import security_counters
            st["security_groups"] = security_counters(self, TOPOLOGY_COOKIE)   # hits per rule, denials per port
        return st

    def set_tenants(self, tenants: Sequence[Tuple[str, int]]) -> None:
        with self.transaction() as t:
            t.set_tenants(tenants)

    # ---- connection tracking ---------------------------------------------------------------
    def conntrack(self, zone: Optional[int] = None) -> List[Connection]:
        """The connection table (one zone, or all), like ``ovs-appctl dpctl/dump-conntrack``."""
        return [Connection(d) for d in self._core.ct_dump(-1 if zone is None else _zone(zone))]

    def ct_flush(self, zone: Optional[int] = None, keys: Optional[Sequence[bytes]] = None) -> int:
        """Removes the connections of one zone (or all), or with ``keys`` exactly
        those connections (their :attr:`Connection.key`); returns how many."""
        if keys is not None:
            if zone is not None:
                raise ValueError("ct_flush: give a zone or keys, not both (a key names its zone)")
            return self._core.ct_flush_keys(list(keys))
        return self._core.ct_flush(-1 if zone is None else _zone(zone))

    def ct_config(self, timeouts: Optional[Dict[str, float]] = None, max_connections: Optional[int] = None) -> dict:
        """Sets (when given) and returns the conntrack timeouts in seconds
        (:data:`CT_TIMEOUTS`: tcp_established, tcp_transitory, udp, icmp) and
        the connection limit; a change is a transaction of its own."""
        if timeouts or max_connections is not None:
            with self.transaction() as t:
                t.set_ct_config(timeouts, max_connections)
        return self._core.ct_config()

    def set_frags(self, mode: str) -> None:
        """How IP fragments meet the tables, as ``ovs-ofctl set-frags``: ``"normal"``
        (the default, as Open vSwitch: every fragment's L4 ports and ICMP type/code
        read as 0 when matching) or ``"nx-match"`` (a first fragment's real ports are
        matched; later fragments have none). Flushes the caches."""
        if mode not in ("normal", "nx-match"):
            raise InvalidArgumentError(f"frag mode must be 'normal' or 'nx-match', got {mode!r}")
        self._core.set_frag_nx_match(mode == "nx-match")

    @property
    def frags(self) -> str:
        """The fragment handling mode (:meth:`set_frags`)."""
        return "nx-match" if self._core.frag_nx_match() else "normal"

    def warp(self, seconds: float) -> None:
        """Advances this dataplane's clock (tests: flow durations, later aging)."""
        if not _is_number(seconds) or not 0 <= seconds < 1e9:
            raise InvalidArgumentError(f"warp takes seconds to jump ahead, 0 or more, got {seconds!r}")
        self._core.warp(int(seconds * 1e9))

    def stop_clock(self, stop: bool = True) -> None:
        """Stops this dataplane's clock where it stands (``ovs-appctl time/stop``), or
        lets it run on from there. A stopped clock moves only with :meth:`warp` and, for
        connection tracking, with the packets' timestamps: replayed expiries then depend
        on packet time alone."""
        self._core.stop_clock(stop)


def _zone(zone) -> int:
    if not _is_int(zone) or not 0 <= zone <= 65535:
        raise InvalidArgumentError(f"zone must be 0..65535, got {zone!r}")
    return int(zone)


def _relocate(e: DpuError, path: str) -> str:
    """Rewrites an error message so that it names the file and its line (no
    file, path "": the line of the caller's text)."""
    msg = str(e)
    if msg.startswith("line "):
        msg = msg.split(": ", 1)[1] if ": " in msg else msg
    return f"{path}:{e.line}: {msg}" if path else f"line {e.line}: {msg}"


from .replay import ReplaySummary  # noqa: E402  (typing reference)
