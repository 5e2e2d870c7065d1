"""Tenant topology files: validation and compilation into flows.

A topology (YAML; schema in the README, "Tenant topology") describes the uplink
(our VTEP), and per tenant a VNI, an anycast gateway, subnets, local ports and
remote endpoints (EVPN type-2) and flood VTEPs (type-3). It compiles into
ordinary ovs-ofctl flows and groups, which users can print (``dpu compile``)
and extend with flows of their own.

Pipeline (tables):

  0   ingress: a local port's own MAC/IP (anti-spoofing) sets ``metadata`` to
      the tenant's VNI; decapsulated frames are accepted only for configured
      VNIs from VTEPs named for them; everything else is dropped with a reason.
  10  local ingress, L3: ARP suppression (answers for gateways and known
      endpoints of the same tenant), routing via the anycast gateway MAC.
  20  local ingress, L2: to local ports, VXLAN to remote endpoints, isolation
      drops for other tenants' MACs, flood group for broadcast/unknown.
  30  from the fabric, L2: to local ports only (split horizon).

Every compiled flow carries a cookie with TOPOLOGY_COOKIE in its top byte, so
a reload replaces exactly the compiled flows and keeps the user's own.
Validation happens before anything is applied; errors name the path in the
file (``tenants.red.ports.vm3.ip: ...``) and, for YAML, the file, line and
column (``topo.yaml:12:27: tenants.red.ports.vm3.ip: ...``), all of a file's
mistakes at once. The reader is strict where YAML is lenient: a key written
twice, an alias (``*name``), a tag, or nesting deeper than MAX_DEPTH is an
error, and each scalar field checks its type (``strict_vxlan: 'false'`` is not
a boolean). See "reading a topology file" below.
"""
from __future__ import annotations

import ipaddress
import os
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .errors import TopologyError

TOPOLOGY_COOKIE = 0xD9 << 56
TOPOLOGY_COOKIE_MASK = 0xFF << 56
TUNNEL_PORT = "vxlan0"

T_INGRESS, T_L3, T_L2, T_FABRIC = 0, 10, 20, 30
T_NAT_OUT, T_NAT_OUT_CT, T_NAT_OUT_ROUTE = 40, 41, 42
T_INET_IN, T_INET_IN_CT, T_INET_IN_ROUTE = 60, 61, 62
PROTO_NUMBERS = {"tcp": 6, "udp": 17}

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
UNRESOLVED_MAC = "00:00:00:00:00:00"  # a tunnel port's next hop before ARP answers: output drops
# OVS's reserved port names (and drop), in any case, and the tunnel port's.
_RESERVED = {"in_port", "flood", "all", "drop", "local", "normal", "controller", "table", "any", "none",
             TUNNEL_PORT}


@dataclass
class Uplink:
    port: str
    ip: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
    mac: str
    nexthop_mac: Optional[str]       # None: resolved by ARP for `nexthop` (dpu run)
    mtu: int = 1500
    vxlan_port: int = 4789
    ttl: int = 64
    src_port_range: Tuple[int, int] = (49152, 65535)
    strict_vxlan: bool = False
    nexthop: Optional[ipaddress.IPv4Address] = None  # the underlay router, when its MAC is resolved by ARP

    @property
    def ipv6(self) -> bool:
        return self.ip.version == 6


@dataclass
class Endpoint:
    mac: str
    ip: ipaddress.IPv4Address
    port: Optional[str] = None  # local port name
    vtep: Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]] = None  # remote


@dataclass
class Forward:
    proto: str                       # tcp | udp
    public: ipaddress.IPv4Address
    port: int
    to: ipaddress.IPv4Address
    to_port: int


@dataclass
class Nat:
    snat: Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]   # pool, first..last
    floating: List[Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]]  # (private, public)
    forwards: List[Forward]
    endpoint_independent_filtering: bool = False

    @property
    def public_addresses(self) -> List[ipaddress.IPv4Address]:
        seen: Dict[Any, None] = {}
        a, b = self.snat
        for i in range(int(a), int(b) + 1):
            seen.setdefault(ipaddress.IPv4Address(i), None)
        for _, pub in self.floating:
            seen.setdefault(pub, None)
        for f in self.forwards:
            seen.setdefault(f.public, None)
        return list(seen)


@dataclass
class Internet:
    port: str
    mac: str
    nexthop_mac: Optional[str]       # None: resolved by ARP for `nexthop` (dpu run)
    nexthop: Optional[ipaddress.IPv4Address] = None
    ip: Optional[ipaddress.IPv4Address] = None  # source of ARP requests (default: first public address)


@dataclass
class Tenant:
    name: str
    vni: int
    gateway_mac: str
    subnets: List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]]
    ports: Dict[str, Endpoint]
    remote: List[Endpoint]
    flood: List[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]
    index: int = 0
    zone: int = 0                    # conntrack zone
    nat: Optional[Nat] = None
    connection_limit: int = 0        # 0: none

    @property
    def vteps(self) -> List[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
        seen: Dict[Any, None] = {}
        for ep in self.remote:
            seen.setdefault(ep.vtep, None)
        for v in self.flood:
            seen.setdefault(v, None)
        return list(seen)


@dataclass
class Topology:
    uplink: Uplink
    tenants: Dict[str, Tenant]
    source: str = "<topology>"
    internet: Optional[Internet] = None
    ct_timeouts: Dict[str, float] = field(default_factory=dict)
    ct_max_connections: Optional[int] = None


# ---- reading a topology file ------------------------------------------------------------
#
# The file is read as bytes (UTF-8, an optional BOM), parsed into YAML events
# (libyaml when PyYAML has it) and built into plain dicts and lists here, not by
# PyYAML's constructor, so that the loader can refuse what a topology never needs
# and what can hurt: aliases (an alias bomb expands without bound), nesting deeper
# than MAX_DEPTH (no recursion is involved, but no topology needs it), tags other
# than YAML's plain scalars, and a key written twice in one mapping (YAML would
# keep the last one silently). It also remembers where each key and value was
# written, so that every error names its file, line and column.
#
# The YAML layer may refuse deep nesting first: in a flow collection (`[[[...`)
# the scanner reads ahead to the end of the nesting before it yields an event,
# and the libyaml of PyYAML 6.0.4 and later stops past 1,000 levels. Its error
# is reported in dpu's words, as ours is, so that the message does not depend
# on PyYAML's version.

MAX_DEPTH = 64                  # nesting levels a topology file may use (it needs 7)
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels (a topology needs a handful)"
MAX_FILE_BYTES = 256 << 20      # a larger file is refused before it is parsed
MAX_ERRORS = 100                # errors listed by one TopologyError; the rest are counted

_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ, _MERGE = _TAG + "str", _TAG + "map", _TAG + "seq", _TAG + "merge"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "timestamp", "binary"))
_INDEX_RE = re.compile(r"\[(\d+)\]")
_COMPONENT_RE = re.compile(r"[^.\[]*")

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxlevel = 2


def _short(value: Any) -> str:
    """repr(value), cut short: an error message never formats a large object."""
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - e.g. an integer too long to print
        if isinstance(value, int):
            return f"<a {value.bit_length()}-bit integer>"
        return f"<{type(value).__name__}>"


def _clip(text: str, limit: int = 160) -> str:
    """``text``, its middle cut out when it is longer than ``limit``."""
    return text if len(text) <= limit else f"{text[:limit * 2 // 3]}...{text[-(limit // 3 - 3):]}"


def _ks(key: Any) -> str:
    """A mapping key as it appears in an error path."""
    if isinstance(key, str):
        return key
    try:
        return str(key) if isinstance(key, (int, float, type(None))) else _short(key)
    except ValueError:  # an integer too long to print
        return _short(key)


def _child(path: str, key: Any) -> str:
    return f"{path}.{_ks(key)}" if path else _ks(key)


class _Abort(Exception):
    """The item being validated is bad; its error is recorded in _V.errors."""


class _Guard:
    """``with v.guard:`` ends the current item at its first error and goes on
    with the next one, so that one load reports every independent mistake."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, _Abort)


_GUARD = _Guard()
_BAD = object()      # a field that failed validation (its error is recorded)
_NO_KEY = object()


class _Doc:
    """A parsed YAML document: the data, and where each key and value was written."""

    def __init__(self) -> None:
        self.data: Any = None
        self.root_place: Tuple[int, int] = (1, 1)
        # id(dict or list) -> (the object, {key: (key place, value place)} or [value place])
        self.places: Dict[int, Tuple[Any, Any]] = {}

    def locate(self, path: str, at_key: bool = False) -> Tuple[int, int]:
        """(line, column) of the value at ``path`` (``tenants.blue.subnets[1].cidr``),
        of its key with ``at_key``; for a path that goes on past what the file has
        (a missing key), the place of the last key it does have."""
        obj, rest = self.data, path
        kplace = vplace = self.root_place
        while rest:
            entry = self.places.get(id(obj))
            if entry is None or entry[0] is not obj:
                break
            kids = entry[1]
            if isinstance(obj, list):
                m = _INDEX_RE.match(rest)
                if not m or int(m.group(1)) >= len(obj):
                    break
                i = int(m.group(1))
                kplace = vplace = kids[i]
                obj, rest = obj[i], rest[m.end():]
            else:
                key = self._key_at(obj, rest)
                if key is _NO_KEY:
                    break
                kplace, vplace = kids[key]
                obj, rest = obj[key], rest[len(_ks(key)):]
            if rest.startswith("."):
                rest = rest[1:]
        if rest:
            return kplace
        return kplace if at_key else vplace

    @staticmethod
    def _key_at(obj: dict, rest: str) -> Any:
        comp = _COMPONENT_RE.match(rest).group(0)
        if comp in obj:
            return comp
        best, best_len = _NO_KEY, -1  # keys that are not strings, or have dots in them
        for k in obj:
            s = _ks(k)
            if len(s) > best_len and rest.startswith(s) and (len(rest) == len(s) or rest[len(s)] in ".["):
                best, best_len = k, len(s)
        return best


class _Frame:
    __slots__ = ("obj", "is_map", "path", "place", "kids", "key", "kplace", "skip")


def _place(mark: Any) -> Tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _read_yaml(text: str, v: "_V") -> Any:
    """The data of one YAML document, built from parser events (see above).
    Duplicate keys are recorded in ``v``; anything that stops the reading raises
    TopologyError at once."""
    import yaml
    from yaml.events import (AliasEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                             SequenceEndEvent, SequenceStartEvent)

    doc = v.doc = _Doc()
    where = v.source
    resolver = yaml.resolver.Resolver()
    constructor = yaml.constructor.SafeConstructor()
    resolved: Dict[str, str] = {}
    stack: List[_Frame] = []

    def refuse(mark: Any, msg: str) -> None:
        v.fatal(_place(mark), None, msg)

    def scalar(e: Any) -> Any:
        tag, value = e.tag, e.value
        if tag is None or tag == "!":
            if not e.implicit[0]:   # quoted, or a block scalar: a string
                return value
            tag = resolved.get(value)
            if tag is None:
                tag = resolver.resolve(yaml.ScalarNode, value, (True, False))
                if len(resolved) < 4096:
                    resolved[value] = tag
        if tag == _STR:
            return value
        if tag == _MERGE:
            refuse(e.start_mark, "YAML merge keys (<<) are not supported in a topology file: write the keys out")
        if tag not in _SCALAR_TAGS:
            refuse(e.start_mark, f"YAML tag {_short(tag)} is not supported in a topology file")
        try:
            node = yaml.ScalarNode(tag, value, e.start_mark, e.end_mark)
            return constructor.yaml_constructors[tag](constructor, node)
        except Exception as x:  # noqa: BLE001 - PyYAML's constructors fail in many ways ("!!int" alone: IndexError)
            detail = getattr(x, "problem", None) or str(x)
            refuse(e.start_mark, f"cannot read {_short(value)} as a YAML {tag[len(_TAG):]}: {_clip(str(detail), 100)}")
        raise AssertionError  # not reached: refuse() raises

    def put(value: Any, place: Tuple[int, int]) -> None:
        if not stack:
            doc.data, doc.root_place = value, place
            return
        p = stack[-1]
        if not p.is_map:
            p.obj.append(value)
            p.kids.append(place)
        elif p.key is _NO_KEY:      # a key (containers as keys are refused in start())
            if value in p.obj:
                (line, col), path = p.kids[value][0], _child(p.path, value)
                v.note(path, f"key written twice, at {where}:{line}:{col} and {where}:{place[0]}:{place[1]} "
                             "(YAML would keep only the last; remove or rename one)", place=place)
                p.skip = True
            p.key, p.kplace = value, place
        else:
            if not p.skip:
                p.obj[p.key] = value
                p.kids[p.key] = (p.kplace, place)
            p.key, p.skip = _NO_KEY, False

    def start(e: Any, is_map: bool) -> None:
        if e.tag not in (None, "!", _MAP if is_map else _SEQ):
            refuse(e.start_mark, f"YAML tag {_short(e.tag)} is not supported in a topology file")
        if len(stack) >= MAX_DEPTH:
            refuse(e.start_mark, _TOO_DEEP)
        f = _Frame()
        if stack:
            p = stack[-1]
            if p.is_map and p.key is _NO_KEY:
                refuse(e.start_mark, "a mapping key must be a plain value, not a list or a mapping")
            f.path = _child(p.path, p.key) if p.is_map else f"{p.path}[{len(p.obj)}]"
        else:
            f.path = ""
        f.is_map = is_map
        f.obj, f.kids = ({}, {}) if is_map else ([], [])
        f.place = _place(e.start_mark)
        f.key, f.kplace, f.skip = _NO_KEY, None, False
        stack.append(f)

    loader_class = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    try:
        loader = loader_class(text)
    except UnicodeError as x:   # a str with lone surrogates, from the API
        v.fatal(None, None, f"not valid Unicode text ({_clip(str(x), 100)})")
    docs = 0
    try:
        while loader.check_event():
            e = loader.get_event()
            kind = type(e)
            if kind is ScalarEvent:
                put(scalar(e), _place(e.start_mark))
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                start(e, kind is MappingStartEvent)
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                f = stack.pop()
                doc.places[id(f.obj)] = (f.obj, f.kids)
                put(f.obj, f.place)
            elif kind is AliasEvent:
                refuse(e.start_mark, f"YAML alias *{_clip(str(e.anchor), 40)} is not allowed in a topology file "
                                     "(aliases can expand without bound): write the value out")
            elif kind is DocumentStartEvent:
                docs += 1
                if docs > 1:
                    refuse(e.start_mark, "a second YAML document: a topology file holds one")
    except yaml.MarkedYAMLError as x:
        mark = x.problem_mark or x.context_mark
        if "maximum nesting depth" in str(x.problem):  # libyaml's limit (1,000 levels), met first: see above
            v.fatal(_place(mark) if mark else None, None, _TOO_DEEP)
        msg = f"invalid YAML: {_clip(str(x.problem or x.context or 'unreadable'), 200)}"
        if x.context and x.problem and x.context_mark is not None:
            line, col = _place(x.context_mark)
            msg += f" ({_clip(str(x.context), 100)} at {line}:{col})"
        v.fatal(_place(mark) if mark else None, None, msg)
    except yaml.YAMLError as x:  # ReaderError: a character YAML does not allow
        pos = getattr(x, "position", None)
        place = None
        if isinstance(pos, int) and 0 <= pos <= len(text):
            line = text.count("\n", 0, pos) + 1
            place = (line, pos - (text.rfind("\n", 0, pos) + 1) + 1)
        what = getattr(x, "reason", None) or "unreadable"
        char = getattr(x, "character", None)
        if isinstance(char, str):
            what += f" ({char!r})"
        elif isinstance(char, int):
            what += f" (#x{char:04x})"
        v.fatal(place, None, f"invalid YAML: {_clip(str(what), 200)}")
    finally:
        loader.dispose()
    return doc.data


def _decode(raw: bytes, where: str) -> str:
    """UTF-8 text (a BOM at the start is dropped), or a TopologyError at the first bad byte."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        start = raw.rfind(b"\n", 0, e.start) + 1
        col = len(raw[start:e.start].decode("utf-8", "replace")) + 1
        raise TopologyError(f"{where}:{line}:{col}: not UTF-8 text (byte {raw[e.start]:#04x}): "
                            "save the file as UTF-8", file=where, line=line, column=col) from None


def _read_file(path: Any, where: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, ValueError):   # ValueError: a NUL in the name
        raise TopologyError(f"{where}: no such topology file", file=where) from None
    except IsADirectoryError:
        raise TopologyError(f"{where}: is a directory, not a topology file", file=where) from None
    except OSError as e:
        raise TopologyError(f"{where}: cannot read the topology file: {e.strerror or e}", file=where) from None
    if len(raw) > MAX_FILE_BYTES:
        raise TopologyError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB: not a topology file", file=where)
    return raw


def _read_source(src: Any) -> Tuple[Any, Optional[str], str]:
    """(a dict, None, name) or (None, YAML text, name) for what load_topology was given.

    A ``str`` is YAML text when it has a line break or starts with ``{`` (a flow
    mapping) and names no file; otherwise it is a file name, like a PathLike."""
    if isinstance(src, dict):
        return src, None, "<dict>"
    if isinstance(src, (bytes, bytearray)):
        return None, _decode(bytes(src), "<bytes>"), "<bytes>"
    if isinstance(src, str) and ("\n" in src or "\r" in src or
                                 (src.lstrip().startswith("{") and not os.path.exists(src))):
        return None, src[1:] if src.startswith("\ufeff") else src, "<string>"
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        where = _clip(path if isinstance(path, str) else os.fsdecode(path), 300)
        return None, _decode(_read_file(path, where), where), where
    raise TopologyError(f"expected a topology file name, YAML text or a mapping, got {type(src).__name__}")


# ---- validation --------------------------------------------------------------------------


class _V:
    """Validation helpers. ``fail`` records an error naming the key path and
    ends the current item (see _Guard); ``note`` records one and goes on. At the
    end ``raise_errors`` raises one TopologyError for all of them, each with its
    file, line and column when the topology came from YAML."""

    guard = _GUARD

    def __init__(self, source: str) -> None:
        self.source = source
        self.doc: Optional[_Doc] = None
        self._ips: Dict[Optional[int], Dict[str, Any]] = {None: {}, 4: {}, 6: {}}  # good ones, by version
        self.errors: List[Tuple[Optional[Tuple[int, int]], Optional[str], str, bool]] = []
        self.bad = 0  # errors that leave a value unusable (all but unknown keys)

    def note(self, path: Optional[str], msg: str, at_key: bool = False,
             place: Optional[Tuple[int, int]] = None, blocking: bool = True) -> None:
        self.errors.append((place, path, msg, at_key))
        self.bad += blocking
        if len(self.errors) >= 10 * MAX_ERRORS:   # enough to read: stop here
            self.raise_errors()

    def fail(self, path: str, msg: str, at_key: bool = False) -> None:
        self.note(path, msg, at_key)
        raise _Abort()

    def fatal(self, place: Optional[Tuple[int, int]], path: Optional[str], msg: str) -> None:
        self.errors.append((place, path, msg, False))
        self.raise_errors()

    def _text(self, place: Optional[Tuple[int, int]], path: Optional[str], msg: str) -> str:
        if path and not path.isprintable():   # one line per error, whatever the keys are
            path = path.encode("unicode_escape").decode("ascii")
        head = f"{_clip(path)}: {msg}" if path else msg
        if place is not None:
            return f"{self.source}:{place[0]}:{place[1]}: {head}"
        if self.doc is not None:
            return f"{self.source}: {head}"
        return head

    def raise_errors(self) -> None:
        items = []
        for place, path, msg, at_key in self.errors:
            if place is None and path is not None and self.doc is not None:
                place = self.doc.locate(path, at_key)
            items.append((place, path, msg))
        if self.doc is not None:
            items.sort(key=lambda it: it[0] or (0, 0))   # in file order (stable)
        errors = [TopologyError(self._text(place, path, msg), path=path, file=self.source,
                                line=place[0] if place else None, column=place[1] if place else None)
                  for place, path, msg in items[:MAX_ERRORS]]
        text = "\n".join(e.message for e in errors)
        if len(items) > MAX_ERRORS:
            text += f"\n{self.source}: and {len(items) - MAX_ERRORS} more errors"
        first = errors[0]
        raise TopologyError(text, path=first.path, file=self.source, line=first.line, column=first.column,
                            errors=errors)

    # -- one field each: fail() with a message naming the value, or return it --

    def mapping(self, v: Any, path: str, required: Sequence[str], optional: Sequence[str]) -> dict:
        """``v`` itself; unknown keys and missing required ones are recorded
        (read required ones with ``req``, which skips them)."""
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {type(v).__name__}")
        for k in v:
            if k not in required and k not in optional:
                known = ", ".join(list(required) + list(optional))
                self.note(_child(path, k), f"unknown key (expected one of: {known})",
                          at_key=True, blocking=False)
        for k in required:
            if k not in v or v[k] is None:
                self.note(_child(path, k), "required")
        return v

    def req(self, m: dict, key: str, path: str, check, *args) -> Any:
        """check(m[key], path, *args), or _BAD (missing: ``mapping`` said so; or failed)."""
        value = m.get(key)
        if value is None:
            return _BAD
        try:
            return check(value, path, *args)
        except _Abort:
            return _BAD

    def opt(self, m: dict, key: str, path: str, check, *args, default: Any = None) -> Any:
        """check(m[key], path, *args) if the key is written (even as null), else default."""
        if key not in m:
            return default
        try:
            return check(m[key], path, *args)
        except _Abort:
            return _BAD

    def collection(self, m: dict, key: str, path: str, kind: type, what: str) -> Any:
        """The optional list or mapping ``m[key]``: empty when it is absent or
        written as nothing (null, [] or {}); None, with the error recorded, when
        it is something else."""
        value = m.get(key)
        if value is None or (isinstance(value, (dict, list)) and not value):
            return kind()
        if not isinstance(value, kind):
            self.note(path, f"expected {what}")
            return None
        return value

    def mac(self, v: Any, path: str, unicast: bool = True) -> str:
        if not isinstance(v, str) or not _MAC_RE.match(v):
            hint = ""
            if isinstance(v, int) and not isinstance(v, bool):
                hint = "; YAML read it as a number: put the MAC in quotes"
            self.fail(path, f"{_short(v)} is not a MAC address (xx:xx:xx:xx:xx:xx){hint}")
        if unicast and int(v[0:2], 16) & 1:
            self.fail(path, f"{v} is a multicast MAC address")
        if unicast and v.replace(":", "") == "000000000000":
            self.fail(path, "00:00:00:00:00:00 is not a usable MAC address")
        return v.lower()

    def ip(self, v: Any, path: str, version: Optional[int] = None):
        if isinstance(v, str):
            key = v
        elif isinstance(v, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            key = str(v)
        else:
            self.fail(path, f"{_short(v)} is not an IP address")
        good = self._ips[version]
        a = good.get(key)  # 100k endpoints reuse few distinct strings across tenants
        if a is not None:
            return a
        try:
            a = ipaddress.ip_address(key)
        except ValueError:
            self.fail(path, f"{_short(v)} is not an IP address")
        if version and a.version != version:
            self.fail(path, f"{a} is not an IPv{version} address")
        if a.is_multicast or a.is_unspecified:
            self.fail(path, f"{a} is not a unicast address")
        good[key] = a
        return a

    def network(self, v: Any, path: str) -> ipaddress.IPv4Network:
        if isinstance(v, ipaddress.IPv4Network):
            return v
        if not isinstance(v, str):
            self.fail(path, f"{_short(v)} is not an IPv4 network (a string like 10.0.0.0/24)")
        try:
            return ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            self.fail(path, f"{_short(v)} is not an IPv4 network ({_clip(str(e), 120)})")
        raise AssertionError  # not reached

    def integer(self, v: Any, path: str, lo: int, hi: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(path, f"{_short(v)} is not an integer")
        if not lo <= v <= hi:
            self.fail(path, f"{_short(v)} is out of range ({lo}..{hi})")
        return v

    def boolean(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            self.fail(path, f"{_short(v)} is not a boolean (write true or false, without quotes)")
        return v

    def name(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not _NAME_RE.match(v) or v.lower() in _RESERVED:
            self.fail(path, f"{_short(v)} is not a valid name (letters, digits, _ . -; not a reserved word)")
        return v

    def choice(self, v: Any, path: str, choices: Sequence[str], what: str) -> str:
        if not isinstance(v, str) or v not in choices:
            self.fail(path, f"{_short(v)} is not {what}")
        return v


def load_topology(src: Any) -> Topology:
    """Parses and validates a topology: a YAML file (a path), YAML text, or a dict.

    Raises TopologyError for a bad one, naming every mistake (at most
    MAX_ERRORS; ``errors`` lists them), each with its key path and, for YAML,
    its file, line and column."""
    data, text, where = _read_source(src)
    v = _V(where)
    if text is not None:
        data = _read_yaml(text, v)
    topo = _validate(v, data)
    if v.errors:
        v.raise_errors()
    return topo


def _validate(v: _V, data: Any) -> Optional[Topology]:
    if not isinstance(data, dict):
        got = "nothing (the document is empty)" if data is None else type(data).__name__
        v.note("", f"expected a mapping (uplink:, tenants:), got {got}")
        return None
    v.mapping(data, "", ["uplink", "tenants"], ["internet", "conntrack"])
    uplink = None
    if data.get("uplink") is not None:
        with v.guard:
            uplink = _uplink_section(v, data["uplink"])
    internet = None
    if data.get("internet") is not None:
        with v.guard:
            internet = _internet_section(v, data["internet"], uplink)
    ct_timeouts: Dict[str, float] = {}
    ct_max = None
    with v.guard:
        ct_timeouts, ct_max = _conntrack_section(v, data.get("conntrack"))
    tenants: Dict[str, Tenant] = {}
    if data.get("tenants") is not None:
        with v.guard:
            tenants = _tenants_section(v, data["tenants"], uplink, internet, data.get("internet") is not None)
    if v.errors or uplink is None:
        return None
    return Topology(uplink, tenants, v.source, internet, ct_timeouts, ct_max)


def _uplink_section(v: _V, u: Any) -> Optional[Uplink]:
    bad = v.bad
    v.mapping(u, "uplink", ["port", "ip", "mac"],
              ["nexthop_mac", "nexthop", "mtu", "vxlan_port", "ttl", "src_port_range", "strict_vxlan"])
    port = v.req(u, "port", "uplink.port", v.name)
    ip = v.req(u, "ip", "uplink.ip", v.ip)
    mac = v.req(u, "mac", "uplink.mac", v.mac)
    nexthop_mac = v.opt(u, "nexthop_mac", "uplink.nexthop_mac", v.mac)
    mtu = v.opt(u, "mtu", "uplink.mtu", v.integer, 576, 10000, default=1500)
    vxlan_port = v.opt(u, "vxlan_port", "uplink.vxlan_port", v.integer, 1, 65535, default=4789)
    ttl = v.opt(u, "ttl", "uplink.ttl", v.integer, 1, 255, default=64)
    strict = False if u.get("strict_vxlan") is None else v.opt(u, "strict_vxlan", "uplink.strict_vxlan", v.boolean)
    ipv6 = ip is not _BAD and ip.version == 6
    nexthop = v.opt(u, "nexthop", "uplink.nexthop", v.ip, None if ip is _BAD else ip.version)
    if nexthop_mac is None:
        if ipv6:
            v.note("uplink.nexthop_mac", "required over an IPv6 underlay (next hops are resolved by ARP, IPv4 only)")
        elif nexthop is None:
            v.note("uplink", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
    if ipv6 and mtu is not _BAD and mtu < 1280:
        v.note("uplink.mtu", "an IPv6 underlay needs an MTU of at least 1280")
    port_range = v.opt(u, "src_port_range", "uplink.src_port_range", _port_range, v, default=(49152, 65535))
    if v.bad > bad:
        return None
    return Uplink(port=port, ip=ip, mac=mac, nexthop_mac=nexthop_mac, mtu=mtu, vxlan_port=vxlan_port, ttl=ttl,
                  src_port_range=port_range, strict_vxlan=strict, nexthop=nexthop)


def _port_range(r: Any, path: str, v: _V) -> Tuple[int, int]:
    if not isinstance(r, (list, tuple)) or len(r) != 2:
        v.fail(path, "expected [min, max]")
    lo = v.opt({"min": r[0]}, "min", f"{path}[0]", v.integer, 1, 65535)
    hi = v.opt({"max": r[1]}, "max", f"{path}[1]", v.integer, 1, 65535)
    if lo is _BAD or hi is _BAD:
        raise _Abort()
    if lo > hi:
        v.fail(path, f"min {lo} is above max {hi}")
    return lo, hi


def _internet_section(v: _V, i: Any, uplink: Optional[Uplink]) -> Optional[Internet]:
    bad = v.bad
    v.mapping(i, "internet", ["port", "mac"], ["nexthop_mac", "nexthop", "ip"])
    port = v.req(i, "port", "internet.port", v.name)
    mac = v.req(i, "mac", "internet.mac", v.mac)
    nexthop_mac = v.opt(i, "nexthop_mac", "internet.nexthop_mac", v.mac)
    nexthop = v.opt(i, "nexthop", "internet.nexthop", v.ip, 4)
    ip = v.opt(i, "ip", "internet.ip", v.ip, 4)
    if nexthop_mac is None and nexthop is None:
        v.note("internet", "give nexthop_mac, or nexthop (the router's address, resolved by ARP)")
    if uplink is not None and port == uplink.port:
        v.note("internet.port", f"{port} is the uplink port")
    if v.bad > bad:
        return None
    return Internet(port=port, mac=mac, nexthop_mac=nexthop_mac, nexthop=nexthop, ip=ip)


_TIMEOUTS = ("tcp_established", "tcp_transitory", "udp", "icmp")


def _conntrack_section(v: _V, c: Any) -> Tuple[Dict[str, float], Optional[int]]:
    """conntrack: {max_connections: N, timeouts: {tcp_established: s, ...}}"""
    from . import _core  # the bounds are the core's (ct_timeouts.def, conntrack.h)

    if c is None:
        return {}, None
    v.mapping(c, "conntrack", [], ["max_connections", "timeouts"])
    max_conns = None
    if c.get("max_connections") is not None:
        max_conns = v.opt(c, "max_connections", "conntrack.max_connections", v.integer, *_core.CT_MAX_CONNECTIONS_RANGE)
    timeouts: Dict[str, float] = {}
    if c.get("timeouts") is not None:
        t = v.mapping(c["timeouts"], "conntrack.timeouts", [], list(_TIMEOUTS))
        for k in _TIMEOUTS:
            if k in t:
                timeouts[k] = v.opt(t, k, f"conntrack.timeouts.{k}", v.integer, 1, int(_core.CT_TIMEOUT_RANGE[1]))  # whole seconds
    return timeouts, max_conns


def _tenants_section(v: _V, raw: Any, uplink: Optional[Uplink], internet: Optional[Internet],
                     internet_given: bool) -> Dict[str, Tenant]:
    if not isinstance(raw, dict) or not raw:
        v.fail("tenants", "expected a mapping of tenant name to tenant")
    tenants: Dict[str, Tenant] = {}
    vnis: Dict[int, str] = {}
    port_owner: Dict[str, str] = {}
    for index, (tname, t) in enumerate(raw.items(), 1):
        with v.guard:
            tenant = _tenant(v, index, tname, t, uplink, internet, internet_given, vnis, port_owner)
            if tenant is not None:
                tenants[tname] = tenant
    _check_public_addresses(v, tenants)
    zones: Dict[int, str] = {}
    for tname, tenant in tenants.items():
        if not tenant.nat and not tenant.connection_limit:
            continue  # no conntrack: its zone is never used
        if tenant.zone > 65535:
            v.note(f"tenants.{tname}.zone",
                   f"VNI {tenant.vni} does not fit a 16-bit conntrack zone: set tenants.{tname}.zone")
        elif tenant.zone in zones:
            v.note(f"tenants.{tname}.zone",
                   f"conntrack zone {tenant.zone} is already used by tenant {zones[tenant.zone]}")
        else:
            zones[tenant.zone] = tname
    return tenants


def _tenant(v: _V, index: int, tname: Any, t: Any, uplink: Optional[Uplink], internet: Optional[Internet],
            internet_given: bool, vnis: Dict[int, str], port_owner: Dict[str, str]) -> Optional[Tenant]:
    """One tenant, or None when it has errors (recorded in ``v``)."""
    tp = _child("tenants", tname)
    v.name(tname, tp)
    bad = v.bad
    v.mapping(t, tp, ["vni", "gateway_mac", "subnets"], ["ports", "remote", "flood", "zone", "nat", "limits"])
    vni = v.req(t, "vni", f"{tp}.vni", v.integer, 1, (1 << 24) - 1)
    if vni is not _BAD:
        if vni in vnis:
            v.note(f"{tp}.vni", f"VNI {vni} is already used by tenant {vnis[vni]}")
        else:
            vnis[vni] = tname
    gw_mac = v.req(t, "gateway_mac", f"{tp}.gateway_mac", v.mac)
    subnets, gw_ips, subnets_ok = _subnets(v, t.get("subnets"), tp)
    nets = [n for n, _ in subnets] if subnets_ok else None   # None: incomplete, "inside" is not checked
    seen_ip: Dict[Any, str] = {}
    seen_mac: Dict[str, str] = {} if gw_mac is _BAD else {gw_mac: f"{tp}.gateway_mac"}

    ports: Dict[str, Endpoint] = {}
    ports_raw = v.collection(t, "ports", f"{tp}.ports", dict, "a mapping of port name to {mac, ip}")
    for pname, p in (ports_raw or {}).items():
        pp = _child(f"{tp}.ports", pname)
        with v.guard:
            v.name(pname, pp)
            if uplink is not None and pname == uplink.port:
                v.fail(pp, f"{pname} is the uplink port")
            if internet is not None and pname == internet.port:
                v.fail(pp, f"{pname} is the internet port")
            if pname in port_owner:
                v.fail(pp, f"port {pname} already belongs to tenant {port_owner[pname]}")
            port_owner[pname] = tname
            ep = _endpoint(v, p, pp, tname, nets, seen_ip, seen_mac, gw_ips, ["mac", "ip"], None)
            ep.port = pname
            ports[pname] = ep

    remote: List[Endpoint] = []
    remote_raw = v.collection(t, "remote", f"{tp}.remote", list, "a list of {vtep, mac, ip}")
    for i, r in enumerate(remote_raw or []):
        with v.guard:
            remote.append(_endpoint(v, r, f"{tp}.remote[{i}]", tname, nets, seen_ip, seen_mac, gw_ips,
                                    ["vtep", "mac", "ip"], uplink))
    # every endpoint is known: NAT may say that an address is none of them
    endpoints_ok = (ports_raw is not None and remote_raw is not None
                    and len(ports) == len(ports_raw) and len(remote) == len(remote_raw))

    flood: List[Any] = []
    for i, f in enumerate(v.collection(t, "flood", f"{tp}.flood", list, "a list of VTEP addresses") or []):
        with v.guard:
            a = v.ip(f, f"{tp}.flood[{i}]", uplink.ip.version if uplink else None)
            if uplink is not None and a == uplink.ip:
                v.fail(f"{tp}.flood[{i}]", f"{a} is our own VTEP address")
            if a not in flood:
                flood.append(a)

    zone = vni
    if t.get("zone") is not None:
        zone = v.opt(t, "zone", f"{tp}.zone", v.integer, 1, 65535)
    connection_limit = 0
    if t.get("limits") is not None:
        with v.guard:
            lim = v.mapping(t["limits"], f"{tp}.limits", [], ["connections"])
            if lim.get("connections") is not None:
                connection_limit = v.opt(lim, "connections", f"{tp}.limits.connections", v.integer, 1, 1 << 30)
    nat = None
    if t.get("nat") is not None:
        with v.guard:
            if not internet_given:
                v.fail(f"{tp}.nat", "NAT needs the internet: section (port, mac, nexthop_mac)")
            endpoints = {ep.ip: ep for ep in list(ports.values()) + remote} if endpoints_ok else None
            nat = _nat_section(v, t["nat"], f"{tp}.nat", tname, [n for n, _ in subnets], endpoints)
    if v.bad > bad:
        return None
    tenant = Tenant(tname, vni, gw_mac, subnets, ports, remote, flood, index)
    tenant.zone, tenant.connection_limit, tenant.nat = zone, connection_limit, nat
    return tenant


def _subnets(v: _V, raw: Any, tp: str) -> Tuple[List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]],
                                               Dict[Any, int], bool]:
    """The tenant's good subnets, their gateways (to the subnet's index), and
    whether all of its subnets are good."""
    if raw is None:
        return [], {}, False     # required: recorded by mapping()
    if not isinstance(raw, list) or not raw:
        v.note(f"{tp}.subnets", "expected a non-empty list of {cidr, gateway}")
        return [], {}, False
    subnets: List[Tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]] = []
    gateways: Dict[Any, int] = {}
    for i, s in enumerate(raw):
        sp = f"{tp}.subnets[{i}]"
        with v.guard:
            v.mapping(s, sp, ["cidr", "gateway"], [])
            net = v.req(s, "cidr", f"{sp}.cidr", v.network)
            gw = v.req(s, "gateway", f"{sp}.gateway", v.ip, 4)
            if net is _BAD or gw is _BAD:
                raise _Abort()
            if gw not in net:
                v.fail(f"{sp}.gateway", f"{gw} is outside its subnet {net}")
            if net.prefixlen <= 30 and gw in (net.network_address, net.broadcast_address):
                v.fail(f"{sp}.gateway", f"{gw} is the network or broadcast address of {net}")
            for (other, other_gw) in subnets:
                if net.overlaps(other):
                    j = gateways[other_gw]
                    v.fail(f"{sp}.cidr", f"{net} overlaps {other} (subnets[{j}]) in the same tenant")
            gateways[gw] = i
            subnets.append((net, gw))
    return subnets, gateways, len(subnets) == len(raw)


def _endpoint(v: _V, r: Any, rp: str, tname: Any, nets: Optional[List[ipaddress.IPv4Network]],
              seen_ip: Dict[Any, str], seen_mac: Dict[str, str], gw_ips: Dict[Any, int],
              keys: List[str], uplink: Optional[Uplink]) -> Endpoint:
    """A local port's {mac, ip} or a remote endpoint's {vtep, mac, ip} (with ``uplink``)."""
    bad = v.bad
    v.mapping(r, rp, keys, [])
    vtep = None
    if "vtep" in keys:
        vtep = v.req(r, "vtep", f"{rp}.vtep", v.ip, uplink.ip.version if uplink else None)
        if uplink is not None and vtep == uplink.ip:
            v.note(f"{rp}.vtep", f"{vtep} is our own VTEP address")
    mac_path, ip_path = f"{rp}.mac", f"{rp}.ip"
    mac = v.req(r, "mac", mac_path, v.mac)
    ip = v.req(r, "ip", ip_path, v.ip, 4)
    if ip is not _BAD:
        with v.guard:
            if nets is not None:
                _inside(v, ip, ip_path, nets, tname)
            _unique(v, seen_ip, ip, ip_path, gw_ips)
    if mac is not _BAD:
        with v.guard:
            _unique(v, seen_mac, mac, mac_path, None)
    if v.bad > bad:
        raise _Abort()
    return Endpoint(mac=mac, ip=ip, vtep=vtep)


def _inside(v: _V, ip: Any, path: str, nets: List[ipaddress.IPv4Network], tname: Any) -> None:
    for n in nets:
        if ip in n:
            if n.prefixlen <= 30 and ip in (n.network_address, n.broadcast_address):
                v.fail(path, f"{ip} is the network or broadcast address of {n}")
            return
    v.fail(path, f"{ip} is not inside any subnet of tenant {tname}")


def _ipv4(v: _V, value: Any, path: str) -> ipaddress.IPv4Address:
    return v.ip(value, path, 4)


# Ranges no public address may be in (RFC 6890): an address there cannot be
# reached from the internet, and the internet port would answer ARP for it.
_NOT_PUBLIC = [(ipaddress.IPv4Network(n), what) for n, what in (
    ("0.0.0.0/8", "in 'this network' (0.0.0.0/8)"), ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"), ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address (240.0.0.0/4, the broadcast address included)"))]


def _public_kind(v: _V, lo: ipaddress.IPv4Address, hi: ipaddress.IPv4Address, path: str) -> None:
    """Refuses a public address (or pool lo-hi) in a range no public address may be in."""
    for net, what in _NOT_PUBLIC:
        if int(lo) <= int(net.broadcast_address) and int(net.network_address) <= int(hi):
            first = max(int(lo), int(net.network_address))
            v.fail(path, f"{ipaddress.IPv4Address(first)} is {what}, not a public address")


def _snat_pool(snat: Any, path: str, v: _V) -> Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    if isinstance(snat, ipaddress.IPv4Address):
        snat = str(snat)
    if not isinstance(snat, str):
        v.fail(path, f"{_short(snat)} is not an IPv4 address or a pool (first-last)")
    if "-" in snat:
        lo_s, hi_s = snat.split("-", 1)
        lo, hi = _ipv4(v, lo_s.strip(), path), _ipv4(v, hi_s.strip(), path)
        if int(lo) > int(hi):
            v.fail(path, f"pool {lo}-{hi} is reversed (first address above the last)")
        if int(hi) - int(lo) >= 65536:
            v.fail(path, f"pool {lo}-{hi} has more than 65,536 addresses")
    else:
        lo = hi = _ipv4(v, snat, path)
    return lo, hi


def _nat_section(v: _V, n: Any, np: str, tname: Any, nets: List[ipaddress.IPv4Network],
                 endpoints: Optional[Dict[Any, Endpoint]]) -> Nat:
    """A tenant's nat: section; ``endpoints`` None when its ports or remote have
    errors (then "not an endpoint" is not checked)."""
    bad = v.bad
    v.mapping(n, np, ["snat"], ["floating", "forwards", "filtering"])

    def public(addr, path):
        if any(addr in net for net in nets):
            v.fail(path, f"{addr} is inside tenant {tname}'s own subnets, not a public address")
        _public_kind(v, addr, addr, path)
        return addr

    pool = v.req(n, "snat", f"{np}.snat", _snat_pool, v)
    if pool is not _BAD:
        with v.guard:
            _public_kind(v, pool[0], pool[1], f"{np}.snat")
    if pool is not _BAD:   # the pool's first address inside one of the tenant's subnets
        lo, hi = int(pool[0]), int(pool[1])
        inside = [max(lo, int(net.network_address)) for net in nets
                  if lo <= int(net.broadcast_address) and int(net.network_address) <= hi]
        if inside:
            with v.guard:
                public(ipaddress.IPv4Address(min(inside)), f"{np}.snat")
    floating = []
    seen_private: Dict[Any, str] = {}
    seen_public: Dict[Any, str] = {}
    for i, f in enumerate(v.collection(n, "floating", f"{np}.floating", list, "a list of {private, public}") or []):
        fp = f"{np}.floating[{i}]"
        with v.guard:
            v.mapping(f, fp, ["private", "public"], [])
            priv = v.req(f, "private", f"{fp}.private", v.ip, 4)
            pub = v.req(f, "public", f"{fp}.public", lambda a, p: public(_ipv4(v, a, p), p))
            if priv is _BAD or pub is _BAD:
                raise _Abort()
            if endpoints is not None and priv not in endpoints:
                v.fail(f"{fp}.private", f"{priv} is not an endpoint of tenant {tname} (ports or remote)")
            if priv in seen_private:
                v.fail(f"{fp}.private", f"{priv} already has a floating address ({seen_private[priv]})")
            seen_private[priv] = fp
            if pub in seen_public:
                v.fail(f"{fp}.public", f"{pub} is already the floating address of {seen_public[pub]}")
            seen_public[pub] = f"{priv} ({fp})"
            if pool is not _BAD and int(pool[0]) <= int(pub) <= int(pool[1]):
                v.fail(f"{fp}.public", f"{pub} is in the tenant's snat pool; a floating address needs its own")
            floating.append((priv, pub))
    forwards: List[Forward] = []
    fw = v.collection(n, "forwards", f"{np}.forwards", list, "a list of {proto, public, port, to, to_port}") or []
    seen_fw: Dict[Any, str] = {}
    float_pubs = {pub for _, pub in floating}
    for i, f in enumerate(fw):
        fp = f"{np}.forwards[{i}]"
        with v.guard:
            v.mapping(f, fp, ["proto", "public", "port", "to"], ["to_port"])
            proto = v.req(f, "proto", f"{fp}.proto", v.choice, ("tcp", "udp"), "tcp or udp")
            pub = v.req(f, "public", f"{fp}.public", lambda a, p: public(_ipv4(v, a, p), p))
            if pub is not _BAD and pub in float_pubs:
                v.note(f"{fp}.public", f"{pub} is a floating address (all its ports go to its machine)")
            port = v.req(f, "port", f"{fp}.port", v.integer, 1, 65535)
            to = v.req(f, "to", f"{fp}.to", v.ip, 4)
            if to is not _BAD and endpoints is not None and to not in endpoints:
                v.note(f"{fp}.to", f"{to} is not an endpoint of tenant {tname} (ports or remote)")
            to_port = v.opt(f, "to_port", f"{fp}.to_port", v.integer, 1, 65535, default=port)
            if _BAD in (proto, pub, port, to, to_port):
                raise _Abort()
            key = (proto, pub, port)
            if key in seen_fw:
                v.fail(fp, f"{proto} {pub}:{port} is already forwarded by {seen_fw[key]}")
            seen_fw[key] = fp
            forwards.append(Forward(proto, pub, port, to, to_port))
    filterings = ("endpoint-independent", "address-and-port-dependent")
    filtering = v.opt(n, "filtering", f"{np}.filtering", v.choice, filterings, " or ".join(filterings),
                      default="address-and-port-dependent")
    if v.bad > bad:
        raise _Abort()
    return Nat(pool, floating, forwards, filtering == "endpoint-independent")


def _check_public_addresses(v: _V, tenants: Dict[str, "Tenant"]) -> None:
    owner: Dict[Any, str] = {}
    for tname, t in tenants.items():
        if not t.nat:
            continue
        with v.guard:
            for addr in t.nat.public_addresses:
                if addr in owner and owner[addr] != tname:
                    v.fail(f"tenants.{tname}.nat", f"public address {addr} is already used by tenant {owner[addr]}")
                owner[addr] = tname


def _unique(v: _V, seen: Dict[Any, str], key: Any, path: str, gateways: Optional[dict]) -> None:
    if gateways is not None and key in gateways:
        v.fail(path, f"{key} is the gateway address of subnets[{gateways[key]}]")
    if key in seen:
        v.fail(path, f"{key} is already used by {seen[key]}")
    seen[key] = path


# ---- compilation ----------------------------------------------------------------------


@dataclass
class Compiled:
    """What a topology compiles to: ports, groups and flows, each with a comment."""

    ports: List[dict]
    groups: List[Tuple[str, str]]            # (group text, comment)
    flows: List[Tuple[str, str]]             # (flow text, section comment)
    tenants: List[Tuple[str, int]]           # (name, metadata)
    topology: Topology
    ct_zones: List[Tuple[int, int, bool]] = field(default_factory=list)   # (zone, limit, EIF)
    nat_static: List[tuple] = field(default_factory=list)  # (zone, proto, int ip, int port, pub ip, pub port)

    @property
    def port_names(self) -> List[str]:
        return [p["name"] for p in self.ports]

    def text(self) -> str:
        """The `dpu compile` listing: a flows file (groups as group_id= lines)."""
        u = self.topology.uplink
        out = [f"# dpu compile {self.topology.source}"]
        out.append(f"# ports: {u.port} (uplink), {TUNNEL_PORT} (VTEP {u.ip} udp/{u.vxlan_port} over {u.port}, mtu {u.mtu})")
        if self.topology.internet:
            out.append(f"#   internet: {self.topology.internet.port}")
        for t in self.topology.tenants.values():
            if t.ports:
                out.append(f"#   tenant {t.name} (vni {t.vni}, conntrack zone {t.zone}): " + ", ".join(t.ports))
            if t.nat:
                a, b = t.nat.snat
                nat = [f"snat {a}" + (f"-{b}" if b != a else "")]
                nat += [f"floating {pub} -> {priv}" for priv, pub in t.nat.floating]
                nat += [f"forward {f.proto} {f.public}:{f.port} -> {f.to}:{f.to_port}" for f in t.nat.forwards]
                if t.nat.endpoint_independent_filtering:
                    nat.append("endpoint-independent filtering")
                out.append(f"#   tenant {t.name} NAT: " + "; ".join(nat))
            if t.connection_limit:
                out.append(f"#   tenant {t.name} connection limit: {t.connection_limit}")
        out.append("")
        last = None
        for text, comment in self.groups:
            if comment != last:
                out.append(f"# {comment}")
                last = comment
            out.append(text)
        for text, comment in self.flows:
            if comment != last:
                out.append("")
                out.append(f"# {comment}")
                last = comment
            out.append(text)
        return "\n".join(out) + "\n"


def _arp_reply(mac: str, ip: Any) -> str:
    return (
        "move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
        f"mod_dl_src:{mac},"
        "load:0x2->NXM_OF_ARP_OP[],"
        "move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],"
        "move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],"
        f"set_field:{mac}->arp_sha,"
        f"set_field:{ip}->arp_spa,"
        "in_port"
    )


def compile_topology(topo: Topology) -> Compiled:
    u = topo.uplink
    tun_src_field = "tun_ipv6_src" if u.ipv6 else "tun_src"
    tun_dst_field = "tun_ipv6_dst" if u.ipv6 else "tun_dst"
    ports: List[dict] = [{"name": u.port, "ofport": 0}]
    ports.append(
        {
            "name": TUNNEL_PORT,
            "ofport": 0,
            "tunnel": True,
            "underlay": u.port,
            "local_ip": str(u.ip),
            "local_mac": u.mac,
            "nexthop_mac": u.nexthop_mac or UNRESOLVED_MAC,
            "dst_port": u.vxlan_port,
            "sport_min": u.src_port_range[0],
            "sport_max": u.src_port_range[1],
            "ttl": u.ttl,
            "mtu": u.mtu,
            "strict": u.strict_vxlan,
        }
    )
    groups: List[Tuple[str, str]] = []
    flows: List[Tuple[str, str]] = []
    add = flows.append
    g0 = f"cookie={TOPOLOGY_COOKIE:#x}"

    # Uplink: answer ARP for our VTEP address; anything else that is not VXLAN for
    # us (VXLAN is popped before the tables) is dropped.
    sec = f"table {T_INGRESS}: uplink {u.port}"
    if not u.ipv6:
        add((f"table={T_INGRESS},priority=200,{g0},in_port={u.port},arp,arp_op=1,arp_tpa={u.ip},"
             f"actions={_arp_reply(u.mac, u.ip)}", sec))
    add((f"table={T_INGRESS},priority=100,{g0},in_port={u.port},actions=drop(underlay)", sec))
    sec = f"table {T_INGRESS}: decapsulated VXLAN (in_port={TUNNEL_PORT})"
    add((f"table={T_INGRESS},priority=100,{g0},in_port={TUNNEL_PORT},actions=drop(unknown_vni)", sec))
    sec = f"table {T_L3}: default"
    add((f"table={T_L3},priority=0,{g0},actions=goto_table:{T_L2}", sec))

    # Isolation: a destination MAC that belongs to another tenant.
    owners: Dict[str, None] = {}
    local_owners: Dict[str, None] = {}
    for t in topo.tenants.values():
        for ep in t.ports.values():
            owners.setdefault(ep.mac, None)
            local_owners.setdefault(ep.mac, None)
        for ep in t.remote:
            owners.setdefault(ep.mac, None)
    sec = f"table {T_L2}: isolation (MACs of every tenant; a tenant's own entries win)"
    for mac in owners:
        add((f"table={T_L2},priority=50,{g0},dl_dst={mac},actions=drop(isolation)", sec))
    sec = f"table {T_FABRIC}: isolation (local MACs of every tenant; a tenant's own entries win)"
    for mac in local_owners:
        add((f"table={T_FABRIC},priority=50,{g0},dl_dst={mac},actions=drop(isolation)", sec))

    for t in topo.tenants.values():
        ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
        md = f"metadata={t.vni:#x}"
        wmd = f"write_metadata:{t.vni:#x}"
        flood_id, flood_local_id = 2 * t.index - 1, 2 * t.index
        tname = f"tenant {t.name} (vni {t.vni})"

        # Groups: head-end replication.
        local_buckets = [f"bucket=actions=output:{p}" for p in t.ports]
        vtep_buckets = [
            f"bucket=actions=set_field:{t.vni:#x}->tun_id,set_field:{vt}->{tun_dst_field},output:{TUNNEL_PORT}"
            for vt in t.flood
        ]
        groups.append((",".join([f"group_id={flood_id},type=all"] + local_buckets + vtep_buckets),
                       f"{tname}: broadcast/unknown from local ports -> local ports + flood VTEPs"))
        groups.append((",".join([f"group_id={flood_local_id},type=all"] + local_buckets),
                       f"{tname}: broadcast/unknown from the fabric -> local ports"))

        # Table 0: anti-spoofing for local ports.
        sec = f"table {T_INGRESS}: {tname}: local ports, anti-spoofing"
        for p, ep in t.ports.items():
            own = f"{ck},in_port={p},dl_src={ep.mac},vlan_tci=0x0000"
            go = f"actions={wmd},goto_table:{T_L3}"
            add((f"table={T_INGRESS},priority=200,{own},ip,nw_src={ep.ip},{go}", sec))
            add((f"table={T_INGRESS},priority=200,{own},arp,arp_spa={ep.ip},arp_sha={ep.mac},{go}", sec))
            add((f"table={T_INGRESS},priority=190,{own},arp,arp_spa=0.0.0.0,arp_sha={ep.mac},{go}", sec))
            add((f"table={T_INGRESS},priority=190,{own},udp,nw_src=0.0.0.0,nw_dst=255.255.255.255,"
                 f"tp_src=68,tp_dst=67,{go}", sec))
            add((f"table={T_INGRESS},priority=100,{ck},in_port={p},actions={wmd},drop(spoofed)", sec))

        # Table 0: VXLAN acceptance.
        sec = f"table {T_INGRESS}: {tname}: VXLAN from its VTEPs"
        tun = f"table={T_INGRESS},{{prio}},{ck},in_port={TUNNEL_PORT},tun_id={t.vni:#x}"
        for vt in t.vteps:
            add((tun.format(prio="priority=200") + f",{tun_src_field}={vt},vlan_tci=0x0000,"
                 f"actions={wmd},goto_table:{T_FABRIC}", sec))
            add((tun.format(prio="priority=190") + f",{tun_src_field}={vt},actions={wmd},drop(inner_vlan)", sec))
        # Not from one of its VTEPs: unauthenticated, so not charged to the tenant.
        add((tun.format(prio="priority=150") + ",actions=drop(unknown_vtep)", sec))

        # Table 10: ARP suppression and routing.
        sec = f"table {T_L3}: {tname}: ARP suppression and anycast-gateway routing"
        for p, ep in t.ports.items():  # probes / gratuitous ARP for a port's own address are flooded
            add((f"table={T_L3},priority=300,{ck},{md},in_port={p},arp,arp_tpa={ep.ip},actions=goto_table:{T_L2}", sec))
        answers = [(gw, t.gateway_mac) for _, gw in t.subnets]
        answers += [(ep.ip, ep.mac) for ep in t.ports.values()]
        answers += [(ep.ip, ep.mac) for ep in t.remote]
        for ip, mac in answers:
            add((f"table={T_L3},priority=200,{ck},{md},arp,arp_op=1,arp_tpa={ip},actions={_arp_reply(mac, ip)}", sec))
        endpoints = list(t.ports.values()) + t.remote
        for ep in endpoints:
            add((f"table={T_L3},priority=100,{ck},{md},dl_dst={t.gateway_mac},ip,nw_dst={ep.ip},"
                 f"actions=mod_dl_src:{t.gateway_mac},mod_dl_dst:{ep.mac},dec_ttl,goto_table:{T_L2}", sec))
        add((f"table={T_L3},priority=50,{ck},{md},dl_dst={t.gateway_mac},actions=drop(unroutable)", sec))

        # Table 20: L2 from local ports.
        sec = f"table {T_L2}: {tname}: L2 forwarding from local ports"
        for p, ep in t.ports.items():
            add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
        for ep in t.remote:
            add((f"table={T_L2},priority=100,{ck},{md},dl_dst={ep.mac},actions=set_field:{t.vni:#x}->tun_id,"
                 f"set_field:{ep.vtep}->{tun_dst_field},output:{TUNNEL_PORT}", sec))
        add((f"table={T_L2},priority=10,{ck},{md},actions=group:{flood_id}", sec))

        # Table 30: from the fabric, to local ports only.
        sec = f"table {T_FABRIC}: {tname}: L2 forwarding from the fabric (split horizon)"
        for p, ep in t.ports.items():
            add((f"table={T_FABRIC},priority=100,{ck},{md},dl_dst={ep.mac},actions=output:{p}", sec))
        add((f"table={T_FABRIC},priority=90,{ck},{md},dl_dst={t.gateway_mac},actions=drop(unroutable)", sec))
        add((f"table={T_FABRIC},priority=10,{ck},{md},actions=group:{flood_local_id}", sec))

        for p in t.ports:
            ports.append({"name": p, "ofport": 0})

    ct_zones: List[Tuple[int, int, bool]] = []
    nat_static: List[tuple] = []
    if topo.internet:
        ports.append({"name": topo.internet.port, "ofport": 0})
        _compile_internet(topo, add)
    for t in topo.tenants.values():
        if t.nat or t.connection_limit:
            ct_zones.append((t.zone, t.connection_limit, bool(t.nat and t.nat.endpoint_independent_filtering)))
        if t.nat:
            _compile_nat(topo, t, add)
            for f in t.nat.forwards:
                nat_static.append((t.zone, PROTO_NUMBERS[f.proto], str(f.to), f.to_port, str(f.public), f.port))
    tenants = [(t.name, t.vni) for t in topo.tenants.values()]
    return Compiled(ports, groups, flows, tenants, topo, ct_zones, nat_static)


def _compile_internet(topo: Topology, add) -> None:
    """Table 0 on the internet port: ARP for every public address is answered;
    IP to a public address enters its tenant's inbound NAT (table 60);
    anything else is unroutable."""
    inet = topo.internet
    g0 = f"cookie={TOPOLOGY_COOKIE:#x}"
    sec = f"table {T_INGRESS}: internet port {inet.port}"
    for t in topo.tenants.values():
        if not t.nat:
            continue
        ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
        for pub in t.nat.public_addresses:
            add((f"table={T_INGRESS},priority=200,{ck},in_port={inet.port},arp,arp_op=1,arp_tpa={pub},"
                 f"actions={_arp_reply(inet.mac, pub)}", sec))
            add((f"table={T_INGRESS},priority=200,{ck},in_port={inet.port},dl_dst={inet.mac},ip,nw_dst={pub},"
                 f"actions=write_metadata:{t.vni:#x},goto_table:{T_INET_IN}", sec))
    add((f"table={T_INGRESS},priority=100,{g0},in_port={inet.port},actions=drop(unroutable)", sec))


def _compile_nat(topo: Topology, t: Tenant, add) -> None:
    """A tenant's way to the internet and back, through its conntrack zone.

    Out (from its machines, routed by the gateway to an address outside its
    subnets): 40 conntrack with the existing translation; 41 new connections
    committed with the machine's floating address or the SNAT pool; 42 to the
    internet (TTL decremented once), or back in (hairpin) when the
    destination is one of the tenant's own public addresses.
    In (to one of its public addresses): 60 conntrack; 61 new connections are
    forwards, floating addresses, or (endpoint-independent filtering)
    mappings, else dropped; 62 routed to the machine by its private address.
    """
    inet = topo.internet
    nat = t.nat
    ck = f"cookie={TOPOLOGY_COOKIE | t.index:#x}"
    md = f"metadata={t.vni:#x}"
    z = f"zone={t.zone}"
    a, b = nat.snat
    pool = f"{a}" + (f"-{b}" if b != a else "")
    tname = f"tenant {t.name} (vni {t.vni}, zone {t.zone})"

    sec = f"table {T_L3}: {tname}: to the internet"
    for net, _ in t.subnets:  # inside its own subnets but not a known endpoint: stays unroutable
        add((f"table={T_L3},priority=60,{ck},{md},dl_dst={t.gateway_mac},ip,nw_dst={net},actions=drop(unroutable)", sec))
    add((f"table={T_L3},priority=55,{ck},{md},dl_dst={t.gateway_mac},ip,actions=goto_table:{T_NAT_OUT}", sec))

    sec = f"table {T_NAT_OUT}: {tname}: conntrack, existing translation"
    add((f"table={T_NAT_OUT},priority=100,{ck},{md},ip,actions=ct({z},nat,table={T_NAT_OUT_CT})", sec))

    sec = f"table {T_NAT_OUT_CT}: {tname}: new connections take the floating address or the SNAT pool"
    add((f"table={T_NAT_OUT_CT},priority=200,{ck},{md},ct_state=+trk+inv,ip,actions=drop(ct_invalid)", sec))
    for priv, pub in nat.floating:
        add((f"table={T_NAT_OUT_CT},priority=150,{ck},{md},ct_state=+trk+new,ip,nw_src={priv},"
             f"actions=ct(commit,{z},nat(src={pub}),table={T_NAT_OUT_ROUTE})", sec))
    add((f"table={T_NAT_OUT_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,"
         f"actions=ct(commit,{z},nat(src={pool}),table={T_NAT_OUT_ROUTE})", sec))
    add((f"table={T_NAT_OUT_CT},priority=50,{ck},{md},ct_state=+trk,ip,actions=goto_table:{T_NAT_OUT_ROUTE}", sec))

    sec = f"table {T_NAT_OUT_ROUTE}: {tname}: out the internet port, or back in to its own public addresses"
    for pub in nat.public_addresses:
        # hairpin: in again as if from the internet, with a fresh conntrack lookup
        add((f"table={T_NAT_OUT_ROUTE},priority=100,{ck},{md},ip,nw_dst={pub},actions=ct_clear,goto_table:{T_INET_IN}", sec))
    if inet.nexthop_mac:
        add((f"table={T_NAT_OUT_ROUTE},priority=50,{ck},{md},ip,actions=mod_dl_src:{inet.mac},"
             f"mod_dl_dst:{inet.nexthop_mac},dec_ttl,output:{inet.port}", sec))
    else:  # dpu run resolves it by ARP and reloads
        add((f"table={T_NAT_OUT_ROUTE},priority=50,{ck},{md},ip,actions=drop(nexthop_unresolved)", sec))

    sec = f"table {T_INET_IN}: {tname}: inbound, conntrack"
    add((f"table={T_INET_IN},priority=100,{ck},{md},ip,actions=ct({z},nat,table={T_INET_IN_CT})", sec))

    sec = f"table {T_INET_IN_CT}: {tname}: inbound: replies, forwards, floating addresses; else unsolicited"
    add((f"table={T_INET_IN_CT},priority=200,{ck},{md},ct_state=+trk+inv,ip,actions=drop(ct_invalid)", sec))
    for f in nat.forwards:
        add((f"table={T_INET_IN_CT},priority=150,{ck},{md},ct_state=+trk+new,{f.proto},nw_dst={f.public},"
             f"tp_dst={f.port},actions=ct(commit,{z},nat(dst={f.to}:{f.to_port}),table={T_INET_IN_ROUTE})", sec))
    for priv, pub in nat.floating:
        add((f"table={T_INET_IN_CT},priority=140,{ck},{md},ct_state=+trk+new,ip,nw_dst={pub},"
             f"actions=ct(commit,{z},nat(dst={priv}),table={T_INET_IN_ROUTE})", sec))
    # A mapping reached under endpoint-independent filtering: committed by the first ct already.
    add((f"table={T_INET_IN_CT},priority=130,{ck},{md},ct_state=+trk+new+dnat,ip,actions=goto_table:{T_INET_IN_ROUTE}", sec))
    add((f"table={T_INET_IN_CT},priority=100,{ck},{md},ct_state=+trk+new,ip,actions=drop(nat_unsolicited)", sec))
    add((f"table={T_INET_IN_CT},priority=50,{ck},{md},ct_state=+trk,ip,actions=goto_table:{T_INET_IN_ROUTE}", sec))

    sec = f"table {T_INET_IN_ROUTE}: {tname}: inbound, routed to the machine"
    for p, ep in t.ports.items():
        # Hairpinned back to the machine it came from (one reaching its own
        # public address or forward): out the port it came in on (in_port),
        # as a Linux NAT router sends it back.
        add((f"table={T_INET_IN_ROUTE},priority=110,{ck},{md},in_port={p},ip,nw_dst={ep.ip},"
             f"actions=mod_dl_src:{t.gateway_mac},mod_dl_dst:{ep.mac},dec_ttl,in_port", sec))
    for ep in list(t.ports.values()) + t.remote:
        add((f"table={T_INET_IN_ROUTE},priority=100,{ck},{md},ip,nw_dst={ep.ip},actions=mod_dl_src:{t.gateway_mac},"
             f"mod_dl_dst:{ep.mac},dec_ttl,resubmit(,{T_L2})", sec))
    add((f"table={T_INET_IN_ROUTE},priority=50,{ck},{md},actions=drop(unroutable)", sec))
