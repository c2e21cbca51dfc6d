"""CPU seconds of the build's per-rollout core without the Rust encoder in them.

The distinct-text bound (``bound.py``) pays for the encoder and the shards; what the build
pays on top of it per rollout is Python around the encoder: rendering pieces, cutting
them into units, the encode cache, the seam replay, segments, masks and row columns. On
a loaded machine that overhead drowns in the encoder's noise, so this measures it alone:
a first pass segments, masks and lays out the rows of the first N rollouts of a canonical
JSONL file as the build does (``masked_segments``, ``RowBatch.add_rollout``) and records
every text the encoder was asked for with its ids; the timed passes answer the encoder
from that record (the encode cache emptied first, so every other step runs as in the
first pass) and report the fastest pass's CPU seconds per step.

    python -m bench.core_overhead INPUT.jsonl [--rollouts 200] [--passes 4]

prints one JSON line: ``total`` and the steps (``render``; ``tokenize``: cutting pieces into
units and the replayed encodes; ``segment+mask``; ``rows``), and ``tokens_sha256`` of the
rows' tokens and masks, which two versions of seam must agree on. Run two checkouts alternately (``PYTHONPATH``)
and compare pass by pass.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="canonical JSONL rollouts")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--passes", type=int, default=4, help="timed passes (the fastest counts)")
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as in a build worker

    from pipeline.build.worker import segmenter_with
    from pipeline.common.step_times import StepTimes
    from pipeline.core.render import ChatRenderer
    from pipeline.core.rows import RowBatch, RowOptions, masked_segments
    from schemas.rollout import Rollout

    rollouts = []
    with open(args.input, "rb") as fh:
        for line in fh:
            if len(rollouts) == args.rollouts:
                break
            if line.strip():
                rollouts.append(Rollout.model_validate_json(line))
    segmenter = segmenter_with(None, None)
    renderer = segmenter.renderer
    encode = ChatRenderer._encode_uncached
    recorded: dict[str, object] = {}

    def recording(self, texts):
        ids = encode(self, texts)
        recorded.update(zip(map(str, texts), ids))
        return ids

    def replaying(self, texts):
        return [recorded[t] for t in texts]

    def one_pass() -> tuple[float, StepTimes, RowBatch]:
        times = StepTimes()
        renderer.times = times
        renderer.forget()
        batch = RowBatch()
        options = RowOptions()
        start = time.process_time()
        for ordinal, rollout in enumerate(rollouts):
            with times.step("segment+mask"):
                segments, _ = masked_segments(rollout, segmenter, options)
            with times.step("rows"):
                batch.add_rollout(rollout, ordinal, segments)
        return time.process_time() - start, times, batch

    ChatRenderer._encode_uncached = recording  # type: ignore[method-assign]
    _, _, batch = one_pass()
    digest = hashlib.sha256()
    for chunk in (*batch.token_chunks, *batch.mask_chunks):
        digest.update(chunk.tobytes())
    del batch
    ChatRenderer._encode_uncached = replaying  # type: ignore[method-assign]
    gc.collect()
    gc.freeze()  # the recorded ids are not the build's garbage
    best: tuple[float, StepTimes] | None = None
    for _ in range(args.passes):
        total, times, _ = one_pass()
        if best is None or total < best[0]:
            best = (total, times)
    assert best is not None
    steps = {name: round(cpu, 3) for name, _, cpu in best[1].ordered()}
    print(json.dumps({"total": round(best[0], 3), **steps, "tokens_sha256": digest.hexdigest()}))


if __name__ == "__main__":
    main()
