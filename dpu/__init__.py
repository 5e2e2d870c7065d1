"""dpu: a userspace packet dataplane (OVS-style flow caches, VXLAN tenant overlays).

The public API is :class:`Dataplane`; errors are in :mod:`dpu.errors`.
"""
import os as _os

# The dataplane uses no BLAS; keep numpy's OpenBLAS from parking spinning
# threads on the cores the workers run on.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .dataplane import Dataplane, Flow, Group, Output, Trace, Transaction  # noqa: F401
from .errors import DpuError  # noqa: F401

__all__ = ["Dataplane", "Flow", "Group", "Output", "Trace", "Transaction", "DpuError"]
__version__ = "0.1.0"
