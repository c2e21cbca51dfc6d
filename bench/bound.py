"""The distinct-text bound of a build: work no build of the same input can skip.

A build of rollouts that logged no token ids must tokenize every text its input holds
and write its shards. Texts repeat across rollouts (the system prompt with its tool
schemas, the task, the same file read by every rollout of a task), and a build may
encode a repeated text once; so the bound tokenizes each *distinct* text once —
deduplicated by content — and writes the build's shards once:

    bound = tokenize(distinct texts) + write(shards)

The texts are every string a chat template renders from a rollout: each message's
content and reasoning, each tool call's name and arguments (in events and in the new
context of rewrites), and the rollout's tool schemas as JSON. The template's own text
(role markers, wrappers) is left out. The build also reuses the ids of stretches repeated
*inside* distinct texts (``pipeline/core/text_reuse.py``), so it may tokenize fewer
characters than this bound: ``distinct_pieces`` gives the bound with that reuse too (the
*distinct-piece bound*), against which the ratio measures the build's overhead alone.
Reading and parsing the input, rendering, segmenting, masking and the rows are not in
it: they are the overhead the ratio ``bound / build`` measures.

Both sides encode with the same routine (``ChatRenderer._encode_uncached``: ASCII texts
on the tokenizer's normalizer-free twin, long texts in proven pieces): a faster exact
encoder in the build makes the bound faster too, so the ratio keeps measuring the build's
overhead. Both sides get the same cores: the bound encodes on the tokenizer's Rayon pool
(``RAYON_NUM_THREADS`` threads), in batches of ``BATCH_CHARS`` characters so that the
``Encoding`` objects of a large input never sit in memory at once (~60 bytes per
character), and writes the shards on that many threads, with the build's own Parquet
settings (``pipeline.build.write``).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

BATCH_CHARS = 8 << 20  # characters per call into the tokenizer (parallel inside a call)


def distinct_texts(src: Path) -> list[str]:
    """The distinct texts of a canonical JSONL file, in first-seen order (not timed)."""
    seen: dict[str, None] = {}
    with open(src, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            rollout = orjson.loads(line)
            if rollout.get("tools"):
                seen.setdefault(orjson.dumps(rollout["tools"]).decode(), None)
            for event in rollout["events"]:
                messages = [event] if event["type"] == "message" else event["context"]
                for m in messages:
                    if m.get("type") != "message":
                        continue  # a kept message: its text was seen where it was added
                    for text in (m.get("content"), m.get("reasoning")):
                        if text:
                            seen.setdefault(text, None)
                    for call in m.get("tool_calls") or ():
                        seen.setdefault(call["name"], None)
                        seen.setdefault(call["arguments"], None)
    return list(seen)


def distinct_pieces(texts: list[str]) -> list[str]:
    """The distinct *pieces* of ``texts``: each text the build would cut
    (``pipeline/core/text_reuse.py``: ``REUSE_TEXT_CHARS`` or longer, on a tokenizer the
    cut rule covers) replaced by its content-defined pieces, the rest whole (not timed).

    The build reuses the ids of stretches repeated inside texts, so it tokenizes fewer
    characters than the distinct-text bound: that bound no longer bounds its tokenizer
    work. This one does — it is the distinct-text bound with the build's own reuse — and
    ``bound / build`` against it measures the build's overhead alone."""
    from pipeline.core.text_reuse import REUSE_TEXT_CHARS, cutter
    from pipeline.core.tokenizer import load_build_tokenizer

    cut = cutter(load_build_tokenizer().backend_tokenizer)
    if cut is None:
        return texts
    seen: dict[str, None] = {}
    for text in texts:
        for piece in cut(text) if len(text) >= REUSE_TEXT_CHARS else (text,):
            seen.setdefault(piece, None)
    return list(seen)


def piece_share(texts: list[str], pieces: list[str]) -> float:
    """Characters of the distinct ``pieces`` / characters of the distinct ``texts`` they
    were cut from (``distinct_pieces``): how repetitive an input is inside its texts
    (1.0: no stretch repeats; one minus it is what the build's reuse can skip)."""
    return sum(map(len, pieces)) / max(1, sum(map(len, texts)))


def tokenize_seconds(texts: list[str]) -> tuple[float, int]:
    """Seconds to encode ``texts`` with the build's tokenizer *as the build encodes*
    (``ChatRenderer._encode_uncached``: ASCII texts on the normalizer-free twin, long texts
    in proven pieces, ids taken out of every encoding into arrays), and the number of
    tokens. The same routine on both sides: a faster exact encoder in the build lowers
    the bound too, so the ratio measures the build's overhead, not the encoder."""
    from pipeline.core.render import ChatRenderer, _batches
    from pipeline.core.tokenizer import load_build_tokenizer

    renderer = ChatRenderer(load_build_tokenizer())
    tokens = 0
    start = time.perf_counter()
    for batch in _batches(texts, BATCH_CHARS):
        tokens += sum(len(ids) for ids in renderer._encode_uncached(batch))
    return time.perf_counter() - start, tokens


def write_seconds(out: Path, threads: int) -> float:
    """Seconds to write the shards of the build in ``out`` again, from memory, with the
    build's Parquet settings, on ``threads`` threads (reading them back is not timed)."""
    import pyarrow.parquet as pq

    from pipeline.build.write import _write_parquet

    tables = [pq.read_table(p) for p in sorted(out.glob("train-*.parquet"))]
    with tempfile.TemporaryDirectory(prefix="seam-bound-") as tmp:
        paths = [Path(tmp) / f"shard-{i}.parquet" for i in range(len(tables))]
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            list(pool.map(_write_parquet, paths, tables))
        return time.perf_counter() - start
