"""Fixtures: a tiny model server, and a gateway in front of it, both on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("aiohttp")

from tests.gateway.model_server import ModelServer


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

    def __init__(self, out: Path, upstream: str, judge_factory=None, **config):
        from pipeline.gateway.recorder import Recorder
        from pipeline.gateway.server import Gateway, GatewayConfig

        self.out = out
        self.recorder = Recorder(out, {"upstream": upstream})
        self.gateway = Gateway(
            GatewayConfig(upstream=upstream, **config), self.recorder, judge_factory
        )
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(30), "gateway did not start"

    def _run(self, ready):
        from aiohttp import web

        async def main():
            runner = web.AppRunner(self.gateway.app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())

    def base(self, task: str, rollout: str) -> str:
        return f"{self.url}/s/{task}/{rollout}"

    def stop(self):
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.recorder.close()


@pytest.fixture
def start_gateway(tmp_path):
    running = []

    def start(upstream: str, judge_factory=None, name: str = "collect", **config):
        gw = RunningGateway(tmp_path / name, upstream, judge_factory, **config)
        running.append(gw)
        return gw

    yield start
    for gw in running:
        gw.stop()
