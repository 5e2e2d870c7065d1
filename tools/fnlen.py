#!/usr/bin/env python3
"""Functions longer than N lines (default 150) in dpu's C++ and Python sources.

    python3 tools/fnlen.py [--max N] [--all]

Python: every function and method (ast), its length from `def` to its last line. C++: a
function body is a `{` that follows a `)` (optionally `const`, `override`, `noexcept`, an
initialiser list or a trailing return type) at brace depth of a namespace or class, up to
its matching `}` (strings, characters and comments skipped); good enough for this tree's
style, which the checks below rely on. Prints `length  file:line  name`, longest first;
exit status 1 when any exceeds N (argparse tables excepted: cli.py's _parser).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXEMPT = {("dpu/cli.py", "_parser")}   # argparse tables: one long list of options


def python_functions(path: str):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _strip(src: str) -> str:
    """The source with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', src[i:])
            end = src.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


_HEAD = re.compile(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(final\s*)?(->\s*[\w:<>,\s*&]+)?\s*$")
_NAME = re.compile(r"([~\w:]+(?:<[^()]*>)?)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:const\s*)?(?:noexcept\s*)?"
                   r"(?:override\s*)?(?:final\s*)?(?:->\s*[\w:<>,\s*&]+)?\s*(?::[^{;]*)?$", re.S)


def cpp_functions(path: str):
    with open(path, encoding="utf-8") as f:
        src = _strip(f.read())
    depth_kinds = []   # for each open brace: "fn" (a function body), or "scope"
    start = {}
    for i, c in enumerate(src):
        if c == "{":
            before = src[max(0, i - 600):i]
            in_fn = "fn" in depth_kinds
            m = None if in_fn else _NAME.search(before)
            if m and not re.search(r"\b(if|for|while|switch|catch|return|sizeof|decltype)\s*$",
                                   before[:m.start(1)].rstrip()):
                depth_kinds.append("fn")
                start[len(depth_kinds)] = (m.group(1), src.count("\n", 0, i) + 1)
            else:
                depth_kinds.append("scope")
        elif c == "}" and depth_kinds:
            kind = depth_kinds.pop()
            if kind == "fn":
                name, line = start.pop(len(depth_kinds) + 1)
                end = src.count("\n", 0, i) + 1
                yield name, line, end - line + 1


def scan():
    for top in ("native", "dpu", "bench", "tools"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            if "build" in d.split(os.sep):
                continue
            for f in files:
                p = os.path.join(d, f)
                rel = os.path.relpath(p, ROOT)
                if f.endswith(".py"):
                    yield from ((rel, *fn) for fn in python_functions(p))
                elif f.endswith((".cc", ".h")) and not f.endswith(".pyx.h"):
                    yield from ((rel, *fn) for fn in cpp_functions(p))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=150)
    ap.add_argument("--all", action="store_true", help="list every function over --max, exemptions included")
    a = ap.parse_args()
    rows = sorted(((n, rel, line, name) for rel, name, line, n in scan() if n > a.max), reverse=True)
    bad = 0
    for n, rel, line, name in rows:
        exempt = (rel, name) in EXEMPT
        if exempt and not a.all:
            continue
        bad += not exempt
        print(f"{n:5d}  {rel}:{line}  {name}" + ("  (argparse table)" if exempt else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
