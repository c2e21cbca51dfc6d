"""The executors a build's tasks run on (``--engine``), registered like the readers:
each ``Engine`` names the function that runs a list of tasks and yields their results in
task order, the install extra it needs, and whether its workers own this machine's cores.
``pipeline/build/run.py`` asks the registry instead of branching on the engine's name, and
``--engine``'s choices and help come from it. Light on purpose (the runner is named by
import string), so the command line lists the engines without importing them.

A runner is a context manager ``run(tasks, worker_config, build_config)`` that yields an
iterator over the tasks' ``TaskResult``\\ s in task order; the output is byte-identical
whichever engine ran the tasks (tests/test_ray_engine.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str
    run: str  # "module:function", the runner
    help: str  # one sentence for ``--engine``'s help
    extra: str | None = None  # the install extra it needs (``pipeline/extras.py``)
    # Workers are processes of this machine, one per core, each encoding on one thread
    # (the build sets TOKENIZERS_PARALLELISM=false).
    owns_cores: bool = False

    def runner(self) -> Callable:
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Add an engine under its name; a second engine with a taken name is a bug."""
    if engine.name in ENGINES and ENGINES[engine.name] is not engine:
        raise ValueError(f"engine name {engine.name!r} is taken")
    ENGINES[engine.name] = engine
    return engine


def engines_help() -> str:
    return " ".join(f"{e.name}: {e.help}" for e in ENGINES.values())


register_engine(
    Engine(
        "local",
        "pipeline.build.run:run_local",
        "worker processes on this machine.",
        owns_cores=True,
    )
)
register_engine(
    Engine(
        "ray",
        "pipeline.build.ray_engine:run_on_ray",
        "the same stage functions on Ray Data (map_batches over Arrow); needs `pip install "
        "'seam-rl[ray]'` and, on a cluster, an --out on a filesystem every node can write.",
        extra="ray",
    )
)
