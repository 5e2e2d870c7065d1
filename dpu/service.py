"""``dpu run`` as a service: signals, readiness, the pidfile and the descriptor limit.

What a service manager (systemd, or an operator with ``kill``) expects of a daemon, apart
from forwarding, which :mod:`dpu.live` does:

- :class:`Signals`: SIGHUP asks for a reload (what ``systemctl reload`` sends), every other
  signal that would end the process (:data:`STOP_SIGNALS`) for a clean stop. The handlers
  only note the signal and write a byte to a pipe; the main loop (``Instance.wait``) does
  the work, outside the handler, so a handler never waits for a lock the interrupted code
  holds.
- :class:`Notifier`: systemd's readiness protocol (``sd_notify``), spoken directly: one
  datagram of ``KEY=VALUE`` lines to the AF_UNIX socket ``NOTIFY_SOCKET`` names. No
  libsystemd; without ``NOTIFY_SOCKET`` it does nothing.
- :class:`PidFile`: ``--pidfile PATH``, refused when it names a live process, written once
  dpu forwards, removed at exit.
- :func:`fd_need` and :func:`check_fd_limit`: the descriptors ``dpu run`` needs (queues,
  clients of its servers, its own files), the soft limit raised to the hard one, and a
  clear error when even that is too low.

docs/live.md, "Running as a service", is the user's side of this.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import time
from typing import Dict, Optional, Tuple

from .errors import LiveError

log = logging.getLogger("dpu.live")

# Asynchronous signals whose default action ends the process: each stops dpu cleanly.
# SIGHUP reloads instead. Left out: SIGKILL and SIGSTOP (cannot be caught), the faults
# (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP: a bug, for a core dump to
# show), and SIGPIPE and SIGXFSZ, which Python ignores (a failed write is an error there).
STOP_SIGNALS: Tuple[int, ...] = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM",
                                 "SIGPROF", "SIGPWR", "SIGIO", "SIGSTKFLT", "SIGXCPU") if hasattr(signal, n)
) + tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


class Signals:
    """SIGHUP and :data:`STOP_SIGNALS` turned into what the main loop reads: ``stop`` (the
    first stop signal, or None) and :meth:`take_reload` (a SIGHUP came since the last call;
    several in a row are one reload). A stop signal that the process was started with
    ignored (``nohup``, a background job's SIGINT) stays ignored; SIGHUP always reloads,
    since it never stops dpu."""

    def __init__(self) -> None:
        self.stop: Optional[int] = None
        self._hup = False
        self._old: Dict[int, object] = {}
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self) -> None:
        """From the main thread, before anything that a signal must not leave behind exists."""
        if self._old:
            return
        self._old[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hup)
        for s in STOP_SIGNALS:
            if signal.getsignal(s) != signal.SIG_IGN:
                self._old[s] = signal.signal(s, self._on_stop)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def close(self) -> None:
        self.restore()
        for fd in (self._r, self._w):
            os.close(fd)
        self._r = self._w = -1

    def _on_stop(self, signum: int, _frame) -> None:
        if self.stop is None:
            self.stop = signum
        self._wake()

    def _on_hup(self, _signum: int, _frame) -> None:
        self._hup = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._w, b"s")
        except OSError:  # full: the loop is woken already
            pass

    def wait(self, timeout: float) -> None:
        """Until a signal came or `timeout` seconds passed."""
        if self.stop is None and not self._hup:
            select.select([self._r], [], [], timeout)
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass

    def take_reload(self) -> bool:
        hup, self._hup = self._hup, False
        return hup


class Notifier:
    """sd_notify(3) without libsystemd: each :meth:`send` is one datagram of ``KEY=VALUE``
    lines to the socket ``NOTIFY_SOCKET`` names (a path, or ``@name`` in the abstract
    namespace). The variable is taken out of the environment, so that no program dpu starts
    speaks for it. A socket that cannot be reached is said once, as a warning; dpu goes on."""

    def __init__(self, environ=None) -> None:
        env = os.environ if environ is None else environ
        addr = env.pop("NOTIFY_SOCKET", None) or None
        self.address: Optional[str] = None
        self._sock: Optional[socket.socket] = None
        self._told = False
        if addr is None:
            return
        if addr[0] not in "/@":
            log.warning("NOTIFY_SOCKET=%s is not a unix socket (a path or @abstract name); "
                        "dpu does not notify the service manager", addr)
            return
        self.address = "\0" + addr[1:] if addr[0] == "@" else addr
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, **fields: object) -> None:
        """``send(READY=1, STATUS="...")``: one datagram, keys as given."""
        if self._sock is None:
            return
        msg = "".join(f"{k}={v}\n" for k, v in fields.items())
        try:
            self._sock.sendto(msg.encode(), self.address)
        except OSError as e:
            if not self._told:
                self._told = True
                log.warning("cannot notify the service manager at NOTIFY_SOCKET=%s: %s",
                            self.address.replace("\0", "@"), e.strerror or e)

    def ready(self, status: str) -> None:
        self.send(READY=1, STATUS=status)

    def reloading(self) -> None:
        # MONOTONIC_USEC: what Type=notify-reload (systemd 253) asks to come with RELOADING=1.
        self.send(RELOADING=1, STATUS="reloading", MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self, status: str) -> None:
        self.send(STOPPING=1, STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class PidFile:
    """``dpu run --pidfile PATH``: :meth:`check` before anything starts refuses a file that
    names a live process or holds anything but a process id (it could be some other file,
    given by mistake); :meth:`write` puts this process's id there (written whole: a reader
    never sees half of it); :meth:`remove` takes it away if it is still this process's."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = False

    def check(self) -> None:
        path = self.path
        if os.path.isdir(path):
            raise LiveError(f"--pidfile {path}: is a directory")
        try:
            with open(path, "rb") as f:
                text = f.read(64)
        except FileNotFoundError:
            text = b""
        except OSError as e:
            raise LiveError(f"--pidfile {path}: cannot read it: {e.strerror}") from None
        if text.strip():
            word = text.strip()
            if not word.isdigit() or len(word) > 10:
                raise LiveError(f"--pidfile {path}: holds something other than a process id (dpu replaces only "
                                "a stale pidfile; choose another --pidfile)")
            pid = int(word)
            if pid > 0 and pid != os.getpid() and _alive(pid):
                raise LiveError(f"--pidfile {path}: process {pid} is running (a dpu already? stop it, or "
                                "choose another --pidfile)")
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
            raise LiveError(f"--pidfile {path}: cannot write in {parent}: {os.strerror(errno.EACCES)}")

    def write(self) -> None:
        """After startup; its directory is made if missing, as the control socket's is."""
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise LiveError(f"--pidfile {self.path}: cannot write it: {e.strerror}") from None
        self.written = True

    def remove(self) -> None:
        if not self.written:
            return
        self.written = False
        try:
            with open(self.path) as f:
                mine = f.read().strip() == str(os.getpid())
            if mine:
                os.unlink(self.path)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone but for its parent
    except (OSError, IndexError):
        return True


# ---- descriptors ------------------------------------------------------------------------------

FD_BASE = 64          # the interpreter, stdio, the resolver's and netlink sockets, files, the pipe
FD_PER_AFXDP_IF = 8   # per interface under AF_XDP: program, link, map, promiscuous socket, ...


def fd_need(queues: int, afxdp_interfaces: int, ctl: bool, metrics: bool) -> Tuple[int, str]:
    """Descriptors ``dpu run`` needs at most, and how that adds up (for the error text).
    Each queue is one socket (AF_PACKET: one per worker and interface; AF_XDP: every
    receive queue, at least one per worker), counted twice: a reattached interface's new
    queues open before the old ones close. Then a slot per client each server may have,
    and the rest."""
    from . import control

    clients = (control.CONTROL_LIMITS.clients + 1 if ctl else 0)
    if metrics:
        from .metrics import METRICS_LIMITS

        clients += METRICS_LIMITS.clients + 1
    rest = FD_BASE + FD_PER_AFXDP_IF * afxdp_interfaces
    need = 2 * queues + clients + rest
    return need, f"{queues} queue(s), twice; {clients} for the servers' clients; {rest} more"


def raise_fd_limit() -> Tuple[int, int]:
    """Raises RLIMIT_NOFILE's soft limit to the hard one (the kernel's fs.nr_open when the
    hard one is unlimited): the usual soft 1,024 is few for a daemon whose clients, sockets
    and queues all take descriptors. Returns (before, after)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.debug("open-file limit %s (already the hard limit)", soft)
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.debug("could not raise the open-file limit from %d to %d: %s", soft, target, e)
        return soft, soft
    log.debug("raised the open-file limit from %d to %d (the hard limit)", soft, target)
    return soft, target


def check_fd_limit(need: int, how: str) -> int:
    """The soft limit raised to the hard one; a LiveError if that is still under `need`.
    Returns the limit in force."""
    import resource

    _, after = raise_fd_limit()
    if after == resource.RLIM_INFINITY or after >= need:
        return after
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raise LiveError(f"dpu run needs {need} open files ({how}); its limit is {after} (hard limit {hard}): raise it "
                    f"before starting dpu (ulimit -n {need}, as root for more than the hard limit; "
                    f"LimitNOFILE={need} in a systemd unit)")


__all__ = ["STOP_SIGNALS", "Signals", "Notifier", "PidFile", "fd_need", "check_fd_limit", "raise_fd_limit",
           "signal_name"]
