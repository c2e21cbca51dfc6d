"""verl multi-turn SFT on seam's SFT rows, through verl's own code (skipped where ``verl``
is not installed; CI installs it in a virtualenv of its own, see ``.ci/run``).

verl's ``create_sft_dataset`` loads ``pipeline/export/verl_sft.py`` from
``data.custom_cls`` with verl's own data defaults (``sft_trainer_engine.yaml``), its
``SFTTensorCollator`` batches the items, and its ``sft_loss`` counts exactly seam's
trainable tokens as targets, row by row.

verl 0.9.1's ``SFTTrainer`` does not run on CPU: ``run_sft`` calls
``initialize_global_process_group``, which asks for ``cpu:gloo,cuda:nccl`` (verl's
platform layer has no CPU platform and falls back to CUDA whatever ``trainer.device``
says) and fails with ``RuntimeError: Distributed package doesn't have NCCL built in``;
after it, ``get_torch_device().set_device`` is ``torch.cuda.set_device``. So the two
steps here run the pieces ``SFTTrainer.fit`` and the FSDP engine call, in their order:
``tu.get_tensordict`` with fit's meta info, ``batch_num_tokens`` as
``forward_backward_batch`` computes it, ``prepare_micro_batches``,
``build_attention_mask_from_nested``, ``logprobs_from_logits`` and ``sft_loss``; the
padding, forward and roll of ``FSDPEngineWithLMHead.prepare_model_inputs`` /
``prepare_model_outputs`` (``use_remove_padding=False``) are written out below, and
checked against the model run on each row alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.sft_trainer import create_sft_dataset  # noqa: E402
from verl.utils import hf_tokenizer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.dataset_utils import SFTTensorCollator  # noqa: E402
from verl.utils.torch_functional import logprobs_from_logits  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import sft_loss  # noqa: E402
from verl.workers.utils.padding import build_attention_mask_from_nested  # noqa: E402

import pipeline.export.verl_sft  # noqa: E402
from tests.sample_builds import shard_rows  # noqa: E402
from trainer.models import build_tiny_model  # noqa: E402

ENGINE_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "sft_trainer_engine.yaml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return hf_tokenizer(str(tiny_model))  # what verl's HFModelConfig loads from model.path


def data_config(**overrides):
    """verl's SFT ``data`` config (its yaml defaults) with seam's dataset class, as the
    command line ``data.custom_cls.path=... data.custom_cls.name=SeamSFTDataset`` sets it."""
    data = OmegaConf.load(ENGINE_CONFIG).data
    custom = {"path": pipeline.export.verl_sft.__file__, "name": "SeamSFTDataset"}
    return OmegaConf.merge(data, {"custom_cls": custom, **overrides})


def load(build, tokenizer, max_samples=-1, **overrides):
    return create_sft_dataset(str(build), data_config(**overrides), tokenizer, None, max_samples)


def collate(dataset, rows):
    return SFTTensorCollator(data_config().pad_mode)([dataset[i] for i in rows])


def trained_targets(batch) -> list[np.ndarray]:
    """The tokens ``sft_loss`` trains, per row: d loss / d log_prob[t] is
    -mask[t + 1] / batch_num_tokens, so a nonzero gradient at position t makes token
    t + 1 of the packed batch a target."""
    offsets = batch["input_ids"].offsets()
    values = torch.zeros(int(offsets[-1]), requires_grad=True)
    log_probs = torch.nested.nested_tensor_from_jagged(values, offsets)
    data = tu.get_tensordict(tensor_dict=dict(batch), non_tensor_dict={"pad_mode": "no_padding"})
    num_tokens = int(data["loss_mask"].sum())
    tu.assign_non_tensor(data, batch_num_tokens=num_tokens, dp_size=1)
    loss, _ = sft_loss(config=None, model_output={"log_probs": log_probs}, data=data)
    loss.backward()
    target = torch.roll(-values.grad * num_tokens, shifts=1).round().long().numpy()
    return np.split(target, offsets[1:-1].numpy())


def test_verl_trains_exactly_seams_trainable_tokens(sft_build, tokenizer):
    dataset = load(sft_build, tokenizer)
    rows = shard_rows(sft_build)
    assert len(dataset) == len(rows) == 5
    targets = trained_targets(collate(dataset, range(len(rows))))
    for row, target in zip(rows, targets, strict=True):
        np.testing.assert_array_equal(target, row["loss_mask"])
    assert sum(int(t.sum()) for t in targets) == sum(r["num_trainable_tokens"] for r in rows) == 184
    # Hand-checked: the last segment of "plain" trains its reply "Done." and its end of turn.
    last = next(
        i for i, r in enumerate(rows) if (r["rollout_id"], r["segment_index"]) == ("plain", 2)
    )
    ids = np.asarray(rows[last]["input_ids"])[targets[last] == 1]
    assert tokenizer.decode(ids) == "Done.<|im_end|>" and len(ids) == 3


def test_verl_loads_the_class_by_package_path_too(sft_build, tokenizer):
    custom = {"path": "pkg://pipeline.export.verl_sft", "name": "SeamSFTDataset"}
    dataset = create_sft_dataset(str(sft_build), data_config(custom_cls=custom), tokenizer, None)
    assert type(dataset).__module__ == "pipeline.export.verl_sft" and len(dataset) == 5


def test_rows_longer_than_max_length_are_refused_before_training(sft_build, tokenizer):
    # verl's default truncation is "error"; the longest row has 401 tokens.
    with pytest.raises(ValueError, match=r"3 of 5 .* set data.max_length=401"):
        load(sft_build, tokenizer, max_length=350)
    assert load(sft_build, tokenizer, max_length=401).cut_rows == 0


# Trained tokens sit at the rows' ends (the last call's output, 300-400 tokens in): a
# left cut loses some only when it reaches back to an earlier call's output.
@pytest.mark.parametrize(("side", "length", "cut"), [("left", 100, 5), ("right", 350, 3)])
def test_cut_rows_are_counted_and_the_trained_tokens_stay_targets(
    sft_build, tokenizer, side, length, cut, capsys
):
    dataset = load(sft_build, tokenizer, max_length=length, truncation=side)
    rows = shard_rows(sft_build)
    expected_lost = 0
    for row, item in zip(rows, dataset, strict=True):
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        keep = slice(-length, None) if side == "left" else slice(length)
        np.testing.assert_array_equal(item["input_ids"].numpy(), ids[keep])
        kept = mask[keep]
        assert item["loss_mask"][0] == 0  # a first token has nothing to be predicted from
        np.testing.assert_array_equal(item["loss_mask"][1:].numpy(), kept[1:])
        expected_lost += int(mask.sum() - kept[1:].sum())
    assert dataset.cut_rows == cut and dataset.cut_trainable_tokens == expected_lost > 0
    said = capsys.readouterr().err
    assert f"{cut} row(s) longer than data.max_length={length} cut on the {side}: " in said
    assert f"{expected_lost:,} of 184 trainable tokens cut" in said
    targets = trained_targets(collate(dataset, range(len(dataset))))
    assert sum(int(t.sum()) for t in targets) == 184 - expected_lost


def test_not_seam_sft_rows_are_refused(sft_build, tokenizer, tmp_path):
    rl = tmp_path / "rl"
    rl.mkdir()
    (rl / "manifest.json").write_text(json.dumps({"kind": "rl", "shards": []}))
    with pytest.raises(ValueError, match="seam rl build"):
        load(rl, tokenizer)
    (rl / "manifest.json").write_text(json.dumps({"kind": "sft", "shards": []}))
    with pytest.raises(ValueError, match="no Parquet files to read"):
        load(rl, tokenizer)
    with pytest.raises(ValueError, match="pad_mode=no_padding"):
        load(sft_build, tokenizer, pad_mode="right")
    shard = tmp_path / "rows.parquet"
    empty = {
        "input_ids": pa.array([], pa.list_(pa.int32())),
        "loss_mask": pa.array([], pa.list_(pa.int8())),
    }
    pq.write_table(pa.table(empty), shard)
    assert len(load(shard, tokenizer)) == 0  # an empty shard is no rows, not one empty row
    for ids, mask, reason in [
        ([1, 2, 3], [1, 0, 1], "row 1: its first token is trainable"),
        ([1, len(tokenizer), 3], [0, 1, 1], f"row 1 has token id {len(tokenizer)} beyond"),
    ]:
        rows = {"input_ids": [[1, 2], ids], "loss_mask": [[0, 1], mask]}
        pq.write_table(pa.table(rows), shard)
        assert len(load(shard, tokenizer, max_samples=1)) == 1  # verl's first rows only
        with pytest.raises(ValueError, match=reason):
            load(shard, tokenizer)


def engine_log_probs(model, micro):
    """``FSDPEngineWithLMHead`` without remove-padding: pad the jagged batch, run the
    model with the attention mask of the real tokens, log-prob of the next token of the
    packed batch (ids rolled left by one), back to jagged."""
    ids = micro["input_ids"]
    offsets = ids.offsets()
    lengths = offsets.diff()
    shape = (len(lengths), int(lengths.max()))
    logits = model(
        input_ids=torch.nested.to_padded_tensor(ids, padding=0, output_size=shape),
        attention_mask=build_attention_mask_from_nested(ids, shape[1]),
        position_ids=torch.nested.to_padded_tensor(micro["position_ids"], 0, output_size=shape),
    ).logits
    jagged = torch.nested.narrow(logits, 1, torch.zeros_like(lengths), lengths, layout=torch.jagged)
    rolled = torch.roll(ids.values(), shifts=-1, dims=0)
    # One row of all packed tokens: the values of the engine's (tokens, vocab) call, which
    # logprobs_from_logits_v2 would loop over token by token (seconds on CPU).
    log_probs = logprobs_from_logits(torch.cat(list(jagged.unbind()))[None], rolled[None])[0]
    return torch.nested.nested_tensor_from_jagged(log_probs, offsets)


def train_step(model, optimizer, batch, meta) -> float:
    data = tu.get_tensordict(tensor_dict=dict(batch), non_tensor_dict=meta)
    tu.assign_non_tensor(data, batch_num_tokens=int(data["loss_mask"].sum()), dp_size=1)
    micro_batches, _ = prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
    assert len(micro_batches) == 2
    total = 0.0
    for micro in micro_batches:
        output = {"log_probs": engine_log_probs(model, micro)}
        loss, _ = sft_loss(config=None, model_output=output, data=micro)
        loss.backward()
        total += float(loss)
    optimizer.step()
    optimizer.zero_grad()
    return total


def own_loss(model, rows) -> float:
    """Mean negative log-likelihood of the rows' trainable tokens, each row run alone."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.as_tensor(row["input_ids"])[None]
            mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)[1:]
            logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
            nll -= float(logp.gather(-1, ids[0, 1:, None])[:, 0][mask].sum())
            count += int(mask.sum())
    return nll / count


def test_two_sft_steps_through_verls_pieces(sft_build, tiny_model, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = load(sft_build, tokenizer)
    # verl's dynamic batching (its default) with a token budget that fits one row per
    # micro-batch: sft_loss divides by the whole batch's trainable tokens either way.
    config = data_config(train_batch_size=2, max_token_len_per_gpu=400)
    meta = {  # SFTTrainer.fit's meta_info
        "use_remove_padding": False,
        "use_dynamic_bsz": config.use_dynamic_bsz,
        "max_token_len_per_gpu": config.max_token_len_per_gpu,
        "micro_batch_size_per_gpu": config.micro_batch_size_per_gpu,
        "temperature": 1.0,
        "global_batch_size": config.train_batch_size,
        "pad_mode": config.pad_mode,
        "pad_token_id": tokenizer.pad_token_id,
    }
    rows = shard_rows(sft_build)
    batch = [1, 4]  # two rollouts' segments; the same batch twice, so the second loss is lower
    expected = own_loss(model, [rows[i] for i in batch])
    losses = [train_step(model, optimizer, collate(dataset, batch), meta) for _ in range(2)]
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert np.isfinite(losses).all() and losses[1] < losses[0]


def test_the_documented_command_composes_and_loads_the_build(sft_build, tiny_model, tmp_path):
    """docs/sft.md's ``verl.trainer.sft_trainer`` overrides, composed with verl's
    ``sft_trainer_engine`` config as its ``main`` composes them (run from the seam
    checkout, as the docs say): every key exists, verl's config dataclasses accept the
    model, engine and optimizer sections, and ``create_sft_dataset`` loads the build with
    the composed ``data`` section."""
    import os
    import re

    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    root = Path(pipeline.export.verl_sft.__file__).parents[2]
    text = (root / "docs" / "sft.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "sft_trainer" in b]
    overrides = re.findall(r"^\s+([\w.]+=.+?)(?: \\)?$", block, re.M)
    assert len(overrides) >= 8, block
    filled = [
        o.replace("MODEL_DIR", str(tiny_model)).replace("out/sft", str(sft_build))
        for o in overrides
    ]
    directory = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        config = compose(config_name="sft_trainer_engine", overrides=filled)
    assert config.data.custom_cls.name == "SeamSFTDataset"
    for section in ("engine", "optim", "checkpoint"):
        omega_conf_to_dataclass(config[section])
    model = omega_conf_to_dataclass(config.model)  # loads the tokenizer from model.path
    cwd = os.getcwd()
    os.chdir(root)  # data.custom_cls.path is relative to the checkout
    try:
        dataset = create_sft_dataset(
            config.data.train_files, config.data, model.tokenizer, None, max_samples=-1
        )
    finally:
        os.chdir(cwd)
    assert len(dataset) == len(shard_rows(sft_build)) and dataset.cut_rows == 0
