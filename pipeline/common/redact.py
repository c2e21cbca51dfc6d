"""Remove an API key from text that came back from a server, in any encoding a gateway
or a model might echo it in.

Some gateways echo the ``Authorization`` header back (in error bodies, in "debug"
fields), and a model asked to repeat its input can quote it; a JSON serializer may
escape some or all of its characters. Every text seam shows, stores or raises that
came from a server goes through ``Redactor.redact`` first — the raw body before it is
decoded, and each decoded string after — so an echo is caught whichever layer
decoded it.

What is matched, each character of the key as itself or escaped, in any mix:
JSON/JS/Python escapes (``\\u0073``, ``\\x73``, ``\\u{73}``, ``\\/``), percent-encoding
(also double: ``%2573``), HTML character references (``&#115;``, ``&#x73;``), octal
escapes (``\\163``), UTF-16 (a NUL after each character); and the whole key as
Base64 (standard or URL-safe, at any alignment, so also inside ``Bearer <key>``
encoded whole) or hex.

What is never matched: a key shorter than ``MIN_SECRET_CHARS``. ``OPENAI_API_KEY=null``
or ``EMPTY`` (vLLM's convention for "no key") are not secrets, and replacing every
``null`` of an answer with ``***`` would corrupt it.
"""

from __future__ import annotations

import base64
import re

REDACTED = "***"
MIN_SECRET_CHARS = 16  # issued keys are 32+ characters; shorter values are placeholders


def _char_pattern(c: str) -> str:
    code = ord(c)
    forms = [
        re.escape(c),
        rf"\\[uUx]\{{?0*{code:x}\}}?",  # \u0073 \U00000073 \x73 \u{73}
        rf"%(?:25)?{code:02x}",  # %73, and %2573 (encoded twice)
        rf"&#x0*{code:x};",
        rf"&#0*{code};",
        rf"\\0?{code:o}",  # octal
    ]
    if c == "/":
        forms.append(r"\\/")  # JSON may escape the solidus
    # Hex digits in any case; the character itself stays case-sensitive.
    return "(?:" + forms[0] + "|(?i:" + "|".join(forms[1:]) + "))\x00?"


def _base64_forms(secret: bytes) -> list[str]:
    """The part of ``base64(prefix + secret + suffix)`` fixed by ``secret`` alone, for each
    of the three alignments of ``secret`` in the encoded stream, in both alphabets."""
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret).decode()
        end = 4 * ((offset + len(secret)) // 3)  # later groups depend on the suffix
        stable = encoded[4 if offset else 0 : end]
        forms += [stable, stable.replace("+", "-").replace("/", "_")]
    return forms


class Redactor:
    """Replaces every occurrence of each secret, in every form above, with ``***``."""

    def __init__(self, *secrets: str | None):
        self._pattern: re.Pattern[str] | None = None
        alternatives = []
        # Longest first: a secret that contains another is replaced whole.
        for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
            if len(secret) < MIN_SECRET_CHARS:
                continue
            raw = secret.encode()
            alternatives += [
                "".join(_char_pattern(c) for c in secret),
                *(re.escape(f) for f in _base64_forms(raw)),
                "(?i:" + re.escape(raw.hex()) + ")",
            ]
        if alternatives:
            self._pattern = re.compile("|".join(alternatives))

    def redact(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text
