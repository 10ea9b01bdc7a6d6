"""``python -m salus.bench``: the same as the ``salus-bench`` command."""

import sys

from .cli import main

sys.exit(main())
