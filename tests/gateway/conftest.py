"""Fixtures: a tiny model server, and a gateway in front of it, both on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("aiohttp")

from tests.gateway.model_server import ModelServer
from tests.gateway.serving import ThreadedApp


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from trainer.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("gateway-model") / "tiny")


@pytest.fixture
def model_server(tiny_model_dir):
    server = ModelServer(str(tiny_model_dir)).start()
    yield server
    server.stop()


class RunningGateway:
    """A ``Gateway`` served on its own event loop thread, as ``seam gateway`` serves it."""

    def __init__(
        self, out: Path, upstream: str, judge_factory=None, recorder_options=None, **config
    ):
        from pipeline.gateway.recorder import Recorder
        from pipeline.gateway.server import Gateway, GatewayConfig

        self.out = out
        self.recorder = Recorder(out, {"upstream": upstream}, **(recorder_options or {}))
        self.gateway = Gateway(
            GatewayConfig(upstream=upstream, **config), self.recorder, judge_factory
        )
        self._served = ThreadedApp(
            self.gateway.app(), keepalive_timeout=self.gateway.config.client_timeout_s
        )
        self.url = self._served.url

    def base(self, task: str, rollout: str) -> str:
        return f"{self.url}/s/{task}/{rollout}"

    def stop(self):
        if self.recorder is not None:  # a test may stop it before the fixture does
            self._served.stop()
            self.recorder.close()
            self.recorder = None


@pytest.fixture
def start_gateway(tmp_path):
    running = []

    def start(
        upstream: str, judge_factory=None, name: str = "collect", recorder_options=None, **config
    ):
        gw = RunningGateway(tmp_path / name, upstream, judge_factory, recorder_options, **config)
        running.append(gw)
        return gw

    yield start
    for gw in running:
        gw.stop()
