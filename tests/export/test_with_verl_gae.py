"""seam's cross-trajectory GAE as verl advantage estimators (``pipeline/export/verl_gae.py``),
run through verl's own registry and ``compute_gae_advantage_return`` (skipped where
``verl`` is not installed).

- a hand-checked two-segment rollout (observation gap, padding, fixed and adaptive λ);
- equality with seam's ``trainer.gae.cross_trajectory_gae`` on every row of the verl
  export of the test build, plus a rollout whose last segment ends in a length-cut call;
- with V ≡ 0 and γ = 1 the credit over a rollout's concatenated segments never decreases
  toward the outcome under the default (per-rollout) λ;
- ``VERL_USE_EXTERNAL_MODULES`` registers the estimators when verl is imported, as
  docs/training.md says; verl's own ``compute_advantage`` does not hand them the critic's
  values, and they say so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402

import pipeline.export.verl_gae  # noqa: E402, F401  (registers the estimators)
from pipeline.build.run import BuildConfig, run_build  # noqa: E402
from pipeline.export import export_build  # noqa: E402
from schemas.rollout import MessageEvent  # noqa: E402
from tests.export.test_with_verl import data_proto, load  # noqa: E402
from tests.judge.rollouts import Story  # noqa: E402
from tests.sample_builds import SUMMARY, shard_rows  # noqa: E402
from trainer.gae import cross_trajectory_gae, segment_lambda  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def estimate(name, rewards, values, mask, extra_info, gamma=1.0, lam=1.0):
    """The estimator registered under ``name``, called with what verl's ``compute_advantage``
    gives every registered estimator plus the critic's values and the non-tensor batch."""
    return get_adv_estimator_fn(name)(
        token_level_rewards=rewards,
        response_mask=mask,
        config=AlgoConfig(gamma=gamma, lam=lam),
        index=np.array([str(i) for i in range(len(extra_info))], dtype=object),
        values=values,
        non_tensor_batch={"extra_info": np.array(extra_info, dtype=object)},
    )


def test_hand_checked_two_segments():
    # Segment 1: trainable, trainable, observation, trainable (R on the last); segment 2:
    # two trainable tokens, then padding. N_{>1} = 2, N_{>2} = 0, T_r = 5.
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 9.0, 0.4], [0.3, 0.6, 7.0, 7.0]])
    info = [
        {"trainable_tokens_after": 2, "rollout_trainable_tokens": 5},
        {"trainable_tokens_after": 0, "rollout_trainable_tokens": 5},
    ]
    # γ = 0.9, λ = 0.5 (γλ = 0.45). Segment 1: δ = [-0.32, 0.16, 0.6] over its trainable
    # tokens (the observation's value skipped), A_loc = [-0.1265, 0.43, 0.6], times
    # 0.45² = 0.2025. Segment 2: δ = [0.24, 0.4], A_loc = [0.42, 0.4], factor 1.
    adv, ret = estimate("seam_gae_fixed", rewards, values, mask, info, gamma=0.9, lam=0.5)
    expected = torch.tensor([[-0.02561625, 0.087075, 0.0, 0.1215], [0.42, 0.4, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    # Returns are the local λ-returns A_loc + V, not discounted by the factor.
    torch.testing.assert_close(ret, torch.tensor([[0.3735, 0.63, 0.0, 1.0], [0.72, 1.0, 0, 0]]))
    # seam_gae: λ = 1 − 1/(1.5·5) = 13/15 for both segments, γλ = 0.78.
    adv, _ = estimate("seam_gae", rewards, values, mask, info, gamma=0.9)
    torch.testing.assert_close(adv[1], torch.tensor([0.24 + 0.78 * 0.4, 0.4, 0.0, 0.0]))
    torch.testing.assert_close(adv[0, 3], torch.tensor(0.6 * 0.78**2))


@pytest.fixture(scope="module")
def rows_and_shard(rl_build, tmp_path_factory):
    """The verl export of the test build, plus a 2-segment rollout whose last call was cut
    by max tokens (its segment ends in an untrained token, trimmed by the export); with
    the build's own rows (for R, N_{>s} and T_r) in the same order."""
    tmp = tmp_path_factory.mktemp("verl-gae")
    story = Story("cut").act(("bash", {"command": "pytest"}, "1 failed")).compact(SUMMARY)
    done = story.act(("bash", {"command": "ls"}, "src")).build(reward=1.0)
    # A last call the engine cut at its max tokens (its end-of-turn is not trained).
    end = MessageEvent(id="cut-end", role="assistant", content="Let me", finish_reason="length")
    cut = done.model_copy(update={"events": [*done.events, end]})
    (tmp / "in.jsonl").write_text(cut.model_dump_json(exclude_none=True) + "\n")
    cut_build = tmp / "cut"
    run_build(
        BuildConfig(inputs=[str(tmp / "in.jsonl")], out=str(cut_build), workers=1, progress=False)
    )
    rows, shard = [], []
    for build in (rl_build, cut_build):
        export_build(build, "verl", tmp / build.name / "verl")
        rows += load(tmp / build.name / "verl")
        shard += shard_rows(build)
    assert [(r["extra_info"]["rollout_id"], r["extra_info"]["segment_index"]) for r in rows] == [
        (s["rollout_id"], s["segment_index"]) for s in shard
    ]
    last_cut = [r for r in rows if r["extra_info"]["rollout_id"] == "cut"][-1]
    assert last_cut["trimmed_tokens"] > 0 and last_cut["extra_info"]["num_segments"] == 2
    return rows, shard


def verl_batch(rows, values_seed=None):
    """verl's batch of the rows: the reward where verl's reward manager puts it (the last
    response token), the response mask, and the critic's values (random, or 0)."""
    batch = data_proto(rows)
    mask = batch.batch["response_mask"]
    rewards = torch.zeros(mask.shape)
    last = torch.tensor([len(r["response_ids"]) - 1 for r in rows])
    rewards[torch.arange(len(rows)), last] = torch.tensor(
        [float(r["reward_model"]["ground_truth"]) for r in rows]
    )
    if values_seed is None:
        values = torch.zeros(mask.shape)
    else:
        values = torch.rand(mask.shape, generator=torch.Generator().manual_seed(values_seed))
    return rewards, values, mask, [dict(r["extra_info"]) for r in rows]


@pytest.mark.parametrize(
    ("name", "rule"), [("seam_gae", "rollout"), ("seam_gae_segment", "segment")]
)
def test_equals_seams_cross_trajectory_gae_on_every_row(rows_and_shard, name, rule):
    rows, shard = rows_and_shard
    rewards, values, mask, info = verl_batch(rows, values_seed=0)
    gamma = 0.97
    adv, ret = estimate(name, rewards, values, mask, info, gamma=gamma)
    for i, s in enumerate(shard):
        trained = mask[i].bool()
        assert int(trained.sum()) == s["num_trainable_tokens"] > 0
        lam = segment_lambda(rule, s["num_trainable_tokens"], s["rollout_trainable_tokens"])
        seam_adv, seam_ret = cross_trajectory_gae(
            values[i][trained].double().numpy(),
            s["reward"],
            s["trainable_tokens_after"],
            gamma,
            lam,
        )
        np.testing.assert_allclose(adv[i][trained].numpy(), seam_adv, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ret[i][trained].numpy(), seam_ret, rtol=1e-4, atol=1e-6)
        assert not adv[i][~trained].any()


def credit_by_rollout(rows, adv, mask) -> dict[str, np.ndarray]:
    """Each rollout's advantages over its concatenated trainable tokens, segment order."""
    out: dict[str, list] = {}
    for i in sorted(range(len(rows)), key=lambda i: rows[i]["extra_info"]["segment_index"]):
        rollout = rows[i]["extra_info"]["rollout_id"]
        out.setdefault(rollout, []).append(adv[i][mask[i].bool()].double().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def test_credit_never_decreases_toward_the_outcome(rows_and_shard):
    rows, _ = rows_and_shard
    rewards, values, mask, info = verl_batch(rows)
    adv, _ = estimate("seam_gae", rewards, values, mask, info)
    credit = credit_by_rollout(rows, adv, mask)
    multi = {r["extra_info"]["rollout_id"] for r in rows if r["extra_info"]["num_segments"] > 1}
    assert {"a1", "b0", "cut"} <= multi
    for r in rows:
        c = credit[r["extra_info"]["rollout_id"]]
        assert (np.diff(c) >= -1e-7).all(), r["extra_info"]["rollout_id"]
        # GAE over the concatenation: λ^{T-1-u}·R with T the rollout's trainable tokens.
        total = r["extra_info"]["rollout_trainable_tokens"]
        assert len(c) == total
        lam = 1 - 1 / (1.5 * total)
        R = float(r["reward_model"]["ground_truth"])
        np.testing.assert_allclose(c, R * lam ** np.arange(total - 1, -1, -1.0), rtol=1e-5)


def test_credit_of_unequal_segments_under_both_rules():
    # The rollout: n = [2000, 500, 3000] trainable tokens, R = 1, V ≡ 0, γ = 1.
    n = [2000, 500, 3000]
    width = max(n)
    mask = torch.zeros(3, width, dtype=torch.long)
    rewards = torch.zeros(3, width)
    for s, n_s in enumerate(n):
        mask[s, :n_s] = 1
        rewards[s, n_s - 1] = 1.0
    info = [
        {"trainable_tokens_after": sum(n[s + 1 :]), "rollout_trainable_tokens": sum(n)}
        for s in range(3)
    ]
    values = torch.zeros(3, width)
    first = {}
    for name in ("seam_gae", "seam_gae_segment"):
        adv, _ = estimate(name, rewards, values, mask, info)
        first[name] = adv[:, 0].double().numpy()
        credit = np.concatenate([adv[s, : n[s]].double().numpy() for s in range(3)])
        assert (np.diff(credit) >= -1e-7).all() == (name == "seam_gae")
    # Per rollout: λ = 1 − 1/(1.5·5500), first token of segment s keeps λ^{T-1-u}.
    lam = 1 - 1 / (1.5 * 5500)
    np.testing.assert_allclose(first["seam_gae"], lam ** np.array([5499, 3499, 2999]), rtol=1e-4)
    # Per segment: [0.16, 0.009, 0.51] — an earlier segment more than a later one.
    np.testing.assert_allclose(first["seam_gae_segment"], [0.16, 0.009, 0.51], atol=0.01)


def test_docs_recipe_registers_the_estimators_when_verl_is_imported():
    docs = (ROOT / "docs" / "training.md").read_text()
    setting = "VERL_USE_EXTERNAL_MODULES=pipeline.export.verl_gae"
    assert setting in docs and "algorithm.adv_estimator=seam_gae" in docs
    env = {**os.environ, "PYTHONPATH": str(ROOT), setting.split("=")[0]: setting.split("=")[1]}
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as r\n"
        "print(r['seam_gae'].__module__, r['seam_gae_segment'].__name__, "
        "r['seam_gae_fixed'].__name__)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["pipeline.export.verl_gae", "seam_gae_segment", "seam_gae_fixed"]


def test_verls_compute_advantage_does_not_pass_values_and_the_estimator_says_so():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    mask = torch.ones(1, 3, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0]]),
            "values": torch.zeros(1, 3),
            "response_mask": mask,
        },
        non_tensors={
            "uid": np.array(["u"], dtype=object),
            "extra_info": np.array(
                [{"trainable_tokens_after": 0, "rollout_trainable_tokens": 3}], dtype=object
            ),
        },
    )
    with pytest.raises(ValueError, match="passes neither to registered estimators"):
        compute_advantage(data, adv_estimator="seam_gae", config=AlgoConfig())


def test_an_export_without_the_gae_fields_is_refused():
    old = [{"index": 0, "rollout_id": "r"}]
    mask = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="lacks rollout_trainable_tokens, trainable_tokens_after"):
        estimate("seam_gae", torch.zeros(1, 2), torch.zeros(1, 2), mask, old)
