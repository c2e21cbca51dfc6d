"""Stretches repeated inside texts are encoded once (``pipeline/core/text_reuse.py``), and a
text joined from its pieces' ids has the ids of the whole text.

The property test cuts random multi-line texts (indented code, ``cat -n`` numbering,
Unicode, whitespace runs, special tokens) at *every* candidate a line offers, and
compares the pieces' ids — each piece encoded alone, ASCII pieces on the normalizer-free
twin as the build does — with the real tokenizer's ids of the whole text. The renderer
tests check what the build relies on: a file read again after an edit encodes only the
pieces around the edit; the trip-wire catches a wrong cut and gives the whole text's ids;
reuse pauses where nothing repeats.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.run import real_session_dirs
from pipeline.core import text_reuse
from pipeline.core.long_text import CUT
from pipeline.core.render import ChatRenderer
from pipeline.core.text_reuse import LINE_CUT, PieceReuse, cut_pieces, cutter
from pipeline.core.tokenizer import QWEN25_SPECIAL_TOKENS, QWEN_SPLIT_PATTERN, load_build_tokenizer
from tests.examples import examples


def _whole(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


_LINE_START = st.sampled_from(
    ["", " ", "    ", "\t", "  12\t", "     1\t", "# ", "-", "é", "  ", "1"]
)
_BODY = st.lists(
    st.sampled_from(
        [
            "def f(x):",
            "return x**2  # ok",
            '{"name": "grep", "args": [1, 2.5e-3]}',
            "PASSED [ 12%]",
            "x = y  ",
            "it's they'LL",
            "é中文🙂 e\u0301 \u00a0 \u3000",
            "   ",
            "\r",
            "123 456",
            *QWEN25_SPECIAL_TOKENS,
            "<|im_",
            "end|>",
        ]
    ),
    max_size=4,
).map("".join)
LINES = st.lists(st.tuples(_LINE_START, _BODY).map("".join), min_size=1, max_size=30)


@settings(max_examples=examples(60, 200), deadline=None)
@given(LINES, st.integers(1, 40))
def test_pieces_of_every_candidate_cut_have_the_whole_texts_ids(lines, min_piece):
    backend = load_build_tokenizer().backend_tokenizer  # cached; not a fixture (huge repr)
    renderer = _fresh_renderer()
    text = "\n".join(lines)
    pieces = cut_pieces(text, min_piece=min_piece, mask=0)
    assert "".join(pieces) == text and all(pieces[:-1])
    at = 0
    for piece in pieces[:-1]:  # every cut is one the proven rule allows
        at += len(piece)
        assert CUT.match(text, at) is not None, (text, at)
    got = renderer._encode_uncached(pieces)  # ASCII pieces on the twin, as the build does
    assert np.concatenate(got).tolist() == _whole(backend, text)


def test_the_cuts_a_line_offers_hand_checked():
    text = "abc\n    12\tfoo\nxyz\n  \nplain words\n   a b"
    # After "abc\n": an indented line, cut between its number and the tab. After "foo\n":
    # at "x". The blank-but-spaces line offers none; "plain" starts at its start; the
    # last line is cut where "a" meets the space.
    assert cut_pieces(text, min_piece=1, mask=0) == [
        "abc\n    12",
        "\tfoo\n",
        "xyz\n  \n",
        "plain words\n   a",
        " b",
    ]
    # A piece is never shorter than min_piece (the last one may be).
    assert cut_pieces(text, min_piece=12, mask=0) == [
        "abc\n    12\tfoo\n",
        "xyz\n  \nplain words\n   a",
        " b",
    ]
    assert cut_pieces("no newline at all, a long line" * 10, min_piece=1, mask=0) == [
        "no newline at all, a long line" * 10
    ]
    assert [m.end() - 1 for m in LINE_CUT.finditer(text)] == [10, 15, 22, 38]


def _fresh_renderer() -> ChatRenderer:
    return ChatRenderer(load_build_tokenizer())


def _file(n: int, edit: str | None = None) -> str:
    lines = [
        f"{i:6d}\tvalue_{i} = compute(value_{i - 1}, factor={i % 7})  # step {i}"
        for i in range(1, n)
    ]
    if edit is not None:
        lines[n // 2] = edit
    return "\n".join(lines)


def test_a_file_read_again_after_an_edit_encodes_only_the_pieces_near_the_edit():
    renderer = _fresh_renderer()
    backend = renderer.backend
    encoded: list[int] = []
    real = renderer._encode_batch
    renderer._encode_batch = lambda texts: (encoded.append(sum(map(len, texts))), real(texts))[1]
    first, second = _file(400), _file(400, edit="    200\tvalue_200 = 0  # edited")
    assert renderer._encode_texts([first])[0].tolist() == _whole(backend, first)
    encoded.clear()
    renderer.reuse.stats.cut = text_reuse.CHECK_FIRST + 1  # past the trip-wire's first texts
    ids = renderer._encode_texts([second])[0]
    assert ids.tolist() == _whole(backend, second)
    assert not ids.flags.writeable  # cached, shared: never edited in place
    assert 0 < sum(encoded) < len(second) // 10  # the pieces around the edit, not the file
    assert renderer.reuse.stats.reused_chars > len(second) * 0.8
    assert renderer.reuse.stats.fell_back == 0


def test_short_texts_and_other_tokenizers_are_never_cut():
    renderer = _fresh_renderer()
    short = _file(5)
    assert len(short) < text_reuse.REUSE_TEXT_CHARS
    before = renderer.reuse.stats.cut  # the renderer's own probes may have cut one
    renderer._encode_texts([short])
    assert renderer.reuse.stats.cut == before
    # A tokenizer with an added token holding a pair a cut may fall between is refused;
    # one without such a pair is not (both are otherwise tokenizers the proof covers).
    assert cutter(load_build_tokenizer().backend_tokenizer) is cut_pieces
    for token, allowed in (
        ("<|ok|>", True),
        ("foo bar", False),
        ("<x\ny>", False),
        ("<v1>", False),
    ):
        assert (cutter(_tiny(token)) is cut_pieces) is allowed, token
    assert cutter(_tiny("<t>", pattern=r"\s+|\S+")) is None  # a split rule the proof does not cover


def _tiny(token: str, pattern: str = QWEN_SPLIT_PATTERN):
    """A byte-level BPE with Qwen2's split rule (or ``pattern``) and one added token."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    t = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    t.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    t.add_special_tokens([AddedToken(token)])
    return t


def test_a_wrong_cut_is_caught_by_the_trip_wire_and_the_text_gets_the_whole_ids():
    renderer = _fresh_renderer()
    text = _file(60)
    # A cut inside a word ("val|ue_3"): not one the rule allows; its ids differ.
    at = text.index("value_3") + 3
    renderer._cut_pieces = lambda t: [t[:at], t[at:]] if t == text else [t]
    before = renderer.reuse.stats.cut
    ids = renderer._encode_texts([text])[0]
    assert ids.tolist() == _whole(renderer.backend, text)
    assert renderer.reuse.stats.fell_back == 1 and not renderer.reuse.on
    assert renderer._encode_texts([_file(61)])[0].tolist() == _whole(renderer.backend, _file(61))
    assert renderer.reuse.stats.cut == before + 1  # off for good


def test_the_trip_wire_checks_the_first_texts_and_then_one_in_many():
    reuse = PieceReuse()
    checked = []
    for _ in range(2000):
        checked.append(reuse.check_now())
        reuse.stats.cut += 1
    assert checked[: text_reuse.CHECK_FIRST] == [True] * text_reuse.CHECK_FIRST
    assert sum(checked) == text_reuse.CHECK_FIRST + len(
        range(text_reuse.CHECK_EVERY, 2000, text_reuse.CHECK_EVERY)
    )


def test_reuse_pauses_where_nothing_repeats_and_comes_back_when_repeats_do():
    reuse = PieceReuse()
    cut_batches = 0
    for _ in range(200):  # nothing repeats: every piece character is encoded
        if reuse.wanted():
            cut_batches += 1
            reuse.observe(1000, 1000)
    assert cut_batches < 200 // text_reuse.PROBE_EVERY + 40  # paused after a few dozen
    assert not reuse.wanted() or reuse._paused_batches % text_reuse.PROBE_EVERY == 0
    for _ in range(3 * text_reuse.PROBE_EVERY):  # repeats came back: the probes see them
        if reuse.wanted():
            reuse.observe(1000, 100)
    assert all(reuse.wanted() for _ in range(10))


def test_reused_and_whole_encodes_agree_on_a_real_sample_of_texts():
    """The sample's own long texts, through a renderer with reuse and one without."""
    import orjson
    import zstandard

    from pipeline.core.render import REUSE_TEXT_CHARS

    with open("data/sample/rollouts.jsonl.zst", "rb") as fh:
        raw = zstandard.ZstdDecompressor().stream_reader(fh).read()
    texts = []
    for line in raw.splitlines()[:40]:
        for event in orjson.loads(line)["events"]:
            content = event.get("content")
            if isinstance(content, str) and len(content) >= REUSE_TEXT_CHARS:
                texts.append(content)
    assert len(texts) > 20
    with_reuse = _fresh_renderer()
    without = _fresh_renderer()
    without._cut_pieces = None
    for i in range(0, len(texts), 7):
        batch = texts[i : i + 7]
        got = with_reuse._encode_texts(batch)
        want = without._encode_texts(batch)
        assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert with_reuse.reuse.stats.cut > 0 and with_reuse.reuse.stats.reused_chars > 0


@pytest.mark.parametrize("mask", [0, 1, 3])
def test_the_join_of_the_pieces_is_the_text(mask):
    text = _file(300) + "\n" + "  x\n" * 50 + "end"
    assert "".join(cut_pieces(text, mask=mask)) == text


@pytest.mark.skipif(not real_session_dirs(), reason="SEAM_REALWORLD_DIR / _NEW_DIR not set")
def test_reused_and_whole_encodes_agree_on_every_long_text_of_the_real_sessions():
    """Every message text of the real sessions long enough to be cut (Claude Code, Codex,
    OpenHands, ...: file reads, diffs, test logs, Unicode), encoded with reuse and by a
    renderer without it: the same ids, and the reuse found repeated stretches."""
    from pipeline.core.render import REUSE_TEXT_CHARS
    from pipeline.inspect.verify import iter_input_records

    files = sorted(
        p for d in real_session_dirs() for p in d.rglob("*") if p.is_file() and p.suffix != ".md"
    )
    texts: dict[str, None] = {}
    for _, _, rollout in iter_input_records(files):
        if not hasattr(rollout, "events"):
            continue  # a quarantined record
        for event in rollout.events:
            for text in (getattr(event, "content", None), getattr(event, "reasoning", None)):
                if isinstance(text, str) and len(text) >= REUSE_TEXT_CHARS:
                    texts.setdefault(text, None)
    assert len(texts) > 100
    with_reuse, without = _fresh_renderer(), _fresh_renderer()
    without._cut_pieces = None
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == 16:
            got, want = with_reuse._encode_texts(batch), without._encode_texts(batch)
            assert [g.tolist() for g in got] == [w.tolist() for w in want]
            batch = []
    stats = with_reuse.reuse.stats
    assert stats.cut > 100 and stats.reused_chars > 0 and stats.fell_back == 0


def test_the_bench_reports_how_much_of_its_input_the_reuse_can_skip(tmp_path):
    """``bench/bound.py``'s ``piece_share`` of an input (distinct piece / distinct text
    characters, the line that shows how repetitive a bench input is): 1.0 where texts
    share no stretch, about half where every text is the same file read again with one
    line edited."""
    import orjson

    from bench.bound import distinct_pieces, distinct_texts, piece_share

    def _piece_share(src):
        texts = distinct_texts(src)
        return piece_share(texts, distinct_pieces(texts))

    def rollout(rid: str, texts: list[str]) -> bytes:
        events = [
            {"type": "message", "id": f"m{i}", "role": "user", "content": t}
            for i, t in enumerate(texts)
        ]
        return orjson.dumps({"rollout_id": rid, "events": events}) + b"\n"

    distinct = tmp_path / "distinct.jsonl"
    lone = [f"{i:5d} " + "".join(chr(65 + (i * j) % 26) for j in range(70)) for i in range(80)]
    distinct.write_bytes(rollout("a", ["\n".join(lone)]))
    assert _piece_share(distinct) == 1.0
    edited = tmp_path / "edited.jsonl"
    versions = [_file(200, None if i == 0 else f"    changed = {i}") for i in range(2)]
    edited.write_bytes(rollout("b", versions))
    share = _piece_share(edited)
    assert 0.45 < share < 0.6, share
