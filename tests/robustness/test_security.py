"""No input makes seam run code, leak a secret or write outside ``--out``.

- Chat templates render in Jinja's immutable sandbox: a template (or a message that
  steers one) reaching for Python internals fails with a clear error or quarantines
  the rollout, and the payload never runs.
- ``.pt`` token dumps are loaded with ``torch.load(weights_only=True)``: a pickle that
  would run a command is rejected and the command does not run.
- API keys given through the environment never appear in output files, logs or caches.
- Ids and names inside inputs never become paths: rollouts named ``../../x`` or
  ``/tmp/x`` write nothing outside ``--out``.
"""

from __future__ import annotations

import copy
import http.server
import json
import random
import threading
from pathlib import Path

import pytest

from pipeline.build.run import BuildConfig, run_build
from pipeline.core.render import ChatRenderer, TemplateError
from pipeline.core.tokenizer import CHAT_TEMPLATES
from tests.robustness.conftest import SEAM, run_seam, snapshot
from tests.robustness.records import good_record, line

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ joiner.__init__.__globals__.__builtins__['__import__']('os').system('touch MARKER') }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ messages.append.__self__.__class__ }}",
    "{{ (messages|first).__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{% set x = messages.clear() %}",
]


def _evil(tmp_path: Path, payload: str, name: str = "evil.jinja") -> tuple[Path, Path]:
    marker = tmp_path / "MARKER"
    path = tmp_path / name
    path.write_text(payload.replace("MARKER", str(marker)))
    return path, marker


@pytest.mark.parametrize("payload", ESCAPES)
def test_a_chat_template_cannot_reach_python_internals(tmp_path, payload, tokenizer, renderer):
    """The sandbox either raises SecurityError or renders the forbidden attribute as
    nothing; the payload never runs."""
    template, marker = _evil(tmp_path, payload + CHAT_TEMPLATES["chatml-tools"])
    hostile = copy.copy(
        tokenizer
    )  # what --chat-template does to a loaded tokenizer, without reloading it
    hostile.chat_template = template.read_text()
    try:
        evil = ChatRenderer(hostile)
    except TemplateError as exc:
        assert "SecurityError" in str(exc)
    else:
        conversation = [{"role": "user", "content": "hi"}]
        assert evil.render(conversation, None, True) == renderer.render(conversation, None, True)
    assert not marker.exists()


def test_an_escaping_template_stops_the_build_with_one_clear_line(tmp_path, corpus):
    template, marker = _evil(tmp_path, ESCAPES[1] + CHAT_TEMPLATES["chatml-tools"])
    done = run_seam(
        [
            *SEAM,
            "build-rl",
            str(corpus / "a.jsonl"),
            "--out",
            "out",
            "--chat-template",
            str(template),
            "--no-progress",
            "--workers",
            "1",
        ],
        tmp_path,
    )
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1 and "chat template" in done.stderr and "unsafe" in done.stderr
    )
    assert "Traceback" not in done.stderr and not marker.exists()


def test_a_message_that_steers_the_template_into_internals_is_quarantined(tmp_path):
    """The template is fine until it meets one message: that rollout is quarantined."""
    trap = (
        "{%- for m in messages %}{%- if m.content == 'PWN' %}"
        "{{ lipsum.__globals__.os.system('touch MARKER') }}{%- endif %}{%- endfor %}"
    )
    template, marker = _evil(tmp_path, trap + CHAT_TEMPLATES["chatml-tools"])
    records = [good_record(random.Random(i), f"r{i}", "t") for i in range(3)]
    records[1]["events"][1]["content"] = "PWN"
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(line(r) for r in records) + b"\n")
    result = run_build(
        BuildConfig(
            [str(src)],
            str(tmp_path / "out"),
            chat_template=str(template),
            workers=1,
            progress=False,
        )
    )
    assert (result.counts["accepted"], result.counts["quarantined"]) == (2, 1)
    (entry,) = [
        json.loads(x) for x in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert entry["line"] == 2 and "SecurityError" in entry["reason"]
    assert not marker.exists()


class _Payload:
    """Unpickling this runs a shell command: what a hostile .pt file carries."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_pt_dump_that_would_run_a_command_is_quarantined_and_the_command_never_runs(tmp_path):
    torch = pytest.importorskip("torch")
    src = tmp_path / "dumps"
    src.mkdir()
    marker = tmp_path / "MARKER"
    torch.save({"rollout_id": 0, "samples": [_Payload(marker)]}, src / "rollout_0.pt")
    torch.save(
        [
            {
                "tokens": torch.tensor([1, 2, 3, 4]),
                "response_length": 2,
                "reward": 1.0,
                "rollout_id": "ok",
            },
            _Payload(marker),
        ],
        src / "rollout_1.pt",
    )
    result = run_build(BuildConfig([str(src)], str(tmp_path / "out"), workers=1, progress=False))
    assert result.counts["accepted"] == 0 and result.counts["quarantined"] == 2
    reasons = [
        json.loads(x)["reason"]
        for x in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert all("weights_only" in r for r in reasons)
    assert not marker.exists()


CANARY = "sk-seam-canary-7f3a9c1e5b"


def _assert_no_canary(*places: Path | str) -> None:
    for place in places:
        if isinstance(place, str):
            assert CANARY not in place
            continue
        for name, data in (
            snapshot(place).items() if place.is_dir() else [(place.name, place.read_bytes())]
        ):
            assert CANARY.encode() not in data, (
                f"the API key leaked into {place / name if place.is_dir() else place}"
            )


@pytest.mark.slow
def test_api_keys_in_the_environment_never_reach_build_outputs_or_logs(tmp_path, corpus):
    keys = {
        name: CANARY
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HF_TOKEN", "SEAM_JUDGE_API_KEY")
    }
    done = run_seam(
        [
            *SEAM,
            "build-rl",
            str(corpus / "a.jsonl"),
            "--out",
            "out",
            "--no-progress",
            "--workers",
            "1",
        ],
        tmp_path,
        **keys,
    )
    assert done.returncode == 0, done.stderr
    _assert_no_canary(tmp_path / "out", done.stdout, done.stderr)


class _Endpoint(http.server.ThreadingHTTPServer):
    """A chat-completions endpoint on loopback that answers every step with no finding,
    or (``echo``) refuses the key and echoes it back, as some gateways do."""

    def __init__(self, echo: bool):
        self.echo, self.authorizations = echo, []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        auth = self.headers.get("Authorization", "")
        self.server.authorizations.append(auth)
        if self.server.echo:
            status, body = 401, {"error": {"message": f"invalid api key: {auth}"}}
        else:
            status, body = (
                200,
                {
                    "choices": [{"message": {"role": "assistant", "content": '{"verdicts": []}'}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                },
            )
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("echo", [False, True], ids=["answering", "echoing-the-key"])
def test_the_judge_sends_the_key_only_in_its_header(tmp_path, corpus, echo):
    server = _Endpoint(echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = run_seam(
            [
                *SEAM,
                "judge",
                str(corpus / "a.jsonl"),
                "--llm",
                f"http://127.0.0.1:{server.server_port}/v1",
                "--model",
                "judge",
                "--api-key-env",
                "SEAM_CANARY_KEY",
                "--retries",
                "0",
                "--timeout",
                "20",
                "--cache-dir",
                "cache",
                "--out",
                "findings.jsonl",
            ],
            tmp_path,
            SEAM_CANARY_KEY=CANARY,
        )
    finally:
        server.shutdown()
    assert server.authorizations and set(server.authorizations) == {f"Bearer {CANARY}"}
    assert done.returncode == (1 if echo else 0), done.stderr
    _assert_no_canary(tmp_path, done.stdout, done.stderr)


HOSTILE_IDS = [
    "../../escaped",
    "/tmp/seam-absolute-escape",
    "..",
    "a/../../b",
    "~/home-escape",
    "con\\..\\x",
    "\x00nul",
]


def test_ids_that_look_like_paths_never_become_paths(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    records = []
    for i, hostile in enumerate(HOSTILE_IDS):
        r = good_record(random.Random(i), hostile, hostile)
        r["source"] = hostile
        records.append(
            line(r).replace(b'"m0"', json.dumps(hostile).encode())
        )  # the system message's id
    (src / "hostile.jsonl").write_bytes(b"\n".join(records) + b"\n")
    outside = snapshot(tmp_path)
    # Paths a hostile id could reach from the working directory or the output; some may
    # exist already on this machine, so the build must not have *created* any of them.
    reachable = [
        base / rel
        for base in (Path.cwd(), tmp_path / "work" / "out")
        for rel in ("../../escaped", "../../b")
    ]
    reachable += [Path("/tmp/seam-absolute-escape"), Path.home() / "home-escape"]
    existed = [p.exists() for p in reachable]
    result = run_build(
        BuildConfig([str(src)], str(tmp_path / "work" / "out"), workers=1, progress=False)
    )
    assert result.counts["accepted"] == len(HOSTILE_IDS)
    written = snapshot(tmp_path / "work")
    assert all(name.startswith("out/") for name in written)
    names = {name.removeprefix("out/") for name in written}
    assert names == {
        "manifest.json",
        "README.md",
        "quarantine.jsonl",
        ".seam-written",  # the names seam wrote, for --overwrite
        *result.shards,
    }
    assert snapshot(tmp_path) == {**outside, **{f"work/{n}": b for n, b in written.items()}}
    assert [p.exists() for p in reachable] == existed
