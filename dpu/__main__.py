"""`python -m dpu`: the dpu command."""
import sys

from ._entry import main

sys.exit(main())
