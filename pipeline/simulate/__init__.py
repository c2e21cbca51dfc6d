"""``seam simulate``: deterministic, realistic SWE-agent rollouts that compact their context.

How a rollout is made, module by module:

- ``repos`` / ``bugs`` / ``tasks``: a small Python repository, one bug template (buggy
  code, fix, failing test, pytest output, a tempting wrong fix) and the issue text;
- ``agent`` / ``actions`` / ``sidetrips`` / ``outputs``: a plan of intents realized as
  tool calls with realistic results (grep hits, ``cat -n`` views, pytest sessions,
  ``str_replace`` edits, diffs); ``state`` is what the agent knows;
- ``summaries``: CompactionRL summaries and AutoCompact working states, with defects at
  audit-worthy rates;
- ``compaction``: the context strategies (budget, auto, memact, truncate);
  ``corrections``: judge records in AutoCompact's proportions;
- ``context`` / ``fastenc`` / ``episode``: exact token accounting and engine logs
  (prompt/output ids, logprobs, non-canonical tokenizations);
- ``rollouts``: one rollout from (seed, task, member); ``run``: N of them, in parallel,
  streamed to a file whose bytes do not depend on the worker count.
"""
