"""``pipeline/build/manifest.py``: the typed reading of ``manifest.json`` (every manifest seam has
written loads; a damaged one is one line) and the one rule that resolves a build's
tokenizer for verify, show and export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.build.manifest import BuildTokenizerError, Manifest, ManifestError, build_tokenizer
from pipeline.build.stage import UnknownStageError
from pipeline.common.errors import SeamError
from pipeline.core.tokenizer import DEFAULT_TOKENIZER, default_tokenizer_dir, tokenizer_file_sha256

# The shape of the first manifests seam wrote: no per-input "from_out", no
# "incremental_rendering", every option of the build under "config", no "verify".
OLDEST = {
    "seam_version": "0.1.0",
    "shard_schema_version": "1.0",
    "kind": "rl",
    "command": "seam build-rl in.jsonl --out out",
    "config": {"inputs": ["in.jsonl"], "out": "out", "kind": "rl", "stage": None},
    "fingerprint": "ab" * 32,
    "tokenizer": {
        "name_or_path": "/gone/qwen",
        "tokenizer_sha256": "cd" * 32,
        "chat_template_sha256": "ef" * 32,
        "vocab_size": "151665",
    },
    "inputs": [{"path": "in.jsonl", "sha256": "01" * 32}],
    "shards": ["train-00000-of-00001.parquet"],
    "shard_sha256": {"train-00000-of-00001.parquet": "23" * 32},
    "counts": {"read": 2, "accepted": 2, "quarantined": 0},
    "seams": {"none": 2},
    "skipped": {},
    "per_file": {"in.jsonl": {"format": "canonical", "read": 2}},
    "groups_of_one": 2,
    "created_unix": None,
}


def _write(tmp_path: Path, manifest) -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_oldest_manifest_shape_loads_with_what_it_means(tmp_path):
    m = Manifest.read(_write(tmp_path, OLDEST))
    assert (m.kind, m.shards, m.count("accepted"), m.count("rollouts_without_segments")) == (
        "rl",
        ["train-00000-of-00001.parquet"],
        2,
        0,
    )
    assert m.inputs[0].from_out is None and m.tokenizer.incremental_rendering is None
    assert m.verify is None
    assert m.as_dict() == OLDEST  # nothing added, nothing lost
    assert type(m.stage()).__name__ == "PlainStage"


def test_unknown_fields_are_kept(tmp_path):
    m = Manifest.read(_write(tmp_path, {**OLDEST, "future_field": {"x": 1}}))
    assert m.as_dict()["future_field"] == {"x": 1}


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"shards": ', "not a manifest this seam can read"),
        ("[1, 2]", "not a manifest this seam can read"),
        (json.dumps({k: v for k, v in OLDEST.items() if k != "shards"}), "shards: Field required"),
        (json.dumps({**OLDEST, "counts": {"read": "many"}}), "counts.read"),
    ],
)
def test_a_manifest_seam_cannot_read_is_one_line(tmp_path, text, says):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ManifestError) as error:
        Manifest.read(tmp_path)
    message = str(error.value)
    assert says in message and "\n" not in message
    assert isinstance(error.value, SeamError)


def test_no_manifest_is_one_line(tmp_path):
    with pytest.raises(ManifestError, match="has no manifest.json: not a finished seam build"):
        Manifest.read(tmp_path)


def test_registry_errors_are_seam_errors():
    assert issubclass(UnknownStageError, SeamError)
    assert issubclass(BuildTokenizerError, SeamError)


@pytest.fixture(scope="module")
def builtin() -> Manifest:
    """A manifest naming seam's built-in tokenizer, as a build records it."""
    directory = default_tokenizer_dir()
    from pipeline.build.worker import segmenter_with
    from pipeline.core.tokenizer import tokenizer_fingerprint

    recorded = tokenizer_fingerprint(segmenter_with(None, None).renderer.tokenizer)
    assert recorded["name_or_path"] == str(directory)
    return Manifest.model_validate({**OLDEST, "config": {}, "tokenizer": recorded})


def _elsewhere(manifest: Manifest, **tokenizer) -> Manifest:
    record = {**manifest.tokenizer.model_dump(), **tokenizer}
    return manifest.model_copy(update={"tokenizer": type(manifest.tokenizer)(**record)})


def test_the_recorded_tokenizer_is_used_when_it_is_here(builtin):
    renderer = build_tokenizer(builtin)
    assert renderer.tokenizer.name_or_path == builtin.tokenizer.name_or_path


def test_the_built_in_tokenizer_resolves_from_another_cache(builtin):
    """A build made with another cache directory (or machine) names a path that is not
    here; its hash says it is seam's built-in tokenizer, which seam rebuilds offline."""
    moved = _elsewhere(builtin, name_or_path="/elsewhere/cache/qwen2.5-chatml-tools-0")
    assert build_tokenizer(moved).tokenizer.name_or_path == str(default_tokenizer_dir())


def test_a_tokenizer_that_is_gone_is_one_line_naming_the_flag(builtin):
    gone = _elsewhere(builtin, name_or_path="/gone/tok", tokenizer_sha256="00" * 32)
    with pytest.raises(
        BuildTokenizerError, match="/gone/tok is not here; pass a copy of it with --tokenizer DIR"
    ):
        build_tokenizer(gone)


def test_a_tokenizer_that_is_not_the_build_s_is_refused(builtin, tmp_path):
    """A copy whose tokenizer.json differs (re-serialized: another sha256) is not the
    build's, whether given with --tokenizer or found at the recorded path."""
    copy = tmp_path / "tok"
    shutil.copytree(default_tokenizer_dir(), copy)
    data = json.loads((copy / "tokenizer.json").read_text())
    (copy / "tokenizer.json").write_text(json.dumps(data, indent=1))
    assert tokenizer_file_sha256(copy) != builtin.tokenizer.tokenizer_sha256
    for manifest, given in (
        (builtin, str(copy)),
        (_elsewhere(builtin, name_or_path=str(copy)), None),
    ):
        with pytest.raises(BuildTokenizerError, match="tokenizer_sha256 differs.*--tokenizer DIR"):
            build_tokenizer(manifest, given)
    assert build_tokenizer(builtin, DEFAULT_TOKENIZER).tokenizer.name_or_path == str(
        default_tokenizer_dir()
    )


def test_the_build_s_chat_template_is_part_of_the_match(builtin):
    other = _elsewhere(builtin, chat_template_sha256="11" * 32)
    with pytest.raises(BuildTokenizerError, match="chat_template_sha256 differs"):
        build_tokenizer(other)
