"""The control socket of a running dpu (``dpu run --ctl PATH``) and its client.

A unix stream socket, mode 0600 (its owner only, as ovs-vswitchd's
``.ctl``), speaking JSON lines: each request is one object
``{"cmd": NAME, "args": {...}}`` and gets one answer,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type":
ERRORCLASS, "message": TEXT}}``. The CLI's commands that take ``--ctl``
send one request each and print the result as they would offline; an error
is re-raised as the same :mod:`dpu.errors` class with the same text, so a
bad flow reads the same whether it was refused by a file load or by a
running instance.

Commands: ping, show, dump-flows, add-flows, mod-flows, del-flows,
dump-groups, stats, ct-dump, ct-flush, trace, reload, evpn, dump-megaflows,
replace-flows, flow-table, clear-stats. Each command's arguments
are checked as the CLI checks its own (:data:`ARGS`: types, ranges, text that
is valid UTF-8) before anything runs, and every request gets an answer: bad
JSON, JSON nested too deeply, an unknown command or argument, a bool where a
number belongs are all ``{"ok": false, "error": ...}`` naming what is wrong.

The server (:class:`ControlServer`) is a :class:`dpu.serving.Listener` with
:data:`CONTROL_LIMITS`: at most 32 clients (more wait in the listen backlog),
a request complete within 5 s of connecting or of the previous answer (else a
partial one is answered with a ControlError and the client closed; an idle one
is closed), an answer taken within 10 s, 64 MB in one request and 128 MB of
unanswered requests across all clients (beyond it a request is refused with a
ControlError). A client that hangs up is no error: it is logged at debug.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import errors
from .errors import ControlError, DpuError, InvalidArgumentError
from .serving import Budget, DeadlineReader, Episode, Limits, Listener, OverBudget

log = logging.getLogger("dpu.control")

MAX_REQUEST = 64 << 20  # bytes in one request line (a large add-flows)
CONTROL_LIMITS = Limits(clients=32, request_timeout=5.0, send_timeout=10.0, max_request=MAX_REQUEST,
                        max_buffered=2 * MAX_REQUEST)
BACKLOG = 64            # connections the kernel queues while every slot is taken
CHUNK = 1 << 16         # bytes read at a time
MAX_LINE_NUMBER = 2 ** 31 - 1
REQUEST_SHAPE = 'a request is {"cmd": NAME, "args": {...}}'


class ControlServer:
    """Serves the control socket of an :class:`~dpu.live.Instance`."""

    def __init__(self, path: str, inst, limits: Limits = CONTROL_LIMITS) -> None:
        self.path = path
        self.inst = inst
        self.limits = limits
        d = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(d, mode=0o755, exist_ok=True)
        except OSError as e:
            raise errors.LiveError(f"--ctl {path}: cannot create {d}: {e.strerror}") from None
        socket_path_ok(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
        try:
            s.bind(path)
        except OSError as e:
            s.close()
            raise errors.LiveError(f"--ctl {path}: {e.strerror or e}") from None
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        s.listen(BACKLOG)
        self.sock = s
        self._budget = Budget(limits.max_buffered)
        self._over = Episode(f"control socket {path}")
        self.listener = Listener(s, f"control socket {path}", limits, self._serve)
        self.handlers: Dict[str, Callable[..., Any]] = {
            "ping": lambda: {"pid": os.getpid()},
            "show": lambda: inst.show(),
            "dump-flows": lambda match, strict, json: _view(inst.dp.dump_flows(match, strict), json),
            "add-flows": lambda flows, file: inst.dp.load_numbered_flows(flows, file),
            "mod-flows": lambda flow, strict: inst.dp.mod_flows(flow, strict),
            "del-flows": lambda match, strict: inst.dp.del_flows(match, strict),
            "dump-groups": lambda json: _view(inst.dp.dump_groups(), json),
            "stats": self._stats,
            "ct-dump": lambda zone, json: _view(inst.dp.conntrack(zone=zone), json),
            "ct-flush": lambda zone: inst.dp.ct_flush(zone=zone),
            "trace": self._trace,
            "reload": lambda: inst.reload(),
            "evpn": lambda: inst.evpn_view(),
            "dump-megaflows": lambda: [m.as_dict() for m in inst.dp.dump_megaflows()],
            "replace-flows": lambda flows, file: inst.dp.replace_numbered_flows(flows, file),
            "flow-table": lambda: {**inst.dp.flow_table().as_json(), "ports": inst.dp.port_info()},
            "clear-stats": self._clear_stats,
        }
        self._zero: Optional[Tuple[dict, float]] = None  # clear-stats: (the counters then, when)
        self._closed = False

    @property
    def address(self) -> str:
        return self.path

    @property
    def clients(self) -> int:
        """Clients connected now."""
        return self.listener.clients

    @property
    def buffered(self) -> int:
        """Bytes of unanswered requests held now, all clients together."""
        return self._budget.held

    def start(self) -> None:
        self.listener.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # ---- serving ----------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        """One client: JSON lines in, one answer each, until it leaves or a deadline passes."""
        lim = self.limits
        r = DeadlineReader(conn, lim, self._budget)
        buf = bytearray()
        chunk = memoryview(bytearray(CHUNK))
        scanned = 0  # bytes of buf known to hold no newline
        try:
            while True:
                nl = buf.find(b"\n", scanned)
                if nl < 0 and len(buf) <= lim.max_request:
                    scanned = len(buf)
                    try:
                        n = r.readinto(chunk)
                    except TimeoutError:
                        if buf:
                            r.send(_error(ControlError(f"no complete request within {lim.request_timeout:g}s "
                                                       f"({len(buf)} bytes received)")))
                        log.debug("control socket %s: closed a client that sent no complete request in time", self.path)
                        return
                    except OverBudget as e:
                        self._over.happens(f"{e.limit} bytes of unanswered requests buffered, the most it holds: "
                                           "refusing requests")
                        r.send(_error(ControlError(
                            f"the control socket buffers at most {e.limit} bytes of unanswered requests, all "
                            f"clients together ({e.held} held now): this request is refused; try again")))
                        return
                    if not n:
                        return  # the client left (with a partial request: nothing to answer)
                    buf += chunk[:n]
                    continue
                if nl < 0 or nl > lim.max_request:
                    r.send(_error(InvalidArgumentError(f"request longer than {lim.max_request} bytes")))
                    return
                with memoryview(buf) as whole, whole[:nl] as line:
                    answer = self.handle_line(line)
                del buf[:nl + 1]
                scanned = 0
                r.send(answer)
                r.release(nl + 1)
                r.restart()
                self._over.ends("serving requests again after refusing {n}")
        finally:
            r.close()

    def handle_line(self, line) -> bytes:
        """The answer (one JSON line) to one request line (bytes-like, without its newline)."""
        try:
            try:
                text = str(line, "utf-8")
            except UnicodeDecodeError as e:
                raise InvalidArgumentError(f"request is not UTF-8 text (byte {e.start + 1})") from None
            try:
                req = json.loads(text)
            except RecursionError:
                raise InvalidArgumentError("request is nested too deeply to read") from None
            except ValueError as e:  # bad JSON, or an integer too long to convert
                raise InvalidArgumentError(f"request is not JSON: {getattr(e, 'msg', e)}"
                                           + (f" (column {e.colno})" if hasattr(e, "colno") else "")) from None
            del text
            cmd, args = parse_request(req)
            with self.inst.lock:
                result = self.handlers[cmd](**args)
            return _encode({"ok": True, "result": result})
        except DpuError as e:
            return _error(e)
        except ValueError as e:  # a value the core refused without a dpu error of its own
            return _error(InvalidArgumentError(f"bad request: {e}"))
        except MemoryError:
            return _error(DpuError("out of memory"))
        except Exception as e:  # noqa: BLE001 - a bug: an answer and a log line, not a traceback
            log.error("control socket %s: a request failed: %s: %s", self.path, type(e).__name__, e)
            log.debug("where it failed", exc_info=True)
            return _error(DpuError(f"internal error: {type(e).__name__}: {e} (a bug in dpu)"))

    # ---- commands ----------------------------------------------------------------------
    def _counters(self) -> dict:
        st = self.inst.dp.stats()
        st["interfaces"] = self.inst.interface_stats()
        return st

    def _stats(self) -> dict:
        st = self._counters()
        if self._zero is not None:
            from .report import stats_since

            st = stats_since(st, self._zero[0])
        st["cleared_seconds_ago"] = round(time.monotonic() - self._zero[1], 3) if self._zero else None
        st["nexthops"] = self.inst.resolver.status() if self.inst.resolver else {}
        from .report import tenant_zones

        st["tenant_zones"] = tenant_zones(self.inst.dp)  # [tenant, zone, limit]: the conntrack table's rows
        return st

    def _clear_stats(self) -> dict:
        """clear-stats (ovs-appctl dpif-netdev/pmd-stats-clear): from now on the stats
        command counts from here. A baseline, as dpif-netdev keeps one: the counters
        themselves have one writer each (a worker) and go on, so the final report,
        the metrics and every rule's and megaflow's counts are untouched."""
        self._zero = (self._counters(), time.monotonic())
        return {"cleared": True}

    def _trace(self, hex: str, in_port: str) -> dict:  # noqa: A002 - the argument's name on the wire
        from dataclasses import asdict

        try:
            data = bytes.fromhex(hex)
        except ValueError:
            raise InvalidArgumentError("trace: 'hex' must be hexadecimal bytes") from None
        tr = self.inst.trace(data, in_port)
        d = asdict(tr)
        d["outputs"] = [{"port": p, "hex": b.hex()} for p, b in tr.outputs]
        return {"text": str(tr), "json": d}


def _encode(obj: dict) -> bytes:
    return json.dumps(obj, default=str).encode() + b"\n"


def _error(e: DpuError) -> bytes:
    return _encode({"ok": False, "error": {"type": type(e).__name__, "message": str(e)}})


# ---- the arguments of each command -------------------------------------------------------------

def _describe(v: Any) -> str:
    """A value as an error message shows it: short, and never a repr of something deep."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        s = str(v)
        return s if len(s) <= 40 else f"a number of {len(s)} digits"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    return "an object"


def _valid_text(cmd: str, what: str, v: str) -> str:
    """v, if it can be UTF-8 (JSON's \\ud800 escapes can make strings that cannot)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{cmd}: {what} is not valid text: a lone surrogate "
                                   f"(\\u{ord(v[e.start]):04x}) at character {e.start + 1}") from None
    return v


def _text(cmd: str, key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidArgumentError(f"{cmd}: '{key}' must be a string, got {_describe(v)}")
    return _valid_text(cmd, f"'{key}'", v)


def _flag(cmd: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidArgumentError(f"{cmd}: '{key}' must be true or false, got {_describe(v)}")
    return v


def _zone(cmd: str, key: str, v: Any) -> Optional[int]:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535):
        raise InvalidArgumentError(f"{cmd}: '{key}' must be 0..65535 or null, got {_describe(v)}")
    return v


def _file(cmd: str, key: str, v: Any) -> Optional[str]:
    """A file name, only ever shown in messages: any string (a name that is not UTF-8
    arrives with the surrogates Python decodes it to), or null."""
    if v is not None and not isinstance(v, str):
        raise InvalidArgumentError(f"{cmd}: '{key}' must be a file name (a string) or null, got {_describe(v)}")
    return v


def _numbered(cmd: str, key: str, v: Any) -> list:
    """[[line, text], ...] as read_flows_file() numbers a file's lines."""
    if not isinstance(v, list):
        raise InvalidArgumentError(f"{cmd}: '{key}' must be a list of [line, text], got {_describe(v)}")
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, list) or len(x) != 2:
            raise InvalidArgumentError(f"{cmd}: {key}[{i}] must be [line, text], got {_describe(x)}")
        n, text = x
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LINE_NUMBER:
            raise InvalidArgumentError(f"{cmd}: the line number of {key}[{i}] must be 1..{MAX_LINE_NUMBER}, "
                                       f"got {_describe(n)}")
        if not isinstance(text, str):
            raise InvalidArgumentError(f"{cmd}: the text of {key}[{i}] must be a string, got {_describe(text)}")
        out.append((n, _valid_text(cmd, f"the text of {key}[{i}]", text)))
    return out


def _view(rows, as_json: bool) -> list:
    """A dump's answer: each row's text, or with ``json`` its fields (the row's as_dict())."""
    return [r.as_dict() if as_json else str(r) for r in rows]


REQUIRED = object()
#: Each command's arguments: name -> (check, default or REQUIRED). The CLI sends all of them.
ARGS: Dict[str, Dict[str, Tuple[Callable[[str, str, Any], Any], Any]]] = {
    "ping": {}, "show": {}, "stats": {}, "reload": {}, "evpn": {},
    "dump-flows": {"match": (_text, ""), "strict": (_flag, False), "json": (_flag, False)},
    "dump-groups": {"json": (_flag, False)},
    "dump-megaflows": {}, "flow-table": {}, "clear-stats": {},
    "replace-flows": {"flows": (_numbered, REQUIRED), "file": (_file, None)},
    "add-flows": {"flows": (_numbered, REQUIRED), "file": (_file, None)},
    "mod-flows": {"flow": (_text, REQUIRED), "strict": (_flag, False)},
    "del-flows": {"match": (_text, ""), "strict": (_flag, False)},
    "ct-dump": {"zone": (_zone, None), "json": (_flag, False)},
    "ct-flush": {"zone": (_zone, None)},
    "trace": {"hex": (_text, REQUIRED), "in_port": (_text, REQUIRED)},
}


def parse_request(req: Any) -> Tuple[str, Dict[str, Any]]:
    """(command, checked arguments) of a decoded request, or InvalidArgumentError naming
    what is wrong with it."""
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        raise InvalidArgumentError(REQUEST_SHAPE)
    extra = sorted(k for k in req if k not in ("cmd", "args"))
    if extra:
        raise InvalidArgumentError(f"{REQUEST_SHAPE}: unexpected key {extra[0]!r}")
    cmd = req["cmd"]
    spec = ARGS.get(cmd)
    if spec is None:
        raise InvalidArgumentError(f"unknown command {cmd!r} (known: {', '.join(sorted(ARGS))})")
    args = req.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidArgumentError(f"{cmd}: 'args' must be an object, got {_describe(args)}")
    unknown = sorted(k for k in args if k not in spec)
    if unknown and not spec:
        raise InvalidArgumentError(f"{cmd} takes no arguments, got {unknown[0]!r}")
    if unknown:
        raise InvalidArgumentError(f"{cmd}: unknown argument {unknown[0]!r} (it takes {', '.join(spec)})")
    out = {}
    for key, (check, default) in spec.items():
        if key in args:
            out[key] = check(cmd, key, args[key])
        elif default is REQUIRED:
            raise InvalidArgumentError(f"{cmd} needs '{key}'")
        else:
            out[key] = default
    return cmd, out


# ---- client -----------------------------------------------------------------------------------

def call(path: str, cmd: str, timeout: float = 60.0, **args: Any) -> Any:
    """Sends one request to the dpu at ``path``; returns its result or raises
    the error it answered with (the same dpu.errors class and text). While
    the dpu serves as many clients as it will, the request waits its turn,
    for up to ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    s = _connect(path, cmd, timeout, deadline)
    try:
        f = s.makefile("rwb")
        try:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            f.write(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
            f.flush()
            line = f.readline()
        except TimeoutError:
            raise ControlError(f"{path}: no answer to {cmd} within {timeout:.0f}s") from None
        except OSError as e:
            raise ControlError(f"{path}: the dpu broke off the conversation about {cmd}: {e.strerror or e}") from None
        if not line:
            raise ControlError(f"{path}: the dpu closed the connection without answering {cmd}")
    finally:
        s.close()
    try:
        resp = json.loads(line)
        ok = resp.get("ok")
    except (ValueError, AttributeError):
        raise ControlError(f"{path}: the answer to {cmd} is not a dpu's (not a JSON object)") from None
    if ok:
        return resp.get("result")
    err = resp.get("error") or {}
    cls = getattr(errors, str(err.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, DpuError)):
        cls = DpuError
    raise cls(str(err.get("message", "error")))


def _connect(path: str, cmd: str, timeout: float, deadline: float) -> socket.socket:
    """A connected socket; a full listen backlog (the dpu is serving as many clients as it
    will, and as many more wait) is retried until the deadline."""
    pause = 0.01
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() + pause > deadline:
                raise ControlError(f"{path}: the dpu is busy with other clients and did not take {cmd} "
                                   f"within {timeout:.0f}s") from None
            time.sleep(pause)
            pause = min(0.2, pause * 2)
        except FileNotFoundError:
            s.close()
            raise ControlError(f"no dpu is running at {path} (no such socket; start one with dpu run, "
                               f"or give its --ctl)") from None
        except ConnectionRefusedError:
            s.close()
            if os.path.exists(path) and not stat.S_ISSOCK(os.stat(path).st_mode):
                kind = "a directory" if os.path.isdir(path) else "a file that is not a socket"
                raise ControlError(f"{path} is {kind}: no dpu control socket (give dpu run's --ctl)") from None
            raise ControlError(f"nothing answers at {path} (a dpu that has exited?)") from None
        except PermissionError:
            s.close()
            raise ControlError(f"{path}: permission denied (the socket is its owner's only: "
                               f"run as the user that started dpu)") from None
        except OSError as e:
            s.close()
            raise ControlError(f"{path}: {e.strerror or e}") from None


# ---- the socket's path: checked by dpu run before anything starts (check_ctl_path),
# and again when the server binds it (socket_path_ok)

# sockaddr_un's sun_path: 108 bytes, the last one the terminating NUL.
MAX_SOCKET_PATH = 107


def check_ctl_path(path: str) -> None:
    """Refuses, before anything starts, a control socket path that cannot be
    one: too long, or an existing file that is not a socket (dpu never
    removes one)."""
    n = len(os.fsencode(path))
    if n > MAX_SOCKET_PATH:
        raise errors.LiveError(f"--ctl {path}: too long for a unix socket ({n} bytes; at most {MAX_SOCKET_PATH})")
    if os.path.islink(path) and not os.path.exists(path):
        raise errors.LiveError(f"--ctl {path}: is a symbolic link to nothing (dpu replaces only a stale socket; "
                               "choose another --ctl)")
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a file that is not a socket"
        raise errors.LiveError(f"--ctl {path}: is {kind} (dpu replaces only a stale socket; choose another --ctl)")


def socket_path_ok(path: str) -> None:
    """Refuses a control socket path check_ctl_path() refuses or where
    another dpu answers; removes a stale socket."""
    check_ctl_path(path)
    if os.path.lexists(path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError:
            try:
                os.unlink(path)  # stale: whoever made it is gone
            except OSError as e:
                raise errors.LiveError(f"--ctl {path}: cannot remove the stale socket: {e.strerror}") from None
        else:
            raise errors.LiveError(f"--ctl {path}: another dpu is running there (stop it, or choose another --ctl)")
        finally:
            s.close()
