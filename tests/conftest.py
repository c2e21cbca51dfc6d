"""Shared fixtures: the real tokenizer (built offline once per session) and renderers.

The objects are built by cached functions so that a process which runs the tests many
times (``tools/mutate.py`` forks one child per mutant) loads them once, before forking.
"""

from __future__ import annotations

import os
from functools import cache

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

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
