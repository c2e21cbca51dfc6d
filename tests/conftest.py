"""Shared fixtures: the real tokenizer (built offline once per session) and renderers.

The objects are built by cached functions so that a process which runs the tests many
times (``tools/mutate.py`` forks one child per mutant) loads them once, before forking.
"""

from __future__ import annotations

import gc
import os
from functools import cache

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The test process's cyclic GC collects its youngest generation after this many container
# allocations instead of Python's 700. A test process holds every imported module (torch,
# transformers, the SDKs), the tokenizers and the session builds, and at 700 the collector
# ran ~27 full collections over all of it in tests/core alone: the GC took 4.6-5.2 s of
# that folder's 30-34 s of CPU, 1.7 s at 20,000 (tests/gateway: 4.0 s, 1.5 s; timed with
# gc.callbacks, two runs each). Garbage in cycles is still collected, a little later; the
# rest is freed by reference count as before. Not pipeline.build.worker.GC_YOUNG_THRESHOLD: a worker forked
# from this process must show the value the worker sets, not one it inherited
# (tests/test_executor_parts.py).
TEST_GC_YOUNG_THRESHOLD = 20_000


def pytest_configure(config):
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(TEST_GC_YOUNG_THRESHOLD, older, oldest)


# Session fixtures: the small hand-written RL and SFT builds the export and inspect tests
# share (tests/sample_builds.py), and the main jobs' builds of data/sample
# (tests/sample_outputs.py), each built once per session and only read.
pytest_plugins = ["tests.sample_builds", "tests.sample_outputs"]


@cache
def _tokenizer():
    from pipeline.core.tokenizer import load_tokenizer

    return load_tokenizer()


@cache
def _renderer(template: str | None = None):
    from pipeline.core.render import ChatRenderer
    from pipeline.core.tokenizer import load_build_tokenizer

    return ChatRenderer(
        load_build_tokenizer(None, template) if template else load_build_tokenizer()
    )


def load_shared() -> None:
    """Build every session object now (tools/mutate.py, before it forks)."""
    _tokenizer()
    _renderer()
    _renderer("chatml-tools-drop-reasoning")


@pytest.fixture(scope="session")
def tokenizer():
    """The transformers tokenizer (an independent oracle for the build's own renderer)."""
    return _tokenizer()


@pytest.fixture(scope="session")
def renderer():
    """The renderer exactly as the build uses it (torch-free tokenizer files)."""
    return _renderer()


@pytest.fixture(scope="session")
def drop_reasoning_renderer():
    return _renderer("chatml-tools-drop-reasoning")


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray instance for the session (2 CPUs, no dashboard), shared by every Ray test:
    starting Ray takes ~25 s on two cores; a second start in one run was most of a test."""
    ray = pytest.importorskip("ray", reason="Ray Data is optional: pip install 'seam-rl[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()
