"""The verl exports run through verl's own code (skipped where ``verl`` is not installed;
CI installs it in a virtualenv of its own, see ``.ci/run``).

- verl's ``get_custom_reward_fn`` loads ``pipeline/export/verl_reward.py``, its
  ``NaiveRewardManager`` places the score, and its ``compute_gae_advantage_return``
  carries the reward to every trainable token, truncated calls included.

The actor update (two steps) and the gradient shares of rollouts split into 1 and 4
segments are in ``test_with_verl_rl.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

import datasets  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_gae_advantage_return  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.workers.reward_manager.naive import NaiveRewardManager  # noqa: E402

import pipeline.export.verl_reward  # noqa: E402
from pipeline.build.run import BuildConfig, run_build  # noqa: E402
from pipeline.export import export_build  # noqa: E402
from tests.judge.rollouts import Story  # noqa: E402
from tests.sample_builds import cut_at_max_tokens  # noqa: E402

PAD = 151643


def load(out: Path) -> list[dict]:
    """The export's rows, ``agent_loop_output``'s token fields beside the other columns."""
    rows = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    return [{**r, **r.pop("agent_loop_output")} for r in rows]


@pytest.fixture(scope="module")
def truncated_build(tmp_path_factory):
    """A rollout whose last call was cut by max tokens (its rendered end-of-turn is not
    trained, so its segment ends with an untrained token), and a plain one."""
    tmp = tmp_path_factory.mktemp("verl-cut")
    cut = cut_at_max_tokens(
        Story("cut").act(("bash", {"command": "pytest"}, "1 failed")).build(reward=1.0)
    )
    plain = Story("plain").say("Fixed it.").build(reward=1.0)
    (tmp / "in.jsonl").write_text(
        "\n".join(r.model_dump_json(exclude_none=True) for r in (cut, plain)) + "\n"
    )
    run_build(
        BuildConfig(inputs=[str(tmp / "in.jsonl")], out=str(tmp / "out"), workers=1, progress=False)
    )
    return tmp / "out"


def padded(rows, key, width, value, left=False):
    out = torch.full(
        (len(rows), width), value, dtype=torch.float32 if key == "logprobs" else torch.long
    )
    for i, r in enumerate(rows):
        seq = torch.as_tensor(r[key])
        if left:
            out[i, width - len(seq) :] = seq
        else:
            out[i, : len(seq)] = seq
    return out


def data_proto(rows) -> DataProto:
    """The batch verl's trainer hands its reward manager: prompts left-padded, responses
    right-padded, one attention mask over both."""
    p = max(len(r["prompt_ids"]) for r in rows)
    c = max(len(r["response_ids"]) for r in rows)
    ones = [{"p": [1] * len(r["prompt_ids"]), "c": [1] * len(r["response_ids"])} for r in rows]
    return DataProto.from_dict(
        tensors={
            "prompts": padded(rows, "prompt_ids", p, PAD, left=True),
            "responses": padded(rows, "response_ids", c, PAD),
            "response_mask": padded(rows, "response_mask", c, 0),
            "attention_mask": torch.cat(
                [padded(ones, "p", p, 0, left=True), padded(ones, "c", c, 0)], 1
            ),
        },
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in rows], dtype=object),
        },
    )


def test_the_recorded_reward_reaches_every_trainable_token_in_verls_gae(
    truncated_build, tmp_path, tokenizer
):
    out = tmp_path / "verl"
    export_build(truncated_build, "verl", out)
    rows = load(out)
    assert {r["extra_info"]["rollout_id"] for r in rows} == {"cut", "plain"}
    cut = next(r for r in rows if r["extra_info"]["rollout_id"] == "cut")
    assert cut["trimmed_tokens"] > 0 and cut["response_mask"][-1] == 1
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": pipeline.export.verl_reward.__file__,
                    "name": "compute_score",
                }
            }
        }
    )
    manager = NaiveRewardManager(tokenizer, 0, compute_score=get_custom_reward_fn(config))
    batch = data_proto(rows)
    rewards = manager(batch)
    mask = batch.batch["response_mask"].float()
    _, returns = compute_gae_advantage_return(
        rewards, torch.zeros_like(rewards), mask, gamma=torch.tensor(1.0), lam=torch.tensor(1.0)
    )
    # γ = λ = 1, V ≡ 0: the return of every trainable token is the rollout's reward R = 1.
    for i, r in enumerate(rows):
        trained = mask[i].bool()
        assert int(trained.sum()) == sum(r["response_mask"]) > 0
        torch.testing.assert_close(returns[i][trained], torch.ones(int(trained.sum())))


def test_verl_reward_function_rejects_rows_from_elsewhere():
    assert pipeline.export.verl_reward.compute_score("seam/test", "", "0.5") == 0.5
    with pytest.raises(ValueError, match="not a seam export row"):
        pipeline.export.verl_reward.compute_score("gsm8k", "", "1")


def test_std_sample_matches_verls_grpo_advantage():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from pipeline.core.advantage import group_advantages

    groups = np.array(["a", "a", "a", "a", "b", "b", "b"])
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.2, 0.9, 0.4])
    scores = torch.zeros(len(rewards), 3)
    scores[:, -1] = torch.tensor(rewards, dtype=torch.float32)
    verl_adv, _ = compute_grpo_outcome_advantage(scores, torch.ones(len(rewards), 3), groups)
    seam_adv, _ = group_advantages(groups, rewards, ddof=1)
    np.testing.assert_allclose(verl_adv[:, -1].numpy(), seam_adv, rtol=1e-5, atol=1e-6)
    population, _ = group_advantages(groups, rewards)
    assert not np.allclose(population, seam_adv)  # the default differs by sqrt(G/(G-1))
