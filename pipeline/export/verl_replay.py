"""verl agent loop that returns a ``seam export --to verl`` row as recorded.

verl's trainer gets its responses from an agent loop: the default one samples a new
response from ``prompt`` with the rollout server. This one samples nothing: verl's
``RLHFDataset`` hands every column of the row to ``run`` as keyword arguments, and it
returns the row's ``agent_loop_output`` (``prompt_ids``, ``response_ids``,
``response_mask``, ``num_turns``) as verl's ``AgentLoopOutput``, so the actor trains on
exactly the recorded segment. ``reward_score`` is left unset so the configured reward
function (``verl_reward.py``) scores the row. ``response_logprobs`` is not handed on:
verl batches it only when every row of a batch has it (its ``_postprocess`` concatenates
them when the first row has one, and a row without raises ``TypeError``), while a build
mixes logged and unlogged rollouts; verl recomputes the old log-probs with the actor,
its default.

Use it with ``actor_rollout_ref.rollout.agent.agent_loop_config_path=
pipeline/export/verl_agent_loop.yaml`` and ``...agent.default_agent_loop=seam_replay``
(``pipeline`` must be importable by verl's workers). Imports verl: only verl loads it.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)


class ReplayAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        recorded = kwargs["agent_loop_output"]
        return AgentLoopOutput(
            prompt_ids=[int(t) for t in recorded["prompt_ids"]],
            response_ids=[int(t) for t in recorded["response_ids"]],
            response_mask=[int(m) for m in recorded["response_mask"]],
            num_turns=int(recorded["num_turns"]),
            metrics=AgentLoopMetrics(),
        )
