"""Exceptions raised by dpu.

Every error from the native core arrives as one of these (the mapping from C++
status codes lives in one place, native/bindings/module.cc). Each carries where
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


class ControlError(DpuError):
    """No running dpu answers on the control socket, or it broke the conversation."""


class TopologyError(DpuError, ValueError):
    """A tenant topology that cannot be compiled; ``path`` names the offending key."""
