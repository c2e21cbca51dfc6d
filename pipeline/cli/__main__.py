"""``python -m pipeline.cli``: the same command line as the ``seam`` script."""

from pipeline.cli import entry

entry()
