"""The `dpu` command's entry point: dpu.cli.main, once the native core has loaded.

dpu.cli needs the core; when it cannot load (DPU_CORE names a build this installation or CPU
does not have, or a broken install), the command ends as every dpu failure does: one
"dpu: ..." line on stderr and exit status 1, not an import traceback (DPU_TRACEBACK=1 shows it).
"""
import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        from .cli import main as cli_main
    except ImportError as e:
        if os.environ.get("DPU_TRACEBACK"):
            raise
        from ._cpu import CoreChoiceError

        text = str(e) if isinstance(e, CoreChoiceError) else f"dpu: cannot load the native core: {e}"
        print(text, file=sys.stderr)
        return 1
    return cli_main(argv)
