"""What dpu says while it runs: records of Python's logging, on stderr.

Every module logs to a child of the ``dpu`` logger (``dpu.live``,
``dpu.control``, ``dpu.fabric``, ...); :func:`setup` gives that logger one
handler, on whatever ``sys.stderr`` is when a record is written. What a
command prints as its result (a table, flows, a summary) is output, on
stdout, and none of this.

Levels: ``debug``, ``info`` (the default), ``warning``, ``error``, chosen by
``--log-level`` (every command takes it, before or after the command's
name) or, without it, the ``DPU_LOG`` environment variable.

Formats (``--log-format``):

- ``text``: ``2026-12-04T20:43:54.123Z dpu: warning: message``, the time in
  UTC to the millisecond, then what dpu has always printed (the message says
  what the structured fields hold). No colours, no control characters. When stderr is
  the journal (``JOURNAL_STREAM`` names it, systemd.exec(5)) the time is left
  to the journal and each line starts with its syslog priority, ``<4>dpu:
  warning: message``, as sd-daemon(3) describes.
- ``json``: one object per line for collectors: ``time`` (as above),
  ``level``, ``logger``, ``message``, then the record's structured fields
  (what the caller passed as ``extra={...}``) and ``exc`` for a traceback.

Structured fields are given as ``log.info("...", extra={"port": "vm1"})``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, Dict, Iterable, Optional, Tuple

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
DEFAULT_LEVEL = "info"
ENV_LEVEL = "DPU_LOG"

# sd-daemon(3): the kernel's syslog priorities, <3> error .. <7> debug.
SYSLOG_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}

# What every LogRecord has: anything else on a record came from `extra=` (a structured field).
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def fields(record: logging.LogRecord) -> Dict[str, Any]:
    """The structured fields of a record: what its caller passed as ``extra=``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def timestamp(record: logging.LogRecord) -> str:
    """The record's time: ISO 8601, UTC, milliseconds (as ovs-vswitchd's log)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def level_name(record: logging.LogRecord) -> str:
    return record.levelname.lower()


def _printable(text: str) -> str:
    """Control characters (an ANSI escape, a carriage return) shown, not obeyed: a log line is plain text."""
    return "".join(ch if ch.isprintable() or ch == "\n" else ascii(ch)[1:-1] for ch in text)


class TextFormatter(logging.Formatter):
    """``TIME dpu: LEVEL: message``; for the journal ``<N>dpu: LEVEL: message``, each line with its ``<N>``."""

    def __init__(self, journal: bool = False) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        lines = _printable(text).split("\n")
        head = f"dpu: {level_name(record)}: "
        if self.journal:
            prio = f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>"
            return "\n".join(prio + (head if i == 0 else "  ") + line for i, line in enumerate(lines))
        return f"{timestamp(record)} {head}" + "\n  ".join(lines)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        obj: Dict[str, Any] = {"time": timestamp(record), "level": level_name(record), "logger": record.name,
                               "message": record.getMessage()}
        for k, v in fields(record).items():
            obj.setdefault(k, v)
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def stderr_is_journal() -> bool:
    """Whether stderr is connected to the journal: JOURNAL_STREAM is "DEVICE:INODE" of the
    stream systemd connected, and stderr is that stream (not one a child redirected)."""
    want = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = want.partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return bool(ino) and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


def _handler() -> Optional[logging.Handler]:
    return next((h for h in logging.getLogger("dpu").handlers if isinstance(h, _StderrHandler)), None)


def setup(level: Optional[str] = None, fmt: Optional[str] = None, keep: bool = False) -> None:
    """Sends the ``dpu`` loggers' records to stderr from `level` up (None: DPU_LOG's, else
    info) in format `fmt` (None: text). With `keep`, an earlier setup (the command line's)
    stays as it is. A DPU_LOG that names no level is said, as a warning, and info is used."""
    root = logging.getLogger("dpu")
    h = _handler()
    if h is not None and keep:
        return
    if h is None:
        h = _StderrHandler()
        root.addHandler(h)
        root.propagate = False  # the command owns the process's stderr: said once, in dpu's format
    fmt = fmt or "text"
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(journal=stderr_is_journal()))
    bad_env = None
    if level is None:
        level = os.environ.get(ENV_LEVEL, DEFAULT_LEVEL).strip().lower()
        if level not in LEVELS:
            bad_env, level = os.environ[ENV_LEVEL], DEFAULT_LEVEL
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    root.setLevel(getattr(logging, level.upper()))
    if bad_env is not None:
        root.warning("%s=%r is not a level (%s); using %s", ENV_LEVEL, bad_env, ", ".join(LEVELS), DEFAULT_LEVEL)


def log_core(records: Iterable[Tuple[str, float, str]]) -> None:
    """What the native core said ((level, unix time, text), as ``_core.take_log()`` gives them:
    native/src/core_log.h) as records of the ``dpu.core`` logger, each with the time it was
    said, not the time it is logged."""
    log = logging.getLogger("dpu.core")
    for level, when, text in records:
        levelno = getattr(logging, level.upper(), logging.INFO)
        if log.isEnabledFor(levelno):
            rec = log.makeRecord(log.name, levelno, "(native core)", 0, "%s", (text,), None)
            rec.created, rec.msecs = when, (when - int(when)) * 1000
            log.handle(rec)


def last_word(text: str) -> None:
    """A command's failure: ``dpu: TEXT`` on stderr, one line as the README promises; with
    ``--log-format json`` an error record instead, so a collector sees why dpu stopped."""
    h = _handler()
    if h is not None and isinstance(h.formatter, JsonFormatter):
        logging.getLogger("dpu").error("%s", text)
    else:
        print(f"dpu: {text}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--log-level and --log-format on `parser`. The top-level parser holds the defaults (None:
    setup decides); each command's parser takes them too, leaving what was said before its
    name in place unless given again after it."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--log-level", choices=LEVELS, default=default, type=str.lower, metavar="LEVEL",
                        help=f"what dpu logs on stderr, from this level up: {', '.join(LEVELS)} "
                             f"(default: ${ENV_LEVEL}, else {DEFAULT_LEVEL})")
    parser.add_argument("--log-format", choices=FORMATS, default=default, metavar="FORMAT",
                        help="text: 'TIME dpu: LEVEL: message' (under journald: '<PRIORITY>dpu: LEVEL: message'); "
                             "json: one object per line (time, level, logger, message, fields) (default: text)")


__all__ = ["FORMATS", "JsonFormatter", "LEVELS", "TextFormatter", "add_arguments", "fields", "last_word",
           "log_core", "setup", "stderr_is_journal"]
