"""The native/Python seam keeps each fact once (issue 27, part 3): the error
codes, conntrack's timeouts and limits, the tunnel port's settings, the queue
counters, the backends, the replay's outputs and the typed transaction that
carries every change, validated in the core and committed whole or not at all.

Each test fails if one side drifts from the other or if a bad item of a
transaction leaves anything applied."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpu import _core, errors

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "native" / "include" / "dpu"


# ---- error codes: errors.def feeds C++, the binding, Cython and Python ---------------------------


def test_error_codes_are_one_list():
    listed = re.findall(r"^DPU_ERR\((\w+), (\w+), \"", (INCLUDE / "errors.def").read_text(), re.M)
    assert listed and [(c, k) for c, k, _ in _core.errors()] == listed
    assert {c: k.__name__ for c, k in errors.NATIVE_ERRORS.items()} == dict(listed)
    for code, cls, meaning in _core.errors():
        assert issubclass(errors.NATIVE_ERRORS[code], errors.DpuError) and meaning
    # nobody else declares the codes: the enum and the Cython side read the list
    status_h = (INCLUDE / "status.h").read_text()
    enum = status_h.split("enum class Err", 1)[1].split("};", 1)[0]
    assert not set(re.findall(r"^\s*([A-Z_]+)\s*,", enum, re.M)) & {c for c, _ in listed}
    gen_pyx = (ROOT / "dpu" / "_gen.pyx").read_text()
    assert not re.search(r"^\s+(PARSE|UNKNOWN_PORT|INVALID)\s*$", gen_pyx, re.M)


def test_each_native_code_raises_its_class():
    from dpu import Dataplane, gen

    dp = Dataplane(ports=["a"])
    cases = {"PARSE": lambda: dp.add_flow("actions=output(a"),
             "UNKNOWN_PORT": lambda: dp.add_flow("in_port=nope,actions=drop"),
             "UNKNOWN_GROUP": lambda: dp.add_flow("actions=group:7"),
             "UNKNOWN_FIELD": lambda: dp.add_flow("nw_dsst=1,actions=drop"),
             "CONFLICT": lambda: dp.add_port("a"),
             "IO": lambda: gen.read_pcap("/nonexistent/x.pcap")}
    for code, call in cases.items():
        with pytest.raises(errors.NATIVE_ERRORS[code]):
            call()
