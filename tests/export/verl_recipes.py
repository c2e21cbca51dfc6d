"""The ``main_ppo`` commands of docs/training.md, read back for the tests that compose
them with verl's own config (no verl import here)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def documented_overrides(marker: str, values: dict[str, str], least: int) -> list[str]:
    """The hydra overrides (``key=value``, ``+key=value``) of the one ```` ```bash ````
    block of docs/training.md that runs ``main_ppo`` and contains ``marker``, each shell
    variable or placeholder in ``values`` replaced by its value; at least ``least``."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S)
    (block,) = [b for b in blocks if "main_ppo" in b and marker in b]
    overrides = re.findall(r"^\s+(\+?[\w.]+=.+?)(?: \\)?$", block, re.M)
    assert len(overrides) >= least, block
    filled = []
    for override in overrides:
        for name, value in values.items():
            override = override.replace(name, value)
        filled.append(override)
    return filled
