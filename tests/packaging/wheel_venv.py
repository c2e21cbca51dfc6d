"""Build seam's wheel and install it into a real virtual environment (tests/packaging/).

The wheel is built from a copy of the sources (what an sdist would hold: pyproject.toml,
README.md and the packages), so a stale ``build/`` folder or an untracked file in the
checkout cannot hide a file the wheel lacks. The environment is a plain ``python -m venv``
(no system site-packages, nothing of the checkout on ``sys.path``) that pip fills from
the wheel's own metadata: its dependencies come from the package registry the first time
and are then kept in seam's cache folder, ``$SEAM_CACHE_DIR/wheel-venvs`` or
``~/.cache/seam/wheel-venvs`` (``SEAM_WHEEL_VENV_CACHE`` overrides; keyed by the wheel's
requirements and the Python version, so a changed dependency list makes a new one); every
run reinstalls the fresh wheel into it with ``--force-reinstall --no-deps`` (the old files
are removed first, and the ``seam`` script is written again for the folder it is in).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import tomllib

from pipeline.core.tokenizer import cache_dir

ROOT = Path(__file__).resolve().parents[2]
# In seam's cache folder (not the checkout), so that a fresh clone — CI's — on the same
# machine finds the environment made before instead of installing ~700 MB again.
CACHE = Path(os.environ.get("SEAM_WHEEL_VENV_CACHE") or cache_dir() / "wheel-venvs")


def packages() -> list[str]:
    """The top-level package folders pyproject.toml's ``find`` includes."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*").rstrip(".") for p in patterns})


def build_wheel(dest: Path) -> Path:
    """Build the wheel from a copy of the sources into ``dest``; return its path."""
    src = dest / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in packages():
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    # setuptools >= 77 (pyproject's build-system) is in the dev extra: no download here.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(dest / "dist"), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (dest / "dist").glob("seam_rl-*.whl")
    return wheel


def requirements(wheel: Path, extras: tuple[str, ...]) -> list[str]:
    """The ``Requires-Dist`` lines of ``wheel`` that apply with ``extras``."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    lines = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    wanted = []
    for line in lines:
        extra = re.search(r"extra == \"([^\"]+)\"", line)
        if extra is None or extra.group(1) in extras:
            wanted.append(line)
    return sorted(wanted)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a command run from the installed wheel: nothing of the checkout
    (no PYTHONPATH), the tokenizer cache shared (built offline, never downloaded)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", NO_COLOR="1", COLUMNS="120", **extra)
    return env


def install(wheel: Path, extras: tuple[str, ...]) -> Path:
    """A virtual environment holding ``wheel`` with ``extras`` (cached; see the module
    docstring); returns its folder."""
    key = hashlib.sha256(
        "\n".join([sys.version, *extras, *requirements(wheel, extras)]).encode()
    ).hexdigest()[:16]
    venv = CACHE / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be filling the same one
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)  # an install cut short is not reused
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
            _pip(python, "install", "-q", "--disable-pip-version-check", spec)
            (venv / ".complete").touch()
            _prune(keep=venv)
        _pip(python, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
        (venv / ".complete").touch()  # used now: not pruned by another checkout's run
    return venv


def _prune(keep: Path, days: float = 2.0) -> None:
    """Remove the environments of older requirement lists (~700 MB each) not used for
    ``days`` (each run touches its ``.complete``); a recent one may be another checkout's."""
    for venv in CACHE.glob("py*-*"):
        marker = venv / ".complete"
        unused = venv != keep and venv.is_dir() and marker.exists()
        if unused and time.time() - marker.stat().st_mtime > days * 86400:
            shutil.rmtree(venv, ignore_errors=True)


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", *args], capture_output=True, text=True, env=clean_env()
    )
    if done.returncode:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
