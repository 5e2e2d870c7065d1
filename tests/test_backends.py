"""The I/O backends as the native registry has them (native/src/ports/backend.h): one list names
every backend, built into this binary or not, and feeds both the binding's IO_BACKENDS (the
built ones) and ``LiveWorkers``' answer (``_core.Live``) to a name that is none. The backends' behaviour on
real interfaces (open, queue counts, reattach after an interface is created again, GRO off and
back on) is tested in test_live.py and test_afxdp.py."""
import pytest

from dpu import Dataplane, _core
from dpu.errors import DpuError


def test_io_backends_are_the_registry_built_ones_default_first():
    assert _core.IO_BACKENDS[0] == "afpacket"
    assert set(_core.IO_BACKENDS) <= {"afpacket", "afxdp"}
    assert len(set(_core.IO_BACKENDS)) == len(_core.IO_BACKENDS)


@pytest.mark.parametrize("name", ["bogus", "AFPACKET", "af_xdp", ""])
def test_a_name_that_is_no_backend_is_refused_with_every_name(name):
    dp = Dataplane(workers=2)
    live = dp._core.live([(1, "lo")], io=name, first_worker=1)
    with pytest.raises(DpuError) as e:
        live.start()  # refused before any socket is opened: no root needed
    # every backend of the registry, the one this build lacks too (opening it says how to get it)
    assert str(e.value) == f"unknown I/O backend '{name}' (afpacket, afxdp)"
    assert not live.running
