"""Watching what FRR installs in the kernel shadow: netlink events to coalesced callbacks.

`Shadow.watch(on_change)` starts one `Watcher`: a thread holding a netlink socket per tenant
namespace (kernel-VRF mode: one for the shared namespace), bound to the link, neighbour and
IPv4 route groups. It keeps what each tenant learned itself, incrementally: one dump of the
namespace when its socket opens (after, so no event is missed), then every neighbour, FDB and
route event folded into it (`fold.Fold`, the same code read() folds a dump with). An event
that changes a tenant's entries marks the tenant; one that changes no entry (the shadow's own
static entries, a refresh of an unchanged one) marks nothing. So a change costs what it
changes: with 10,000 MACs learned, a dump takes a quarter of a second (read() makes two at
least), an event microseconds. `Watcher.learned()` (`Shadow.watched()`) hands the callback
copies of it.

Bridges and VXLAN devices coming, going, going down or up (which can take entries with them
without an event per entry) make the namespace be dumped again before the next callback, as
does a socket that overran (ENOBUFS: events were lost; what waits on it is thrown away at once,
for the kernel reports the next overrun only after its queue has been empty). A dump is made
until two in a row agree (settled_dump: an FDB dump racing deletions skips entries and does not
say so); one made while the entries kept changing is checked again a second later, and a check
is not compared with such a dump. And once a minute every namespace is dumped and compared with
what the events built: a difference (a bug, or an event the kernel never sent) is logged as a
warning, corrected, and reported to the callback.

Marks are coalesced by a `Debouncer` (time injectable, so tests can drive it): the callback
gets the set of marked tenants once `quiet` seconds passed without another event, or
`max_delay` after the first one if events keep coming, and never twice within `quiet`. So a
change is reported at most max_delay after its first event (80 ms with the defaults, inside
the fabric's 100 ms), and a burst of 1,000 changes costs a handful of callbacks. If the
kernel drops events (a socket's buffer overran: ENOBUFS) every tenant of that namespace is
dumped again, so nothing is lost but time.

A VXLAN device of the shadow that goes down and comes back up makes zebra re-read its MACs
but not its neighbours (tests/EVPN_LAB.md): the watcher re-signals that VNI's neighbours
(Shadow._resignal: delete + add) under the Shadow's lock. A device that is new (first seen
down, as every device is while it is made) is not a flap.

The callback runs in the watcher's thread; while it runs, events wait in the sockets (4 MiB
each). In it, `Shadow.batch_since()` is when the first event it reports was read (the fabric's
netlink-to-dataplane latency starts there). An exception from it is logged (logger "dpu.fabric") and the watch goes on.
"""
from __future__ import annotations

import errno
import logging
import math
import os
import select
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ..errors import InvalidArgumentError
from . import netlink as nl
from .fold import Fold, Scan, dump_ns

log = logging.getLogger("dpu.fabric")
GROUPS = nl.RTMGRP_LINK | nl.RTMGRP_NEIGH | nl.RTMGRP_IPV4_ROUTE
RCVBUF = 4 << 20
VERIFY_S = 60.0     # how often the incremental state is checked against a dump
SETTLE_DUMPS = 3    # dumps made at most, until two agree (settled_dump)
READ_DUMPS = 5      # Shadow.read()'s: it has no recheck to come back with
RECHECK_S = 1.0     # after a dump made while the namespace kept changing, the check comes this soon


def _entries(scan) -> Set[Tuple]:
    """A scan's FDB entries and neighbours, comparable between dumps."""
    return {(m["family"], m["ifindex"], m["state"], m["flags"], m.get_attr("NDA_DST"), m.get_attr("NDA_LLADDR"))
            for m in scan.fdb + scan.neigh}


def _entry_id(m) -> Tuple:
    """What an FDB entry or neighbour is (not what it says): a VXLAN FDB entry is its device,
    MAC and remote (the all-zero MAC has one per flood VTEP), a neighbour its device and address."""
    if m["family"] == socket.AF_BRIDGE:
        return (m["family"], m["ifindex"], m.get_attr("NDA_LLADDR"), m.get_attr("NDA_DST"))
    return (m["family"], m["ifindex"], m.get_attr("NDA_DST"))


def _union(dumps) -> Scan:
    """The newest dump, with each FDB entry and neighbour that only older ones listed (as the
    newest of those had it) put before its own, in the order they were last listed: a fold takes
    the last version of a key (several entries can feed one: a MAC at two remotes), so the newest
    listing wins."""
    last = dumps[-1]
    have = {_entry_id(m) for m in last.fdb + last.neigh}
    older: Dict[Tuple, Any] = {}
    for scan in dumps[:-1]:
        for m in scan.fdb + scan.neigh:
            i = _entry_id(m)
            if i not in have:
                older.pop(i, None)   # to the end: listed again, it is newer than what was listed since
                older[i] = m
    fdb = [m for m in older.values() if m["family"] == socket.AF_BRIDGE]
    neigh = [m for m in older.values() if m["family"] != socket.AF_BRIDGE]
    return Scan(last.links, last.addrs, fdb + last.fdb, neigh + last.neigh, last.routes)


def settled_dump(ns: Optional[str], attempts: int = SETTLE_DUMPS, merge: bool = False) -> Tuple[Scan, bool]:
    """dump_ns() of a namespace, its routes included, repeated until two dumps in a row list the
    same FDB entries and neighbours; and whether two did. The kernel's FDB dump is no snapshot: it
    resumes each part by counting entries, so one deleted while it runs makes it skip another
    that stays, and it does not flag that (NLM_F_DUMP_INTR, which Rtnl.dump() retries on).
    After `attempts` dumps that all differ (the namespace kept changing), the last one; with
    `merge`, the last one and every FDB entry and neighbour only earlier ones listed: an entry
    removed meanwhile may be in it, but one that stayed is missing only if every dump skipped it."""
    if attempts < 2:
        raise InvalidArgumentError(f"settled_dump: {attempts} dumps cannot agree (at least 2)")
    scan = dump_ns(ns, routes=True)
    dumps = [scan]
    for _ in range(attempts - 1):
        again = dump_ns(ns, routes=True)
        if _entries(again) == _entries(scan):
            return again, True
        scan = again
        dumps.append(scan)
    return (_union(dumps) if merge else scan), False


class Debouncer:
    """Coalesces marks: `due_in()` says when the pending ones are to be `take()`n."""

    def __init__(self, quiet: float, max_delay: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        max_delay = 4 * quiet if max_delay is None else max_delay
        for name, v in (("debounce_s", quiet), ("max_delay_s", max_delay)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidArgumentError(f"{name} {v!r} is not a positive number of seconds")
        if max_delay < quiet:
            raise InvalidArgumentError(f"max_delay_s {max_delay} is shorter than debounce_s {quiet}")
        self.quiet, self.max_delay, self.clock = float(quiet), float(max_delay), clock
        self.pending: Set[str] = set()
        self._first = self._last = 0.0
        self.taken_since: Optional[float] = None   # clock() of the first mark of what take() gave last
        self._fired = -math.inf

    def add(self, keys) -> None:
        keys = set(keys)
        if not keys:
            return
        now = self.clock()
        if not self.pending:
            self._first = now
        self._last = now
        self.pending |= keys

    def due_in(self) -> Optional[float]:
        """Seconds until the pending marks are due (0.0: now); None when there are none."""
        if not self.pending:
            return None
        at = max(min(self._last + self.quiet, self._first + self.max_delay), self._fired + self.quiet)
        return max(0.0, at - self.clock())

    def take(self) -> Set[str]:
        self.taken_since = self._first if self.pending else None
        keys, self.pending = self.pending, set()
        self._fired = self.clock()
        return keys


class Watcher:
    """The thread behind Shadow.watch(); made and ended by the Shadow."""

    def __init__(self, shadow, on_change: Callable[[Set[str]], None], debounce_s: float,
                 max_delay_s: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        if not callable(on_change):
            raise InvalidArgumentError(f"on_change {on_change!r} is not callable")
        self.shadow, self.on_change = shadow, on_change
        self.debouncer = Debouncer(debounce_s, max_delay_s, clock)
        self.callbacks = 0                      # calls made, for tests and metrics
        # time.monotonic() when the first event of the batch being reported was read: valid in
        # on_change (the fabric measures netlink-to-dataplane latency from it)
        self.batch_since: Optional[float] = None
        self._socks: Dict[Optional[str], Tuple[nl.Rtnl, Set[str]]] = {}
        self._links: Dict[Tuple[Optional[str], int], str] = {}    # VXLAN devices: "up", "down", "new"
        self._folds: Dict[Optional[str], Dict[str, Any]] = {}    # namespace -> tenant -> Fold
        self._rescan: Set[Optional[str]] = set()                  # namespaces to dump before the next callback
        self._next_verify = time.monotonic() + VERIFY_S   # the once-a-minute check of every namespace
        self._recheck: Set[Optional[str]] = set()      # namespaces last dumped while they kept changing,
        self._recheck_at = math.inf                    # checked again then
        self._suspect: Set[Optional[str]] = set()      # ... whose state came from such a dump
        self.drifts = 0                        # verifications that found the events' state wrong
        self.overruns = 0                      # sockets that overran (ENOBUFS): namespaces dumped again
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._refresh = False
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name=f"shadow-watch-{shadow.tag}", daemon=True)

    def start(self) -> None:
        self._sync()          # the sockets exist when watch() returns: no event after it is missed
        self.thread.start()

    def refresh(self) -> None:
        """The Shadow's tenants changed: open and close sockets to match (in the thread)."""
        self._refresh = True
        self._wake()

    def learned(self) -> Optional[Dict[str, Any]]:
        """Every tenant's Learned as the events built it (copies); None if a tenant has none
        (its namespace could not be watched: read() it instead). Only in on_change, or before
        start(): the watch thread changes them."""
        with self.shadow._lock:
            wanted = set(self.shadow._tenant_places())
        out = {}
        for folds in self._folds.values():
            for name, fold in folds.items():
                if name in wanted:
                    out[name] = fold.learned()
        return out if wanted <= set(out) else None

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if threading.current_thread() is not self.thread and self.thread.is_alive():
            self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self._close()

    def _wake(self) -> None:
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _close(self) -> None:
        for sock, _ in self._socks.values():
            sock.close()
        self._socks.clear()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1

    # -- sockets

    def _sync(self) -> None:
        """A socket per namespace of the Shadow's tenants (opened before the namespace's VXLAN
        devices are listed, so no change between the two is missed). The Shadow's lock is held
        only to read its tenants: the dumps run without it."""
        with self.shadow._lock:
            want: Dict[Optional[str], Set[str]] = {}
            for name, (place, _) in self.shadow._tenant_places().items():
                want.setdefault(place.ns, set()).add(name)
        for ns in list(self._socks):
            if ns not in want:
                self._socks.pop(ns)[0].close()
                self._folds.pop(ns, None)
                self._recheck.discard(ns)
                self._suspect.discard(ns)
                self._links = {k: v for k, v in self._links.items() if k[0] != ns}
        for ns, names in want.items():
            if ns in self._socks:
                if names != self._socks[ns][1]:
                    self._rescan.add(ns)
                self._socks[ns] = (self._socks[ns][0], names)
                continue
            try:
                sock = nl.Rtnl(ns, GROUPS, rcvbuf=RCVBUF)
            except OSError as e:
                log.warning("shadow %s: cannot watch %s: %s", self.shadow.tag, ns, e.strerror or e)
                continue
            self._socks[ns] = (sock, names)
            try:
                with nl.Rtnl(ns) as dump:
                    for link in dump.dump("links"):
                        if nl.link_kind(link) == "vxlan":
                            self._links[(ns, link["index"])] = "up" if link["flags"] & nl.IFF_UP else "down"
            except OSError as e:
                log.warning("shadow %s: cannot list the links of %s: %s", self.shadow.tag, ns, e.strerror or e)
            self._dump(ns)

    def _dump(self, ns: Optional[str], verify: Optional[Set[Tuple[str, Optional[int]]]] = None) -> Set[str]:
        """Folds a fresh dump of namespace ns into new state for its tenants; the tenants whose
        entries it changed. With `verify` (the loop's flaps), a change is a drift, said as a
        warning: the events that came while the dump ran are first folded into both states,
        so a change made during the dump is no drift."""
        with self.shadow._lock:
            places = {n: p for n, (p, _) in self.shadow._tenant_places().items() if p.ns == ns}
        try:
            scan, settled = settled_dump(ns)
        except OSError as e:
            log.warning("shadow %s: cannot read %s: %s", self.shadow.tag, ns, e.strerror or e)
            self._folds.pop(ns, None)   # learned() says so (the callback read()s); its next event retries
            self._recheck.discard(ns)
            self._suspect.discard(ns)
            return set(places)
        had = ns in self._folds
        old = self._folds.get(ns, {})
        new = {n: Fold(scan, p, self.shadow.tag).fill(scan) for n, p in places.items()}
        if settled:
            self._recheck.discard(ns)
        else:                               # it may lack entries: checked again soon
            self._recheck.add(ns)
            self._recheck_at = min(self._recheck_at, time.monotonic() + RECHECK_S)
        if verify is not None and had:
            self._read(ns, verify, also=new)
            if ns in self._rescan:          # it overran: what the events built is not comparable
                verify = None
            elif not settled:               # nor with a dump that may lack entries: kept as built
                return set()
        suspect = ns in self._suspect       # what it replaces came from such a dump
        if settled:
            self._suspect.discard(ns)
        else:
            self._suspect.add(ns)
        self._folds[ns] = new
        changed = {n for n, f in new.items() if n not in old or old[n].learned() != f.learned()}
        changed |= set(old) - set(new)
        if verify is not None and had and changed:
            if suspect:
                log.info("shadow %s: %s read again after a dump made while entries changed; corrected",
                         self.shadow.tag, ", ".join(sorted(changed)))
            else:
                self.drifts += 1
                log.warning("shadow %s: what the netlink events built for %s differs from the kernel's; "
                            "corrected from a dump", self.shadow.tag, ", ".join(sorted(changed)))
        return changed

    def _verify(self, flaps: Set[Tuple[str, Optional[int]]], only: Optional[Set[Optional[str]]] = None) -> None:
        """Each namespace's events read to now (`only`: those namespaces'), then dumped and
        compared with what they built. The next check of all is due VERIFY_S after this one
        ended; of one whose dump was made while its entries kept changing, RECHECK_S after."""
        self._recheck_at = math.inf         # (_dump sets it again for a dump that does not settle)
        for ns in list(self._socks):
            if only is not None and ns not in only:
                continue
            self._read(ns, flaps)
            if ns in self._socks and ns not in self._rescan:
                self.debouncer.add(self._dump(ns, verify=flaps))
        if only is None:
            self._next_verify = time.monotonic() + VERIFY_S
        if self._recheck & set(self._socks):
            self._recheck_at = min(self._recheck_at, time.monotonic() + RECHECK_S)

    # -- the loop

    def _run(self) -> None:
        while not self._stopping:
            if self._refresh:
                self._refresh = False
                self._sync()
            socks = {sock.fileno(): ns for ns, (sock, _) in self._socks.items()}
            try:
                due = self.debouncer.due_in()
                to_verify = max(0.0, min(self._next_verify, self._recheck_at) - time.monotonic())
                ready, _, _ = select.select(list(socks) + [self._r], [], [],
                                           to_verify if due is None else min(due, to_verify))
            except OSError as e:                  # a socket closed under us by stop(): go round
                if e.errno != errno.EBADF:
                    raise
                continue
            flaps: Set[Tuple[str, Optional[int]]] = set()
            for fd in ready:
                if fd == self._r:
                    try:
                        while os.read(self._r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    self._read(socks[fd], flaps)
            if time.monotonic() >= self._next_verify:
                self._verify(flaps)
            elif time.monotonic() >= self._recheck_at:
                self._verify(flaps, only=set(self._recheck))
            for tenant, vni in sorted(flaps, key=str):
                self._resignal(tenant, vni)
            if self.debouncer.due_in() == 0.0:
                rescan, self._rescan = self._rescan, set()
                for ns in sorted(rescan, key=str):
                    if ns in self._socks:
                        self._dump(ns)
                tenants = self.debouncer.take()
                self.batch_since = self.debouncer.taken_since
                self.callbacks += 1
                try:
                    self.on_change(tenants)
                except Exception:     # noqa: BLE001 - a consumer's bug must not end the watch
                    log.exception("shadow %s: the on_change callback failed", self.shadow.tag)
        self._close()

    def _read(self, ns: Optional[str], flaps: Set[Tuple[str, Optional[int]]],
              also: Optional[Dict[str, Fold]] = None) -> None:
        """Folds the namespace's pending events into its tenants' state (and into `also`, a
        fresh dump's, when verifying)."""
        sock, names = self._socks[ns]
        try:
            msgs = sock.events()
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                log.warning("shadow %s: reading events of %s: %s", self.shadow.tag, ns, e.strerror or e)
            else:
                # What waits is older than the dump to come; and until the queue has been
                # empty once, the kernel drops what overflows it again without saying so.
                self.overruns += 1
                try:
                    sock.drain()
                except OSError as e2:
                    log.warning("shadow %s: emptying the socket of %s: %s", self.shadow.tag, ns, e2.strerror or e2)
            self._rescan.add(ns)                 # some were lost: dumped again
            self.debouncer.add(names)
            return
        folds = self._folds.get(ns)
        for m in msgs:
            event = m.get("event")
            if event in ("RTM_NEWNEIGH", "RTM_DELNEIGH", "RTM_NEWROUTE", "RTM_DELROUTE"):
                if folds is None:                # its dump failed: a change there dumps it again
                    self._rescan.add(ns)
                    self.debouncer.add(names)
                    continue
                for name, fold in folds.items():
                    if fold.message(m):
                        self.debouncer.add((name,))
                for fold in (also or {}).values():
                    fold.message(m)
            elif event in ("RTM_NEWLINK", "RTM_DELLINK"):
                kind = nl.link_kind(m)
                if kind in ("vxlan", "bridge"):
                    self._rescan.add(ns)
                    self.debouncer.add(names)
                if kind == "vxlan":
                    self._link(ns, m, event == "RTM_DELLINK", flaps)

    def _link(self, ns, m, deleted: bool, flaps) -> None:
        key = (ns, m["index"])
        if deleted:
            self._links.pop(key, None)
            return
        up = bool(m["flags"] & nl.IFF_UP)
        before = self._links.get(key, "new")
        self._links[key] = "up" if up else (before if before == "new" else "down")
        if up and before == "down":
            vni = nl.vxlan_id(m)
            for t in self.shadow.tenants():
                if vni == t.l3vni:
                    flaps.add((t.name, None))
                elif any(s.vni == vni for s in t.subnets):
                    flaps.add((t.name, vni))

    def _resignal(self, tenant: str, vni: Optional[int]) -> None:
        with self.shadow._lock:
            t = next((t for t in self.shadow.tenants() if t.name == tenant), None)
            if t is None:
                return
            try:
                self.shadow._resignal(t, None if vni is None else {vni})
            except Exception:     # noqa: BLE001 - logged; the next apply() or resignal() repairs it
                log.exception("shadow %s: re-signalling tenant %s after its VXLAN device came back up",
                              self.shadow.tag, tenant)
