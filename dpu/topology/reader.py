"""The strict YAML reader of topology files, and the errors of one load.

What it does: turns what ``load_topology`` was given (a file name, YAML text,
bytes or a dict) into plain dicts, lists and scalars, refusing what YAML allows
but a topology never needs (see "reading a topology file" below), and keeps,
for every key and value, the line and column it was written at (``_Doc``).
``_Errors`` collects a load's mistakes, from this reader and from the schema,
and raises them together as one TopologyError in file order, each naming its
file:line:column and key path, at most MAX_ERRORS of them.

What it reads: bytes (UTF-8, an optional BOM) and PyYAML's parser events,
never PyYAML's constructor (only its scalar constructors, for plain scalars).
What it hands on: the data to ``schema`` (which validates it through an
``_Errors`` subclass); nothing here knows what a tenant or an uplink is.
"""
from __future__ import annotations

import os
import re
import reprlib
from typing import Any, Dict, List, Optional, Tuple

from ..errors import TopologyError


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
    """The item being validated is bad; its error is recorded in _Errors.errors."""


class _Guard:
    """``with v.guard:`` ends the current item at its first error and goes on
    with the next one, so that one load reports every independent mistake."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, _Abort)


_GUARD = _Guard()
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


def _read_yaml(text: str, v: "_Errors") -> Any:
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


# ---- a load's errors ---------------------------------------------------------------------


class _Errors:
    """A load's errors. ``fail`` records an error naming the key path and
    ends the current item (see _Guard); ``note`` records one and goes on. At the
    end ``raise_errors`` raises one TopologyError for all of them, each with its
    file, line and column when the topology came from YAML."""

    guard = _GUARD

    def __init__(self, source: str) -> None:
        self.source = source
        self.doc: Optional[_Doc] = None
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
