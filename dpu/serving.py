"""What dpu's two local servers share: the control socket (:mod:`dpu.control`) and the
metrics endpoint (:mod:`dpu.metrics`) each run one :class:`Listener`.

A listener is one accept loop and a thread per client, at most ``Limits.clients`` of them.
At the cap it stops accepting until a client leaves: newcomers wait their turn in the
listen backlog (the kernel's, which costs the process no descriptor), and as every
client's request has a deadline, a turn comes within seconds. (Accepting to refuse at
once was tried: the refusal raced the client's request, which then met a reset.)

The accept loop never ends on an error, only when the listening socket is closed: running
out of descriptors (EMFILE, ENFILE), of buffers or memory (ENOBUFS, ENOMEM) or of threads
starts an *episode*, logged once as a warning, retried with a growing pause (50 ms to
1 s) and logged once more when accept succeeds again; a connection aborted before it was
accepted (ECONNABORTED, EPROTO) is simply skipped. Nothing is printed: the module-level
loggers (``dpu.serving``, ``dpu.control``, ``dpu.metrics``) say what happened, and
``dpu run`` sends them to stderr.

Each client has deadlines rather than a per-read timeout: a request must arrive complete
within ``request_timeout`` of the connection (or of the previous answer), however slowly
it dribbles in, and an answer must be taken within ``send_timeout``. :class:`Budget`
caps the bytes of unanswered requests held across all of a server's clients, beside the
per-request cap, so that many clients with large partial requests cannot grow the
process without bound.

Called from: ControlServer and MetricsServer (construction, start, close); the serving
callbacks run on the connection threads.
"""
from __future__ import annotations

import errno
import io
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Set

log = logging.getLogger("dpu.serving")

BACKOFF_FIRST = 0.05   # seconds: the first pause after a failed accept
BACKOFF_MOST = 1.0     # seconds: the longest pause (each failure in a row doubles it)
SKIP_ERRNOS = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN}  # that client only: accept the next


@dataclass(frozen=True)
class Limits:
    """What one server allows its clients."""
    clients: int            # served at once
    request_timeout: float  # seconds for a request to arrive complete (after connecting, or after an answer)
    send_timeout: float     # seconds for a client to take its answer
    max_request: int        # bytes in one request
    max_buffered: int       # bytes of unanswered requests across all clients


class Budget:
    """Bytes held for unanswered requests, across a server's clients, up to a limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._mu = threading.Lock()

    def take(self, n: int) -> bool:
        with self._mu:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._mu:
            self.held -= n


class Episode:
    """A run of one kind of trouble: logged when it starts and when it ends, not each time."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self.since = 0.0
        self._mu = threading.Lock()  # connection threads share an episode

    def happens(self, message: str) -> float:
        """Counts one more; logs `message` as a warning if it is the first. Returns the pause
        before trying again (doubling from BACKOFF_FIRST to BACKOFF_MOST)."""
        with self._mu:
            self.count += 1
            n = self.count
            if n == 1:
                self.since = time.monotonic()
        if n == 1:
            log.warning("%s: %s", self.what, message)
        else:
            log.debug("%s: %s (again, %d in a row)", self.what, message, n)
        return min(BACKOFF_MOST, BACKOFF_FIRST * 2 ** min(n - 1, 16))

    def ends(self, message: str) -> None:
        """If an episode was running, logs its end (`message` gets the count and duration)."""
        if not self.count:  # the common case, without the lock
            return
        with self._mu:
            n, self.count = self.count, 0
        if n:
            log.info("%s: %s", self.what, message.format(n=n, secs=time.monotonic() - self.since))


class Listener:
    """The accept loop of one listening socket (see the module docstring).

    ``serve(sock)`` runs on a thread of its own for each accepted client and may block; the
    listener closes the socket when it returns."""

    def __init__(self, sock: socket.socket, what: str, limits: Limits, serve: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.what = what
        self.limits = limits
        self._serve = serve
        self._slots = threading.BoundedSemaphore(limits.clients)
        self._clients: Set[socket.socket] = set()
        self._mu = threading.Lock()
        self._closed = threading.Event()
        self._failing = Episode(what)
        self._full = Episode(what)
        self.thread = threading.Thread(target=self._accept_loop, name=f"dpu-{what.split()[0]}", daemon=True)

    @property
    def clients(self) -> int:
        """Clients connected now."""
        with self._mu:
            return len(self._clients)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stops accepting and cuts every client short (their threads then end)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()
        with self._mu:
            clients = list(self._clients)
        for c in clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(5)

    # ---- the loop ---------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if not self._slots.acquire(blocking=False):
                self._full.happens(f"{self.limits.clients} clients at once, the most it serves: new ones wait "
                                   "until one leaves")
                while not self._slots.acquire(timeout=0.25):
                    if self._closed.is_set():
                        return
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                self._slots.release()
                if self._closed.is_set():
                    return
                if e.errno in SKIP_ERRNOS:
                    continue
                self._closed.wait(self._failing.happens(f"cannot accept a client: {e.strerror or e} "
                                                        f"({self.clients} connected); trying again"))
                continue
            self._failing.ends("accepting again after {n} failed accepts over {secs:.1f}s")
            if self._full.count and self.clients < self.limits.clients // 2:  # not at each slot freed and taken again
                self._full.ends("fewer clients again (the cap was reached {n} time(s) over {secs:.1f}s)")
            with self._mu:
                self._clients.add(conn)
            try:
                threading.Thread(target=self._run, args=(conn,), name=f"{self.thread.name}-client",
                                 daemon=True).start()
            except RuntimeError as e:  # no thread to be had: like running out of descriptors
                self._forget(conn)
                self._closed.wait(self._failing.happens(f"cannot serve a client: {e}; trying again"))

    def _run(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        except OSError as e:  # the client went away, or its deadline cut it short
            log.debug("%s: a client's connection ended: %s", self.what, e)
        except Exception as e:  # noqa: BLE001 - a bug must not print a traceback or lose the slot
            log.error("%s: serving a client failed: %s: %s", self.what, type(e).__name__, e)
            log.debug("%s: where it failed", self.what, exc_info=True)
        finally:
            self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        with self._mu:
            self._clients.discard(conn)
        try:
            conn.close()
        finally:
            self._slots.release()


class DeadlineReader(io.RawIOBase):
    """Reads a client's socket against a deadline for the whole request (not per read),
    charging what it reads to the server's Budget and, when given, to a cap of this
    client's own. Raises TimeoutError once the deadline has passed and OverBudget when
    reading on would pass either cap. (A raw stream: io.BufferedReader can wrap it.)"""

    def __init__(self, sock: socket.socket, limits: Limits, budget: Budget, own_cap: Optional[int] = None) -> None:
        super().__init__()
        self.sock = sock
        self.limits = limits
        self.budget = budget
        self.own_cap = own_cap
        self.deadline = time.monotonic() + limits.request_timeout
        self.held = 0          # bytes charged and not yet given back

    def readable(self) -> bool:
        return True

    def restart(self) -> None:
        """A request was answered: the next one has a full request_timeout."""
        self.deadline = time.monotonic() + self.limits.request_timeout

    def readinto(self, buf) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self.sock.settimeout(left)
        n = self.sock.recv_into(buf)
        if n:
            if self.own_cap is not None and self.held + n > self.own_cap:
                raise OverBudget(self.held + n, self.own_cap, own=True)
            if not self.budget.take(n):
                raise OverBudget(self.budget.held, self.budget.limit, own=False)
            self.held += n
        return n

    def release(self, n: int) -> None:
        self.budget.give(n)
        self.held -= n

    def close(self) -> None:
        """Gives back whatever is still charged (the socket is the Listener's to close)."""
        if self.held:
            self.release(self.held)
        super().close()

    def send(self, data: bytes) -> None:
        self.sock.settimeout(self.limits.send_timeout)  # sendall's timeout is for the whole of it
        self.sock.sendall(data)


class OverBudget(Exception):
    """Reading on would take a client past its own cap, or its server past its budget."""

    def __init__(self, held: int, limit: int, own: bool) -> None:
        super().__init__(f"{held} bytes buffered (at most {limit})")
        self.held, self.limit, self.own = held, limit, own
