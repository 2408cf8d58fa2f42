"""``python -m dmrl`` (also what torchrun launches)."""

import sys

from dmrl.cli import main

sys.exit(main())
