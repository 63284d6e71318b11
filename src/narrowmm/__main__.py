"""``python -m narrowmm``: the same as the ``narrowmm`` command."""

import sys

from .cli import main

sys.exit(main())
