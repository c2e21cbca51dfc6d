"""Optional capabilities and the extras that install them (README, "Install").

The core install (``pip install seam-rl``) reads, builds, verifies, shows and exports;
the HTTP gateway, the HTML report, the LLM judge, the PPO step and the Ray engine need
libraries that a build does not, so they come with extras. A command that needs one
checks for it before any work and fails with one line that names the extra to install.
``EXTRAS`` lists, per extra, the modules it must make importable; a test checks that
every one of them is a distribution of that extra in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util

from pipeline.common.errors import UsageError

# The distribution's name on PyPI ("seam" is an unrelated project); the command is `seam`.
DISTRIBUTION = "seam-rl"

EXTRAS: dict[str, tuple[str, ...]] = {
    "gateway": ("aiohttp", "httptools"),
    "report": ("matplotlib",),
    "judge-llm": ("httpx2", "tenacity"),
    "train": ("torch",),
    "ray": ("ray",),
    "trainers": ("torch", "trl", "verl"),
}


class MissingExtra(UsageError):
    """A command needs an extra that is not installed; the message is the whole line."""

    def __init__(self, command: str, extra: str):
        super().__init__(
            f"seam {command} needs the {extra} extra: pip install '{DISTRIBUTION}[{extra}]'"
        )
        self.extra = extra


def installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported (found, not imported: cheap)."""
    return all(importlib.util.find_spec(module) is not None for module in EXTRAS[extra])


def require(extra: str, command: str) -> None:
    """Raise :class:`MissingExtra` when ``extra`` is not installed; ``command`` is how the
    message names what needed it (``"report"``, ``"export --to slime"``)."""
    if not installed(extra):
        raise MissingExtra(command, extra)


def extra_providing(module: str | None) -> str | None:
    """The first extra that installs top-level module ``module`` (of a
    ``ModuleNotFoundError``), or None for a module no extra provides (a core one: a bug)."""
    top = (module or "").split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)
