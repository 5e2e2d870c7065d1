"""Waiting on a condition, not on the clock.

A test that needs something to happen (a socket to answer, a counter to move, a
process to end) polls for it with ``wait_for`` and a generous deadline: it goes on
as soon as the thing happened, and when it never does the failure names what did
not happen instead of an assertion about a value read too early. A deadline is a
limit on how long to wait, never a claim about how fast something is: no test
asserts on elapsed time.

A sleep stays only where the waiting is the point (showing that something does
NOT happen for a while), with a comment saying so.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What a test waited for did not happen before its deadline."""


def _poll(probe: Callable[[], T], done: Callable[[T], bool], timeout: float, interval: float):
    """(value, True) once done(probe()) holds, else (the last value, False) after timeout.
    The poll interval doubles from ``interval`` to at most 0.25 s: a long wait costs
    little CPU, a short one little time."""
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        value = probe()
        if done(value):
            return value, True
        left = deadline - time.monotonic()
        if left <= 0:
            return value, False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def wait_for(cond: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
             interval: float = 0.02) -> T:
    """Polls ``cond()`` until it returns something true and returns that; fails with
    WaitTimeout naming ``what`` after ``timeout`` seconds."""
    value, ok = _poll(cond, bool, timeout, interval)
    if not ok:
        raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
    return value


def settle(probe: Callable[[], T], done: Callable[[T], bool], timeout: float = 30.0,
           interval: float = 0.1) -> T:
    """probe()'s value once done(value) holds, or its last value when ``timeout`` passes
    first: for a test that asserts on the value itself, so that a failure shows what was
    there rather than only that the wait ran out."""
    return _poll(probe, done, timeout, interval)[0]


def wait_stable(probe: Callable[[], T], hold: float, timeout: float = 30.0,
                what: str = "the value to settle") -> T:
    """probe()'s value once it has stayed the same for ``hold`` seconds (a system that has
    gone quiet: no change still on its way); fails with WaitTimeout naming ``what`` when it
    keeps changing for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value, since = probe(), time.monotonic()
    while True:
        now = time.monotonic()
        if now - since >= hold:
            return value
        if now >= deadline:
            raise WaitTimeout(f"{what} kept changing for {timeout:g} s (last: {value!r})")
        time.sleep(min(0.1, hold / 4))
        v = probe()
        if v != value:
            value, since = v, time.monotonic()
