"""Shared pieces of the bounded fuzz runs (tests/test_fuzz.py and the other
hypothesis fuzzers): the same inputs every CI run, a longer run on demand.

``DPU_FUZZ_EXAMPLES=N python3 -m pytest -q tests/test_fuzz.py``: N examples
per test, fresh random ones each run (the README's test section says so).
"""
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG = int(os.environ.get("DPU_FUZZ_EXAMPLES", "0"))


def bounded(n: int):
    """n examples, the same ones every run; DPU_FUZZ_EXAMPLES=N: N fresh ones."""
    return settings(max_examples=LONG or n, derandomize=not LONG, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def edited(draw, text: str, pieces, edits: int = 4, cut: int = 8) -> str:
    """``text`` with 1..edits random edits: a piece inserted, up to ``cut``
    characters deleted, or characters overwritten by a piece."""
    for _ in range(draw(st.integers(1, edits))):
        i = draw(st.integers(0, len(text)))
        piece = draw(st.sampled_from(pieces) | st.text(max_size=3))
        op = draw(st.integers(0, 2))
        if op == 0:
            text = text[:i] + piece + text[i:]
        elif op == 1:
            text = text[:i] + text[i + draw(st.integers(1, cut)):]
        else:
            text = text[:i] + piece + text[i + len(piece):]
    return text
