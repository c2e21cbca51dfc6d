"""``seam schema``: print the JSON Schema of the canonical rollout (or a correction record)."""

from __future__ import annotations

import json

from schemas.correction import Correction
from schemas.rollout import rollout_json_schema


def run(args) -> int:
    schema = rollout_json_schema() if args.which == "rollout" else Correction.model_json_schema()
    print(json.dumps(schema, indent=2))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "schema",
        help="Print the JSON Schema of canonical rollouts (or correction records).",
        description="Print the JSON Schema that every canonical rollout record must satisfy.",
    )
    p.add_argument(
        "which",
        nargs="?",
        choices=["rollout", "correction"],
        default="rollout",
        help="Which record's schema to print (default: rollout).",
    )
    p.set_defaults(func=run)
