"""How many examples a hypothesis property test draws: fewer in the everyday loop, the
full count under ``make fuzz``.

``make test`` runs each property on ``everyday`` examples (the same budget every run, so
the loop stays fast); ``make fuzz`` sets ``SEAM_DEEP_PROPERTIES=1`` and runs the same
tests on ``deep`` examples, the count they ran on before the loop was cut to size.
"""

from __future__ import annotations

import os


def examples(everyday: int, deep: int) -> int:
    """``max_examples`` for a property test: ``deep`` under ``make fuzz``, else ``everyday``."""
    return deep if os.environ.get("SEAM_DEEP_PROPERTIES") == "1" else everyday
