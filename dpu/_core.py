"""dpu._core: the native core, in the build this CPU runs fastest.

setup.py builds the core once per instruction-set level (dpu/_cpu.py lists them): a wheel
holds every one (dpu/_core_v1: the x86-64 baseline, dpu/_core_v3: x86-64-v3, AVX2 and BMI2),
a source build in place only its own machine's. This module imports the best one this CPU has
every feature of, or the one DPU_CORE=v1|v3 names (for tests and comparisons), and then
stands aside: `dpu._core` *is* that module (sys.modules holds it under this name), so
`from dpu import _core` and `import dpu._core` get the binding itself, whose classes call
themselves dpu._core.* whichever build it is (_core.pyi describes them all).
`dpu._core.BUILD_ISA` is the level loaded (as its compiler said); `dpu --version` names it and why.
"""
import importlib
import importlib.machinery
import os
import sys

from . import _cpu


def _built() -> list:
    """The variants present beside this file, best first."""
    here = os.listdir(os.path.dirname(os.path.abspath(__file__)))
    return [v.name for v in _cpu.VARIANTS
            if any(f"_core_{v.name}{s}" in here for s in importlib.machinery.EXTENSION_SUFFIXES)]


def _load():
    variant, why = _cpu.choose(_built())
    module = importlib.import_module(f"{__package__}._core_{variant.name}")
    module._loaded_because = why  # `dpu --version` says it
    return module


sys.modules[__name__] = _load()
