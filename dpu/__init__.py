"""dpu: a userspace packet dataplane (OVS-style flow caches, VXLAN tenant overlays).

The public API is :class:`Dataplane`; errors are in :mod:`dpu.errors`.

The names below are imported on first use (PEP 562), so that importing a submodule such as
``dpu._entry`` (the ``dpu`` command) does not load the native core before it can say, in one
line, why the core cannot load.
"""
import importlib as _importlib
import os as _os

# The dataplane uses no BLAS; keep numpy's OpenBLAS from parking spinning
# threads on the cores the workers run on.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_EXPORTS = {"Dataplane": "dataplane", "Flow": "dataplane", "Group": "dataplane", "Output": "dataplane",
            "Trace": "dataplane", "Transaction": "dataplane", "DpuError": "errors"}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpu' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
