"""Run ``seam view`` filters in a child process that can be stopped.

DuckDB's ``interrupt()`` stops a query between vectors, but some work never looks:
``repeat(rollout_id, 2000000000)`` ran 41 s and reached 3.9 GB past an interrupt and a
1 GB ``memory_limit`` (measured, DuckDB 2.0). So the filter runs in a child process:

- the child opens the locked connection (``views.connect(..., locked=Limits)``), then
  caps its own data segment (``RLIMIT_DATA``: what it holds now + ``memory_mb`` + 512
  MiB for Python and DuckDB's own allocations), so no filter can take the machine's
  memory;
- a timer in the child calls ``interrupt()`` at ``timeout_s``, and so does a cancel
  message, which the server sends when the client has gone;
- the server kills the child when no answer comes ``GRACE_S`` later (or when it has
  died), answers with the reason, and starts a new one for the next filter.

One child serves one filter at a time (the server's threads queue on a lock): a second
filter waits for the first, which is bounded by the timeout.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from pipeline.inspect.duckdb_views import BuildDirError, Limits
from pipeline.inspect.view_filter import LIST_LIMIT, FilterError, check_filter, rollout_list_sql

GRACE_S = 2.0  # after the timeout or a cancel, how long the child has to answer
POLL_S = 0.05  # how often the server looks at the client and the child
HEADROOM_MB = 512  # the child's data beyond what it holds after connecting + memory_mb
# Messages to the child: ("filter", where) or CANCEL; from it: ("ready",), ("ok", total,
# rows), ("error", message), or ("timeout" | "cancelled", whether the query runs on).
CANCEL = ("cancel",)


class ClientGone(Exception):
    """The client closed its connection while its filter ran; the filter was stopped."""


@dataclass(frozen=True)
class ViewLimits:
    """The limits of one ``seam view`` server."""

    timeout_s: float = 10.0
    duckdb: Limits = field(default_factory=Limits)
    list_limit: int = LIST_LIMIT


class FilterWorker:
    """The server's handle on its filter process (started on first use)."""

    def __init__(self, build_dir: str | Path, limits: ViewLimits):
        self.build_dir = str(build_dir)
        self.limits = limits
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        """Start the child now and wait until its views are open: a directory that is not
        a build raises ``BuildDirError`` here, with its one-line reason."""
        with self._lock:
            self._started()

    def rollouts(
        self, where: str, client_gone: Callable[[], bool] = lambda: False
    ) -> tuple[int, list[tuple]]:
        """The number of rollouts ``where`` selects and the first ``list_limit`` of them."""
        with self._lock:
            conn = self._started()
            conn.send(("filter", where))
            deadline = time.monotonic() + self.limits.timeout_s + GRACE_S
            cancelled = False
            while not conn.poll(POLL_S):
                if self._process is None or self._process.poll() is not None:
                    self._stop()
                    raise FilterError(
                        f"the filter was stopped: it needed more memory than "
                        f"{self.limits.duckdb.memory_mb} MB (seam view --memory-mb)"
                    )
                if not cancelled and client_gone():
                    conn.send(CANCEL)
                    cancelled = True
                    deadline = min(deadline, time.monotonic() + GRACE_S)
                if time.monotonic() > deadline:
                    self._stop()
                    if cancelled:
                        raise ClientGone()
                    raise FilterError(self._timeout_message())
            status, *reply = conn.recv()
            if status in ("timeout", "cancelled") and reply[0]:
                self._stop()  # its query runs on past interrupt(): end the process
        if cancelled:
            raise ClientGone()
        if status == "error":
            raise FilterError(reply[0])
        if status == "timeout":
            raise FilterError(self._timeout_message())
        return reply[0], reply[1]

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _timeout_message(self) -> str:
        return (
            f"the filter ran past {self.limits.timeout_s:g} s and was stopped (seam view --timeout)"
        )

    def _started(self) -> Connection:
        if self._process is not None and self._process.poll() is None and self._conn:
            return self._conn
        self._stop()
        # A fresh interpreter running this module (never a fork of a threaded server, and
        # unlike multiprocessing's spawn it does not re-import the caller's __main__),
        # talking over a socket pair; PYTHONPATH puts this very seam first.
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.inspect.view_worker", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        conn = Connection(ours.detach())
        self._process, self._conn = process, conn
        try:
            conn.send((self.build_dir, self.limits))
            status, *reply = conn.recv()
        except (EOFError, OSError):
            status, reply = "error", ["the filter process died while opening the build"]
        if status != "ready":
            self._stop()
            raise BuildDirError(reply[0])
        return conn

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None


def serve(conn: Connection) -> None:
    """The child: open the locked views, cap memory, answer filters until the pipe closes."""
    from pipeline.inspect.duckdb_views import connect, view_names

    build_dir, limits = conn.recv()
    try:
        con = connect(build_dir, locked=limits.duckdb)
    except BuildDirError as exc:
        conn.send(("error", str(exc)))
        return
    views = view_names(con)
    _cap_data(limits.duckdb.memory_mb + HEADROOM_MB)
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message == CANCEL:  # a cancel that arrived after its filter had answered
            continue
        conn.send(_answer(con.cursor(), message[1], views, conn, limits))


def _answer(cur, where: str, views: list[str], conn, limits: ViewLimits) -> tuple:
    """Run one filter on its own thread; interrupt it at the timeout or on a cancel."""
    result: list[tuple] = []

    def run() -> None:
        try:
            check_filter(cur, where, views)
            count_sql, list_sql = rollout_list_sql(where, limits.list_limit)
            (total,) = cur.execute(count_sql).fetchone() or (0,)
            result.append(("ok", total, cur.execute(list_sql).fetchall()))
        except FilterError as exc:
            result.append(("error", str(exc)))
        except Exception as exc:  # the user's SQL (or memory): its one-line error
            result.append(("error", (str(exc).splitlines() or [type(exc).__name__])[0]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + limits.timeout_s
    stopped = None
    while thread.is_alive():
        thread.join(POLL_S)
        if stopped is None and time.monotonic() > deadline:
            stopped = "timeout"
        elif stopped is None and conn.poll() and conn.recv() == CANCEL:
            stopped = "cancelled"
        if stopped is not None:
            cur.interrupt()
            thread.join(GRACE_S / 2)
            # Still running: work that never looks at interrupt() (one huge repeat()).
            # Only the end of this process stops it; the server kills it and starts anew.
            return (stopped, thread.is_alive())
    return result[0]


def _cap_data(extra_mb: int) -> None:
    """Cap this process's data segment at what it holds now plus ``extra_mb``
    (``RLIMIT_DATA`` counts heap and private writable mappings, not shared libraries, so
    DuckDB's own 800 MB of mapped code does not eat the budget)."""
    used_kb = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                used_kb = int(line.split()[1])
    except OSError:  # no /proc (not Linux): the memory_limit alone bounds DuckDB
        return
    cap = (used_kb // 1024 + extra_mb) * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
