"""Assemble one simulated rollout, and the groups of rollouts of a simulation run.

Rollout ``i`` of a run is member ``i % G`` of task ``i // G``. Its generator is seeded
from ``(seed, task, member)`` and the task's from ``(seed, task)``, so any rollout can be
produced on its own, by any worker, in any order, with identical bytes. A task's group
outcome (all pass, all fail, or mixed) is drawn from the task generator; a rollout's
reward is then read off its final workspace.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from pipeline.simulate import compaction
from pipeline.simulate.actions import ramble
from pipeline.simulate.agent import Agent
from pipeline.simulate.context import Engine
from pipeline.simulate.episode import Config, Episode
from pipeline.simulate.tasks import CodingTask, make_task
from schemas.rollout import Rollout

SOURCE = "seam-simulate"
MODEL = "seam-sim/qwen2.5-coder-7b-instruct"
STRATEGIES = {"budget": 0.40, "auto": 0.35, "memact": 0.12, "truncate": 0.06, "none": 0.07}
LOGGING = {"full": 0.08, "output": 0.30, "none": 0.62}


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_STR = {"type": "string"}
BASE_TOOLS = [
    _fn(
        "bash",
        "Run a shell command in /repo; returns stdout and stderr.",
        {"command": _STR},
        ["command"],
    ),
    _fn(
        "read_file",
        "Show lines of a file numbered like `cat -n`.",
        {"path": _STR, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
        ["path"],
    ),
    _fn(
        "grep",
        "Search file contents recursively for a regular expression (grep -rn).",
        {"pattern": _STR, "path": _STR},
        ["pattern"],
    ),
    _fn(
        "str_replace",
        "Replace exactly one occurrence of old_str with new_str in a file.",
        {"path": _STR, "old_str": _STR, "new_str": _STR},
        ["path", "old_str", "new_str"],
    ),
    _fn("submit", "Submit the repository in its current state as the final answer.", {}, []),
]
COMPACT_TOOL = _fn(
    "compact",
    "Replace the conversation history with the working state written in this message's "
    "content, which must start with '# Auto Context Summary'.",
    {},
    [],
)
PRUNE_TOOL = _fn(
    "prune_context",
    "Remove earlier steps (by number) from the context, leaving a note in their place.",
    {"steps": {"type": "array", "items": {"type": "integer"}}, "note": _STR},
    ["steps", "note"],
)

SYSTEM = (
    "You are an autonomous software engineer working in a Python repository checked out at /repo. Use the tools "
    "to explore the code, reproduce the problem, make a minimal fix to non-test files, and verify it with the "
    "test suite. Think before each action, call one tool at a time, and call `submit` when you are done."
)
SYSTEM_EXTRA = {
    "auto": " Your context is limited. When it grows long or fills with stale output, call `compact` and write your "
    "working state (established facts with evidence, workspace state, next step) as the message content.",
    "memact": " Your context is limited. Remove stale steps with `prune_context`, leaving a note of what they showed.",
}
TASK = (
    "<uploaded_files>\n/repo\n</uploaded_files>\nI've uploaded a Python code repository in the directory /repo. "
    "Consider the following issue:\n\n<issue_description>\n{issue}\n</issue_description>\n\nMake the minimal changes "
    "to non-test files in /repo so that the issue is resolved. Tests for the issue may already exist; run them."
)


def draw_config(rng: random.Random) -> Config:
    strategy = rng.choices(list(STRATEGIES), weights=list(STRATEGIES.values()))[0]
    budget = 131072 if strategy == "none" else rng.choice([8192, 12288, 16384, 24576])
    logging = rng.choices(list(LOGGING), weights=list(LOGGING.values()))[0]
    return Config(
        strategy=strategy,
        budget=budget,
        threshold=budget // 4,
        logging=logging,
        drift=logging != "none" and rng.random() < 0.45,
        reasoning=rng.random() < 0.3,
        n_steps=int(rng.triangular(20, 105, 38)),
        corrected=strategy == "auto" and rng.random() < 0.6,
        auto_fraction=rng.uniform(0.5, 0.8),
        ramble_end=rng.random() < 0.03,
    )


def group_outcomes(task_rng: random.Random, size: int) -> list[bool]:
    """Intended outcomes of a group: all fail, all pass, or mixed (at least one of each)."""
    kind = task_rng.choices(["fail", "pass", "mixed"], weights=[0.25, 0.25, 0.5])[0]
    if kind != "mixed" or size < 2:
        return [kind == "pass"] * size
    outcomes = [task_rng.random() < 0.5 for _ in range(size)]
    if all(outcomes) or not any(outcomes):
        outcomes[task_rng.randrange(size)] = not outcomes[0]
    return outcomes


def simulate_rollout(
    engine: Engine, task: CodingTask, seed: str, member: int, intended: bool
) -> Rollout:
    rng = random.Random(f"{seed}:rollout:{task.task_id}:{member}")
    cfg = draw_config(rng)
    tools = (
        BASE_TOOLS
        + ([COMPACT_TOOL] if cfg.strategy == "auto" else [])
        + ([PRUNE_TOOL] if cfg.strategy == "memact" else [])
    )
    rollout_id = f"{task.task_id}/r{member}"
    agent = Agent(task, rng, intended, cfg.n_steps, cfg.reasoning)
    if cfg.ramble_end:
        agent.queue[-1] = "ramble"
    ep = Episode(engine, tools, cfg, rng, rollout_id)
    ep.append("system", SYSTEM + SYSTEM_EXTRA.get(cfg.strategy, ""))
    ep.append("user", TASK.format(issue=task.issue))
    while not agent.done:
        compaction.before_action(ep, agent)
        if ep.ended:  # out of budget with no compaction left: the call is cut by the length limit
            step = ramble(agent)
            ep.run(step)
            agent.commit(step, [])
            break
        if cfg.corrected:
            compaction.judged_action(ep, agent)
        else:
            step = agent.next_step()
            _, _, ids = ep.run(step)
            agent.commit(step, ids)
    reward = 1.0 if agent.resolved else 0.0
    summaries = [
        ep.ctx.output_len[e.id] for e in ep.events if e.type == "message" and e.kind == "summary"
    ]
    meta = {
        "simulator": "seam-simulate/1",
        "seed": seed,
        "strategy": cfg.strategy,
        "context_budget": cfg.budget,
        "compaction_threshold": cfg.threshold,
        "keep_last_steps": compaction.KEEP_LAST_STEPS,
        "token_logging": cfg.logging,
        "reasoning": cfg.reasoning,
        "compactions": ep.compactions,
        "drifted_calls": ep.drifted_calls,
        "summary_tokens": summaries,
        "bug": task.bug.kind,
        "judged": cfg.corrected,
    }
    return Rollout(
        rollout_id=rollout_id,
        task_id=task.task_id,
        source=SOURCE,
        model=MODEL,
        tools=tools,
        events=ep.events,
        reward=reward,
        resolved=agent.resolved,
        meta=meta,
        corrections=sorted(ep.corrections, key=lambda c: c.call_index),
    )


def simulate_task(
    engine: Engine, seed: str, task_index: int, group_size: int, members: range
) -> list[Rollout]:
    """The rollouts ``members`` of task ``task_index`` (a whole group, or its first members)."""
    task = make_task(seed, task_index)
    outcomes = group_outcomes(random.Random(f"{seed}:group:{task_index}"), group_size)
    return [simulate_rollout(engine, task, seed, m, outcomes[m]) for m in members]


def iter_rollouts(engine: Engine, seed: str, n: int, group_size: int) -> Iterator[Rollout]:
    """Rollouts 0..n-1 in order (the last group may be partial)."""
    for task_index in range((n + group_size - 1) // group_size):
        members = range(min(group_size, n - task_index * group_size))
        yield from simulate_task(engine, seed, task_index, group_size, members)
