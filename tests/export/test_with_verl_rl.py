"""``seam export --to verl`` through verl's own code as docs/training.md's ``main_ppo``
recipe sets it up, trained two steps on CPU (skipped where ``verl`` is not installed;
``make test-trainers`` installs it).

verl 0.9.1's default worker, ``TrainingWorker`` with the FSDP engine, does not start on a
CPU-only torch: ``FSDPEngine.__init__`` builds its device mesh with
``init_device_mesh("cuda", ...)``, which calls ``torch.cuda.set_device``
(``AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'``; verl registers
its FSDP engine for ``cuda`` and ``npu`` only and its platform layer falls back to
``nvidia``), and ``forward_backward_batch`` moves its token count to
``get_device_id()`` (``AssertionError: Torch not compiled with CUDA enabled``). So these
tests run verl's own code from the config up, and rebuild only the engine's loop around
it, line for line:

- verl's ``ppo_trainer`` config composed with the documented overrides, its
  ``RLHFDataset``/``collate_fn`` on the export, its ``AgentLoopWorker`` running the
  ``seam_replay`` agent loop (``pipeline/export/verl_replay.py``) and padding the outputs
  (prompts left-padded to ``rollout.prompt_length``, responses and ``response_mask``
  right-padded to ``rollout.response_length``); the v1 trainer's store of the outputs;
  rewards from verl's ``NaiveRewardManager`` with ``pipeline/export/verl_reward.py``,
  advantages from verl's ``compute_grpo_outcome_advantage``;
- verl's ``left_right_2_no_padding`` (``ray_trainer._update_actor``; the v1 trainer stores
  the same unpadded rows, ``loss_mask = response_mask``), ``make_iterator``
  (``TrainingWorker.train_mini_batch``), ``prepare_micro_batches`` and the global
  ``batch_num_tokens`` all-reduced over a gloo group of one
  (``FSDPEngine.forward_backward_batch``), log-probs as ``FSDPEngineWithLMHead`` computes
  them without padding removal (``logprobs_from_logits`` on the rolled ids), verl's
  ``ppo_loss`` (``workers/utils/losses.py``), then clip and AdamW as
  ``FSDPEngine.optimizer_step``.

Rollouts here: ``one`` (1 segment, its last call cut by the length limit), ``four`` (4
segments: three compactions) and ``two`` (2 segments), one task.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

import datasets  # noqa: E402
import hydra  # noqa: E402
import torch.distributed as dist  # noqa: E402
import verl.trainer.config  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from tensordict import NonTensorStack  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
    get_trajectory_info,
)
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
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

from pipeline.build.run import BuildConfig, run_build  # noqa: E402
from pipeline.export import export_build  # noqa: E402
from tests.export.verl_recipes import documented_overrides  # noqa: E402
from tests.judge.rollouts import Story  # noqa: E402
from tests.sample_builds import (  # noqa: E402
    FAIL,
    SECOND_SUMMARY,
    SUMMARY,
    cut_at_max_tokens,
    one_compaction,
    shard_rows,
)
from tests.strategies import log_token_ids  # noqa: E402
from trainer.models import build_tiny_model, policy_hidden, token_logprobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "training.md"


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


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory, renderer) -> Path:
    """``two`` (first) logged its sampling log-probs, the others did not; ``one`` ends with
    a call cut by max tokens. The build uses the sample std (``std_ddof=1``), as verl's
    GRPO does."""
    tmp = tmp_path_factory.mktemp("verl-rl")
    one = Story("one").act(("bash", {"command": "pytest"}, FAIL)).build(reward=1.0)
    rollouts = [
        log_token_ids(one_compaction("two").build(reward=1.0), renderer, "full", 3),
        cut_at_max_tokens(one),
        three_compactions("four").build(reward=0.0),
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
    """The export, read as verl's ``RLHFDataset`` reads Parquet (``datasets``), with
    ``agent_loop_output``'s token fields beside the other columns."""
    rows = datasets.load_dataset("parquet", data_dir=str(verl_out), split="train")
    rows = [{**r, **r.pop("agent_loop_output")} for r in rows]  # the token fields beside the rest
    segments = defaultdict(int)
    for r in rows:
        segments[r["extra_info"]["rollout_id"]] += 1
    assert segments == {"one": 1, "four": 4, "two": 2}
    (one,) = [r for r in rows if r["extra_info"]["rollout_id"] == "one"]
    assert one["trimmed_tokens"] > 0  # the cut call's untrained end-of-turn
    logged = [r["response_logprobs"] is not None for r in rows]
    assert logged[0] and not all(logged)  # a batch mixes logged and unlogged rows
    return rows


@pytest.fixture(scope="module")
def verl_lengths(verl_out) -> tuple[int, int]:
    """``data.max_prompt_length`` and ``data.max_response_length`` as the export states
    them (``export.json``; the README says the same)."""
    longest = json.loads((verl_out / "export.json").read_text())["verl_lengths"]
    return longest["max_prompt_length"], longest["max_response_length"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def recipe_overrides(values: dict[str, str]) -> list[str]:
    """The ``main_ppo`` overrides of docs/training.md's verl recipe, its shell variables
    (``$SEAM``, ``$P``, ``$R``, ``MODEL_DIR``, the train files) filled in."""
    return documented_overrides("adv_estimator=grpo", values, least=10)


@pytest.fixture(scope="module")
def recipe(verl_out, verl_lengths, tiny_model_dir):
    """verl's ``ppo_trainer`` config composed with the documented overrides, as
    ``python -m verl.trainer.main_ppo`` composes it."""
    files = sorted(str(f) for f in verl_out.glob("*.parquet"))
    values = {
        '"[$(ls export/verl/*.parquet | paste -sd,)]"': f"[{','.join(files)}]",
        "$SEAM": str(ROOT),
        "$P": str(verl_lengths[0]),
        "$R": str(verl_lengths[1]),
        "MODEL_DIR": str(tiny_model_dir),
    }
    directory = Path(verl.trainer.config.__file__).parent
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        return compose(config_name="ppo_trainer", overrides=recipe_overrides(values))


@pytest.fixture(scope="module")
def verl_worker(recipe):
    """verl's ``AgentLoopWorker`` built from the recipe (no rollout server: the replay loop
    samples nothing) and verl's ``RLHFDataset`` on the export's files."""
    worker = AgentLoopWorker(recipe, llm_client=None)
    return worker, RLHFDataset(recipe.data.train_files, worker.tokenizer, recipe.data)


@pytest.fixture(scope="module")
def verl_batch(recipe, verl_worker) -> DataProto:
    """The batch verl's trainer holds after generation (``ray_trainer.fit``): its
    ``RLHFDataset`` reads the export, ``collate_fn`` batches every row, a ``uid`` per row
    (``rollout.n=1``), then its ``AgentLoopWorker`` runs the documented agent loop
    (``seam_replay``) on each row and pads the outputs (``_postprocess``: prompts
    left-padded to ``rollout.prompt_length``, responses and ``response_mask``
    right-padded to ``rollout.response_length``), and the trainer joins the reward keys
    back. ``generate_sequences`` is those steps; it is not called as a whole because
    without the trainer's reward-loop workers it would also merge every dataset column
    into the batch, where the export's ``response_mask`` column meets verl's own."""
    worker, dataset = verl_worker
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    columns = batch.non_tensor_batch
    agent = recipe.actor_rollout_ref.rollout.agent.default_agent_loop

    async def generate():
        trajectories = await get_trajectory_info(0, list(range(len(batch))), False)
        return await asyncio.gather(
            *(
                worker._run_agent_loop(
                    {}, t, agent_name=agent, **{k: v[i] for k, v in columns.items()}
                )
                for i, t in enumerate(trajectories)
            )
        )

    generated = worker._postprocess(asyncio.run(generate()), input_non_tensor_batch=None)
    reward_keys = ("data_source", "reward_model", "extra_info")
    generated.non_tensor_batch.update({k: columns[k] for k in reward_keys})
    generated.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(batch))], dtype=object)
    assert len(generated) == len(dataset) == 7  # every row kept
    assert generated.batch["prompts"].shape[1] == recipe.actor_rollout_ref.rollout.prompt_length
    return generated


def rollouts(batch: DataProto, *ids: str) -> DataProto:
    extra = batch.non_tensor_batch["extra_info"]
    return batch.select_idxs([i for i, e in enumerate(extra) if e["rollout_id"] in ids])


def unpadded(batch: DataProto, key: str, i: int) -> list[int]:
    """Row ``i``'s response-side ``key`` without verl's right padding."""
    width = batch.batch["responses"].shape[1]
    length = int(batch.batch["attention_mask"][i, -width:].sum())
    return batch.batch[key][i, :length].tolist()


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


def recorded_advantages(batch: DataProto, recipe, tokenizer) -> torch.Tensor:
    """The recipe's reward function (``compute_advantage``) placed by verl's
    ``NaiveRewardManager``, through verl's GRPO with one row per group (``rollout.n=1``):
    verl passes a group of one through (mean 0, std 1), so the advantage is seam's."""
    assert recipe.algorithm.adv_estimator == "grpo" and recipe.actor_rollout_ref.rollout.n == 1
    manager = NaiveRewardManager(tokenizer, 0, compute_score=get_custom_reward_fn(recipe))
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
    pad = tu.get_non_tensor_data(data=micro_batch, key="pad_token_id", default=0)
    logits = model(
        input_ids=torch.nested.to_padded_tensor(input_ids, pad, output_size=(n, width)),
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
        outputs.append({"responses": micro["responses"], "loss": loss.detach(), "metrics": metrics})
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
    verl_batch, verl_rows, recipe, build_dir, tiny_model, tokenizer
):
    """One trainer step over the segments of ``one`` and ``two`` with
    ``actor.ppo_epochs=2``: old log-probs recomputed once by the actor (``ray_trainer.fit``),
    then two passes over the mini-batch, two optimizer steps. Before the update, verl's
    log-probs of the trainable tokens are those of seam's own trainer on the segment."""
    batch = rollouts(verl_batch, "one", "two")
    n = len(batch)
    config = actor_config(n)
    assert recipe.actor_rollout_ref.actor.loss_agg_mode == config.loss_agg_mode == "token-mean"
    assert not config.use_kl_loss
    by_index = {r["extra_info"]["index"]: r for r in verl_rows}
    extra = batch.non_tensor_batch["extra_info"]
    for i, e in enumerate(extra):  # the agent loop returned each row as recorded
        row = by_index[e["index"]]
        assert unpadded(batch, "responses", i) == row["response_ids"]
        assert unpadded(batch, "response_mask", i) == row["response_mask"]
        assert row["response_mask"][-1] == 1  # the score lands on a trained token
    advantages = recorded_advantages(batch, recipe, tokenizer)
    mask = batch.batch["response_mask"].bool()
    for i, e in enumerate(extra):
        expected = torch.full((int(mask[i].sum()),), e["advantage"])
        torch.testing.assert_close(advantages[i][mask[i]], expected, rtol=1e-5, atol=1e-6)
    batch.batch["advantages"] = advantages
    model = tiny_model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    old, _ = prepare_micro_batches(trainer_td(batch, n))
    model.eval()
    with torch.no_grad():
        batch.batch["old_log_probs"] = torch.cat(
            [no_padding_2_padding(engine_log_probs(model, m), m) for m in old]
        )
        segments = {(s["rollout_id"], s["segment_index"]): s for s in shard_rows(build_dir)}
        for i, e in enumerate(extra):
            segment = segments[e["rollout_id"], e["segment_index"]]
            ids = torch.as_tensor(segment["input_ids"])
            trained = torch.as_tensor(segment["loss_mask"], dtype=torch.bool)[1:]
            hidden = policy_hidden(model, ids, torch.arange(ids.numel()))[:-1]
            seam, _ = token_logprobs(model, hidden[trained], ids[1:][trained])
            assert int(mask[i].sum()) == segment["num_trainable_tokens"] == seam.numel()
            torch.testing.assert_close(
                batch.batch["old_log_probs"][i][mask[i]], seam, atol=2e-4, rtol=1e-4
            )
    model.train()
    kl = []
    for mini_batch in tu.make_iterator(trainer_td(batch, n), mini_batch_size=n, epochs=2, seed=42):
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


def gradient_shares(batch: DataProto, global_token_count: bool) -> dict[str, float]:
    """Each rollout's share of the gradient through verl's ``ppo_loss``, one segment per
    micro-batch: with advantages 1 at ratio 1, d loss / d log π_t is minus token t's
    weight, read from autograd on the log-probs."""
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = torch.zeros_like(mask)
    batch.batch["advantages"] = torch.ones_like(mask)
    n = len(batch)
    (mini_batch,) = tu.make_iterator(trainer_td(batch, n), mini_batch_size=n, epochs=1, seed=42)
    leaves = []

    def log_probs_of(micro):
        leaf = torch.zeros(int(micro["input_ids"].offsets()[-1]), requires_grad=True)
        leaves.append(leaf)
        return torch.nested.nested_tensor_from_jagged(leaf, micro["input_ids"].offsets())

    outputs = forward_backward(mini_batch, log_probs_of, actor_config(n), global_token_count)
    assert len(outputs) == n  # one segment per micro-batch
    weight = defaultdict(float)
    extra = batch.non_tensor_batch["extra_info"]
    for i, (output, leaf) in enumerate(zip(outputs, leaves)):  # verl keeps the rows' order
        assert torch.equal(output["responses"][0], batch.batch["responses"][i])
        weight[extra[i]["rollout_id"]] += -float(leaf.grad.sum())
    total = sum(weight.values())
    return {k: v / total for k, v in weight.items()}


def test_rollouts_of_1_and_4_segments_get_their_token_shares(verl_batch):
    batch = rollouts(verl_batch, "one", "four")
    assert len(batch) == 5
    tokens = defaultdict(int)
    for e, mask in zip(batch.non_tensor_batch["extra_info"], batch.batch["response_mask"]):
        tokens[e["rollout_id"]] += int(mask.sum())
    token_shares = {k: v / sum(tokens.values()) for k, v in tokens.items()}
    shares = gradient_shares(batch, global_token_count=True)
    for rollout, share in token_shares.items():
        assert shares[rollout] == pytest.approx(share, rel=1e-6)
    # Without the global count each micro-batch (segment) weighs the same: 4 of 5.
    local = gradient_shares(batch, global_token_count=False)
    assert local["four"] == pytest.approx(4 / 5, rel=1e-6)
    assert local["four"] != pytest.approx(token_shares["four"], rel=1e-2)


def test_main_ppos_v1_store_keeps_verls_masks(recipe, verl_worker, verl_rows):
    """main_ppo's default (v1) trainer batches the dataset with ``tu.get_tensordict``,
    hands each row's columns to the agent loop (``AgentLoopWorkerTQ.generate_sequences``)
    and stores ``output.as_dict()`` updated with those columns, then ``loss_mask =
    response_mask`` (``_agent_loop_postprocess``), stacked by ``list_of_dict_to_tensordict``.
    The export's columns must not replace verl's masks: a top-level ``response_mask`` list
    column did (the stored mask was a non-tensor), so the token fields are one struct."""
    worker, dataset = verl_worker
    td = tu.get_tensordict(collate_fn([dataset[i] for i in range(len(dataset))]))
    loop = hydra.utils.instantiate(
        _agent_loop_registry[recipe.actor_rollout_ref.rollout.agent.default_agent_loop],
        trainer_config=DictConfigWrap(config=recipe),
        server_manager=None,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(recipe.data),
        tools=ToolListWrap(worker.tools),
    )
    fields = []
    for i in range(len(td)):
        row = {k: v[i].data for k, v in td.items() if isinstance(v, NonTensorStack)}
        field = asyncio.run(loop.run({}, **row)).as_dict()
        field.update(row)
        field["loss_mask"] = field["response_mask"]
        fields.append(field)
    stored = tu.list_of_dict_to_tensordict(fields)
    assert isinstance(stored["loss_mask"], torch.Tensor) and stored["loss_mask"].is_nested
    by_index = {r["extra_info"]["index"]: r for r in verl_rows}
    for i, field in enumerate(fields):
        recorded = by_index[field["extra_info"]["index"]]["response_mask"]
        assert stored["loss_mask"][i].tolist() == recorded


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
