"""A build's first pass over its inputs (``read_hash.file_digests``: each input's sha256
and block digests), in child processes started before the build loads its tokenizer.

``Tokenizer.from_file`` holds the GIL for its whole ~0.5 s load, so hashing threads of
the build process stood still while it ran, and the build then waited for them (about
0.2 s of a 173 MB input). A child process hashes on the core the load leaves idle and
prints one JSON line per file; the build reads them on a thread. The children are an
accelerator only: a file a child did not hash (it failed, could not start, or printed
nothing) is hashed here, so the result and any error are those of ``file_digests`` in
this process. Only stdlib and ``read_hash`` are imported in a child (~30 ms to start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

from pipeline.sources.read_hash import file_digests

_CHILD = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from pipeline.sources.read_hash import file_digests\n"
    "for name in sys.argv[1:]:\n"
    "    print(json.dumps(file_digests(Path(name))), flush=True)\n"
)

Digests = tuple[str, list[str]]


def start_digests(files: list[Path], stop: threading.Event) -> list[Future[Digests]]:
    """``file_digests`` of each file, computed from now on: one child per core (the files
    dealt out in turn), each child's output read on a daemon thread. ``stop`` set (the
    build failed) kills the children; what they had not hashed is then not hashed."""
    futures: list[Future[Digests]] = [Future() for _ in files]
    children = max(1, min(len(files), os.cpu_count() or 1))
    for k in range(children):
        mine = list(range(k, len(files), children))
        threading.Thread(
            target=_hash_in_child,
            args=([files[i] for i in mine], [futures[i] for i in mine], stop),
            name="seam-hash",
            daemon=True,
        ).start()
    return futures


def _hash_in_child(files: list[Path], futures: list[Future[Digests]], stop: threading.Event):
    done = 0
    try:
        # The child imports ``pipeline`` from where this process does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with subprocess.Popen(
            [sys.executable, "-c", _CHILD, *map(str, files)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        ) as child:
            assert child.stdout is not None
            killer = threading.Thread(target=_kill_on, args=(stop, child), daemon=True)
            killer.start()
            for line in child.stdout:
                whole, blocks = json.loads(line)
                futures[done].set_result((whole, blocks))
                done += 1
                if done == len(files):
                    break
    except Exception:  # the child could not start or printed something else: hash here
        pass
    for f, future in zip(files[done:], futures[done:]):
        if stop.is_set():
            future.set_exception(RuntimeError("the build stopped before hashing " + str(f)))
            continue
        try:
            future.set_result(file_digests(f, stop))
        except BaseException as exc:
            future.set_exception(exc)


def _kill_on(stop: threading.Event, child: subprocess.Popen) -> None:
    """Kill ``child`` once ``stop`` is set, or return once it has exited."""
    while child.poll() is None:
        if stop.wait(0.05):
            child.kill()
            return
