"""Exceptions raised by dpu.

Every error from the native core arrives as one of these, through one mapping
from the core's status codes (``dpu::Err``, listed once with their classes in
native/include/dpu/errors.def) to classes: :data:`NATIVE_ERRORS` and :func:`from_native`, which both native
extensions use (native/bindings/module.cc for dpu._core, dpu.gen for
dpu._gen). An operating-system error on a file the user named becomes a
:class:`DpuIOError` through :func:`from_os_error`. Each carries where
the problem is: ``token`` and ``position`` (0-based character offset) inside a
flow, ``line`` (1-based) in a list or file of flows, ``file`` and ``record``
(1-based) in a capture file, or ``path`` in a topology file.
"""
from __future__ import annotations

from typing import Optional


class DpuError(Exception):
    """Base class of every dpu error."""

    def __init__(
        self,
        message: str,
        *,
        reason: Optional[str] = None,
        token: Optional[str] = None,
        position: Optional[int] = None,
        line: Optional[int] = None,
        file: Optional[str] = None,
        record: Optional[int] = None,
        path: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason if reason is not None else message
        self.token = token
        self.position = position
        self.line = line
        self.file = file
        self.record = record
        self.path = path


class FlowError(DpuError, ValueError):
    """A flow, group or match that cannot be accepted."""


class FlowParseError(FlowError):
    """Malformed flow/group text; ``token`` and ``position`` say where."""


class UnknownFieldError(FlowError):
    """A match or action names a field dpu does not know."""


class BadValueError(FlowError):
    """A value or mask that does not fit its field."""


class UnknownPortError(FlowError):
    """A port name or number that is not configured."""


class UnknownTableError(FlowError):
    """A table id outside 0..254."""


class UnknownGroupError(FlowError):
    """A group reference to a group that does not exist."""


class ConflictError(DpuError, ValueError):
    """The object already exists or clashes with another."""


class InvalidArgumentError(DpuError, ValueError):
    """An argument that is not valid for the call."""


class PcapError(DpuError):
    """A corrupt, truncated or unsupported capture file; ``file`` and ``record`` say where."""


class DpuIOError(DpuError, OSError):
    """A file could not be opened, read or written."""


class LiveError(DpuError):
    """``dpu run`` cannot start: an interface, a permission, the control socket or the metrics address."""


class FabricError(LiveError):
    """The fabric mirror's kernel side cannot do what was asked: a namespace, device or entry of
    the kernel shadow, an FRR daemon, or the VXLAN guard (dpu.fabric); the message names it."""


class ControlError(DpuError):
    """No running dpu answers on the control socket, or it broke the conversation."""


class TopologyError(DpuError, ValueError):
    """A tenant topology that cannot be compiled; ``path`` names the offending key.

    From a YAML file or text, ``file``, ``line`` and ``column`` (1-based) say
    where it is written. A topology with several mistakes raises one error for
    all of them: the message has one line per mistake, and ``errors`` lists them
    (one TopologyError each, in file order); the attributes are the first one's.
    """

    def __init__(self, message: str, *, column: Optional[int] = None,
                 errors: Optional[list] = None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.column = column
        self.errors: list = list(errors) if errors else [self]


def _native_errors() -> dict:
    """code name -> class, from the core's list (native/include/dpu/errors.def,
    exported as ``dpu._core.errors()``): a code whose class is not here fails
    the import, so the two can never drift apart."""
    from . import _core

    out = {}
    for code, cls, _meaning in _core.errors():
        c = globals().get(cls)
        if not (isinstance(c, type) and issubclass(c, DpuError)):
            raise ImportError(f"native/include/dpu/errors.def maps {code} to {cls}, which dpu.errors does not define")
        out[code] = c
    return out


#: The one mapping from the native core's status codes (the names of
#: ``dpu::Err``, listed once in native/include/dpu/errors.def) to exception
#: classes, built from that list.
NATIVE_ERRORS = _native_errors()


def from_native(code: str, message: str, **where) -> DpuError:
    """The exception for a native status: ``code`` is the ``dpu::Err`` name
    (any other name gives a plain DpuError), ``where`` the location keywords
    (token, position, line, file, record, reason)."""
    return NATIVE_ERRORS.get(str(code).upper(), DpuError)(message, **where)


def show_path(path) -> str:
    """A file name as an error message prints it: as given, or quoted with
    escapes (Python's repr) when it holds a newline or another character that
    would not print, so that an error stays one line."""
    s = str(path)
    return s if s.isprintable() else repr(s)


def from_os_error(e: OSError, path=None, doing: str = "") -> DpuIOError:
    """``PATH: [doing: ]REASON`` for an OSError on a file the user named, the
    reason as the OS says it (e.g. "No such file or directory")."""
    name = path if path is not None else (e.filename if e.filename is not None else "")
    name = str(name)
    reason = e.strerror or str(e)
    text = f"{doing}: {reason}" if doing else reason
    return DpuIOError(f"{show_path(name)}: {text}" if name else text, reason=reason, file=name or None)
