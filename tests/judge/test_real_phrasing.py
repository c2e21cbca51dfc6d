"""The rules read real Claude Code summaries and continuations the way they are written
(issue 23, item 3: what the tune part of judge/labels/real_compactions.jsonl showed).

The session below is written in Claude Code's record format, in this project's own
words: the agent edits a loader, tests and commits in one command, then edits two files
whose extensions the path pattern does not know and writes a scratch file under /tmp.
The budget compaction's summary names files the way real summaries do — a base name, a
path with a leading slash relative to the repository, a templated path — says a file
"changed X to Y" (a name in code, not a file edit) and that a test "still needs to be
updated"; the harness's 2.1 tail ("where we left off", no "it") follows. After it the
agent looks around (``git status``, a search, ``git diff``) before it runs the first
part of the quoted command chain. None of this is a defect, and the rule judge says so.
"""

from __future__ import annotations

import json

import pytest

from judge.facts import is_temporary, names_file, paths_in, paths_memo, same_path
from judge.history import compactions
from judge.rules import ALL_CHECKS, _commands, _identifiers, continuation_findings, judge_rollout
from judge.summary import _is_negated, _object_paths, check_summary, summary_body
from judge.workspace import workspace_state
from schemas.replay import replay
from tests.readers.util import only

SESSION = "5e1f0c2a-0000-4000-8000-0000000ph23a"
REPO = "/work/svc"
TRANSCRIPT = f"/home/dev/.claude/projects/-work-svc/{SESSION}.jsonl"
SUMMARY = f"""This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.

Analysis:
The user asked for YAML support in the config loader.

Summary:
1. Primary Request and Intent:
   - Make the config loader read YAML as well as JSON.

3. Files and Code Sections:
   - **`loader/config.go`**: `Load` now dispatches on the extension; committed as "Load YAML config".
   - **`/web/views/page.html.heex`**: shows the loaded format.
   - **notes.ex**: a scratch module documenting the formats.
   - Changed `defaults.json` to `defaults.yaml` in the lookup list of `Load`.
   - Settings are looked up at `.svc/<env>/settings.json`.
   - `loader/config_test.go` still needs to be updated for YAML; I haven't yet updated `loader/config_test.go`.

9. Optional Next Step:
   Run `go vet ./... && go test ./loader/...` and then wire `loader.LoadYAML(path)` into the main command.

If you need specific details from before compaction (like exact code snippets, error messages, or content you generated), read the full transcript at: {TRANSCRIPT}
Please continue the conversation from where we left off without asking the user any further questions. Continue with the last task that you were asked to work on."""


def _records() -> list[dict]:
    """(kind, payload) steps → Claude Code records with parent links and timestamps."""
    steps: list[tuple[str, object]] = [
        ("user", "Make the config loader read YAML too."),
        ("call", ("Read", {"file_path": f"{REPO}/loader/config.go"}, "package loader\n")),
        ("call", ("Read", {"file_path": f"{REPO}/loader/config_test.go"}, "package loader\n")),
        (
            "call",
            (
                "Edit",
                {
                    "file_path": f"{REPO}/loader/config.go",
                    "old_string": '"defaults.json"',
                    "new_string": '"defaults.yaml"',
                },
                "ok",
            ),
        ),
        (
            "call",
            (
                "Bash",
                {"command": "cd /work/svc && go test ./... && git commit -am 'Load YAML config'"},
                "ok  \tsvc/loader\t0.02s\n[main 1a2b3c4] Load YAML config\n 1 file changed",
            ),
        ),
        (
            "call",
            (
                "Edit",
                {
                    "file_path": f"{REPO}/web/views/page.html.heex",
                    "old_string": "x",
                    "new_string": "y",
                },
                "ok",
            ),
        ),
        (
            "call",
            (
                "Write",
                {"file_path": f"{REPO}/docs/notes.ex", "content": "defmodule Notes do end"},
                "ok",
            ),
        ),
        ("call", ("Write", {"file_path": "/tmp/probe_yaml.go", "content": "package main"}, "ok")),
        ("compact", SUMMARY),
        (
            "call",
            ("Bash", {"command": "git status", "description": "Check state"}, "On branch main"),
        ),
        ("call", ("Grep", {"pattern": "func main", "path": f"{REPO}/cmd"}, "cmd/svc/run.go")),
        ("call", ("Bash", {"command": "git diff", "description": "Show changes"}, "")),
        ("call", ("Bash", {"command": "go vet ./..."}, "")),
    ]
    records: list[dict] = []
    parent = None
    base = {"isSidechain": False, "userType": "external", "cwd": REPO, "sessionId": SESSION,
            "version": "2.1.39", "gitBranch": "main"}  # fmt: skip

    def add(uuid: str, **fields) -> None:
        nonlocal parent
        minute = len(records)
        records.append(
            {
                "parentUuid": parent,
                **base,
                "uuid": uuid,
                "timestamp": f"2026-03-02T10:{minute:02d}:00.000Z",
                **fields,
            }  # fmt: skip
        )
        parent = uuid

    for i, (kind, payload) in enumerate(steps):
        if kind == "user":
            add(f"u{i}", type="user", message={"role": "user", "content": payload})
        elif kind == "compact":
            add(f"cb{i}", type="system", subtype="compact_boundary", content="Conversation compacted",
                isMeta=False, level="info", compactMetadata={"trigger": "auto", "preTokens": 160000})  # fmt: skip
            add(f"s{i}", type="user", message={"role": "user", "content": payload},
                isCompactSummary=True, isVisibleInTranscriptOnly=True)  # fmt: skip
        else:
            name, args, result = payload  # type: ignore[misc]
            tool_id = f"toolu_{i:02d}"
            add(f"a{i}", type="assistant", requestId=f"req_{i}",
                message={"model": "claude-opus-4-5-20251101", "id": f"msg_{i:02d}", "type": "message",
                         "role": "assistant", "stop_reason": "tool_use", "stop_sequence": None,
                         "usage": {"input_tokens": 100, "output_tokens": 20},
                         "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": args}]})  # fmt: skip
            add(f"r{i}", type="user", toolUseResult={"stdout": result, "stderr": "", "interrupted": False},
                message={"role": "user", "content": [{"tool_use_id": tool_id, "type": "tool_result",
                                                      "content": result, "is_error": False}]})  # fmt: skip
    return records


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    path = tmp_path_factory.mktemp("phrasing") / f"{SESSION}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    return only("claude-code", path)


def test_the_rule_judge_raises_no_flag_on_real_phrasing(rollout):
    (comp,) = compactions(rollout, replay(rollout))
    assert comp.message_id == "s8"
    assert judge_rollout(rollout, ALL_CHECKS) == []


def test_the_harness_tail_without_it_is_not_part_of_the_summary(rollout):
    (comp,) = compactions(rollout, replay(rollout))
    body = summary_body(comp.summary)
    assert TRANSCRIPT not in body and "where we left off" not in body
    assert body.rstrip().endswith("into the main command.")


def test_key_files_are_uncommitted_work_files_named_by_base_name_or_root_path(rollout):
    (comp,) = compactions(rollout, replay(rollout))
    state = workspace_state(comp.history)
    # config.go went into the commit; /tmp/probe_yaml.go is scratch.
    assert state.key_files == [f"{REPO}/web/views/page.html.heex", f"{REPO}/docs/notes.ex"]
    assert state.committed == [f"{REPO}/loader/config.go"]
    check = check_summary(comp.summary, state, workspace_state(comp.prior))
    assert check.omitted == [] and check.wrong_state == [] and check.invented_paths == []


def test_the_continuation_looks_around_before_it_runs_one_part_of_the_chain(rollout):
    assert continuation_findings(rollout, compactions(rollout, replay(rollout))) == []


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        ("at `.svc/<env>/settings.json`", []),  # a template's tail is not a file
        ("under ${HOME}/x.json and */y.go and [id]/z.py", []),
        ("`/cmd/svc/main.go` and root.html.heex", ["/cmd/svc/main.go"]),  # .heex: not root.html
        ("echo >/tmp/out.txt", []),  # (a redirection glued to /: read as a template tail too)
        ("see /etc/svc/app.yaml", ["/etc/svc/app.yaml"]),
    ],
)
def test_paths_in_templates_and_unknown_extensions(text, paths):
    assert paths_in(text) == paths


def test_paths_memo_answers_what_a_scan_answers_with_a_list_of_its_own():
    texts = ["edit src/a.py then tests/test_a.py", "no paths here", "src/a.py and ./b/c.md"]
    scanned = [paths_in(t) for t in texts]
    with paths_memo():
        first = [paths_in(t) for t in texts]
        first[0].append("appended.py")  # what a caller does with its list (workspace _add)
        again = [paths_in(t) for t in texts]
        with paths_memo():  # a nested block (a rollout judged inside another's) starts afresh
            assert [paths_in(t) for t in texts] == scanned
    assert again == scanned and first[1:] == scanned[1:]
    assert [paths_in(t) for t in texts] == scanned  # and nothing is kept after the block


def test_file_names_as_summaries_write_them():
    assert same_path("/cmd/svc/main.go", "/work/svc/cmd/svc/main.go")
    assert not same_path("/main.go", "/work/svc/main.go")  # a bare root file: too loose
    assert names_file("- **notes.ex**: a module", "/work/svc/docs/notes.ex")
    assert not names_file("notes.exs", "/work/svc/docs/notes.ex")
    assert not names_file("mynotes.ex", "/work/svc/docs/notes.ex")
    assert is_temporary("/tmp/probe.go") and is_temporary("/private/var/folders/x/y.go")
    assert is_temporary("/work/svc/tmp/scratch.go") and not is_temporary("/work/svc/template.go")


def test_future_and_denied_edits_and_renamed_names_are_not_edit_claims():
    assert _is_negated("but I haven't yet ") and _is_negated("it needs to be ")
    assert _is_negated("this should be ") and not _is_negated("I ")
    assert _object_paths(" `defaults.json` to `defaults.yaml` in Load") == []
    assert _object_paths(" `a.py`, `b.py` and c.py to fix it") == ["a.py", "b.py", "c.py"]


def test_next_step_targets_pair_quotes_and_split_command_chains():
    text = "Check `os.Getwd()` with relative paths (not starting with `/`) then run `make fmt && make lint`"
    assert _identifiers(text) == ["os.Getwd"]
    assert _commands(text) == ["make fmt", "make lint"]  # not " with relative paths (not ..."


def test_a_next_step_saying_nothing_is_left_names_nothing_to_follow(tmp_path):
    records = _records()
    summary = next(r for r in records if r.get("isCompactSummary"))
    summary["message"]["content"] = SUMMARY.replace(
        "Run `go vet ./... && go test ./loader/...` and then wire `loader.LoadYAML(path)` into the main command.",
        "None - the work is committed. If asked, `git show HEAD:loader/other.go` shows it.",
    )
    path = tmp_path / f"{SESSION}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rollout = only("claude-code", path)
    assert continuation_findings(rollout, compactions(rollout, replay(rollout))) == []


def test_working_on_a_file_the_summary_names_is_not_ignoring_its_next_step(tmp_path):
    """The agent updates the test the summary says still needs it before running the
    chain: another part of the summary's plan, not an ignored step."""
    records = _records()
    first_after = next(i for i, r in enumerate(records) if r.get("isCompactSummary")) + 1
    call = records[first_after]["message"]["content"][0]
    call["name"], call["input"] = (
        "Edit",
        {"file_path": f"{REPO}/loader/config_test.go", "old_string": "j", "new_string": "y"},
    )
    path = tmp_path / f"{SESSION}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rollout = only("claude-code", path)
    assert continuation_findings(rollout, compactions(rollout, replay(rollout))) == []
    # Working on something the summary never names is still flagged.
    call["input"]["file_path"] = f"{REPO}/web/server.go"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rollout = only("claude-code", path)
    (found,) = continuation_findings(rollout, compactions(rollout, replay(rollout)))
    assert found.verdict == "ignored_next_step"


def test_a_prose_next_step_that_quotes_the_users_request_is_concrete():
    text = SUMMARY.replace(
        "Run `go vet ./... && go test ./loader/...` and then wire `loader.LoadYAML(path)` into the main command.",
        "Add the loaded format to the startup log. The user's exact request was:\n"
        '   > "when the service starts it should also say which config format it loaded"',
    )
    assert check_summary(text, workspace_state([])).has_next_step
    vague = text.split("9. Optional Next Step:")[0] + "9. Optional Next Step:\n   Keep going.\n"
    assert not check_summary(vague, workspace_state([])).has_next_step
