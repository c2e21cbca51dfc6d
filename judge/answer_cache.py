"""The judge's content-addressed answer cache: one small JSON file per request body.

The key is the SHA-256 of the canonical request body, so a rerun over the same inputs
sends no request. Only answers the caller accepted are stored, never one larger than
the response limit. A file that cannot be read back as an entry this client would have
written (truncated by a crash, edited, another program's, over the limit) is a miss:
the request is sent again and its answer replaces the file. A cache is an optimisation,
and a broken one must not end a run.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.common import atomic


class AnswerCache:
    def __init__(self, root: str | Path, model: str, max_bytes: int):
        self.root = Path(root)
        self.model = model
        self.max_bytes = max_bytes

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        """The cached answer, or None when there is none or it is unusable."""
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read(self.max_bytes + 1)  # an entry is never larger than an answer
            if len(data) > self.max_bytes:
                return None
            content = json.loads(data)["content"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable or not an entry: a miss, rewritten on success
        return content if isinstance(content, str) else None

    def put(self, key: str, content: str) -> bool:
        """Store ``content`` (temp file, then rename); False when it is over the limit."""
        data = json.dumps({"model": self.model, "content": content}).encode()
        if len(data) > self.max_bytes:
            return False
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # no fsync: a torn entry after a power cut is a miss, and a sync per answer is slow
        atomic.write_bytes(path, data, fsync=False)
        return True
