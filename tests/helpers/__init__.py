"""What the tests share, so that no test module imports another.

  packets     named addresses and scapy packets of examples/topology.yaml (STYLE.md #11)
  ctpackets   the same for the conntrack and NAT tests (docs/conntrack.md)
  model       the reference model of the pipeline (README, "Pipeline semantics")
  ct_model    its conntrack and NAT part (docs/conntrack.md)
  differential  the random rule and packet generators and the core-vs-model comparison
              of the differential tests (test_differential, test_ct_differential, test_ovs_compat)
  checksums   the one checksum verifier (and the Internet checksum builders use)
  tshark      tshark with checksum validation on, and "nothing wrong in this capture"
  wait        wait_for: waiting on a condition, not on the clock; wait_stable: until quiet
  fuzzing     bounded hypothesis settings and byte-level edits of valid inputs
  core_levels (here) dpu/_cpu.py read alone: the core's levels and this CPU's best

The labs stay beside the tests (tests/netns.py, livelab.py, live_peer.py,
evpn_lab.py, ovs_oracle.py): they build namespaces and daemons, and some of them also
run by hand as scripts. Rules (tests/test_layout.py checks them): a test module
(test_*.py) imports no other test module; nothing here or in a lab imports one; the
tests directory goes on sys.path in one place, conftest.py. Modules here import each
other relatively (``from .model import ...``); tests import ``helpers.x``.
"""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


def child_env(**extra: str) -> dict:
    """The environment of a child interpreter that imports this checkout's dpu, the
    helpers and the labs as the tests do (instead of a sys.path edit in its code)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS]), **extra}


def core_levels():
    """dpu/_cpu.py, the core's levels and which this CPU runs, read alone: without importing
    dpu, which would load this checkout's core (or fail where none is built)."""
    import importlib.util
    import sys

    name = "_dpu_cpu"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "dpu", "_cpu.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # NamedTuple looks its module up
        spec.loader.exec_module(mod)
    return sys.modules[name]
