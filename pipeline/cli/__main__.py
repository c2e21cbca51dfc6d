"""``python -m pipeline.cli``: the same command line as the ``seam`` script."""

import sys

from pipeline.cli import main

sys.exit(main())
