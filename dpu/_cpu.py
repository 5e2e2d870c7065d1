"""The builds of the native core, one per x86-64 instruction-set level, and which of them this CPU runs.

setup.py compiles the core once per variant below, each an extension module of its own
(dpu/_core_v1, dpu/_core_v3); dpu/_core.py imports the best one the CPU has every feature of.
This file is the one list of both: setup.py reads it by path (it imports nothing of dpu), so
a variant's compiler flags and the CPU features it needs cannot disagree.

x86-64-v4 (AVX-512) is not built: measured on a CPU that has it, it ran slower than v3
(docs/development.md, "Instruction sets").
"""
from __future__ import annotations

import os
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple


class Variant(NamedTuple):
    name: str             # the module's suffix (dpu._core_v3) and DPU_CORE's value
    level: str            # what `dpu --version` calls it
    march: str            # the compiler's -march
    needs: FrozenSet[str]  # /proc/cpuinfo flags the CPU must have (lzcnt is "abm" there)


_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
# Best first: the loader takes the first one the CPU runs.
VARIANTS: Tuple[Variant, ...] = (
    Variant("v3", "x86-64-v3", "x86-64-v3",
            _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    Variant("v1", "x86-64", "x86-64", frozenset()),
)
BY_NAME: Dict[str, Variant] = {v.name: v for v in VARIANTS}


class CoreChoiceError(ImportError):
    """No build of the core can load here, or DPU_CORE names one that cannot: the message says
    why (the `dpu` command prints it as its one line, with no traceback)."""


def cpu_flags(path: str = "/proc/cpuinfo") -> FrozenSet[str]:
    """The feature flags of the first CPU (the kernel lists only what it lets programs use:
    no avx when it does not save the AVX registers); none when the file cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def missing(variant: Variant, flags: FrozenSet[str]) -> List[str]:
    """The features `variant` needs that `flags` lack, sorted."""
    return sorted(variant.needs - flags)


def best(flags: FrozenSet[str], built: Optional[List[str]] = None) -> Variant:
    """The first variant (of `built`, default all) this CPU runs; the baseline when none."""
    for v in VARIANTS:
        if (built is None or v.name in built) and not missing(v, flags):
            return v
    return VARIANTS[-1]


def choose(built: List[str], env: Optional[Dict[str, str]] = None) -> Tuple[Variant, str]:
    """(the variant to load, why) from the variants `built`: DPU_CORE=NAME when set, else the
    best this CPU runs. Raises CoreChoiceError, saying why, for one that cannot load here."""
    env = os.environ if env is None else env
    asked = env.get("DPU_CORE", "").strip()
    flags = cpu_flags()
    if not asked:
        runnable = [n for n in built if not missing(BY_NAME[n], flags)]
        if not runnable:
            raise CoreChoiceError(f"dpu: no build of the native core this CPU runs (built: {', '.join(built) or 'none'})")
        return best(flags, runnable), "the best this CPU runs"
    v = BY_NAME.get(asked)
    if v is None:
        raise CoreChoiceError(f"dpu: DPU_CORE={asked}: takes one of {', '.join(BY_NAME)}")
    if asked not in built:
        raise CoreChoiceError(f"dpu: DPU_CORE={asked}: this installation has {', '.join(built) or 'no core'} "
                          "(a source build has only its machine's; a wheel has all)")
    lacks = missing(v, flags)
    if lacks:
        raise CoreChoiceError(f"dpu: DPU_CORE={asked}: this CPU lacks {', '.join(lacks)} ({v.level})")
    return v, f"DPU_CORE={asked}"
