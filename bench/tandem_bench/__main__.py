"""`python -m tandem_bench ARGS...` (what `tandem bench ARGS...` runs)."""
import sys

from .cli import main

sys.exit(main())
