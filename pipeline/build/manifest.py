"""A build's ``manifest.json``, typed: what ``seam verify``, ``show``, ``export`` and the
build's up-to-date check read of it, and the one function that resolves the build's
tokenizer and chat template from it.

The build writes the manifest as a plain dict (``pipeline/build/run.py``; its bytes are
pinned by ``tests/test_output_pin.py``); this module is the reading side. ``Manifest``
accepts every manifest seam has written: fields added over time have the defaults that
older builds mean (no ``skipped`` counts, no ``per_file``, no ``verify``), and unknown
fields are kept. A file that is not JSON or lacks what every build records (its shards)
is refused with one line (``ManifestError``).

The build's tokenizer (``build_tokenizer``), one rule for every reader:

1. ``--tokenizer DIR`` when given (``qwen2.5``: seam's built-in one);
2. else the directory the manifest records (``tokenizer.name_or_path``) when it is still
   there;
3. else seam's built-in tokenizer when the build used it (its ``tokenizer.json`` hashes
   to the recorded ``tokenizer_sha256``: seam rebuilds it offline, so a build made with
   another cache directory or on another machine still resolves);
4. else one line: the recorded directory is gone, pass ``--tokenizer DIR``.

Whatever is chosen must hash to the recorded ``tokenizer_sha256`` and, with the build's
``--chat-template``, to its ``chat_template_sha256`` — else one line naming the flag:
text is never decoded or re-rendered with a vocabulary or template the build did not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.common.errors import SeamError

if TYPE_CHECKING:
    from pipeline.build.stage import PlainStage
    from pipeline.core.render import ChatRenderer

NAME = "manifest.json"


class ManifestError(SeamError, ValueError):
    """No manifest, or one this seam cannot read: one line."""


class BuildTokenizerError(SeamError, ValueError):
    """The build's tokenizer is not at hand, or the one given is not the build's: one line
    naming ``--tokenizer``."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class TokenizerRecord(_Record):
    """``manifest["tokenizer"]``: where the build's tokenizer was and what it hashes to."""

    name_or_path: str = ""
    tokenizer_sha256: str | None = None
    chat_template_sha256: str | None = None
    incremental_rendering: bool | None = None
    vocab_size: str | None = None


class InputRecord(_Record):
    """One input file: its path as given, its sha256, and (newer builds) its place
    relative to the build directory."""

    path: str
    sha256: str
    from_out: str | None = None


class Manifest(_Record):
    """``manifest.json`` of a finished build (fields in the order the build writes them)."""

    seam_version: str = "unknown"
    shard_schema_version: str | int | None = None
    kind: str = "rl"  # the registered name of the build's stage (``pipeline/build/stage.py``)
    command: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)  # the output-affecting options
    fingerprint: str | None = None
    tokenizer: TokenizerRecord = Field(default_factory=TokenizerRecord)
    inputs: list[InputRecord] = Field(default_factory=list)
    shards: list[str]
    shard_sha256: dict[str, str] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)
    seams: dict[str, int] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)
    per_file: dict[str, dict[str, Any]] = Field(default_factory=dict)
    groups_of_one: int = 0
    created_unix: int | None = None
    verify: dict[str, Any] | None = None  # written by ``seam verify`` / the build's --verify

    @classmethod
    def read(cls, build_dir: str | Path) -> Manifest:
        """The manifest of ``build_dir``; ``ManifestError`` (one line) when there is none
        or it cannot be read."""
        path = Path(build_dir) / NAME
        if not path.is_file():
            raise ManifestError(f"{build_dir} has no {NAME}: not a finished seam build")
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the file"
            raise ManifestError(
                f"{path} is not a manifest this seam can read ({where}: {first['msg']}); "
                "rebuild the directory with this seam"
            ) from None

    @classmethod
    def of(cls, manifest: Manifest | dict) -> Manifest:
        """A manifest as a model (a dict, e.g. the one a build just wrote, is validated)."""
        return manifest if isinstance(manifest, Manifest) else cls.model_validate(manifest)

    def stage(self) -> PlainStage:
        """The build's stage, resolved by its registered name (``pipeline/build/stage.py``)."""
        from pipeline.build.stage import stage_class

        return stage_class(self.kind).from_manifest(self.config.get("stage") or {})

    def count(self, key: str) -> int:
        return int(self.counts.get(key, 0))

    def as_dict(self) -> dict[str, Any]:
        """The manifest as the JSON object it was read from (unknown fields included)."""
        return self.model_dump(mode="json", exclude_unset=True)


def read_manifest(build_dir: str | Path) -> Manifest:
    return Manifest.read(build_dir)


def build_tokenizer(manifest: Manifest, tokenizer: str | None = None) -> ChatRenderer:
    """The build's tokenizer and chat template, by the rule in the module docstring."""
    from pipeline.build.worker import segmenter_with
    from pipeline.core.tokenizer import (
        DEFAULT_TOKENIZER,
        default_tokenizer_dir,
        tokenizer_file_sha256,
        tokenizer_fingerprint,
    )

    recorded = manifest.tokenizer
    template = manifest.config.get("chat_template")
    if tokenizer is None:
        where = Path(recorded.name_or_path) if recorded.name_or_path else None
        if where is not None and (where / "tokenizer.json").is_file():
            tokenizer = str(where)
        elif tokenizer_file_sha256(default_tokenizer_dir()) == recorded.tokenizer_sha256:
            tokenizer = DEFAULT_TOKENIZER
        else:
            raise BuildTokenizerError(
                f"the build's tokenizer {recorded.name_or_path or '(not recorded)'} is not here; "
                "pass a copy of it with --tokenizer DIR"
            )
    renderer = segmenter_with(tokenizer, template).renderer  # a bad DIR: TokenizerError
    have = tokenizer_fingerprint(renderer.tokenizer)
    for key in ("tokenizer_sha256", "chat_template_sha256"):
        if have[key] != getattr(recorded, key):
            raise BuildTokenizerError(
                f"the tokenizer at hand ({have['name_or_path']}) is not the build's ({key} "
                "differs from manifest.json); pass the build's with --tokenizer DIR"
            )
    return renderer
