"""seam's GAE inside verl's trainer (``pipeline/export/verl_gae_trainer.py``), through
verl's own code on CPU (skipped where ``verl`` or verl's v1 trainer, which needs
``transfer_queue``, is not installed):

- docs/training.md's multi-node ``main_ppo`` command, composed with verl's ``ppo_trainer``
  config and checked by verl's ``validate_config``, chooses seam's trainer
  (``get_trainer_cls``), seam's estimator and a critic config verl instantiates;
- the critic that config builds -- verl's ``TrainingWorker`` with ``model_type=
  "value_model"``, FSDP2, seam's engine on the CPU platform of ``verl_cpu_platform.py``, a
  tiny Qwen2 model loaded with ``sdpa`` where verl's own loader fails (no flash-attn) --
  gives the values of the export's rows (``infer_batch``, then ``response_from_nested`` as
  the trainer's ``_compute_values``); the trainer's advantage step (``advantage_step``, the
  body of ``SeamGAETrainer._compute_advantage`` between its TransferQueue read and write)
  runs on those values and the rows' ``extra_info`` stored as verl's agent loop stores
  them, and gives ``trainer/gae.py``'s ``cross_trajectory_gae`` on every trainable token;
  the critic then trains one step on those returns with verl's ``value_loss``
  (``½·token-mean (V − G)²`` over the mini-batch's 161 trainable tokens);
- the trainer refuses seam's estimator without a critic; verl's own advantage step still
  runs any other estimator.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")
if importlib.util.find_spec("transfer_queue") is None:
    pytest.skip("verl's v1 trainer needs transfer_queue", allow_module_level=True)

from pipeline.export import export_build  # noqa: E402
from tests.export import test_with_verl_cpu_trainer as cpu_trainer  # noqa: E402
from tests.export.verl_recipes import documented_overrides  # noqa: E402
from tests.sample_builds import shard_rows  # noqa: E402
from trainer.gae import cross_trajectory_gae, segment_lambda  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
tiny_model_dir = cpu_trainer.tiny_model_dir  # the fixture: a tiny Qwen2 model, seam's tokenizer
GAMMA = 0.97
# What a CPU needs on top of the documented command (tests/export/verl_cpu_platform.py):
# FSDP2 (FSDP1 wants an accelerator device_id), fp32, no torch.compile or checkpointing.
CPU_CRITIC = [
    "critic.strategy=fsdp2",
    "+critic.fsdp.mixed_precision.param_dtype=fp32",
    "critic.fsdp.use_torch_compile=False",
    "critic.model.enable_gradient_checkpointing=False",
    f"algorithm.gamma={GAMMA}",  # the documented default is 1; γ < 1 checks the factor
]


def compose_documented(export_dir: str, model_dir: str, extra: list[str]):
    """verl's ``ppo_trainer`` config as ``python -m verl.trainer.main_ppo`` composes the
    documented command (2 nodes)."""
    import verl.trainer.config
    from hydra import compose, initialize_config_dir

    lengths = json.loads((Path(export_dir) / "export.json").read_text())["verl_lengths"]
    files = sorted(str(f) for f in Path(export_dir).glob("*.parquet"))
    values = {
        '"[$(ls export/verl/*.parquet | paste -sd,)]"': f"[{','.join(files)}]",
        "$SEAM": str(ROOT),
        "$P": str(lengths["max_prompt_length"]),
        "$R": str(lengths["max_response_length"]),
        "$NNODES": "2",
        "MODEL_DIR": model_dir,
    }
    overrides = documented_overrides("trainer_mode=seam_gae", values, least=25)
    assert not [o for o in overrides if "$" in o]  # every shell variable filled in
    directory = Path(verl.trainer.config.__file__).parent
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides + extra)


@pytest.fixture(scope="module")
def verl_export(rl_build, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verl-gae-trainer") / "verl"
    export_build(rl_build, "verl", out)
    return out


def test_documented_command_composes_with_seams_trainer_and_critic(verl_export, tiny_model_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from pipeline.export.verl_gae_trainer import SeamGAETrainer

    config = compose_documented(str(verl_export), str(tiny_model_dir), [])
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    assert get_trainer_cls(config.trainer.v1.trainer_mode) is SeamGAETrainer
    assert config.algorithm.adv_estimator == "seam_gae" and need_critic(config)
    assert config.trainer.nnodes == 2 and config.data.train_batch_size % 16 == 0
    critic = omega_conf_to_dataclass(config.critic)
    assert critic.model.override_config["attn_implementation"] == "sdpa"
    assert critic.model.hf_config._attn_implementation == "sdpa"
    assert not critic.model.use_remove_padding
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "pipeline.export.verl_gae"
    assert Path(env.PYTHONPATH) == ROOT
    assert config.ray_kwargs.ray_init.address == "auto"


def test_trainer_refuses_seams_gae_without_a_critic(verl_export, tiny_model_dir):
    from pipeline.export.verl_gae_trainer import SeamGAETrainer

    config = compose_documented(str(verl_export), str(tiny_model_dir), ["critic.enable=False"])
    with pytest.raises(ValueError, match="set critic.enable=True"):
        SeamGAETrainer(config)


def test_seams_advantage_step_on_verls_critic_values_equals_trainer_gae(
    verl_export, tiny_model_dir, rl_build, tmp_path
):
    out = tmp_path / "critic.json"
    script = (
        "import sys; import tests.export.verl_cpu_platform as cpu; cpu.use_cpu_platform(); "
        "from tests.export.test_with_verl_gae_trainer import critic_advantages; "
        "critic_advantages(*sys.argv[1:])"
    )
    args = [str(verl_export), str(tiny_model_dir), str(out), "a0", "a2"]
    done = cpu_trainer.run_on_cpu(["-c", script, *args])
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    # The critic: seam's engine, the model (FSDP2-wrapped) with sdpa; verl's own loader
    # fails for want of flash-attn.
    assert result["critic"] == ["SeamValueEngine", "FSDPQwen2ForTokenClassification", "sdpa"]
    assert "flash" in result["verl_loader_error"].lower()
    build = {(r["rollout_id"], r["segment_index"]): r for r in shard_rows(rl_build)}
    compared = 0
    for row in result["rows"]:
        s = build[row["rollout_id"], row["segment_index"]]
        trained = np.array(row["response_mask"], dtype=bool)
        assert int(trained.sum()) == s["num_trainable_tokens"] > 0
        values = np.array(row["values"])
        assert np.isfinite(values).all() and np.ptp(values[trained]) > 0  # a real critic
        lam = segment_lambda("rollout", s["num_trainable_tokens"], s["rollout_trainable_tokens"])
        adv, ret = cross_trajectory_gae(
            values[trained], s["reward"], s["trainable_tokens_after"], GAMMA, lam
        )
        np.testing.assert_allclose(np.array(row["advantages"])[trained], adv, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.array(row["returns"])[trained], ret, rtol=1e-4, atol=1e-6)
        assert not np.array(row["advantages"])[~trained].any()
        compared += 1
    assert compared == 4  # a0 (1 segment) and a2 (3 segments)
    # The critic's update on seam's targets: verl's value_loss over the mini-batch (before
    # the step the prediction is the value, so no clipping) is ½·token-mean (V − G)².
    residuals = [
        np.array(row["values"])[m] - np.array(row["returns"])[m]
        for row in result["rows"]
        for m in [np.array(row["response_mask"], dtype=bool)]
    ]
    squares = np.concatenate(residuals) ** 2
    assert len(squares) == 161 and result["vf_loss"] == pytest.approx(
        [0.5 * squares.mean()], rel=1e-5
    )
    assert {s["trainable_tokens_after"] for s in build.values() if s["rollout_id"] == "a2"} != {0}


def critic_advantages(export_dir: str, model_dir: str, out: str, *rollout_ids: str) -> None:
    """Run in a subprocess on the CPU platform (``use_cpu_platform`` first): the critic of
    the documented command (plus ``CPU_CRITIC``) as verl's v1 trainer builds it
    (``TrainingWorker``, ``model_type="value_model"``, then ``reset``) with seam's engine
    registered for the CPU platform, its values of the rows of ``rollout_ids`` as the
    trainer's ``_compute_values`` gets them, then seam's advantage step on the fields as
    verl's TransferQueue holds them, then one critic update on the returns as the
    trainer's ``_update_critic`` runs it. Writes the per-row results to ``out``."""
    from functools import partial

    import pyarrow.parquet as pq
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import value_loss
    from verl.workers.utils.padding import left_right_2_no_padding, response_from_nested

    import pipeline.export.verl_gae_trainer as seam

    seam.register_value_engine(device="cpu", vendor="cpu")
    torch.distributed.init_process_group(backend="gloo")
    rows = [
        r
        for f in sorted(Path(export_dir).glob("*.parquet"))
        for r in pq.read_table(f).to_pylist()
        if r["extra_info"]["rollout_id"] in rollout_ids
    ]
    config = compose_documented(export_dir, model_dir, CPU_CRITIC)
    critic = omega_conf_to_dataclass(config.critic)
    critic.engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    critic.engine.max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    worker = TrainingWorker(
        TrainingWorkerConfig(
            model_type="value_model",
            model_config=critic.model,
            engine_config=critic.engine,
            optimizer_config=critic.optim,
            checkpoint_config=critic.checkpoint,
        )
    )
    worker.reset()
    module = worker.engine.module
    try:  # verl's own loader, on the same config: flash-attn is not installed
        seam.VERL_LOAD_VALUEHEAD_MODEL(model_dir, torch.float32, critic.model.hf_config, False)
        verl_error = ""
    except Exception as error:  # its type depends on whether trl is importable
        verl_error = repr(error.__cause__ or error) + repr(error)

    batch = cpu_trainer.pad_as_agent_loop(rows, critic.model.tokenizer.pad_token_id)
    td = left_right_2_no_padding(batch.clone())
    tu.assign_non_tensor(td, compute_loss=False, temperature=1.0)
    masks = [torch.as_tensor(r["agent_loop_output"]["response_mask"]) for r in rows]
    nested_mask = torch.nested.as_nested_tensor(masks, layout=torch.jagged)
    values = response_from_nested(tu.get(worker.infer_batch(td), "values"), nested_mask)

    # The TransferQueue's fields: the agent loop's output updated with the row's columns
    # (rm_scores: the reward on the last response token), the critic's values.
    fields = []
    for i, (r, mask) in enumerate(zip(rows, masks, strict=True)):
        scores = torch.zeros(len(mask))
        scores[-1] = float(r["reward_model"]["ground_truth"])
        fields.append(
            {
                "uid": f"u{i}",
                "response_mask": mask,
                "rm_scores": scores,
                "values": values[i].float(),
                "extra_info": dict(r["extra_info"]),
            }
        )
    stored = tu.list_of_dict_to_tensordict(fields)
    output = seam.advantage_step(stored, config.algorithm)

    # One critic update on seam's returns, as the trainer's _update_critic runs it: verl's
    # value_loss over one mini-batch of every row, one epoch.
    batch["values"] = values.to_padded_tensor(0.0, (len(rows), batch["responses"].shape[1]))
    batch["returns"] = output["returns"].to_padded_tensor(0.0, batch["values"].shape)
    worker.set_loss_fn(partial(value_loss, config=critic))
    metrics = cpu_trainer.train_one_mini_batch(worker, batch, epochs=1)
    result = {
        "vf_loss": [float(x) for x in metrics["critic/vf_loss"]],
        "critic": [
            type(worker.engine).__name__,
            type(module).__name__,
            module.config._attn_implementation,
        ],
        "verl_loader_error": verl_error,
        "rows": [
            {
                "rollout_id": r["extra_info"]["rollout_id"],
                "segment_index": r["extra_info"]["segment_index"],
                "response_mask": masks[i].tolist(),
                "values": values[i].tolist(),
                "advantages": output["advantages"][i].tolist(),
                "returns": output["returns"][i].tolist(),
            }
            for i, r in enumerate(rows)
        ],
    }
    Path(out).write_text(json.dumps(result))
    torch.distributed.destroy_process_group()
