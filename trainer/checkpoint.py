"""Resumable PPO runs: ``torch.distributed.checkpoint`` (DCP) checkpoints and Hugging Face export.

A checkpoint is a directory ``CKPT_DIR/step-NNNNNNNN`` holding

- DCP files (``.metadata`` and one ``__R_0.distcp`` per rank) of ``{"policy": {"model",
  "optim"}, "critic": {"model", "optim"}}`` — both models and both AdamW states, as the
  sharded (FSDP2 DTensor) or whole tensors each rank holds, under fully qualified names
  (``torch.distributed.checkpoint.state_dict``). DCP stores every tensor with its global
  shape and reshards on load, so a checkpoint written by N ranks loads on M ranks or in
  one process;
- ``rng-rank{r}.pt`` per rank: torch's (and CUDA's) RNG state, numpy's and Python's;
- ``meta.json``: the step, the world size that wrote it, the plan (options and a
  fingerprint of the build's index) and the plan cursor (segments consumed so far);
- ``hf-policy/`` and ``hf-critic/``: config and tokenizer files of the models trained,
  so ``export_hf`` can rebuild them with no other input.

The run has no learning-rate scheduler (constant AdamW rates), so none is stored.
``CKPT_DIR/latest`` names the newest complete checkpoint and is written last, atomically
(``pipeline/common/atomic.py``) after every rank finished its files: a run killed
mid-save leaves ``latest`` on the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.common.atomic import atomic_write
from trainer.models import TOKENIZER_FILES

LATEST = "latest"
META = "meta.json"
HF_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)
FORMAT = 1


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _one_process_is_intended():
    """DCP warns that it assumes one process whenever no process group exists; here that is
    the intent (``no_dist``), so the warning would only be noise on the console."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def index_fingerprint(segments) -> str:
    """sha256 over every indexed segment's rollout, segment index and sizes, in index order."""
    digest = hashlib.sha256()
    for s in segments:
        digest.update(
            f"{s.rollout_id}\0{s.segment_index}\0{s.num_tokens}\0{s.num_trainable_tokens}\n".encode()
        )
    return digest.hexdigest()


def train_state(trainer) -> dict[str, Any]:
    """The DCP state dict of both models and optimizers, as this rank holds them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {}
    for name, module, optim in (
        ("policy", trainer.policy_lp, trainer.policy_opt),
        ("critic", trainer.critic, trainer.critic_opt),
    ):
        model_sd, optim_sd = get_state_dict(module, optim)
        state[name] = {"model": model_sd, "optim": optim_sd}
    return state


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    directory: str | Path,
    trainer,
    step: int,
    plan: dict[str, Any],
    cursor: int,
    model_dirs: dict[str, str | Path],
) -> Path:
    """Write checkpoint ``step`` (collective: every rank calls it), then point ``latest`` at it.

    ``plan``: the options the plan is a function of (checked on resume); ``cursor``:
    segments of the plan consumed by steps 1..``step``; ``model_dirs``: the policy's and
    critic's source directories, whose config and tokenizer files are copied along.
    """
    import torch.distributed.checkpoint as dcp

    rank, world = _rank_world()
    root = Path(directory)
    target = root / f"step-{step:08d}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if target.exists():  # a half-written save of this step from a killed run: not `latest`
            _remove_partial(target)
        target.mkdir()
    _barrier()
    with _one_process_is_intended():
        dcp.save(train_state(trainer), checkpoint_id=str(target), no_dist=not dist.is_initialized())
    torch.save(rng_state(), target / f"rng-rank{rank}.pt")
    _barrier()
    if rank == 0:
        for name, source in model_dirs.items():
            hf = target / f"hf-{name}"
            hf.mkdir()
            for file in HF_FILES:
                if (Path(source) / file).is_file():
                    shutil.copy2(Path(source) / file, hf / file)
        meta = dict(
            format=FORMAT,
            step=step,
            world_size=world,
            plan=plan,
            cursor=cursor,
            steps_done=trainer.steps_done,
        )
        (target / META).write_text(json.dumps(meta, indent=1) + "\n")
        atomic_write(root / LATEST, lambda tmp: Path(tmp).write_text(target.name + "\n"))
    _barrier()
    return target


def _is_ours(name: str) -> bool:
    return (
        name in (".metadata", META)
        or name.endswith(".distcp")
        or (name.startswith("rng-rank") and name.endswith(".pt"))
        or name.startswith("hf-")
    )


def _remove_partial(target: Path) -> None:
    """Remove a checkpoint directory a killed run left, only if it holds nothing but checkpoint files."""
    strangers = [f.name for f in target.iterdir() if not _is_ours(f.name)]
    if strangers:
        raise FileExistsError(
            f"{target} exists and holds {strangers[0]}, which no checkpoint writes: not overwriting it"
        )
    shutil.rmtree(target)


def resolve(path: str | Path) -> Path:
    """A checkpoint directory: ``path`` itself if it holds ``meta.json``, else ``path/latest``'s."""
    path = Path(path)
    if (path / META).is_file():
        return path
    latest = path / LATEST
    if not latest.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint here (neither {META} nor {LATEST})")
    target = path / latest.read_text().strip()
    if not (target / META).is_file():
        raise FileNotFoundError(f"{latest} names {target.name}, which holds no {META}")
    return target


def read_meta(checkpoint: Path) -> dict[str, Any]:
    meta = json.loads((checkpoint / META).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{checkpoint}: checkpoint format {meta.get('format')}, expected {FORMAT}")
    return meta


def load(directory: str | Path, trainer) -> dict[str, Any]:
    """Restore models, optimizers, step counter and this rank's RNG from the latest checkpoint.

    Collective. Returns its ``meta.json``. At another world size each rank takes the RNG
    state of rank ``r mod`` the saved world size.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    checkpoint = resolve(directory)
    meta = read_meta(checkpoint)
    state = train_state(trainer)
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=not dist.is_initialized())
    for name, module, optim in (
        ("policy", trainer.policy_lp, trainer.policy_opt),
        ("critic", trainer.critic, trainer.critic_opt),
    ):
        set_state_dict(
            module,
            optim,
            model_state_dict=state[name]["model"],
            optim_state_dict=state[name]["optim"],
        )
    trainer.steps_done = meta["steps_done"]
    rank, _ = _rank_world()
    rng_file = checkpoint / f"rng-rank{rank % meta['world_size']}.pt"
    set_rng_state(torch.load(rng_file, weights_only=False))
    return meta


def export_hf(checkpoint: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """``out_dir/policy`` (loads with ``AutoModelForCausalLM``) and ``out_dir/critic`` from a
    checkpoint, in one process, with the tokenizer; returns the two directories."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from trainer.models import Critic, PolicyLogprobs, copy_tokenizer

    path = resolve(checkpoint)
    read_meta(path)
    policy = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path / "hf-policy"))
    critic = Critic(AutoModel.from_config(AutoConfig.from_pretrained(path / "hf-critic")))
    wrapper = PolicyLogprobs(policy)
    state = {"policy": {"model": wrapper.state_dict()}, "critic": {"model": critic.state_dict()}}
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    wrapper.load_state_dict(state["policy"]["model"])
    critic.load_state_dict(state["critic"]["model"])
    out = {"policy": Path(out_dir) / "policy", "critic": Path(out_dir) / "critic"}
    for name, model in (("policy", policy), ("critic", critic)):
        out[name].mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out[name])
        copy_tokenizer(path / f"hf-{name}", out[name])
    return out
