"""Export one kept checkpoint of a pre-training run as a Hugging Face folder: a stable phase's
checkpoint (`optimizer.schedule=wsd`, `decay_steps=0`) becomes the `model.init_from` of a decay
run, on the same corpus or on another.

    python -m training.export_checkpoint RUN_DIR TAG OUT

RUN_DIR is `bert-pretrain`'s output folder, TAG a folder of its `checkpoints/` (e.g.
`00-phase1-step00000500`). The checkpoint is verified (checksums, no pickled code) before
anything in it is read; the export is the run's own (`training.pretrain.export`).
"""
from __future__ import annotations

import argparse
import os
import sys

from common.errors import exit_with_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.export_checkpoint",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="bert-pretrain's output folder")
    parser.add_argument("tag", help="a checkpoint folder under RUN_DIR/checkpoints")
    parser.add_argument("out", help="the Hugging Face folder to write")
    args = parser.parse_args(argv)
    from training import config as cfg
    from training import pretrain
    from training.checkpoint import CHECKPOINTS, verify_checkpoint

    ckpt_dir = os.path.join(args.run_dir, CHECKPOINTS)
    folder = os.path.join(ckpt_dir, args.tag)
    if not os.path.isdir(folder):
        kept = sorted(t for t in os.listdir(ckpt_dir) if os.path.isdir(os.path.join(ckpt_dir, t))) \
            if os.path.isdir(ckpt_dir) else []
        exit_with_error(parser.prog, f"{folder}: no such checkpoint (kept: {', '.join(kept) or 'none'})")
    try:
        verify_checkpoint(folder)
        config = cfg.load_saved(os.path.join(folder, "config.json"))
        pretrain.export(config, ckpt_dir, args.tag, os.path.abspath(args.out))
    except (ValueError, OSError) as error:
        exit_with_error(parser.prog, str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
