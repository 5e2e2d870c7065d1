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
dump-groups, stats, ct-dump, ct-flush, trace, reload.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
from typing import Any, Callable, Dict

from . import errors
from .errors import ControlError, DpuError, InvalidArgumentError

MAX_REQUEST = 64 << 20  # bytes in one request line (a large add-flows)


class ControlServer:
    """Serves the control socket of an :class:`~dpu.live.Instance`."""

    def __init__(self, path: str, inst) -> None:
        self.path = path
        self.inst = inst
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
        s.listen(16)
        self.sock = s
        self.thread = threading.Thread(target=self._accept, name="dpu-ctl", daemon=True)
        self.handlers: Dict[str, Callable[[dict], Any]] = {
            "ping": lambda a: {"pid": os.getpid()},
            "show": lambda a: inst.show(),
            "dump-flows": self._dump_flows,
            "add-flows": self._add_flows,
            "mod-flows": lambda a: inst.dp.mod_flows(_str(a, "flow"), bool(a.get("strict"))),
            "del-flows": lambda a: inst.dp.del_flows(_str(a, "match", ""), bool(a.get("strict"))),
            "dump-groups": lambda a: [str(g) for g in inst.dp.dump_groups()],
            "stats": self._stats,
            "ct-dump": lambda a: [str(c) for c in inst.dp.conntrack(zone=a.get("zone"))],
            "ct-flush": lambda a: inst.dp.ct_flush(zone=a.get("zone")),
            "trace": self._trace,
            "reload": lambda a: inst.reload(),
        }
        self._closed = False

    @property
    def address(self) -> str:
        return self.path

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # ---- serving ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="dpu-ctl-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            f = conn.makefile("rwb")
            while True:
                line = f.readline(MAX_REQUEST + 1)
                if not line:
                    return
                if len(line) > MAX_REQUEST:
                    _reply(f, {"ok": False, "error": {"type": "InvalidArgumentError",
                                                      "message": f"request longer than {MAX_REQUEST} bytes"}})
                    return
                _reply(f, self.handle_line(line))

    def handle_line(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                raise InvalidArgumentError('a request is {"cmd": NAME, "args": {...}}')
            h = self.handlers.get(req["cmd"])
            if h is None:
                raise InvalidArgumentError(f"unknown command '{req['cmd']}' (known: {', '.join(sorted(self.handlers))})")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise InvalidArgumentError("args must be an object")
            with self.inst.lock:
                return {"ok": True, "result": h(args)}
        except DpuError as e:
            return {"ok": False, "error": {"type": type(e).__name__, "message": str(e)}}
        except (ValueError, TypeError, KeyError) as e:
            return {"ok": False, "error": {"type": "InvalidArgumentError", "message": f"bad request: {e}"}}

    # ---- commands ----------------------------------------------------------------------
    def _dump_flows(self, a: dict) -> list:
        return [str(f) for f in self.inst.dp.dump_flows(_str(a, "match", ""), bool(a.get("strict")))]

    def _add_flows(self, a: dict) -> int:
        """``flows``: [[line, text], ...] from ``file`` (named in errors), all or nothing."""
        numbered = a.get("flows")
        if not isinstance(numbered, list) or not all(
                isinstance(x, list) and len(x) == 2 and isinstance(x[0], int) and isinstance(x[1], str) for x in numbered):
            raise InvalidArgumentError("add-flows takes flows: [[line, text], ...]")
        return self.inst.dp.load_numbered_flows([tuple(x) for x in numbered], a.get("file"))

    def _stats(self, a: dict) -> dict:
        st = self.inst.dp.stats()
        st["interfaces"] = self.inst.interface_stats()
        st["nexthops"] = self.inst.resolver.status() if self.inst.resolver else {}
        from .report import tenant_zones

        st["tenant_zones"] = tenant_zones(self.inst.dp)  # [tenant, zone, limit]: the conntrack table's rows
        return st

    def _trace(self, a: dict) -> dict:
        from dataclasses import asdict

        try:
            data = bytes.fromhex(_str(a, "hex"))
        except ValueError:
            raise InvalidArgumentError("trace: hex must be hexadecimal bytes") from None
        tr = self.inst.dp.trace(data, _str(a, "in_port"))
        d = asdict(tr)
        d["outputs"] = [{"port": p, "hex": b.hex()} for p, b in tr.outputs]
        return {"text": str(tr), "json": d}


def _str(a: dict, key: str, default: Any = None) -> str:
    v = a.get(key, default)
    if not isinstance(v, str):
        raise InvalidArgumentError(f"'{key}' must be a string")
    return v


def _reply(f, obj: dict) -> None:
    f.write(json.dumps(obj, default=str).encode() + b"\n")
    f.flush()


# ---- client -----------------------------------------------------------------------------------

def call(path: str, cmd: str, timeout: float = 60.0, **args: Any) -> Any:
    """Sends one request to the dpu at ``path``; returns its result or raises
    the error it answered with (the same dpu.errors class and text)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
        except FileNotFoundError:
            raise ControlError(f"no dpu is running at {path} (no such socket; start one with dpu run, "
                               f"or give its --ctl)") from None
        except ConnectionRefusedError:
            if os.path.exists(path) and not stat.S_ISSOCK(os.stat(path).st_mode):
                kind = "a directory" if os.path.isdir(path) else "a file that is not a socket"
                raise ControlError(f"{path} is {kind}: no dpu control socket (give dpu run's --ctl)") from None
            raise ControlError(f"nothing answers at {path} (a dpu that has exited?)") from None
        except PermissionError:
            raise ControlError(f"{path}: permission denied (the socket is its owner's only: "
                               f"run as the user that started dpu)") from None
        except OSError as e:
            raise ControlError(f"{path}: {e.strerror or e}") from None
        f = s.makefile("rwb")
        f.write(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
        f.flush()
        try:
            line = f.readline()
        except socket.timeout:
            raise ControlError(f"{path}: no answer to {cmd} within {timeout:.0f}s") from None
        if not line:
            raise ControlError(f"{path}: the dpu closed the connection without answering {cmd}")
    finally:
        s.close()
    resp = json.loads(line)
    if resp.get("ok"):
        return resp.get("result")
    err = resp.get("error") or {}
    cls = getattr(errors, str(err.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, DpuError)):
        cls = DpuError
    raise cls(err.get("message", "error"))


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
