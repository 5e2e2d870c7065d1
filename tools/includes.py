#!/usr/bin/env python3
"""The include graph of the worker's stages, and the rule it keeps.

    python3 tools/includes.py          # the graph (file -> the project headers it includes)

The stages (worker, stage.h, classify, upcall, execute, ct_stage, transmit) see the dataplane
only through stage.h's interfaces and datapath_view.h: none of them may include dataplane.h,
directly or through another project header. Exit status 1 when one does.
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "native", "src")
STAGES = ["worker.h", "worker.cc", "stage.h", "classify.h", "upcall.h", "upcall.cc", "execute.h", "execute.cc",
          "vxlan.cc", "ct_stage.h", "ct_stage.cc", "transmit.h", "transmit.cc"]
_INC = re.compile(r'^#include "([^"]+)"', re.M)


def resolve(name: str, inc: str) -> str:
    """The file `#include "inc"` in native/src/name means, as the compiler finds it: next to
    the including file first (conntrack/conntrack.h's "conn.h" is conntrack/conn.h), then in
    native/src; named relative to native/src. "" for a public header (native/include/dpu)."""
    for base in (os.path.dirname(os.path.join(SRC, name)), SRC):
        path = os.path.normpath(os.path.join(base, inc))
        if path.startswith(SRC + os.sep) and os.path.isfile(path):
            return os.path.relpath(path, SRC)
    return ""


def includes(name: str) -> list:
    path = os.path.join(SRC, name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        found = (resolve(name, i) for i in _INC.findall(f.read()))
        return list(dict.fromkeys(i for i in found if i))


def reaches(name: str, target: str, seen=None) -> list:
    """The include chain from name to target, or []."""
    seen = seen if seen is not None else set()
    for inc in includes(name):
        if inc == target:
            return [name, inc]
        if inc not in seen:
            seen.add(inc)
            chain = reaches(inc, target, seen)
            if chain:
                return [name] + chain
    return []


def main() -> int:
    bad = 0
    for name in STAGES:
        print(f"{name:14} -> {', '.join(includes(name)) or '-'}")
    for name in STAGES:
        chain = reaches(name, "dataplane.h")
        if chain:
            bad += 1
            print(f"{name} reaches dataplane.h: {' -> '.join(chain)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
