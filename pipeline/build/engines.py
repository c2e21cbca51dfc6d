"""The executors a build's tasks run on (``--engine``), registered like the readers:
each ``Engine`` names its executor class, the install extra it needs, and whether its
workers own this machine's cores. ``pipeline/build/run.py`` asks the registry instead of
branching on the engine's name, and ``--engine``'s choices and help come from it. Light
on purpose (the class is named by import string), so the command line lists the engines
without importing them.

An executor class is built as ``Class(worker_config, build_config)`` and implements the
``Executor`` protocol (``pipeline/build/executor.py``: submit the tasks, their results in
task order, shut down); the output is byte-identical whichever engine ran the tasks
(tests/test_executors.py runs every registered engine through the protocol,
tests/test_ray_engine.py compares whole builds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.common.registry import add_named, resolve

if TYPE_CHECKING:
    from pipeline.build.config import BuildConfig
    from pipeline.build.executor import Executor
    from pipeline.build.worker import WorkerConfig


@dataclass(frozen=True)
class Engine:
    name: str
    executor: str  # "module:Class", the executor class (``executor.Executor``)
    help: str  # one sentence for ``--engine``'s help
    extra: str | None = None  # the install extra it needs (``pipeline/extras.py``)
    # Workers are processes of this machine, one per core, each encoding on one thread
    # (the build sets TOKENIZERS_PARALLELISM=false).
    owns_cores: bool = False

    def start(self, wconf: WorkerConfig, build: BuildConfig) -> Executor:
        """The engine's executor for one build (its class imported now)."""
        return resolve(self.executor)(wconf, build)


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Add an engine under its name; a second engine with a taken name is a bug."""
    return add_named(ENGINES, engine.name, engine, "engine")


def engines_help() -> str:
    return " ".join(f"{e.name}: {e.help}" for e in ENGINES.values())


register_engine(
    Engine(
        "local",
        "pipeline.build.executor:LocalExecutor",
        "worker processes on this machine.",
        owns_cores=True,
    )
)
register_engine(
    Engine(
        "ray",
        "pipeline.build.ray_engine:RayExecutor",
        "the same stage functions on Ray Data (map_batches over Arrow); needs `pip install "
        "'seam-rl[ray]'` and, on a cluster, an --out on a filesystem every node can write.",
        extra="ray",
    )
)
