"""``seam gateway``: collect token-exact rollouts from any harness, with the Judge in the loop.

An HTTP server on 127.0.0.1 sits between agent harnesses and an OpenAI-compatible
inference engine (vLLM, SGLang, ...):

```
harness ──OpenAI chat / Anthropic Messages──▶ gateway ──OpenAI chat──▶ engine
        ◀── response (the Judge's replacement, if any) ──  │
                                                           ▼
                       OUT/calls/<rollout>.jsonl  (one line per call, --durability)
                       OUT/corrections.jsonl      (the Judge's executed corrections)
                       OUT/rewards.jsonl          (outcomes posted afterwards)
                       OUT/gateway.json           (upstream, token-id mode, judge)
```

Modules: ``dialects`` translates Anthropic Messages to and from OpenAI chat
completions and writes both dialects' server-sent events; ``recorder`` appends calls
crash-safely; ``judging`` runs the Judge on each candidate response before the harness
sees it; ``server`` is the aiohttp application. The call log is the ``chat-completions``
format that ``pipeline/readers/openai_messages.py`` reads, so a collection directory is
built with ``seam build-rl OUT/calls --rewards OUT/rewards.jsonl`` (or ``build-sft ...
--corrections OUT/corrections.jsonl``) and nothing else.
"""
