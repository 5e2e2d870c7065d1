"""What a tool or test sets up outside itself is removed when it ends, however it ends.

Labs (network namespaces and the veths in them, daemons such as ovsdb-server
and ovs-vswitchd, temporary directories) outlive the process that made them
unless someone removes them. ``with`` blocks and ``finally`` clauses do so on
a normal exit and on an exception, but not when the process is ended by
SIGTERM (the default action kills it on the spot) and not always on SIGINT.
This module is the one place that covers all of them:

- :func:`register` records a cleanup (a callable and its arguments) and
  returns a :class:`Cleanup` handle; ``handle.run()`` runs it once, now, and
  forgets it (the normal way to close a lab); ``handle.cancel()`` forgets it.
- The first registration in the main thread installs a handler for SIGTERM,
  SIGINT and SIGHUP (unless the signal is ignored, as ``nohup`` or a
  background job arranges). On a signal it runs every registered cleanup,
  newest first, then does what would have happened without it: the previous
  Python handler is called (for SIGINT by default that raises
  KeyboardInterrupt), or the signal's default action is taken again, so that
  the process ends *by that signal* and its parent sees it so.
- At a normal interpreter exit (``atexit``) whatever is still registered is
  run too: a lab nobody closed does not outlive its process.
- :func:`deferred` holds a signal back while something is being made and
  recorded (an ``ip netns add`` still running, a directory made but not yet
  known to its cleanup): the signal is acted on when the block ends, so the
  cleanup never misses what the block made.
- A cleanup belongs to the process that registered it: a forked child that
  exits or is signalled does not remove its parent's lab.

The helpers below it are what every lab builder needs: :func:`netns_remove`
ends the processes in a namespace before deleting it (deleting a namespace
leaves its processes running), :class:`TempDir` is a temporary directory
removed by the same means, and :func:`die_with_parent` (a ``preexec_fn``)
asks the kernel to send SIGTERM to a child whose parent dies without
cleaning up (SIGKILL, a crash).

Cleanups run in the main thread, inside the signal handler, while the code
the signal interrupted is suspended: they must not wait for anything that
code holds. Each one must be idempotent (``close()`` may be called again by
a ``finally`` after the handler ran it) and must tolerate a half-built lab.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_registry: Dict[int, "Cleanup"] = {}  # insertion order is registration order
_ids = itertools.count()
_previous: Dict[int, Any] = {}  # signal -> the handler ours replaced (installed when this holds it)
_installed_pid: Optional[int] = None
_atexit_pid: Optional[int] = None
_hold = 0  # deferred() blocks open, in any thread
_hold_lock = threading.Lock()
_pending: List[int] = []  # signals that arrived during a deferred() block
_running = False  # the signal handler is running the cleanups


class Cleanup:
    """One registered cleanup: ``run()`` runs it (once, now), ``cancel()`` forgets it."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.pid = os.getpid()
        self.id = next(_ids)

    def run(self) -> None:
        """Runs the cleanup unless it already ran or was cancelled; exceptions propagate."""
        if _registry.pop(self.id, None) is not None:
            self.fn(*self.args, **self.kwargs)

    def cancel(self) -> None:
        _registry.pop(self.id, None)

    @property
    def pending(self) -> bool:
        return self.id in _registry

    def __repr__(self) -> str:
        return f"<Cleanup {getattr(self.fn, '__qualname__', self.fn)!s}>"


def register(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Cleanup:
    """Runs ``fn(*args, **kwargs)`` when the process ends by SIGTERM, SIGINT, SIGHUP or a
    normal exit, unless the returned handle is run or cancelled before."""
    c = Cleanup(fn, args, kwargs)
    _registry[c.id] = c
    _install()
    return c


def run_all() -> None:
    """Runs every cleanup this process registered, newest first. A cleanup that fails is
    reported as one error record of the ``dpu.cleanup`` logger (on stderr when logging is not
    set up) and the others still run."""
    for c in reversed(list(_registry.values())):
        if c.pid != os.getpid():  # a forked child's copy of its parent's registry
            continue
        try:
            c.run()
        except Exception as e:  # noqa: BLE001 - one broken cleanup must not keep the others from running
            logging.getLogger("dpu.cleanup").error("cleanup %r failed: %s: %s", c, type(e).__name__, e)


def _install() -> None:
    global _installed_pid, _atexit_pid
    if _atexit_pid != os.getpid():
        atexit.register(run_all)
        _atexit_pid = os.getpid()
    if _installed_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a later registration there will
    for sig in SIGNALS:
        prev = signal.getsignal(sig)
        if prev is _on_signal:  # inherited through fork: its previous handler stays the one to chain
            continue
        if prev == signal.SIG_IGN:
            continue  # nohup, a background job: the signal does not end this process
        _previous[sig] = prev
        signal.signal(sig, _on_signal)
    _installed_pid = os.getpid()


def _on_signal(sig: int, frame: Any) -> None:
    global _running
    if _hold:
        _pending.append(sig)
        if _hold:
            return
        try:  # the block ended meanwhile, in another thread
            _pending.remove(sig)
        except ValueError:
            return  # ... and sent the signal again: that one is acted on
    if _running:
        return  # a second signal while cleaning: the first one's action follows the cleanups
    _running = True
    try:
        run_all()
    finally:
        _running = False
    _chain(sig, frame)


def _chain(sig: int, frame: Any) -> None:
    """What the signal would have done without our handler."""
    prev = _previous.get(sig, signal.SIG_DFL)
    if callable(prev):
        prev(sig, frame)  # e.g. signal.default_int_handler: KeyboardInterrupt
        return
    if prev == signal.SIG_IGN:
        return
    # SIG_DFL, or a handler set outside Python (None): end the process by this signal
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1)  # delivery is immediate; this is only in case it is blocked in this thread
    os._exit(128 + sig)


@contextlib.contextmanager
def deferred():
    """A signal that arrives in the block is acted on when the block ends: wrap the
    making of something together with the recording of it (in the object a cleanup
    reads, or in a registration)."""
    global _hold
    with _hold_lock:
        _hold += 1
    try:
        yield
    finally:
        with _hold_lock:
            _hold -= 1
            fire = list(_pending) if _hold == 0 else []
            if fire:
                _pending.clear()
        for sig in fire:
            os.kill(os.getpid(), sig)  # handled by _on_signal in the main thread, now unblocked


# ---- what labs are made of ----------------------------------------------------------------

def netns_pids(name: str) -> List[int]:
    """The processes (other than this one) whose network namespace is `name`; [] if it does not exist."""
    try:
        target = os.stat(f"/run/netns/{name}")
    except OSError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone meanwhile, a zombie, or not ours to look at
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            out.append(int(entry))
    return out


def netns_remove(name: str, timeout: float = 5.0) -> None:
    """Ends every process in network namespace `name` (SIGTERM, then SIGKILL for those
    still there after `timeout` seconds) and deletes it. Deleting alone would leave its
    processes running, and the namespace alive with them. Quiet if it does not exist."""
    if not os.path.exists(f"/run/netns/{name}"):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        pids = netns_pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = netns_pids(name)
        if not pids:
            break
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


class TempDir:
    """A temporary directory (tempfile.mkdtemp's arguments) removed by :meth:`remove`, at
    the end of a ``with`` block (which gives its path), on a signal or at exit."""

    def __init__(self, prefix: str = "dpu-", dir: Optional[str] = None) -> None:
        with deferred():
            self.path = tempfile.mkdtemp(prefix=prefix, dir=dir)
            self._cleanup = register(shutil.rmtree, self.path, ignore_errors=True)

    def remove(self) -> None:
        self._cleanup.run()

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        self.remove()


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the thread that started it ends (its parent
    killed by SIGKILL, crashed): the last line of defence for daemons a cleanup never saw."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


__all__ = ["Cleanup", "register", "run_all", "deferred", "netns_remove", "netns_pids", "TempDir",
           "die_with_parent", "SIGNALS"]
