"""verl multi-turn SFT on seam's SFT rows: a dataset class for verl's ``data.custom_cls``.

verl 0.9's ``MultiTurnSFTDataset`` re-renders ``messages`` turn by turn and sets
``loss_mask`` to 1 on every assistant message, so on seam's rows it would train turns
seam does not (the kept turns before a rewrite, calls seam leaves untrained). This class
gives verl each row's ``input_ids`` and ``loss_mask`` as the build wrote them instead::

    data.custom_cls.path=pipeline/export/verl_sft.py data.custom_cls.name=SeamSFTDataset
    data.train_files=out/sft   # a seam SFT build directory, or a list of its shards

verl's ``create_sft_dataset`` constructs it as ``cls(parquet_files=..., tokenizer=...,
config=data, processor=..., max_samples=...)``. Each item is what ``MultiTurnSFTDataset``
returns with ``pad_mode=no_padding`` (the only mode verl 0.9's engines take:
``FSDPEngine.prepare_model_inputs`` asserts it): 1-D ``input_ids``, ``position_ids``
(``0..n-1``) and ``loss_mask``, which ``SFTTensorCollator`` turns into jagged nested
tensors.

Which tokens verl trains: its engine computes ``log_probs[t] = log p(x_{t+1} | x_{≤t})``
over the packed micro-batch and ``sft_loss`` rolls ``loss_mask`` left by one before the
masked sum, so ``loss_mask[t] = 1`` makes token ``t`` a target — seam's convention (1 on
tokens the policy generated), taken as is. ``batch_num_tokens``, the denominator, is
``loss_mask.sum()``: the loss is the mean over seam's trainable tokens. The roll joins
rows of a micro-batch, so a row's first token must not be trainable (it has no context;
it would be attached to the previous row's last position): seam rows start with the
prompt, the class refuses rows that do not, and a left cut untrains its new first token.

Lengths follow verl's ``data.max_length`` and ``data.truncation`` (verl's defaults: 1024,
``error``), but are settled when the dataset is built, with the count said: ``error``
refuses rows longer than ``max_length`` before training starts (verl's own class raises
on the first such row it meets mid-run), ``left`` keeps a row's last ``max_length``
tokens, ``right`` its first (verl's own class cuts on the right in ``no_padding`` mode
whatever ``truncation`` says). Nothing is dropped. Recipe and what is tested where:
docs/sft.md, "verl multi-turn SFT".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from pipeline.build.manifest import Manifest

COLUMNS = ["input_ids", "loss_mask"]
TRUNCATIONS = ("error", "left", "right")


class SeamSFTDataset(Dataset):
    """seam SFT rows for verl's ``SFTTrainer`` (``data.custom_cls``); see the module text."""

    def __init__(self, parquet_files, tokenizer, config, processor=None, max_samples: int = -1):
        config = config or {}
        pad_mode = str(config.get("pad_mode", "no_padding"))
        if pad_mode != "no_padding":
            raise ValueError(
                f"data.pad_mode={pad_mode}: SeamSFTDataset returns no_padding items, the only "
                "layout verl 0.9's engines take; set data.pad_mode=no_padding"
            )
        self.max_length = int(config.get("max_length", 1024))
        self.truncation = str(config.get("truncation", "error"))
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation={self.truncation}: choose one of {TRUNCATIONS}")
        paths = shard_paths(parquet_files)
        if not paths:
            raise ValueError(f"data.train_files={parquet_files}: no Parquet files to read")
        table = pa.concat_tables(pq.read_table(p, columns=COLUMNS) for p in paths)
        if 0 < max_samples < table.num_rows:
            # verl's MultiTurnSFTDataset also keeps the first max_samples rows (unshuffled)
            table = table.slice(0, max_samples)
        self.input_ids = list_rows(table.column("input_ids"))
        self.loss_mask = list_rows(table.column("loss_mask"))
        self._check(tokenizer)
        self.cut_rows, self.cut_trainable_tokens = self._cut()
        print(self.summary(), file=sys.stderr)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(self.input_ids[item])
        return {
            "input_ids": ids,
            "position_ids": torch.arange(ids.numel(), dtype=torch.long),
            "loss_mask": torch.from_numpy(self.loss_mask[item]),
        }

    @property
    def trainable_tokens(self) -> int:
        return int(sum(m.sum() for m in self.loss_mask))

    def summary(self) -> str:
        """One line: rows, trainable tokens kept, and what ``max_length`` cut."""
        cut = (
            f"{self.cut_rows:,} row(s) longer than data.max_length={self.max_length} cut on the "
            f"{self.truncation}: {self.cut_trainable_tokens:,} of "
            f"{self.trainable_tokens + self.cut_trainable_tokens:,} trainable tokens cut"
            if self.cut_rows
            else f"every row within data.max_length={self.max_length}"
        )
        return (
            f"seam SFT rows: {len(self):,} rows, {self.trainable_tokens:,} trainable tokens "
            f"trained; {cut}"
        )

    def _check(self, tokenizer) -> None:
        vocabulary = len(tokenizer)
        for i, (ids, mask) in enumerate(zip(self.input_ids, self.loss_mask, strict=True)):
            if len(ids) != len(mask):
                raise ValueError(f"row {i}: input_ids and loss_mask differ in length")
            if len(ids) and ids.max() >= vocabulary:
                raise ValueError(
                    f"row {i} has token id {ids.max()} beyond the model tokenizer's {vocabulary:,} "
                    "tokens: train the model whose tokenizer built these rows"
                )
            if len(mask) and mask[0]:
                raise ValueError(
                    f"row {i}: its first token is trainable (nothing precedes it to predict it "
                    "from); not a seam SFT row"
                )

    def _cut(self) -> tuple[int, int]:
        lengths = np.array([len(x) for x in self.input_ids])
        over = np.flatnonzero(lengths > self.max_length)
        if len(over) and self.truncation == "error":
            trainable = sum(int(self.loss_mask[i].sum()) for i in over)
            raise ValueError(
                f"{len(over)} of {len(lengths)} seam SFT rows are longer than data.max_length="
                f"{self.max_length} (longest {lengths.max():,} tokens; {trainable:,} of "
                f"{self.trainable_tokens:,} trainable tokens in them): set data.max_length="
                f"{lengths.max()}, or data.truncation=left|right to cut them"
            )
        lost = 0
        for i in over:
            before = int(self.loss_mask[i].sum())
            keep = (
                slice(-self.max_length, None)
                if self.truncation == "left"
                else slice(self.max_length)
            )
            self.input_ids[i], self.loss_mask[i] = (
                self.input_ids[i][keep],
                self.loss_mask[i][keep].copy(),
            )
            self.loss_mask[i][0] = 0  # a first token has no context to be predicted from
            lost += before - int(self.loss_mask[i].sum())
        return len(over), lost


def list_rows(column: pa.ChunkedArray) -> list[np.ndarray]:
    """A Parquet list column as one int64 array per row (views of one buffer: an agent
    build's rows as Python lists would take tens of bytes per token)."""
    array = column.combine_chunks()
    if not len(array):
        return []
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    return np.split(values, offsets[1:-1] - offsets[0])


def shard_paths(parquet_files) -> list[Path]:
    """``data.train_files`` as Parquet paths: a seam SFT build directory stands for the
    shards its ``manifest.json`` lists, in build order."""
    items = [parquet_files] if isinstance(parquet_files, str | Path) else list(parquet_files)
    paths: list[Path] = []
    for item in map(Path, items):
        if not item.is_dir():
            paths.append(item)
            continue
        manifest = Manifest.read(item)  # none, or unreadable: one line (a ValueError)
        if manifest.stage().trl_mode != "sft":  # rows the stage meant for SFT
            raise ValueError(
                f"{item} is a seam {manifest.kind} build: SFT on it would train every "
                "rollout, failed ones included; pass a seam build-sft directory"
            )
        paths += [item / name for name in manifest.shards]
    return paths
