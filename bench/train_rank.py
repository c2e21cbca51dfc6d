"""One torchrun rank of ``bench/train_scale.py``: ``seam train-step``, then its peak RSS.

The peak (``VmHWM`` of /proc/self/status, in kB) goes to ``$SEAM_PEAK_DIR/rank-N`` when the
command returns, so the benchmark reads every rank's own peak, not the launcher's.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pipeline.cli import main

if __name__ == "__main__":
    code = main(["train-step", *sys.argv[1:]])
    status = Path("/proc/self/status").read_text()
    peak_kb = re.search(r"VmHWM:\s+(\d+) kB", status)
    if peak_kb and os.environ.get("SEAM_PEAK_DIR"):
        rank = os.environ.get("RANK", "0")
        (Path(os.environ["SEAM_PEAK_DIR"]) / f"rank-{rank}").write_text(peak_kb.group(1))
    sys.exit(code)
