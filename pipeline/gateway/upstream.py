"""The gateway's HTTP/1.1 client for its calls to the engine (``POST …/chat/completions``).

Why its own: aiohttp's ``ClientSession`` cost the gateway about 0.57 ms of CPU per call
on the chat path, against 0.11 ms for a relay whose upstream leg is a plain asyncio
``Protocol`` (measured in front of ``bench/engine_stub.py`` on the quiet VM; the
gateway's server side stays aiohttp, whose cost is small). This client does only what
that leg needs, on either event loop (asyncio's or uvloop's):

- **Connections**: a pool of persistent connections (``Upstream``). The one used last is
  reused first (the least likely to have hit the engine's idle timer); one idle longer
  than ``IDLE_S`` is closed instead of reused. ``connections`` caps the connections open
  at once (0: no cap; a call over the cap waits for one, within its total timeout).
- **Requests**: ``POST target HTTP/1.1`` with ``Host``, ``Content-Type:
  application/json``, ``Accept-Encoding: identity`` (an answer is never compressed: a
  ``Content-Encoding`` other than identity is an error), ``Content-Length`` and the
  endpoint's own headers (its ``Authorization``: the key never goes into the target).
- **Answers** are parsed by ``httptools`` (llhttp): a body delimited by
  ``Content-Length``, by chunked transfer coding, or by the connection's close (no length
  and not chunked, RFC 9112 §6.3 rule 8: the message ends at EOF, which llhttp cannot be
  told, so ``connection_lost`` ends it). Interim 1xx answers are skipped. A connection is
  reused only when its answer was read whole and llhttp says keep-alive (HTTP/1.1
  without ``Connection: close``, or HTTP/1.0 with ``keep-alive``).
- **Limits**: ``timeout`` bounds a whole call (waiting for a connection, connecting,
  sending, the answer's last byte, a streamed one's too); ``connect_timeout`` bounds
  opening a connection (TLS handshake included); an answer over ``max_body`` bytes is
  refused (``AnswerTooLarge``) without holding more than that.
- **Failures** are ``UpstreamError`` (refused, reset, closed mid-answer, not HTTP),
  ``UpstreamTimeout`` (also a ``TimeoutError``) or ``AnswerTooLarge``, each with a
  one-line message.
- **One retry**: a kept-alive connection that the engine closed or reset before any byte
  of the answer (its idle close crossed our request; it gave 3% 502s) is retried once,
  on a new connection. Nothing else is retried: not a new connection's failure, not a
  timeout, not a connection that had begun to answer (the engine did work).
- **Streams** (``post_stream``): the ``Response`` comes at the answer's headers, and its
  body is read as it arrives (``iter_any``: whatever bytes came, no line limit); reading
  pauses past ``HIGH_WATER`` bytes not yet taken. ``release()`` before the end closes
  the connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote, urlsplit

import httptools

IDLE_S = 15.0  # an idle connection older than this is closed, not reused (aiohttp's default)
HIGH_WATER = 1 << 20  # stream bytes received and not yet taken before reading pauses
_SAFE_TARGET = "/%:@!$&'()*+,;=-._~?"  # RFC 3986 pchar / query characters: left unquoted
# A request body: bytes, or its pieces in order (written as they are, not joined)
Body = bytes | list[bytes]


class UpstreamError(Exception):
    """A call to the engine failed; the message says how (one line, no key)."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The engine did not connect or answer in time."""


class AnswerTooLarge(UpstreamError):
    """The engine's answer is larger than --max-response-mb."""


class _Dropped(UpstreamError):
    """A kept-alive connection closed or reset before any byte of the answer: retryable."""


class Response:
    """A streamed answer: its status and headers (names lower-cased), and its body as
    it arrives (``iter_any``, ``read``). The connection enforces the size cap and the
    call's timeout; an error is raised after the bytes that came before it."""

    def __init__(self, conn: _Connection, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self._conn: _Connection | None = conn
        self._pieces: list[bytes] = []
        self._pending = 0  # bytes in _pieces
        self._paused = False
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come, in pieces of any size."""
        while True:
            if self._pieces:
                data = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
                self._pieces, self._pending = [], 0
                if self._paused:
                    self._paused = False
                    if self._conn is not None:
                        self._conn.resume()
                yield data
            elif self._error is not None:
                raise self._error
            elif self._ended:
                return
            else:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([piece async for piece in self.iter_any()])

    def release(self) -> None:
        """Done with the answer: an unfinished one closes its connection."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._ended:
            conn.abandon()

    # -- fed by the connection

    def _feed(self, data: bytes) -> bool:
        """Take a piece; True when the connection should pause reading now."""
        self._pieces.append(data)
        self._pending += len(data)
        self._wake()
        if self._pending > HIGH_WATER and not self._paused:
            self._paused = True
            return True
        return False

    def _end(self) -> None:
        self._ended, self._conn = True, None
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error, self._conn = exc, None
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One connection to the engine, answering one request at a time (no pipelining).
    Also the parser's callback object (``on_header``, ``on_body``, ...)."""

    def __init__(self, pool: Upstream) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.counted = False  # in pool.open (set once connected)
        self.answered = 0  # answers read whole on this connection
        self.idle_since = 0.0
        self.busy = False  # a request was sent and its answer is not complete
        self._reset()

    def _reset(self) -> None:
        self.waiter: asyncio.Future | None = None  # the caller's: (status, body) or Response
        self.stream: Response | None = None
        self.streamed = False
        self.timer: asyncio.TimerHandle | None = None
        self.cap = 0
        self.got_bytes = False
        self.interim = False  # a 1xx answer is being read
        self.header_list: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.headers_done = False
        self.until_close = False  # the body ends when the connection does
        self.body: list[bytes] = []
        self.size = 0
        self.complete = False
        self.keep_alive = False

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: this connection cannot be trusted
            self.abandon()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, UpstreamError):
                self._failed(cause)
            else:
                self._failed(UpstreamError(f"the engine's answer is not usable HTTP: {cause}"))
            return
        except Exception as exc:  # llhttp's HttpParserError and its kin
            self._failed(UpstreamError(f"the engine's answer is not valid HTTP/1.1: {exc}"))
            return
        if self.complete:
            self._finished()

    def eof_received(self) -> bool | None:
        return None  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._forget(self)
        if not self.busy:
            return
        if self.headers_done and self.until_close and not self.complete:
            self.keep_alive = False  # the close was the body's end
            self._finished()
            return
        how = f" ({exc})" if exc is not None else ""
        if not self.got_bytes and self.answered:
            self._failed(_Dropped(f"the engine closed a kept-alive connection{how}"))
        elif not self.got_bytes:
            self._failed(UpstreamError(f"the engine closed the connection before answering{how}"))
        else:
            self._failed(UpstreamError(f"the engine closed the connection mid-answer{how}"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # more after the answer, unasked: stop here (the connection closes)
            raise UpstreamError("the engine sent more than one answer")
        self.header_list = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_list.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the real answer follows
            self.interim = True
            return
        self.status, self.headers_done = status, True
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in self.header_list
        }
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", ""):
            raise UpstreamError(f"the engine's answer is encoded ({encoding}), not asked for")
        length = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if length is not None and not chunked and int(length) > self.cap:
            raise AnswerTooLarge(
                f"the engine's answer has {int(length):,} bytes, over {self.cap:,}"
            )
        self.until_close = length is None and not chunked and status not in (204, 304)
        if self.streamed:
            self.stream = Response(self, status, headers)
            self._resolve(self.stream)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.cap:
            raise AnswerTooLarge(f"the engine's answer is over {self.cap:,} bytes")
        if self.stream is not None:
            if self.stream._feed(body) and self.transport is not None:
                self.transport.pause_reading()
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        # Read here: llhttp clears the flags it is computed from once this returns.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    # -- one exchange

    def send(self, data: list[bytes], deadline: float, cap: int, streamed: bool) -> asyncio.Future:
        loop = self.pool.loop
        self._reset()
        self.busy, self.cap, self.streamed = True, cap, streamed
        self.waiter = loop.create_future()
        self.timer = loop.call_at(deadline, self._timed_out)
        assert self.transport is not None
        self.transport.writelines(data)
        return self.waiter

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abandon(self) -> None:
        """Close this connection now (an unfinished answer, a cancelled call)."""
        if self.busy:
            self._failed(UpstreamError("the call was abandoned"))
        elif self.transport is not None:
            self.transport.abort()

    def _resolve(self, result) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def _finished(self) -> None:
        """The answer is complete: hand it over, then reuse or close the connection."""
        if self.timer is not None:
            self.timer.cancel()
        self.busy = False
        self.answered += 1
        waiter, stream = self.waiter, self.stream
        result = (self.status, b"".join(self.body))
        keep = self.keep_alive and not self.lost
        self._reset()
        if stream is not None:
            if stream._paused and keep:
                self.resume()
            stream._end()
        elif waiter is not None and not waiter.done():
            waiter.set_result(result)
        if keep:
            self.pool._release(self)
        else:
            self.pool._discard(self)

    def _failed(self, exc: UpstreamError) -> None:
        """The exchange failed: tell whoever waits, and close the connection."""
        if self.timer is not None:
            self.timer.cancel()
        self.busy = False
        waiter, stream = self.waiter, self.stream
        self._reset()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        elif stream is not None:
            stream._fail(exc)
        self.pool._discard(self, abort=True)  # its place under the cap is free at once

    def _timed_out(self) -> None:
        self.timer = None
        self._failed(UpstreamTimeout(f"the engine did not answer within {self.pool.timeout:g} s"))


class Upstream:
    """A pool of connections to one engine, and its two calls: ``post`` (the whole answer)
    and ``post_stream`` (the answer as it arrives). ``url`` is the engine's base URL
    without credentials (``split_url``); ``headers`` go with every request."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connections: int = 0,
        connect_timeout: float = 30.0,
        timeout: float = 600.0,
        max_body: int = 64 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the engine's URL must be http(s)://HOST[:PORT]/..., not {url!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        default_port = 443 if self.tls else 80
        self.port = parts.port or default_port
        self.ssl = (ssl_context or ssl.create_default_context()) if self.tls else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.query = parts.query
        lines = [
            f"Host: {self.host_header}",
            "Content-Type: application/json",
            "Accept-Encoding: identity",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        if any(c in line for line in lines for c in "\r\n\0"):
            raise ValueError("a header for the engine holds a line break")
        self._fields = "".join(line + "\r\n" for line in lines).encode("latin-1")
        self._heads: dict[str, bytes] = {}
        self.connections = connections
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_body = max_body
        self.open = 0  # connections open or opening (what the cap counts)
        self._idle: dict[_Connection, None] = {}  # insertion-ordered: popitem() is the last
        self._waiters: deque[asyncio.Future] = deque()  # calls waiting under the cap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def target(self, path: str) -> str:
        """The request target for ``path`` under the base URL (its query kept after it)."""
        target = quote(self.base_path + path, safe=_SAFE_TARGET)
        return target + "?" + quote(self.query, safe=_SAFE_TARGET) if self.query else target

    def _request(self, path: str, body: Body) -> list[bytes]:
        """The request's bytes in pieces: the head, then the body's pieces as they are
        (written with one ``writelines``; joining a 160 KB body to its head was a copy)."""
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = (
                f"POST {self.target(path)} HTTP/1.1\r\n".encode("latin-1")
                + self._fields
                + b"Content-Length: "
            )
        pieces = [body] if isinstance(body, bytes) else body
        return [b"%s%d\r\n\r\n" % (head, sum(map(len, pieces))), *pieces]

    async def post(self, path: str, body: Body) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``: (status, the whole answer body)."""
        return await self._exchange(path, body, False)

    async def post_stream(self, path: str, body: Body) -> Response:
        """POST ``body`` to ``path``: the ``Response`` once its headers arrived."""
        return await self._exchange(path, body, True)

    async def _exchange(self, path: str, body: Body, streamed: bool):
        loop = self.loop
        deadline = loop.time() + self.timeout
        data = self._request(path, body)
        for fresh in (False, True):
            conn = await self._acquire(deadline, fresh)
            waiter = conn.send(data, deadline, self.max_body, streamed)
            try:
                return await waiter
            except _Dropped:
                if fresh:  # cannot be: a fresh connection is never kept-alive
                    raise
            except BaseException:  # cancelled: the answer will never be read
                if conn.busy:
                    conn.abandon()
                raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close every idle connection (calls in flight close theirs when they end)."""
        self._closed = True
        while self._idle:
            conn, _ = self._idle.popitem()
            if conn.transport is not None:
                conn.transport.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()

    # -- the pool

    async def _acquire(self, deadline: float, fresh: bool) -> _Connection:
        """A connection for one call: the idle one used last, else a new one (``fresh``:
        always a new one), else, at the cap, the next one to come free."""
        while True:
            if self._closed:
                raise UpstreamError("the gateway is stopping")
            if not fresh:
                conn = self._idle_connection()
                if conn is not None:
                    return conn
            elif self._idle and self._full():
                self._discard(next(iter(self._idle)))  # room for the fresh one
            if not self._full():
                return await self._connect(deadline)
            got = await self._wait_turn(deadline)
            if got is not None:
                if not fresh and not got.lost:
                    return got
                self._discard(got)

    def _full(self) -> bool:
        return bool(self.connections) and self.open >= self.connections

    def _idle_connection(self) -> _Connection | None:
        now = self.loop.time()
        while self._idle:
            conn, _ = self._idle.popitem()
            if now - conn.idle_since <= IDLE_S:
                return conn
            self._discard(conn)  # the engine may be closing it: not worth the retry
        return None

    async def _wait_turn(self, deadline: float) -> _Connection | None:
        """Wait under the cap: a connection someone released, or None (one closed, so a
        new one may be opened)."""
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter, max(0.0, deadline - self.loop.time()))
        except BaseException as exc:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled():  # handed a turn it will not take
                got = waiter.result()
                if got is not None:
                    self._release(got)
                else:
                    self._turn(None)
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout(
                    f"no connection to the engine came free within {self.timeout:g} s "
                    f"(--upstream-connections {self.connections})"
                ) from None
            raise

    async def _connect(self, deadline: float) -> _Connection:
        loop = self.loop
        self.open += 1
        left = deadline - loop.time()
        timeout = max(0.0, min(self.connect_timeout, left))
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.tls else None,
                ),
                timeout,
            )
        except BaseException as exc:
            self.open -= 1
            self._turn(None)
            if isinstance(exc, TimeoutError):
                limit = (
                    f"{self.connect_timeout:g} s"
                    if self.connect_timeout <= left
                    else f"the call's {self.timeout:g} s"
                )
                raise UpstreamTimeout(
                    f"no connection to the engine at {self.host_header} within {limit}"
                ) from None
            if isinstance(exc, (OSError, ssl.SSLError)):
                reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
                raise UpstreamError(
                    f"cannot connect to the engine at {self.host_header}: {reason}"
                ) from None
            raise
        conn.counted = True
        if conn.lost:  # closed before we got it
            self._forget(conn)
            raise UpstreamError(f"the engine at {self.host_header} closed the connection at once")
        return conn

    def _release(self, conn: _Connection) -> None:
        """A connection free for the next call: to a call waiting under the cap, else idle."""
        if self._closed:
            assert conn.transport is not None
            conn.transport.close()
            return
        if self._turn(conn):
            return
        conn.idle_since = self.loop.time()
        self._idle[conn] = None

    def _turn(self, conn: _Connection | None) -> bool:
        """Give the first call waiting under the cap ``conn`` (None: room to open one)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def _discard(self, conn: _Connection, abort: bool = False) -> None:
        """Close a connection no call will use again; its place under the cap is free at
        once (not when the loop reports it closed: a call waiting may open one now)."""
        self._idle.pop(conn, None)
        if conn.counted:
            conn.counted = False
            self.open -= 1
            self._turn(None)
        if conn.transport is not None:
            if abort:
                conn.transport.abort()
            else:
                conn.transport.close()

    def _forget(self, conn: _Connection) -> None:
        """A connection is gone: out of the pool, and its place under the cap is free."""
        self._idle.pop(conn, None)
        if conn.counted:
            conn.counted = False
            self.open -= 1
            self._turn(None)
