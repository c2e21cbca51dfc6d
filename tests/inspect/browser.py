"""Headless Chromium for the page tests: the DOM after load and the console messages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    return path


def load(url: str, tmp_path: Path, offline: bool = True) -> tuple[str, list[str]]:
    """(DOM after load, console messages) of ``url``; ``offline``: no host resolves."""
    args = [
        chromium_path(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        url,
    ]
    if offline:
        args.insert(1, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return result.stdout, console
