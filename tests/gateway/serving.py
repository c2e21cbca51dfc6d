"""Serve an aiohttp application on 127.0.0.1 from its own event-loop thread (the tests'
model server, gateway and judge run this way, beside synchronous test code)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ThreadedApp:
    def __init__(self, app: web.Application, **runner_options):
        self._runner_options = runner_options
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(app, ready), daemon=True)
        self._thread.start()
        assert ready.wait(30), "the server did not start"

    def _run(self, app: web.Application, ready: threading.Event) -> None:
        async def main():
            runner = web.AppRunner(app, access_log=None, **self._runner_options)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
