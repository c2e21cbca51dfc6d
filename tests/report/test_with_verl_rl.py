"""``seam export --to verl`` trained by verl's own actor-update code, two steps on CPU
(skipped where ``verl`` is not installed; ``make test-trainers`` installs it).

verl 0.9.1's default worker, ``TrainingWorker`` with the FSDP engine, does not start on a
CPU-only torch: ``FSDPEngine.__init__`` builds its device mesh with
``init_device_mesh("cuda", ...)``, which calls ``torch.cuda.set_device``
(``AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'``; verl registers
its FSDP engine for ``cuda`` and ``npu`` only and its platform layer falls back to
``nvidia``), and ``forward_backward_batch`` moves its token count to
``get_device_id()`` (``AssertionError: Torch not compiled with CUDA enabled``).
``verl.workers.engine_workers`` and ``verl.trainer.ppo.ray_trainer`` do not even import
without verl's ``verl-core`` extra (uvicorn, cachetools). So these tests run verl's own
code from the batch up, and rebuild only the engine's loop around it, line for line:

- the batch as verl's agent loop pads it (``AgentLoopWorker._agent_loop_postprocess``:
  prompts left-padded to ``rollout.prompt_length``, responses and ``response_mask``
  right-padded to ``rollout.response_length``, positions from verl's
  ``compute_position_id_with_mask``), rewards from verl's ``NaiveRewardManager`` with
  ``pipeline/export/verl_reward.py``, advantages from verl's
  ``compute_grpo_outcome_advantage``;
- verl's ``left_right_2_no_padding`` (``ray_trainer._update_actor``; main_ppo's default
  v1 trainer stores the same unpadded rows, ``loss_mask = response_mask``), ``make_iterator``
  (``TrainingWorker.train_mini_batch``), ``prepare_micro_batches`` and the global
  ``batch_num_tokens`` all-reduced over a gloo group of one
  (``FSDPEngine.forward_backward_batch``), log-probs as ``FSDPEngineWithLMHead`` computes
  them without padding removal (``logprobs_from_logits`` on the rolled ids), verl's
  ``ppo_loss`` (``workers/utils/losses.py``), then clip and AdamW as
  ``FSDPEngine.optimizer_step``.

Rollouts here: ``one`` (1 segment), ``four`` (4 segments: three compactions) and ``two``
(2 segments), one task.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

import datasets  # noqa: E402
import torch.distributed as dist  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402
from verl.utils.torch_functional import logprobs_from_logits  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.reward_manager.naive import NaiveRewardManager  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import (  # noqa: E402
    build_attention_mask_from_nested,
    left_right_2_no_padding,
    no_padding_2_padding,
)

import pipeline.export.verl_reward  # noqa: E402
from pipeline.build import BuildConfig, run_build  # noqa: E402
from pipeline.export import export_build  # noqa: E402
from schemas.rollout import MessageEvent, Rollout  # noqa: E402
from tests.judge.rollouts import Story  # noqa: E402
from tests.report.conftest import (  # noqa: E402
    FAIL,
    SECOND_SUMMARY,
    SUMMARY,
    one_compaction,
    shard_rows,
)
from trainer.models import build_tiny_model, policy_hidden, token_logprobs  # noqa: E402

PAD = 151643  # Qwen2.5's <|endoftext|>, the tokenizer's pad token


def three_compactions(rollout_id: str) -> Story:
    """7 calls, 4 segments."""
    return (
        Story(rollout_id)
        .act(("bash", {"command": "pytest"}, FAIL))
        .compact(SUMMARY)
        .act(("read_file", {"path": "src/dates.py"}, "x"))
        .compact(SECOND_SUMMARY, trigger="budget")
        .act(("edit_file", {"path": "src/dates.py"}, "edited"))
        .compact(SECOND_SUMMARY)
        .say("Done.")
    )


def cut_by_max_tokens(rollout: Rollout) -> Rollout:
    """The rollout with a last call cut by the length limit: its rendered end-of-turn is
    not trained, so its segment ends with untrained tokens, which the export cuts."""
    cut = MessageEvent(id="cut", role="assistant", content="Let me", finish_reason="length")
    return rollout.model_copy(update={"events": [*rollout.events, cut]})


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    """``one`` ends with a call cut by max tokens. The build uses the sample std
    (``std_ddof=1``), as verl's GRPO does."""
    tmp = tmp_path_factory.mktemp("verl-rl")
    one = Story("one").act(("bash", {"command": "pytest"}, FAIL)).build(reward=1.0)
    rollouts = [
        cut_by_max_tokens(one),
        three_compactions("four").build(reward=0.0),
        one_compaction("two").build(reward=1.0),
    ]
    (tmp / "in.jsonl").write_text(
        "\n".join(r.model_dump_json(exclude_none=True) for r in rollouts) + "\n"
    )
    run_build(
        BuildConfig(
            inputs=[str(tmp / "in.jsonl")],
            out=str(tmp / "build"),
            workers=1,
            progress=False,
            std_ddof=1,
        )
    )
    return tmp / "build"


@pytest.fixture(scope="module")
def verl_out(build_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verl-export") / "verl"
    export_build(build_dir, "verl", out)
    return out


@pytest.fixture(scope="module")
def verl_rows(verl_out) -> list[dict]:
    """The export, read as verl's ``RLHFDataset`` reads Parquet (``datasets``)."""
    rows = list(datasets.load_dataset("parquet", data_dir=str(verl_out), split="train"))
    segments = defaultdict(int)
    for r in rows:
        segments[r["extra_info"]["rollout_id"]] += 1
    assert segments == {"one": 1, "four": 4, "two": 2}
    (one,) = [r for r in rows if r["extra_info"]["rollout_id"] == "one"]
    assert one["trimmed_tokens"] > 0  # the cut call's untrained end-of-turn
    return rows


@pytest.fixture(scope="module")
def verl_lengths(verl_out) -> tuple[int, int]:
    """``data.max_prompt_length`` and ``data.max_response_length`` as the export states
    them (``export.json``; the README says the same)."""
    longest = json.loads((verl_out / "export.json").read_text())["verl_lengths"]
    return longest["max_prompt_length"], longest["max_response_length"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module", autouse=True)
def gloo_group(tmp_path_factory):
    """World size 1 on gloo: the group verl's engine all-reduces its token count over."""
    if dist.is_initialized():
        yield
        return
    store = f"file://{tmp_path_factory.mktemp('gloo')}/store"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def agent_loop_batch(rows, prompt_length: int, response_length: int) -> DataProto:
    """The batch verl's agent loop hands the trainer (``_agent_loop_postprocess`` and
    ``_postprocess``), from rows an agent loop returns as recorded: prompts left-padded,
    responses and ``response_mask`` right-padded, positions from the attention mask, and
    one ``uid`` per row (``rollout.n=1``)."""
    n = len(rows)
    prompts = torch.full((n, prompt_length), PAD)
    responses = torch.full((n, response_length), PAD)
    response_mask = torch.zeros(n, response_length, dtype=torch.long)
    attention = torch.zeros(n, prompt_length + response_length, dtype=torch.long)
    for i, r in enumerate(rows):
        p, c = len(r["prompt_ids"]), len(r["response_ids"])
        assert p <= prompt_length and c <= response_length
        prompts[i, prompt_length - p :] = torch.tensor(r["prompt_ids"])
        responses[i, :c] = torch.tensor(r["response_ids"])
        response_mask[i, :c] = torch.tensor(r["response_mask"])
        attention[i, prompt_length - p : prompt_length + c] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": compute_position_id_with_mask(attention),
        },
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in rows], dtype=object),
            "uid": np.array([str(r["extra_info"]["index"]) for r in rows], dtype=object),
        },
    )


def recorded_advantages(batch: DataProto, tokenizer) -> torch.Tensor:
    """``reward.custom_reward_function.name=compute_advantage`` placed by verl's
    ``NaiveRewardManager``, through verl's GRPO with one row per group (``rollout.n=1``):
    verl passes a group of one through (mean 0, std 1), so the advantage is seam's."""
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": pipeline.export.verl_reward.__file__,
                    "name": "compute_advantage",
                }
            }
        }
    )
    manager = NaiveRewardManager(tokenizer, 0, compute_score=get_custom_reward_fn(config))
    scores = manager(batch)
    advantages, _ = compute_grpo_outcome_advantage(
        scores, batch.batch["response_mask"], batch.non_tensor_batch["uid"]
    )
    return advantages


def engine_log_probs(model, micro_batch) -> torch.Tensor:
    """Per-token log-probs as ``FSDPEngineWithLMHead`` computes them with
    ``use_remove_padding=False``: the nested sequences right-padded, the attention mask
    from their lengths, logits narrowed back to each sequence, ``logprobs_from_logits``
    against the ids rolled by one; a nested tensor over prompt + response."""
    input_ids, position_ids = micro_batch["input_ids"], micro_batch["position_ids"]
    lengths = input_ids.offsets().diff()
    width, n = int(lengths.max()), len(lengths)
    logits = model(
        input_ids=torch.nested.to_padded_tensor(input_ids, PAD, output_size=(n, width)),
        attention_mask=build_attention_mask_from_nested(input_ids, max_seq_len=width),
        position_ids=torch.nested.to_padded_tensor(position_ids, 0, output_size=(n, width)),
        use_cache=False,
    ).logits
    logits = torch.cat([logits[i, : lengths[i]] for i in range(n)])
    rolled = torch.roll(input_ids.values(), shifts=-1, dims=0)
    return torch.nested.nested_tensor_from_jagged(
        logprobs_from_logits(logits, rolled), input_ids.offsets()
    )


def trainer_td(batch: DataProto, mini_batch_size: int):
    """``ray_trainer._update_actor``: the batch without padding, the mini-batch size as
    ``global_batch_size``, then ``TrainingWorker.train_batch``'s engine defaults (micro
    batches of one row, no dynamic batch size)."""
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        td,
        global_batch_size=mini_batch_size,
        use_remove_padding=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=1,
    )
    return td


def forward_backward(mini_batch, log_probs_of, config, global_token_count=True) -> list[dict]:
    """``FSDPEngine.forward_backward_batch``: count the loss-mask tokens of the whole
    mini-batch, all-reduce them over the data-parallel group, then one ``ppo_loss`` and
    backward per micro-batch. ``global_token_count=False`` is a worker that leaves
    ``batch_num_tokens`` unset (``agg_loss`` then divides per micro-batch)."""
    count = mini_batch["loss_mask"].sum()
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    tu.assign_non_tensor(
        mini_batch,
        batch_num_tokens=count.item() if global_token_count else None,
        dp_size=dist.get_world_size(),
    )
    micro_batches, _ = prepare_micro_batches(mini_batch, same_micro_num_in_dp=True)
    outputs = []
    for micro in micro_batches:
        log_probs = log_probs_of(micro)
        loss, metrics = ppo_loss(config, {"log_probs": log_probs}, micro)
        loss.backward()
        responses = micro["responses"][0][
            : int(micro["attention_mask"][0, -micro["responses"].shape[1] :].sum())
        ]
        outputs.append({"responses": responses.tolist(), "loss": loss.detach(), "metrics": metrics})
    return outputs


def actor_config(mini_batch_size: int) -> FSDPActorConfig:
    # verl's defaults: loss_agg_mode token-mean, vanilla PPO clip, no KL or entropy term.
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        ppo_mini_batch_size=mini_batch_size,
        rollout_n=1,
    )


def test_verl_actor_update_trains_two_steps_on_the_export(
    verl_rows, verl_lengths, build_dir, tiny_model, tokenizer
):
    """One trainer step over the segments of ``one`` and ``two`` with
    ``actor.ppo_epochs=2``: old log-probs recomputed once by the actor (``ray_trainer.fit``),
    then two passes over the mini-batch, two optimizer steps. Before the update, verl's
    log-probs of the trainable tokens are those of seam's own trainer on the segment."""
    rows = [r for r in verl_rows if r["extra_info"]["rollout_id"] in ("one", "two")]
    config = actor_config(len(rows))
    assert config.loss_agg_mode == "token-mean" and not config.use_kl_loss
    model = tiny_model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    batch = agent_loop_batch(rows, *verl_lengths)
    advantages = recorded_advantages(batch, tokenizer)
    mask = batch.batch["response_mask"].bool()
    for i, r in enumerate(rows):
        assert r["response_mask"][-1] == 1  # the score lands on a trained token
        expected = torch.full((int(mask[i].sum()),), r["extra_info"]["advantage"])
        torch.testing.assert_close(advantages[i][mask[i]], expected, rtol=1e-5, atol=1e-6)
    batch.batch["advantages"] = advantages
    old, _ = prepare_micro_batches(trainer_td(batch, len(rows)))
    model.eval()
    with torch.no_grad():
        batch.batch["old_log_probs"] = torch.cat(
            [no_padding_2_padding(engine_log_probs(model, m), m) for m in old]
        )
        segments = {(s["rollout_id"], s["segment_index"]): s for s in shard_rows(build_dir)}
        for i, r in enumerate(rows):
            segment = segments[r["extra_info"]["rollout_id"], r["extra_info"]["segment_index"]]
            ids = torch.as_tensor(segment["input_ids"])
            trained = torch.as_tensor(segment["loss_mask"], dtype=torch.bool)[1:]
            hidden = policy_hidden(model, ids, torch.arange(ids.numel()))[:-1]
            seam, _ = token_logprobs(model, hidden[trained], ids[1:][trained])
            assert int(mask[i].sum()) == segment["num_trainable_tokens"] == seam.numel()
            torch.testing.assert_close(
                batch.batch["old_log_probs"][i][mask[i]], seam, atol=2e-4, rtol=1e-4
            )
    model.train()
    td = trainer_td(batch, len(rows))
    kl = []
    for mini_batch in tu.make_iterator(td, mini_batch_size=len(rows), epochs=2, seed=42):
        optimizer.zero_grad()
        outputs = forward_backward(mini_batch, lambda m: engine_log_probs(model, m), config)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        assert torch.isfinite(grad_norm) and grad_norm > 0
        optimizer.step()
        assert all(torch.isfinite(o["loss"]) for o in outputs)
        kl.append([abs(o["metrics"]["actor/ppo_kl"].values[0]) for o in outputs])
    assert len(kl) == 2
    # Step 1 starts at ratio 1 (the old log-probs are the policy's); step 2 sees the update.
    assert max(kl[0]) < 1e-6 and max(kl[1]) > 1e-4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def gradient_shares(rows, lengths, global_token_count: bool) -> dict[str, float]:
    """Each rollout's share of the gradient through verl's ``ppo_loss``, one segment per
    micro-batch: with advantages 1 at ratio 1, d loss / d log π_t is minus token t's
    weight, read from autograd on the log-probs."""
    batch = agent_loop_batch(rows, *lengths)
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = torch.zeros_like(mask)
    batch.batch["advantages"] = torch.ones_like(mask)
    td = trainer_td(batch, len(rows))
    (mini_batch,) = tu.make_iterator(td, mini_batch_size=len(rows), epochs=1, seed=42)
    leaves = []

    def log_probs_of(micro):
        leaf = torch.zeros(int(micro["input_ids"].offsets()[-1]), requires_grad=True)
        leaves.append(leaf)
        return torch.nested.nested_tensor_from_jagged(leaf, micro["input_ids"].offsets())

    outputs = forward_backward(
        mini_batch, log_probs_of, actor_config(len(rows)), global_token_count
    )
    assert len(outputs) == len(rows)  # one segment per micro-batch
    weight = defaultdict(float)
    for row, output, leaf in zip(rows, outputs, leaves):  # verl keeps the rows' order
        assert output["responses"] == row["response_ids"]
        weight[row["extra_info"]["rollout_id"]] += -float(leaf.grad.sum())
    total = sum(weight.values())
    return {k: v / total for k, v in weight.items()}


def test_rollouts_of_1_and_4_segments_get_their_token_shares(verl_rows, verl_lengths):
    rows = [r for r in verl_rows if r["extra_info"]["rollout_id"] in ("one", "four")]
    tokens = defaultdict(int)
    for r in rows:
        tokens[r["extra_info"]["rollout_id"]] += sum(r["response_mask"])
    token_shares = {k: v / sum(tokens.values()) for k, v in tokens.items()}
    shares = gradient_shares(rows, verl_lengths, global_token_count=True)
    for rollout, share in token_shares.items():
        assert shares[rollout] == pytest.approx(share, rel=1e-6)
    # Without the global count each micro-batch (segment) weighs the same: 4 of 5.
    local = gradient_shares(rows, verl_lengths, global_token_count=False)
    assert local["four"] == pytest.approx(4 / 5, rel=1e-6)
    assert local["four"] != pytest.approx(token_shares["four"], rel=1e-2)


def test_recorded_advantages_are_verls_grpo_over_rollouts(verl_rows):
    """seam's advantage (sample std) is verl's GRPO with one score per rollout in its
    task's group; verl's GRPO over segments would count a 4-segment rollout four times."""
    by_rollout = {r["extra_info"]["rollout_id"]: r for r in verl_rows}
    ids = sorted(by_rollout)
    scores = torch.zeros(len(ids), 2)
    scores[:, -1] = torch.tensor(
        [float(by_rollout[k]["reward_model"]["ground_truth"]) for k in ids]
    )
    groups = np.array([by_rollout[k]["extra_info"]["task_id"] for k in ids], dtype=object)
    verl_adv, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), groups)
    for i, k in enumerate(ids):
        assert verl_adv[i, -1].item() == pytest.approx(
            by_rollout[k]["extra_info"]["advantage"], rel=1e-5
        )
    per_segment = torch.zeros(len(verl_rows), 2)
    per_segment[:, -1] = torch.tensor([float(r["reward_model"]["ground_truth"]) for r in verl_rows])
    groups = np.array([r["extra_info"]["task_id"] for r in verl_rows], dtype=object)
    segment_adv, _ = compute_grpo_outcome_advantage(
        per_segment, torch.ones_like(per_segment), groups
    )
    assert not np.allclose(
        segment_adv[:, -1].numpy(), [r["extra_info"]["advantage"] for r in verl_rows], rtol=1e-2
    )
