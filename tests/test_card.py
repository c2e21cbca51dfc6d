"""The dataset card: `datasets` restores the exact shard features from it."""

from __future__ import annotations

import datasets
import pyarrow as pa
import pytest
from datasets.info import DatasetInfosDict
from huggingface_hub import DatasetCard

from pipeline.build.card import feature_yaml
from pipeline.core.shard_schema import SHARD_SCHEMA
from pipeline.sft.stage import SftStage


def expected_features(extra_fields=()) -> datasets.Features:
    return datasets.Features.from_arrow_schema(pa.schema([*SHARD_SCHEMA, *extra_fields]))


@pytest.fixture(params=["rl", "sft"])
def build_and_fields(request, rl_build, sft_build):
    return (rl_build, ()) if request.param == "rl" else (sft_build, SftStage.extra_fields)


def test_card_header_declares_the_exact_features(build_and_fields):
    build, extra = build_and_fields
    card = DatasetCard.load(build / "README.md")
    infos = DatasetInfosDict.from_dataset_card_data(card.data)
    assert infos["default"].features == expected_features(extra)


def test_load_dataset_parquet_restores_the_exact_features(build_and_fields, tmp_path):
    # datasets' default split patterns match train-* files in subdirectories too: SFT
    # preference pairs are named pairs/pairs-*.parquet so they never mix with segments.
    build, extra = build_and_fields
    ds = datasets.load_dataset(
        "parquet", data_dir=str(build), split="train", cache_dir=str(tmp_path)
    )
    assert ds.features == expected_features(extra)
    assert ds.features["loss_mask"].feature.dtype == "int8"
    assert ds.features["reward"].dtype == "float32"


def test_load_dataset_on_the_directory_reads_the_card(build_and_fields, tmp_path):
    build, extra = build_and_fields
    ds = datasets.load_dataset(str(build), split="train", cache_dir=str(tmp_path))
    assert ds.features == expected_features(extra)
    assert ds.num_rows == sum(1 for _ in ds)


def test_card_documents_config_counts_seam_kinds_columns_and_commands(rl_build):
    text = (rl_build / "README.md").read_text()
    for needle in (
        '"rows_per_shard": 7',
        "| accepted | 6 |",
        "| quarantined | 3 |",
        "`compaction`",
        "| `loss_mask` |",
        "| `call_spans` |",
        "seam stats",
        "seam sql",
        "seam report",
        "seam export",
        f'load_dataset("{rl_build}", split="train")',
        "## Context fidelity",
        "| exact |",
    ):
        assert needle in text, needle
    columns = [line for line in text.splitlines() if line.startswith("| `")]
    assert all(line.count(" | ") == 2 for line in columns), "a column doc breaks the Markdown table"


def test_feature_yaml_spells_nested_types_as_datasets_does():
    nested = pa.list_(pa.list_(pa.struct([("a", pa.int8())])))
    assert feature_yaml(nested) == {"list": {"list": [{"name": "a", "dtype": "int8"}]}}
    assert feature_yaml(pa.struct([("x", pa.list_(pa.float32()))])) == {
        "struct": [{"name": "x", "list": "float32"}]
    }
    with pytest.raises(ValueError, match="dataset card dtype"):
        feature_yaml(pa.date32())


def test_card_has_hub_metadata_and_the_split_size(build_and_fields):
    build, _ = build_and_fields
    card = DatasetCard.load(build / "README.md")
    rows = datasets.load_dataset("parquet", data_files=str(build / "train-*.parquet"))[
        "train"
    ].num_rows
    assert card.data.license == "other"
    assert card.data.pretty_name.startswith("seam ")
    assert card.data.task_categories == ["reinforcement-learning", "text-generation"]
    assert card.data.size_categories == ["n<1K"]
    infos = DatasetInfosDict.from_dataset_card_data(card.data)
    assert infos["default"].splits["train"].num_examples == rows


def test_an_sft_builds_pairs_are_a_config_of_the_directory(sft_build, tmp_path):
    pairs = datasets.load_dataset(str(sft_build), "pairs", split="train", cache_dir=str(tmp_path))
    assert {"prompt", "chosen", "rejected"} <= set(pairs.column_names)
    assert pairs.num_rows >= 1
    segments = datasets.load_dataset(str(sft_build), split="train", cache_dir=str(tmp_path))
    assert "prompt" not in segments.column_names  # the default config stays the segments


def test_size_category_buckets():
    from pipeline.build.card import size_category

    assert [size_category(n) for n in (0, 999, 1000, 54_321, 2_000_000)] == [
        "n<1K",
        "n<1K",
        "1K<n<10K",
        "10K<n<100K",
        "1M<n<10M",
    ]
