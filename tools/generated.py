"""The command line of every generator in tools/ (gen_core_pyi.py, gen_manpage.py): write the
generated text to its file, or, with --check, compare and say how to bring it up to date.
Tests run the generators with --check, so a committed file that differs fails them.

    python tools/GENERATOR.py [--check] [PATH]
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Callable, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(doc: str, default: str, make: Callable[[], str], source: str, argv: Optional[List[str]] = None) -> int:
    """The generator's main: `make()` (called with the tree's root on sys.path, so it may
    import dpu) gives the text for `default` or the PATH given; `source` names where it
    comes from in the message of a failed --check."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    ap.add_argument("path", nargs="?", default=default, help=f"the file (default {os.path.relpath(default)})")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    return write_or_check(args.path, make(), args.check, source, os.path.relpath(sys.argv[0], ROOT))


def write_or_check(path: str, text: str, check: bool, source: str, tool: str) -> int:
    """Writes `text` to `path`; with `check`, exit status 1 and a unified diff on stdout when
    the file differs (`source` names what the text came from, `tool` the script to run)."""
    if check:
        try:
            with open(path, encoding="utf-8") as f:
                have = f.read()
        except FileNotFoundError:
            have = ""
        if have != text:
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True), path,
                                                       f"from the {source}"))
            print(f"{path} differs from the {source}: run python {tool}", file=sys.stderr)
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return 0
