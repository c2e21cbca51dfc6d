"""A CPU platform for verl, registered through verl's own platform plugin point.

verl 0.9.1 resolves its device through ``verl.plugin.platform``: ``get_platform()`` picks
the class registered under the ``VERL_PLATFORM`` environment variable
(``PlatformRegistry.register``), and without one falls back to ``nvidia`` (CUDA) when no
accelerator is found. Importing this module registers ``cpu``: device ``cpu``, process
group backend ``gloo``, Ray resource ``CPU``, and as the device module
(``get_torch_device()``) ``torch.cpu`` plus the few calls verl makes on it that only an
accelerator has (memory caches: none on CPU; the RNG: the CPU generator's).
``use_cpu_platform`` puts a process on it: ``VERL_PLATFORM=cpu``, verl's FSDP engines
registered for device ``cpu`` in its ``EngineRegistry``, a trl 1.x hidden. Run as a module, it is verl's ``sft_trainer`` on CPU (docs/sft.md,
"What is checked where", has the overrides a CPU needs):

    VERL_PLATFORM=cpu torchrun --standalone --nproc_per_node=1 \
        -m tests.export.verl_cpu_platform model.path=... trainer.device=cpu ...

It is test support for seam's exports, not a verl feature: slow, one process, no
rollout engines.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.cpu
from verl.plugin.platform import PlatformBase, PlatformRegistry

NAME = "cpu"


def _device_module() -> ModuleType:
    """``torch.cpu`` with the accelerator calls verl makes on ``get_torch_device()``
    (``empty_cache``, ``mem_get_info``, RNG state, ...) answered for host memory."""
    module = ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def no_bytes(*args: Any, **kwargs: Any) -> int:
        return 0

    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    calls: dict[str, Any] = {
        "empty_cache": nothing,
        "ipc_collect": nothing,
        "set_per_process_memory_fraction": nothing,
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_rng_state": torch.get_rng_state,
        "set_rng_state": torch.set_rng_state,
        "mem_get_info": mem_get_info,
        "get_device_name": lambda *args, **kwargs: "cpu",
        "memory_allocated": no_bytes,
        "memory_reserved": no_bytes,
        "max_memory_allocated": no_bytes,
        "max_memory_reserved": no_bytes,
    }
    for name, call in calls.items():
        setattr(module, name, call)
    return module


DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):
    """verl's ``PlatformBase`` for the host CPU (one device, index 0)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Only when asked for by VERL_PLATFORM=cpu: never auto-detected over an accelerator.
        return False

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl passes it to .to(), torch.device() and FSDP's device_id, where the index
        # 0 would mean cuda:0.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # nothing to hide on CPU; the name verl's Ray code expects

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_fsdp_engines() -> None:
    """verl's FSDP engines, as they are, for device ``cpu`` too (``EngineRegistry`` keys
    engines by device, and registers them for ``cuda`` and ``npu`` only). Imports the
    engines, which resolve verl's platform: call it after ``VERL_PLATFORM`` is set."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import (
        FSDPEngineWithLMHead,
        FSDPEngineWithValueHead,
    )

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=NAME)(
            engine
        )


def hide_trl_without_value_head() -> None:
    """verl's FSDP engine (``apply_monkey_patch``) imports trl's
    ``AutoModelForCausalLMWithValueHead`` whenever trl is installed; verl[fsdp] pins trl
    0.27, and trl 1.x no longer has it (seam's trainers environment has trl 1.16, for the
    TRL tests). Hide such a trl from this process (a ``None`` entry in ``sys.modules`` is
    Python's "not importable"): verl's SFT and actor code do not use it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("trl").split(".")[0])
    except PackageNotFoundError:
        return
    if major >= 1:
        sys.modules["trl"] = None  # type: ignore[assignment]


def use_cpu_platform() -> None:
    """This process on verl's CPU platform: ``VERL_PLATFORM=cpu`` (before verl resolves
    its platform, on import), trl 1.x hidden, verl's FSDP engines registered for ``cpu``."""
    os.environ["VERL_PLATFORM"] = NAME
    hide_trl_without_value_head()
    register_fsdp_engines()


def sft_main() -> None:
    """verl's ``sft_trainer`` entry point on the CPU platform: ``main`` (its config, its
    ``auto_set_device``) and ``run_sft``, whose ``initialize_global_process_group`` asks for
    ``cpu:gloo,{device}:{backend}`` -- ``cpu:gloo,cpu:gloo`` here, which torch refuses as a
    duplicate device type -- so the process group is a plain ``gloo`` one, created the
    same way from torchrun's environment; ``SFTTrainer`` and its ``fit`` are verl's."""
    use_cpu_platform()
    import hydra
    import torch.distributed
    import verl.trainer.sft_trainer as sft_trainer
    from verl.utils.device import auto_set_device

    config_dir = str(Path(sft_trainer.__file__).parent / "config")

    @hydra.main(config_path=config_dir, config_name="sft_trainer_engine", version_base=None)
    def main(config) -> None:
        auto_set_device(config)
        torch.distributed.init_process_group(backend="gloo")
        sft_trainer.SFTTrainer(config=config).fit()
        torch.distributed.destroy_process_group()

    main()


if __name__ == "__main__":
    sft_main()
