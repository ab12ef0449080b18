"""`make demo`: the whole DAG (tiny preset) on the bundled sample, on CPU, in minutes.

Runs the `pretrain-bert` flow in this process against Prefect's ephemeral local server (no
server to start), writing the run under `runs/tiny/` and Prefect's database under
`runs/.prefect/` (unless PREFECT_HOME is set), and ends by printing the report: stage timings,
data statistics, the loss curve's path, the fine-tuning table, what to run next and where the
report is saved.

Its output is our stages' lines (one per reused stage), one progress bar per long stage: the
libraries' INFO lines (HTTP requests, Beam, matplotlib) and the config dumps show with
`make demo ARGS=--verbose` or BERT_LOG_LEVEL=DEBUG (common/logs.py).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    # Keep Prefect's database with the run instead of in ~/.prefect, unless the user set one.
    os.environ.setdefault("PREFECT_HOME", str(REPO / "runs" / ".prefect"))
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)  # Prefect creates only the last level
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from flows.cli import main as cli_main

    return cli_main(["--preset", "tiny", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
