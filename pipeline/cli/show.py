"""``seam show``: one rollout as the model saw it (terminal, or one HTML page)."""

from __future__ import annotations

from pathlib import Path

from pipeline.common.errors import UsageError


def run(args) -> int:
    from rich.console import Console

    from pipeline.inspect.show.html import render_html
    from pipeline.inspect.show.load import load_view
    from pipeline.inspect.show.terminal import print_view

    view = load_view(args.target, args.rollout_id, args.where, args.tokenizer, args.chat_template)
    if args.segment is not None and not any(s.index == args.segment for s in view.segments):
        raise UsageError(
            f"rollout {view.rollout_id} has {len(view.segments)} segment(s), no --segment {args.segment}"
        )
    if args.html:
        path = Path(args.html)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_html(view, segment=args.segment))
        print(f"wrote {path} (rollout {view.rollout_id}, {len(view.segments)} segment(s))")
        return 0
    print_view(view, Console(highlight=False), args.segment, args.tokens)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "show",
        help="Show one rollout as the model saw it: segments, trained tokens, seams.",
        description="Show one rollout of a build directory or of raw input files (any format; "
        "segmented and masked on the fly) segment by segment: trained tokens highlighted, "
        "context dimmed, call and role boundaries, seam banners (kind, trigger, what the "
        "rewrite kept, dropped and added), drift realignments, truncated calls, "
        "context_fidelity, advantage, n_s and N_>s, judge corrections and the summary audit.",
    )
    p.add_argument("target", help="A build directory, or rollout input files / a directory.")
    p.add_argument("rollout_id", nargs="?", default=None, help="Default: the first rollout.")
    p.add_argument(
        "--where",
        default=None,
        metavar="SQL",
        help="Build directories: the first rollout matching this condition on the rollouts view "
        '(e.g. "num_compactions >= 2 AND NOT passed").',
    )
    p.add_argument("--segment", type=int, default=None, help="Only this segment (0-based).")
    p.add_argument(
        "--tokens",
        action="store_true",
        help="Every token with its id (shows BPE merges at boundaries).",
    )
    p.add_argument(
        "--html", default=None, metavar="FILE", help="Write one self-contained HTML page."
    )
    from pipeline.build.config import TokenizerConfig
    from pipeline.common.options import add_options

    add_options(p, TokenizerConfig)  # a build directory: its own (manifest.json), if found
    p.set_defaults(func=run)
