"""--durability: what is fsync'd when, seen through an injected fsync.

``sync`` answers a call only after its line's fsync returned, and concurrent calls share
fsync rounds; ``group`` answers at once and fsyncs in the background within the window,
one fsync per file per round; ``none`` never fsyncs. (The kill -9 test for every mode is
in test_gateway.py.)"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time

import orjson
import pytest
import requests

from bench.engine_stub import make_app
from tests.gateway.serving import ThreadedApp


@pytest.fixture(scope="module")
def engine():
    served = ThreadedApp(make_app())
    yield served.url + "/v1"
    served.stop()


class Fsyncs:
    """An fsync that records what it synced and can be held until released."""

    def __init__(self, hold: bool = False, delay_s: float = 0.0):
        self.done: list[tuple[float, str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.delay_s = delay_s
        if not hold:
            self.release.set()

    def __call__(self, fd: int) -> None:
        self.started.set()
        self.release.wait(30)
        time.sleep(self.delay_s)
        os.fsync(fd)
        self.done.append((time.monotonic(), os.readlink(f"/proc/self/fd/{fd}")))


def _post(url: str, content: str = "hi") -> requests.Response:
    body = {"model": "stub", "messages": [{"role": "user", "content": content}]}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("rounds", ["fsync", "syncfs"])
def test_sync_answers_only_after_the_line_is_durable(engine, start_gateway, rounds):
    """Rounds of fsync (one per file, and a new file's directory), or of syncfs (Linux's
    default: one call per filesystem): either way a ``sync`` answer waits for its round."""
    fsyncs, syncfs = Fsyncs(hold=True), Fsyncs(hold=True)
    options = {"durability": "sync", "fsync": fsyncs}
    if rounds == "syncfs":
        options["syncfs"] = syncfs
    held = syncfs if rounds == "syncfs" else fsyncs
    gw = start_gateway(engine, recorder_options=options)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, gw.base("t", "s1"))
        assert held.started.wait(30)
        time.sleep(0.3)
        # The line is written (a killed gateway keeps it) but not yet durable: no answer.
        assert (gw.out / "calls" / "s1.jsonl").read_bytes().endswith(b"}}\n")
        assert not answer.done()
        held.release.set()
        assert answer.result(30).status_code == 200
    synced = [path for _, path in held.done]
    if rounds == "syncfs":
        assert fsyncs.done == [] and synced == [str(gw.out / "calls")]
    else:
        assert str(gw.out / "calls" / "s1.jsonl") in synced
        assert str(gw.out / "calls") in synced  # a new file: its directory entry too


def test_group_answers_at_once_and_fsyncs_in_the_background(engine, start_gateway):
    fsyncs = Fsyncs(hold=True)
    gw = start_gateway(engine, recorder_options={"durability": "group", "fsync": fsyncs})
    assert _post(gw.base("t", "g1")).status_code == 200  # answered while no fsync returned
    assert fsyncs.started.wait(5)  # the background round began within its window
    fsyncs.release.set()
    deadline = time.time() + 5
    while not fsyncs.done and time.time() < deadline:
        time.sleep(0.01)
    assert str(gw.out / "calls" / "g1.jsonl") in [p for _, p in fsyncs.done]


def test_concurrent_calls_share_fsync_rounds(engine, start_gateway):
    """8 sessions, 4 calls each, at once; each fsync takes 20 ms. ``sync``: the calls of
    different sessions share rounds (group commit), far fewer rounds than the 32 calls;
    ``group``: a file written by several calls within a window is fsync'd once."""
    for mode in ("sync", "group"):
        fsyncs = Fsyncs(delay_s=0.02)
        gw = start_gateway(
            engine, name=mode, recorder_options={"durability": mode, "fsync": fsyncs}
        )

        base = [gw.base("t", f"{mode}{i}") for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(_four_calls, base))
        syncer = gw.recorder.syncer
        gw.stop()  # drains: every written line fsync'd
        synced = [p for _, p in fsyncs.done if p.endswith(".jsonl")]
        assert set(synced) == {str(gw.out / "calls" / f"{mode}{i}.jsonl") for i in range(8)}
        if mode == "sync":
            assert len(synced) == 32 and syncer.rounds <= 16, syncer.rounds
        else:
            assert len(synced) < 32 and syncer.rounds < 16


def test_syncfs_rounds_are_one_call_per_filesystem(engine, start_gateway):
    """8 sessions, 4 calls each, at once: every round is one ``syncfs`` (all the logs are
    on one filesystem), however many files it covers; ``sync`` rounds are shared."""
    for mode in ("sync", "group"):
        fsyncs, syncfs = Fsyncs(), Fsyncs(delay_s=0.02)
        options = {"durability": mode, "fsync": fsyncs, "syncfs": syncfs}
        gw = start_gateway(engine, name=mode, recorder_options=options)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(_four_calls, [gw.base("t", f"{mode}{i}") for i in range(8)]))
        syncer = gw.recorder.syncer
        gw.stop()  # drains
        assert fsyncs.done == [] and syncer.errors == []
        assert len(syncfs.done) == syncer.rounds and 0 < syncer.rounds < 16, syncer.rounds


def test_the_default_rounds_on_linux_are_syncfs(engine, start_gateway):
    gw = start_gateway(engine, recorder_options={"durability": "sync"})
    assert _post(gw.base("t", "d1")).status_code == 200
    syncer = gw.recorder.syncer
    if sys.platform.startswith("linux"):
        assert syncer.syncfs is not None
    assert syncer.rounds >= 1 and syncer.errors == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs is Linux's")
def test_syncfs_only_on_filesystems_where_it_is_an_fsync_of_everything(tmp_path, monkeypatch):
    """On a network or FUSE filesystem syncfs may only write pages back: the recorder's
    rounds fsync each file there; on a local journaling one (or tmpfs) they use syncfs."""
    from pipeline.gateway import recorder
    from pipeline.gateway.recorder import Recorder

    assert recorder.filesystem_type(tmp_path) is not None  # read from /proc/self/mountinfo
    for kind, expected in (("ext4", True), ("nfs4", False), ("fuse.sshfs", False)):
        monkeypatch.setattr(recorder, "filesystem_type", lambda path, kind=kind: kind)
        rec = Recorder(tmp_path / kind, {"upstream": "test"}, durability="sync")
        try:
            assert (rec.syncer.syncfs is not None) is expected, kind
        finally:
            rec.close()


def _four_calls(base: str) -> None:
    for k in range(4):
        assert _post(base, f"call {k}").status_code == 200


def test_none_never_fsyncs_and_gateway_ms_counts_the_write(engine, start_gateway):
    fsyncs = Fsyncs()
    gw = start_gateway(engine, recorder_options={"durability": "none", "fsync": fsyncs})
    assert _post(gw.base("t", "n1")).status_code == 200
    gw.stop()
    assert fsyncs.done == []
    record = orjson.loads((gw.out / "calls" / "n1.jsonl").read_bytes())
    seam = record["seam"]
    assert list(seam)[-1] == "gateway_ms" and 0 < seam["gateway_ms"] < 10_000


def test_group_a_line_written_during_a_round_gets_the_next_round(tmp_path):
    """``Syncer.written`` returns at once for a file already in the coming round (group
    mode): a line written while a round runs is not in that round's batch, so it must
    start the next one, and further lines before that round are covered by it."""
    import asyncio

    from pipeline.gateway.recorder import Syncer

    fsyncs = Fsyncs(hold=True)
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"{}\n")

    async def scenario() -> list[int]:
        syncer = Syncer("group", window_s=0.01, fsync=fsyncs, syncfs=None)
        syncer.written(path)
        await asyncio.to_thread(fsyncs.started.wait, 30)  # round 1 runs, held
        syncer.written(path)  # after round 1 took its batch: the next round's
        syncer.written(path)  # already in it
        seen = [syncer.rounds]
        fsyncs.release.set()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if syncer.rounds >= 2:
                break
        seen.append(syncer.rounds)
        await syncer.drain()
        seen.append(syncer.rounds)
        return seen

    assert asyncio.run(scenario()) == [0, 2, 2]
    assert len(fsyncs.done) == 2
