"""The gateway's aiohttp application: route, translate, forward, judge, record, answer.

Sessions. A call belongs to the session named in its URL path
(``/s/TASK_ID/ROLLOUT_ID/v1/...``: set it as the harness's base URL) or in the headers
``X-Seam-Task-Id`` / ``X-Seam-Rollout-Id``. The rollout id names the call log and is
the rollout's id in the build; the task id is its GRPO group key. Calls of one session
are handled one at a time, in arrival order (a harness waits for each answer; a
sub-agent that runs in parallel should get its own rollout id). Sessions run
concurrently.

Token ids. With ``--token-ids auto`` (the default) the gateway asks the engine for
``logprobs`` and ``return_token_ids`` (vLLM's and SGLang's names); an engine that
rejects those parameters is asked again without them, and from then on the gateway
records text only. ``gateway.json`` says which calls carry ids. The harness gets the
fields it asked for, not the ones the gateway added.

Rewrites are found online: each request is compared with the session's previous request
plus its response, and the call records ``extends_previous``. A request whose last user
message is a compaction prompt (``--summary-prompt``, defaults for Claude Code, Codex
and OpenHands) makes its call a summary call (``kind: "summary"``); the reader also
recognises a summary call afterwards, when its text reappears in the next context.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from pipeline.common import http_guard
from pipeline.common.credentials import split_url, with_path
from pipeline.common.redact import Redactor
from pipeline.gateway import streaming
from pipeline.gateway.config import GatewayConfig
from pipeline.gateway.dialects import (
    DialectError,
    anthropic_sse,
    anthropic_to_openai,
    openai_sse,
    openai_to_anthropic,
    openai_to_responses,
    responses_sse,
    responses_to_openai,
)
from pipeline.gateway.judging import JudgeFailed, LoopJudge
from pipeline.gateway.recorder import Recorder, check_id
from pipeline.gateway.request_prefix import NONCE, SENTINEL, RequestParser
from pipeline.gateway.upstream import Response, Upstream, UpstreamError
from pipeline.readers import call_delta, raw_ids
from pipeline.sources.limits import check_depth

TOKEN_ID_PARAMS = {"logprobs": True, "return_token_ids": True}
MAX_REQUEST_BYTES = 256 * 1024 * 1024
TRANSLATE = {"anthropic": anthropic_to_openai, "responses": responses_to_openai}


@dataclass
class Session:
    """What the gateway keeps of a session between its calls: what the online marking and
    the next delta record need (the last delivered call, whole; its messages normalized),
    not every record (memory grew with everything ever logged: 630 → 1,852 MB over 1,200
    calls). ``calls`` holds the records only for a judge, which reviews the whole session."""

    rollout_id: str
    task_id: str
    loaded: bool = False  # the call log of an earlier gateway process was read
    calls: list[tuple[int, dict, str]] = field(default_factory=list)  # (line, record, raw)
    base: dict | None = None  # the last delivered call's full record (a delta's base)
    base_call: int | None = None  # its seam.call
    next_call: int = 1  # seam.call of the next record
    since_full: int = 0  # delta records since the chain's full record
    # The history list of the last request body whose depth was checked (``_check_depth``),
    # and what that check found: (this call's history, that earlier list, how many leading
    # items are equal), so the comparisons after it (extends_previous, the delta) need not
    # compare the history again. Matched by identity: it holds for exactly those lists.
    checked: list | None = None
    same_prefix: tuple[list, list, int] | None = None
    checked_body: dict | None = None  # that body: its other members passed the check too
    # The last user message's text the summary prompts were searched in, and the finding:
    # an agent's last user message is often the same for many calls (its tool outputs
    # come as tool messages), and the case-blind search costs ~75 ns a character.
    summary_memo: tuple[str, bool] | None = None
    parser: RequestParser = field(default_factory=RequestParser)  # its requests' bytes
    # The history list last sent upstream and its items serialized (joined, they are the
    # array's bytes without the brackets): the next request's history starts with that
    # list's items (``parser.prior``), which are not serialized again (``_payload``).
    sent: tuple[list, list[bytes]] | None = None

    def known_equal(self, history: list, before: Any) -> int:
        """How many leading items of ``history`` are known to equal ``before``'s."""
        memo = self.same_prefix
        return memo[2] if memo is not None and memo[0] is history and memo[1] is before else 0


def _norm(msg: dict) -> dict:
    """The parts of a message that reach the model (for the extends-previous test)."""
    content = msg.get("content")
    out = {
        "role": msg.get("role"),
        "content": content if isinstance(content, str) or content is None else json.dumps(content),
    }
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            ((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
            for c in msg["tool_calls"]
        ]
    if msg.get("tool_call_id"):
        out["tool_call_id"] = msg["tool_call_id"]
    if not out["content"]:
        out["content"] = ""
    return out


def _extends(messages: list, base: dict, known: int = 0) -> bool:
    """Whether a request's ``messages`` extend the previous call's (``base``) request plus
    its answer, compared as the model sees them (``_norm``). The request part is compared
    as sent first (one C-level list comparison: a harness re-sends it unchanged), and
    only the answer, which harnesses re-send in their own form, is normalized; messages
    that differ as sent fall back to normalizing all of them. Equal as sent implies equal
    normalized, so the answer is the one the full normalization gives, without its
    per-call cost in the history's length (and without a normalized copy of the history
    kept per session). ``known``: how many leading messages are already known to be
    equal as sent (the depth check compared them: ``Session.known_equal``)."""
    sent_before = base["request"].get("messages") or []
    answer = call_delta._answer_message(base["response"]) or {}
    k = len(sent_before)
    if len(messages) < k + 1:
        return False
    if known >= k or messages[:k] == sent_before:
        return _norm(messages[k]) == _norm(answer)
    prefix = [*sent_before, answer]
    return [_norm(m) for m in messages[: k + 1]] == [_norm(m) for m in prefix]


class Gateway:
    def __init__(
        self, config: GatewayConfig, recorder: Recorder, judge_factory=None, stats=None
    ) -> None:
        # A key in the upstream URL goes into a header; config.upstream, the URL the
        # banner prints and gateway.json records, holds none (pipeline/common/credentials.py).
        self.endpoint = split_url(config.upstream, bearer=config.api_key)
        self.config = dataclasses.replace(config, upstream=self.endpoint.url)
        self.redactor = Redactor(*self.endpoint.secrets)
        self.recorder = recorder
        self.judge_factory = judge_factory  # (client session) -> LoopJudge | None
        self.judge: LoopJudge | None = None
        self.sessions: dict[str, Session] = {}
        self.token_ids = config.token_ids != "off"
        # Models whose engine refused the token-id parameters (decided per model, on a
        # retry that succeeded without them; see _forward).
        self.models_without_ids: set[str] = set()
        self.summary_re = re.compile("|".join(f"(?:{p})" for p in config.summary_prompts), re.I)
        self.summary_starts = _literal_starts(config.summary_prompts)
        # The names it answers to, fixed at start (they were worked out on every call).
        self._allowed = http_guard.names(config.listen_host, config.allow_hosts)
        self._checks_host = bool(
            config.listen_host not in http_guard.WILDCARD_HOSTS or config.allow_hosts
        )
        self._hosts_seen: dict[str | None, bool] = {}
        # The chat calls go through seam's own client (pipeline/gateway/upstream.py: aiohttp's
        # cost ~0.5 ms of CPU per call more); /v1/models and an HTTP judge use aiohttp's.
        self.upstream = Upstream(
            self.endpoint.url,
            self.endpoint.headers,
            connections=config.upstream_connections,
            connect_timeout=config.upstream_connect_timeout_s,
            timeout=config.upstream_timeout_s,
            max_body=config.max_response_bytes,
        )
        self.client: aiohttp.ClientSession | None = None
        self.stats = stats if stats is not None else {"calls": 0, "corrected": 0, "errors": 0}

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[self._guard])
        for prefix in ("", "/s/{task_id}/{rollout_id}"):
            app.router.add_post(prefix + "/v1/chat/completions", self.chat_completions)
            app.router.add_post(prefix + "/chat/completions", self.chat_completions)
            app.router.add_post(prefix + "/v1/messages", self.messages)
            app.router.add_post(prefix + "/v1/responses", self.responses)
            app.router.add_post(prefix + "/responses", self.responses)
            app.router.add_post(prefix + "/v1/messages/count_tokens", self.count_tokens)
            app.router.add_get(prefix + "/v1/models", self.models)
        app.router.add_post("/s/{task_id}/{rollout_id}/reward", self.reward)
        app.router.add_post("/rewards", self.reward)
        app.router.add_get("/healthz", self.health)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler) -> web.StreamResponse:
        """Refuse what a web page could send (pipeline/common/http_guard.py): a Host the gateway
        is not known by (DNS rebinding), a browser Origin of another site, and a POST
        body that is not JSON (a cross-site "simple" request needs no preflight)."""
        headers = request.headers
        host = headers.get("Host")
        if self._checks_host and not self._host_allowed(host):
            return _error(
                403,
                f"Host {host!r} is not a name this gateway answers to; "
                "add it with --allow-host NAME",
            )
        if not http_guard.origin_allowed(headers.get("Origin"), self._allowed):
            return _error(
                403,
                f"Origin {headers.get('Origin')!r} is another site; a page may not "
                "call the gateway (add its host with --allow-host NAME if it should)",
            )
        if request.method == "POST" and not http_guard.is_json(headers.get("Content-Type")):
            return _error(
                415,
                "the body must be JSON sent as Content-Type: application/json "
                "(curl: -H 'Content-Type: application/json')",
            )
        return await handler(request)

    def _host_allowed(self, host: str | None) -> bool:
        """``http_guard.host_allowed`` remembered per ``Host`` value: a fleet sends the same
        one or two on every call (parsing it is a urlsplit). Bounded: a client sending a
        new value on every call only refills it."""
        verdict = self._hosts_seen.get(host)
        if verdict is None:
            if len(self._hosts_seen) >= 64:
                self._hosts_seen.clear()
            verdict = self._hosts_seen[host] = http_guard.host_allowed(host, self._allowed)
        return verdict

    async def _start(self, app: web.Application) -> None:
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self.config.upstream_connections, limit_per_host=0
            ),
            timeout=aiohttp.ClientTimeout(
                total=self.config.upstream_timeout_s,
                sock_connect=self.config.upstream_connect_timeout_s,
            ),
        )
        if self.judge_factory is not None:
            self.judge = self.judge_factory(self.client)

    async def _stop(self, app: web.Application) -> None:
        await self.upstream.close()
        if self.client is not None:
            await self.client.close()
        await self.recorder.drain()
        self.recorder.write_manifest()

    # ------------------------------------------------------------------ routes

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, **self.stats})

    async def models(self, request: web.Request) -> web.StreamResponse:
        assert self.client is not None
        try:
            async with self.client.get(self._upstream("/models"), headers=self._auth()) as resp:
                return web.Response(
                    status=resp.status, body=await resp.read(), content_type="application/json"
                )
        except (aiohttp.ClientError, TimeoutError) as exc:  # the engine is down: one line
            return _error(502, f"seam gateway: upstream failed: {exc!r}")

    async def count_tokens(self, request: web.Request) -> web.Response:
        # An estimate (4 characters a token): harnesses use it to decide when to compact,
        # and the engine's own count arrives with every call anyway.
        body = await request.read()
        return web.json_response({"input_tokens": max(1, len(body) // 4)})

    async def reward(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            rollout_id = request.match_info.get("rollout_id") or body.get("rollout_id")
            task_id = request.match_info.get("task_id") or body.get("task_id")
            check_id(str(rollout_id or ""), "rollout id")
            reward = body.get("reward")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise ValueError("'reward' must be a number")
            if not math.isfinite(reward):  # NaN, 1e999: the build would quarantine it later
                raise ValueError(f"'reward' must be a finite number, not {reward}")
            row: dict[str, Any] = {"rollout_id": rollout_id, "reward": float(reward)}
            if task_id:
                row["task_id"] = check_id(str(task_id), "task id")
            if isinstance(body.get("resolved"), bool):
                row["resolved"] = body["resolved"]
        except ValueError as exc:
            return _error(400, str(exc))
        # One outcome per rollout: a different second one would fail the whole build (the
        # rewards join refuses two outcomes for one id), so it is refused here, at once;
        # the same outcome again (a harness retry) is answered as recorded.
        earlier = await self.recorder.record_reward(row)
        if earlier is not None and earlier != row:
            return _error(
                409,
                f"rollout {rollout_id} already has an outcome ({json.dumps(earlier)}); "
                "a rollout gets one reward",
            )
        return web.json_response({"recorded": row})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "openai")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "anthropic")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "responses")

    # ------------------------------------------------------------------ one call

    async def _call(self, request: web.Request, dialect: str) -> web.StreamResponse:
        received = time.monotonic()
        try:
            session = self._session(request)
            raw = await _read_body(request, self.config.client_timeout_s)
            if raw is None:
                return _error(408, "the request body did not arrive in time", dialect)
            # The history it shares with the session's previous request is not parsed
            # again (pipeline/gateway/request_prefix.py): same result as orjson.loads.
            body = session.parser.parse(raw, "input" if dialect == "responses" else "messages")
            if not isinstance(body, dict):
                raise DialectError("the request body must be a JSON object")
            # Deeper nesting would fail later, after the engine answered, where the call is
            # serialized (orjson stops at 255 levels): a 500 with the engine's work lost.
            _check_depth(body, raw, session)
            upstream_body = TRANSLATE[dialect](body) if dialect in TRANSLATE else dict(body)
        except (ValueError, DialectError) as exc:
            return _error(400, str(exc), dialect)
        stream = bool(body.get("stream"))
        upstream_body.pop("stream", None)
        include_usage = bool((upstream_body.pop("stream_options", None) or {}).get("include_usage"))
        asked = {k for k in TOKEN_ID_PARAMS if upstream_body.get(k)}
        async with self.recorder.session_lock(session.rollout_id):
            if not session.loaded:  # lazily, off the event loop: other sessions go on
                # A session with no log yet (a new one: most first calls) has nothing to
                # read; one stat here spares it the hand-off to a thread and back.
                if self.recorder.log_path(session.rollout_id).exists():
                    await asyncio.to_thread(self._load, session)
                session.loaded = True
            if stream and self.judge is None:  # relayed as it comes (pipeline/gateway/streaming.py)
                return await streaming.streamed_call(
                    self,
                    request,
                    session,
                    dialect,
                    body.get("model"),
                    upstream_body,
                    asked,
                    include_usage,
                    received,
                )
            status, response, upstream_ms = await self._forward(
                upstream_body, _known_prompt(session.base), session
            )
            if status != 200:
                self.stats["errors"] += 1
                return web.Response(status=status, body=response, content_type="application/json")
            seam = self._seam(session, upstream_body, dialect, stream, upstream_ms)
            executed, correction = await self._judge(session, upstream_body, response, seam)
            try:  # the harness's answer is made before anything is written (nothing half-done)
                reply = _reply(executed, asked, dialect, body.get("model"), stream, include_usage)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self.stats["errors"] += 1
                message = f"seam gateway: the engine's answer cannot be translated: {exc!r}"
                return _error(502, message[:500], dialect)
            token_ids = correction is None and bool(response["choices"][0].get("token_ids"))
            # The client gave up while the engine worked (a harness timeout): nobody sees
            # this answer, and the harness's retry must not read as a rewrite of it.
            failed = await self._record(
                session,
                upstream_body,
                executed,
                seam,
                token_ids,
                received,
                upstream_ms,
                delivered=not _client_gone(request),
                correction=correction,
            )
            if failed is not None:
                return _error(503, failed, dialect)
        if stream:
            return await _stream(request, reply)
        return web.Response(body=reply, content_type="application/json")

    def _seam(
        self, session: Session, upstream_body: dict, dialect: str, stream: bool, upstream_ms: float
    ) -> dict[str, Any]:
        """The call's ``seam`` object: how it came, and how it continues the session."""
        messages = upstream_body.get("messages") or []
        base = session.base
        extends = base is not None and _extends(
            messages, base, session.known_equal(messages, base["request"].get("messages"))
        )
        seam: dict[str, Any] = {
            "dialect": dialect,
            "stream": stream,
            "upstream_ms": round(upstream_ms, 2),
            "extends_previous": extends if session.base is not None else None,
        }
        if self._is_summary_request(upstream_body, session):
            seam["kind"] = "summary"
        return seam

    async def record_answer(
        self,
        session: Session,
        dialect: str,
        upstream_body: dict,
        response: dict,
        received: float,
        upstream_ms: float,
        delivered: bool,
    ) -> str | None:
        """Record a streamed call's whole answer as an unstreamed one's (no Judge)."""
        seam = self._seam(session, upstream_body, dialect, True, upstream_ms)
        token_ids = bool(response["choices"][0].get("token_ids"))
        return await self._record(
            session, upstream_body, response, seam, token_ids, received, upstream_ms, delivered
        )

    async def _record(
        self,
        session: Session,
        upstream_body: dict,
        executed: dict,
        seam: dict[str, Any],
        token_ids: bool,
        received: float,
        upstream_ms: float,
        delivered: bool,
        correction: dict | None = None,
    ) -> str | None:
        """Write the call's record (and the Judge's correction) and move the session on;
        the reason when it could not be written (the harness is told: 503 or an error
        event), else None. An undelivered call (``seam.delivered: false``) is recorded
        but is not the base the session's next call extends."""
        record = {
            "session_id": session.rollout_id,
            "task_id": session.task_id,
            "request": upstream_body,
            "response": executed,
            "seam": seam,
        }
        seam["call"] = number = session.next_call
        if not delivered:
            seam["delivered"] = False
        stored = self._stored(session, record)
        try:
            await self.recorder.record_call(
                session.rollout_id, stored, token_ids, _stamp_gateway_ms(received, upstream_ms)
            )
        except OSError as exc:  # a full disk, a failed fsync (sync mode): one line
            self.stats["errors"] += 1
            return f"seam gateway: the call could not be recorded: {exc}"
        session.next_call += 1
        session.same_prefix = None  # used: the lists it holds are not kept past the call
        if correction is not None:
            await self.recorder.record_side("corrections.jsonl", correction)
        if delivered:
            session.since_full = 0 if stored is record else session.since_full + 1
            # The previous base (a whole parsed request and answer: ~1,200 objects at a
            # 400-message history) is freed after the answer is written, not before.
            _free_later(session.base)
            session.base, session.base_call = record, number
            if self.judge is not None:
                session.calls.append((number, record, ""))
        self.stats["calls"] += 1
        return None

    def _session(self, request: web.Request) -> Session:
        task_id = request.match_info.get("task_id") or request.headers.get("X-Seam-Task-Id")
        rollout_id = request.match_info.get("rollout_id") or request.headers.get(
            "X-Seam-Rollout-Id"
        )
        # A known session named as before: both ids are the ones checked when it was made
        # (a key of ``sessions`` and its task id are equal strings), so the pattern checks
        # below would pass and the lookup find it; anything else takes the whole path.
        known = self.sessions.get(rollout_id) if rollout_id else None
        if known is not None and (task_id or rollout_id) == known.task_id:
            return known
        if not rollout_id:
            raise ValueError(
                "say which session this call belongs to: use the base URL "
                "http://HOST:PORT/s/TASK_ID/ROLLOUT_ID (or /s/TASK_ID/ROLLOUT_ID/v1 for OpenAI "
                "clients), or the headers X-Seam-Task-Id and X-Seam-Rollout-Id"
            )
        check_id(rollout_id, "rollout id")
        task_id = check_id(task_id, "task id") if task_id else rollout_id
        session = self.sessions.get(rollout_id)
        if session is None:
            session = self.sessions[rollout_id] = Session(rollout_id, task_id)
        elif session.task_id != task_id:
            raise ValueError(
                f"rollout {rollout_id} belongs to task {session.task_id}, not {task_id}"
            )
        return session

    def _stored(self, session: Session, record: dict) -> dict:
        """The record as the log stores it: whole, or as a delta to the session's last
        delivered call (pipeline/readers/call_delta.py), whole at least every full_every."""
        if self.config.log == "full" or session.since_full + 1 >= self.config.full_every:
            return record
        base, messages = session.base, record["request"].get("messages")
        known = session.known_equal(messages, base["request"].get("messages")) if base else 0
        return call_delta.encode(record, base, session.base_call, known)

    def _load(self, session: Session) -> None:
        """A session the gateway saw before a restart: continue its call log. Run in a
        thread on the session's first call (not every file at startup, on the event loop:
        a restart on 532 MB of logs answered its first calls after 14-20 s). Only the
        last delivered call is kept (and every call, for a judge)."""
        path = self.recorder.log_path(session.rollout_id)
        if not path.exists():
            return
        resolver = call_delta.Resolver()
        with path.open("rb") as fh:
            for line, raw in enumerate(fh, start=1):
                try:
                    record = orjson.loads(raw)
                    if not isinstance(record, dict):
                        continue
                    full = resolver.resolve(record)
                except ValueError:
                    continue  # a cut line, or a delta whose base was: the reader says so
                number = call_delta.call_number(record)
                if number is not None:
                    session.next_call = max(session.next_call, number + 1)
                if not call_delta.delivered(full):
                    continue
                resolver.accept(full)
                session.since_full = session.since_full + 1 if call_delta.is_delta(record) else 0
                session.base, session.base_call = full, number
                if self.judge is not None:
                    session.calls.append((line, full, ""))

    def _is_summary_request(self, body: dict, session: Session) -> bool:
        # The last user message, found from the end (not a pass over the whole history)
        for last in reversed(body.get("messages") or []):
            if last.get("role") == "user":
                break
        else:
            return False
        content = last.get("content")
        text = (content if isinstance(content, str) else json.dumps(content)) or ""
        memo = session.summary_memo
        if memo is not None and memo[0] == text:
            return memo[1]
        starts = self.summary_starts
        if starts is not None and text.isascii():
            # Every match starts with one of the prompts' leading text (``_literal_starts``):
            # where none occurs, the regex (~75 ns a character) has nothing to find.
            lowered = text.lower()
            found = any(start in lowered for start in starts) and bool(self.summary_re.search(text))
        else:
            found = bool(self.summary_re.search(text))
        session.summary_memo = (text, found)
        return found

    def _upstream(self, path: str) -> str:
        return with_path(self.config.upstream, lambda base: base.rstrip("/") + path)

    def _auth(self) -> dict[str, str]:
        return dict(self.endpoint.headers)

    def _redacted(self, data: bytes) -> bytes:
        """An upstream error body without the key (some echo the Authorization header);
        the harness may log it."""
        text = data.decode("utf-8", "replace")
        cleaned = self.redactor.redact(text)
        return data if cleaned == text else cleaned.encode()

    async def _post(self, payload: list[bytes]) -> tuple[int, bytes]:
        """One POST of a chat call: (status, body), the body read whole up to
        ``max_response_bytes``. A kept-alive connection the engine closed before any
        answer byte is retried once on a new one (pipeline/gateway/upstream.py; 3% of calls
        were 502s before that)."""
        return await self.upstream.post("/chat/completions", payload)

    async def _post_stream(self, payload: list[bytes]) -> tuple[int, Any]:
        """``_post`` of a streamed call: (200, the open ``Response``, its body unread) or
        (status, the error body)."""
        resp = await self.upstream.post_stream("/chat/completions", payload)
        if resp.status == 200:
            return 200, resp
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()

    async def _ask(self, body: dict, post, session: Session | None = None) -> tuple[int, Any]:
        """POST the call upstream with the token-id parameters when they are on for its model,
        through ``post`` (``_post`` or ``_post_stream``): (status, what ``post`` gave)."""
        model = str(body.get("model"))
        with_ids = self.token_ids and model not in self.models_without_ids
        for attempt in (0, 1):
            status, data = await post(_payload(body, TOKEN_ID_PARAMS if with_ids else {}, session))
            if attempt:
                # The same request without the token-id parameters: if the engine takes it,
                # they were what it refused (for this model, not the fleet); if it refuses
                # again, the 400 was about the request (e.g. a prompt over the context
                # length, which vLLM answers with 400) and token ids stay on.
                if status == 200:
                    self.models_without_ids.add(model)
                    rejected = self.recorder.manifest.setdefault("token_id_params_rejected", [])
                    rejected.append(model)
                    self.recorder.manifest["token_id_params"] = "rejected by the upstream"
                break
            if status == 400 and with_ids and self.config.token_ids == "auto":
                with_ids = False
                continue
            break
        return status, data

    def _upstream_failed(self, exc: BaseException) -> bytes:
        message = self.redactor.redact(f"seam gateway: upstream failed: {exc}")
        return json.dumps({"error": {"message": message}}).encode()

    async def _forward(
        self, body: dict, known: raw_ids.RawIds | None = None, session: Session | None = None
    ) -> tuple[int, Any, float]:
        """POST the call upstream; (status, parsed response or error bytes, upstream ms).
        ``known``: the session's previous prompt ids, which this call's usually extend;
        ``session``: the call's (its history sent before is not serialized again)."""
        started = time.monotonic()
        try:
            status, data = await self._ask(body, self._post, session)
        except UpstreamError as exc:  # timeouts and AnswerTooLarge included
            return 502, self._upstream_failed(exc), (time.monotonic() - started) * 1000
        ms = (time.monotonic() - started) * 1000
        if status != 200:
            return status, self._redacted(data), ms
        try:
            # The prompt's ids stay the engine's bytes (pipeline/readers/raw_ids.py): parsing,
            # comparing and dumping 40,000 ints per call was most of the gateway's CPU. A
            # judge reads the calls as lists, so with one the answer is parsed whole.
            parsed = _parsed_answer(data, self.judge is None, known)
        except (ValueError, AttributeError) as exc:
            detail = {"error": {"message": f"seam gateway: upstream answer unusable: {exc}"}}
            return 502, json.dumps(detail).encode(), ms
        return 200, parsed, ms

    async def open_upstream(self, body: dict) -> web.Response | Response:
        """Ask the engine to stream the call (and its usage): the open response, or what the
        harness gets instead (the engine's error status and body, or a 502)."""
        sent = {**body, "stream": True, "stream_options": streaming.STREAM_OPTIONS}
        try:
            status, data = await self._ask(sent, self._post_stream)
        except UpstreamError as exc:
            return web.Response(
                status=502, body=self._upstream_failed(exc), content_type="application/json"
            )
        if status != 200:
            return web.Response(
                status=status, body=self._redacted(data), content_type="application/json"
            )
        return data

    async def read_answer(self, resp: Response) -> dict | web.Response:
        """A whole answer to a streamed request (an engine that does not stream), or a 502.
        (The connection holds it to ``max_response_bytes``.)"""
        try:
            return _parsed_answer(await resp.read())
        except UpstreamError as exc:
            return web.Response(
                status=502, body=self._upstream_failed(exc), content_type="application/json"
            )
        except (ValueError, AttributeError) as exc:
            return _error(502, f"seam gateway: upstream answer unusable: {exc}")

    async def _judge(
        self, session: Session, body: dict, response: dict, seam: dict
    ) -> tuple[dict, dict | None]:
        """(the response the harness gets and the log records, the correction record)."""
        if self.judge is None:
            return response, None
        from pipeline.readers.openai_messages import ChatCompletionsReader
        from schemas.correction import executed_output_text

        candidate = dict(response["choices"][0].get("message") or {})
        line = len(session.calls) + 1
        pending: dict[str, Any] = {"session_id": session.rollout_id, "task_id": session.task_id}
        pending |= {"request": body, "response": response, "seam": seam}
        items = list(
            ChatCompletionsReader()._rollout(
                session.rollout_id, [*session.calls, (line, pending, "")]
            )
        )
        rollout = getattr(items[-1], "rollout", None) if items else None
        if rollout is None:
            seam["judge"] = {"skipped": getattr(items[-1], "reason", "no rollout")}
            return response, None
        call_index = sum(1 for e in rollout.events if getattr(e, "role", None) == "assistant") - 1
        try:
            outcome = await self.judge.review(rollout, call_index, candidate)
        except JudgeFailed as exc:
            seam["judge"] = {"name": self.judge.name, "error": str(exc)}
            return response, None
        seam["judge"] = {"name": self.judge.name, "findings": outcome.findings}
        review = outcome.review
        if review is None:
            return response, None
        self.stats["corrected"] += 1
        replacement = review.replacement
        finish = "tool_calls" if replacement.get("tool_calls") else "stop"
        executed = {
            "id": response.get("id"),
            "model": response.get("model"),
            "choices": [{"index": 0, "message": replacement, "finish_reason": finish}],
        }
        original_msg = _canonical(candidate)
        replacement_msg = _canonical(replacement)
        correction = {
            "rollout_id": session.rollout_id,
            "call_index": call_index,
            "type": review.type,
            "verdict": review.verdict,
            "original": executed_output_text(original_msg),
            "replacement": executed_output_text(replacement_msg),
            "rationale": review.rationale,
            "evidence": review.evidence,
            "judge_model": review.judge_model,
        }
        seam["correction"] = {**correction, "original_response": response}
        return executed, correction


def event_loop_factory():
    """uvloop's event loop when it is installed (``pip install uvloop``; it comes with the
    ``gateway`` extra where it builds), else None: asyncio's own. The loop and its
    transports are a large part of the gateway's CPU per call (bench/gateway_profile.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _read_body(request: web.Request, timeout_s: float) -> bytes | None:
    """The request's body, or None when it did not arrive within ``timeout_s`` (a trickling
    body is dropped: 3,000 such connections were held for 90 s). A body already received
    whole (most calls) is read without the timer (``wait_for`` makes a task per call), and
    as the chunks it came in: one chunk is the body itself, several are joined once
    (``request.read()`` copies it twice, into a bytearray and then to bytes: ~0.1 ms of
    CPU per call at a 160 KB history), under the same size cap."""
    content = request.content
    if content.is_eof():
        data = content.read_nowait(-1)
        limit = getattr(request, "client_max_size", MAX_REQUEST_BYTES)
        if limit and len(data) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(data))
        return data if type(data) is bytes else bytes(data)
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        return None


def _check_depth(body: dict, raw: bytes, session: Session) -> None:
    """``check_depth`` on a request body, skipping the part of its history (``messages``,
    or a Responses ``input``) that repeats the session's last checked request: an agent
    re-sends its whole history with every call, and walking it again cost ~1 ms per call
    at 400 messages. The skipped messages sit at the same depth as when they passed.
    Likewise the other members equal to that request's (``==``: the same structure, so
    the same depth): a harness's tool schemas, re-sent with every call, are compared in C
    instead of walked in Python."""
    key = "messages" if "messages" in body else "input"
    history, before = body.get(key), session.checked
    if (
        isinstance(history, list)
        and before
        and len(history) >= len(before)
        and history[: len(before)] == before
    ):
        passed = session.checked_body or {}
        rest = {k: v for k, v in body.items() if k != key and not (k in passed and passed[k] == v)}
        rest[key] = history[len(before) :]
        check_depth(rest)  # short: no pass over raw
        session.same_prefix = (history, before, len(before))
    else:
        check_depth(body, raw)
        session.same_prefix = None
    if isinstance(history, list):
        session.checked, session.checked_body = history, body


def _payload(body: dict, extra: dict, session: Session | None) -> list[bytes]:
    """``orjson.dumps({**body, **extra})`` in pieces (joined, byte for byte; the engine
    client writes them as they are, so the history's bytes are not copied into one
    buffer: ~20 µs per copy at 160 KB), without serializing again the
    part of the history (``messages``) that the session's previous request sent: an agent
    re-sends its whole history with every call (~40 µs per call at a 160 KB history).

    The history's items are the previous one's very objects followed by new ones when the
    request parser continued that list (``RequestParser.prior``), and orjson writes an
    array as its items' bytes joined by commas, each item's bytes independent of where it
    stands: so the array's bytes are the previous items' bytes (kept, ``Session.sent``),
    a comma and the new items'. The rest of the body is serialized with a sentinel string
    in the history's place (``request_prefix.NONCE``: no request holds it), and the array
    is put there. A history the parser does not follow (a translated dialect's, a small or
    rewritten request) is serialized whole."""
    history = body.get("messages")
    if session is None or type(history) is not list or session.parser.items is not history:
        if session is not None:
            session.sent = None
        return [orjson.dumps({**body, **extra})]
    memo = session.sent
    if memo is not None and session.parser.prior is memo[0]:
        old = len(memo[0])
        pieces = memo[1]
        if len(history) > old:  # a new list, so a failure below leaves the memo as it was
            more = orjson.dumps(history[old:])[1:-1]
            pieces = [*pieces, b"," + more if old else more]
        if len(pieces) > 32:
            pieces = [b"".join(pieces)]
    else:
        pieces = [orjson.dumps(history)[1:-1]]
    merged = {**body, **extra}
    merged["messages"] = NONCE
    head, _, tail = orjson.dumps(merged).partition(SENTINEL)
    session.sent = (history, pieces)
    return [head + b"[", *pieces, b"]" + tail]


def _literal_starts(patterns: Iterable[str]) -> tuple[str, ...] | None:
    """The text each of ``patterns`` starts with (its leading literal characters, at least
    3, ASCII, lowercased), or None when one does not start so. A case-blind match of a
    pattern in ASCII text begins with that pattern's text up to case (ASCII letters are
    case-equivalent only to their other case), so ASCII text in whose lowercased form none
    of them occurs holds no match. Read from the patterns as Python's own parser reads
    them (an alternation, a group, a class or an escape class is no literal; a character
    before a quantifier is not taken: the quantifier is its own item)."""
    import importlib

    try:
        sre_parse = importlib.import_module("re._parser")  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        sre_parse = importlib.import_module("sre_parse")
    starts = []
    for pattern in patterns:
        try:
            items = list(sre_parse.parse(pattern, re.I))
        except Exception:  # the compiled regex reports a bad pattern; no shortcut here
            return None
        chars = []
        for op, value in items:
            if op is not sre_parse.LITERAL or value >= 128:
                break
            chars.append(chr(value))
        if len(chars) < 3:
            return None
        starts.append("".join(chars).lower())
    return tuple(starts) or None


def _free_later(value: Any) -> None:
    """Drop ``value`` on the event loop's next turn: the handler that runs now returns its
    answer and aiohttp writes it to the socket in the same turn, so freeing a large object
    (the session's previous record) no longer delays the answer."""
    if value is not None:
        asyncio.get_running_loop().call_soon(_drop, value)


def _drop(value: Any) -> None:
    """Nothing: the loop's handle held ``value`` until now."""


def _known_prompt(base: dict | None) -> raw_ids.RawIds | None:
    """The previous call's prompt ids when the gateway kept them as the engine's bytes."""
    found = call_delta.prompt_ids(base["response"]) if base is not None else None
    return found[1] if found is not None and isinstance(found[1], raw_ids.RawIds) else None


def _stamp_gateway_ms(received: float, upstream_ms: float):
    """Set ``seam.gateway_ms`` in the serialized record just before it is written, so it
    counts everything the gateway did for the call up to the write, the record's own
    serialization included (it was taken before that, leaving out the largest cost).
    The record ends with its non-empty ``seam`` object: the bytes end in ``}}\\n``."""

    def finish(data: bytes) -> bytes:
        ms = (time.monotonic() - received) * 1000 - upstream_ms
        assert data.endswith(b"}}\n"), "the record must end with its seam object"
        return data[:-3] + b',"gateway_ms":' + f"{ms:.2f}".encode() + b"}}\n"

    return finish


def _canonical(message: dict):
    from schemas.rollout import MessageEvent, ToolCall

    calls = [
        ToolCall(
            id=c.get("id") or f"call_{i}",
            name=(c.get("function") or {}).get("name") or "?",
            arguments=(c.get("function") or {}).get("arguments") or "",
        )
        for i, c in enumerate(message.get("tool_calls") or [])
    ]
    return MessageEvent(
        id="m", role="assistant", content=message.get("content") or "", tool_calls=calls
    )


def _strip_added(response: dict, asked: set[str]) -> dict:
    """The response without the token-id fields the gateway (not the harness) asked for."""
    if "return_token_ids" in asked:  # the harness gets lists (the SSE writers dump with json)
        response = raw_ids.materialized(response)
    out = dict(response)
    if "return_token_ids" not in asked:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in out.get("choices") or []:
        choice = dict(choice)
        if "return_token_ids" not in asked:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if "logprobs" not in asked:
            choice.pop("logprobs", None)
        choices.append(choice)
    out["choices"] = choices
    return out


def _parsed_answer(
    data: bytes, keep_ids: bool = False, known: raw_ids.RawIds | None = None
) -> dict:
    """The engine's answer parsed and checked (``_check_answer``); a ValueError says why not.
    With ``keep_ids`` its prompt ids are kept as the engine's bytes where they can be cut
    out exactly (``raw_ids.split_prompt_ids``; ``known``: the previous prompt's)."""
    split = raw_ids.split_prompt_ids(data, known) if keep_ids else None
    parsed = split[0] if split is not None else orjson.loads(data)
    # The raw shortcut on the bytes parsed (not two passes over the ids' bytes)
    check_depth(parsed, data if split is None else split[2])
    _check_answer(parsed)
    return parsed


def _check_answer(parsed: Any) -> None:
    """The shape of a chat-completions answer the gateway records and translates; a
    ValueError names the first part that is not (the call is then a 502, not a 500)."""
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    choices = parsed.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise ValueError("choices[0] has no message object")
    message = choice["message"]
    if not isinstance(message.get("content"), (str, type(None))):
        raise ValueError("the message content is not text")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise ValueError("tool_calls is not a list")
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), (str, type(None)))
        ):
            raise ValueError("a tool call has no function name and arguments text")


def _reply(
    executed: dict, asked: set, dialect: str, model: Any, stream: bool, include_usage: bool
) -> Any:
    """What the harness gets, in its dialect: the JSON bytes, or the list of SSE events
    when it streams. Built in full before the call is recorded, so an answer that cannot
    be translated is a 502 with nothing written, not a 500 after the line was."""
    answer = _strip_added(executed, asked)
    if dialect == "responses":
        resp = openai_to_responses(answer, model)
        return list(responses_sse(resp)) if stream else orjson.dumps(resp)
    if dialect == "anthropic":
        message = openai_to_anthropic(answer, model)
        return list(anthropic_sse(message)) if stream else orjson.dumps(message)
    return list(openai_sse(answer, include_usage)) if stream else orjson.dumps(answer)


def _error(status: int, message: str, dialect: str = "openai") -> web.Response:
    if dialect == "anthropic":
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    else:
        body = {"error": {"message": message, "type": "invalid_request_error"}}
    return web.json_response(body, status=status)


def _client_gone(request: web.Request) -> bool:
    """The client closed its connection (aiohttp drops the transport when it does)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _stream(request: web.Request, events: Iterable[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    for event in events:
        await resp.write(event)
    await resp.write_eof()
    return resp
