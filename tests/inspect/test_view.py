"""`seam view`: the build browser on 127.0.0.1, driven by headless Chromium."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.inspect.view_server import make_server
from tests.inspect import browser


@pytest.fixture
def served(rl_build):
    server = make_server(rl_build, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def links(dom: str) -> list[str]:
    return re.findall(r'href="(/rollout/[^"]+)"', dom)


@pytest.mark.slow
def test_every_rollout_page_is_reachable_from_the_list_without_console_errors(served, tmp_path):
    dom, console = browser.load(served + "/", tmp_path)
    assert console == []
    assert "6 rollout(s)" in dom
    pages = links(dom)
    assert [p.rsplit("/", 1)[1] for p in pages] == ["a0", "a1", "a2", "a3", "b0", "b1"]
    for page in pages:
        dom, console = browser.load(served + page, tmp_path)
        assert console == [] and 'id="segment-0"' in dom and "mark" in dom, page


def test_a_sql_filter_narrows_the_list(served, tmp_path):
    dom, console = browser.load(served + "/?where=num_compactions+%3D+2", tmp_path)
    assert console == []
    assert [p.rsplit("/", 1)[1] for p in links(dom)] == ["a2", "b0"]
    dom, _ = browser.load(served + "/?where=no_such_column+%3E+1", tmp_path)
    assert "no_such_column" in dom and links(dom) == []


@pytest.mark.slow
def test_the_report_is_served_and_nothing_is_writable(served):
    with urllib.request.urlopen(served + "/report") as response:
        assert response.status == 200 and b"data:image/png;base64," in response.read()
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(urllib.request.Request(served + "/", data=b"x", method="POST"))
    assert failed.value.code == 501
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(served + "/?where=true%3B+DROP+VIEW+rollouts")
    assert failed.value.code == 400


def test_seam_view_says_where_and_how_to_stop(rl_build):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "pipeline.cli", "view", str(rl_build), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", first).group(0)
        assert "read-only" in first and "Ctrl-C to stop" in first
        with urllib.request.urlopen(url) as response:
            assert b"6 rollout(s)" in response.read()
    finally:
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0 and "stopped" in rest


def test_a_long_list_is_cut_and_says_so(rl_build):
    from pipeline.inspect.view_server import BuildBrowser
    from pipeline.inspect.view_worker import ViewLimits

    browser = BuildBrowser(rl_build, ViewLimits(list_limit=4))
    try:
        status, html = browser.rollout_list("")
    finally:
        browser.filters.close()
    assert status == 200 and html.count("href='/rollout/") == 4
    assert "6 rollout(s); the first 4 by id are listed" in html
