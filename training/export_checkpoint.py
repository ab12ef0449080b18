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


def kept_tag(run_dir: str, global_step: int = 0) -> str:
    """The tag of the run's kept checkpoint at `global_step` (0 = `latest`); a step no kept
    checkpoint has is one line naming the steps kept."""
    from training import config as cfg
    from training.checkpoint import CHECKPOINTS, TAG, latest_tag, phase_index_of

    ckpt_dir = os.path.join(run_dir, CHECKPOINTS)
    latest = latest_tag(ckpt_dir) if os.path.isdir(ckpt_dir) else None
    if latest is None:
        raise ValueError(f"{ckpt_dir}: no checkpoint")
    if not global_step:
        return latest
    phases = cfg.load_saved(os.path.join(run_dir, "config.json")).phases
    kept = {}
    for tag in sorted(os.listdir(ckpt_dir)):
        if TAG.fullmatch(tag) and os.path.isdir(os.path.join(ckpt_dir, tag)):
            index = phase_index_of(tag)
            offset = sum(p.steps for p in phases[:index])
            kept[offset + int(tag.rpartition("step")[2])] = tag
    if global_step not in kept:
        raise ValueError(f"{ckpt_dir}: no kept checkpoint at global step {global_step} (kept: "
                         f"{', '.join(map(str, sorted(kept))) or 'none'}; "
                         "pretrain.cadence.checkpoint_every and keep_checkpoints decide them)")
    return kept[global_step]


def check_stable(run_dir: str, tag: str) -> None:
    """Refuse, in one line naming the checkpoint, a decay's start that is not at a stable
    phase's peak: a run on another schedule, or a step inside its phase's own decay."""
    from training import config as cfg
    from training.checkpoint import CHECKPOINTS, phase_index_of

    config = cfg.load_saved(os.path.join(run_dir, "config.json"))
    where = os.path.join(run_dir, CHECKPOINTS, tag)
    if config.optimizer.schedule != "wsd":
        raise ValueError(f"{where}: not a stable-phase checkpoint: the run's schedule is "
                         f"{config.optimizer.schedule} (optimizer.schedule=wsd holds the peak)")
    phase = config.phases[phase_index_of(tag)]
    step = int(tag.rpartition("step")[2])
    if phase.decay_steps and step > phase.steps - phase.decay_steps:
        raise ValueError(f"{where}: not a stable-phase checkpoint: step {step} of {phase.name} "
                         f"falls in its decay (its last {phase.decay_steps} steps)")


def export_kept(run_dir: str, tag: str, out: str) -> str:
    """Export `run_dir`'s checkpoint `tag` to the Hugging Face folder `out`, verified first."""
    from training import config as cfg
    from training import pretrain
    from training.checkpoint import CHECKPOINTS, verify_checkpoint

    ckpt_dir = os.path.join(run_dir, CHECKPOINTS)
    folder = os.path.join(ckpt_dir, tag)
    if not os.path.isdir(folder):
        kept = sorted(t for t in os.listdir(ckpt_dir) if os.path.isdir(os.path.join(ckpt_dir, t))) \
            if os.path.isdir(ckpt_dir) else []
        raise ValueError(f"{folder}: no such checkpoint (kept: {', '.join(kept) or 'none'})")
    verify_checkpoint(folder)
    config = cfg.load_saved(os.path.join(folder, "config.json"))
    return pretrain.export(config, ckpt_dir, tag, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.export_checkpoint",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="bert-pretrain's output folder")
    parser.add_argument("tag", help="a checkpoint folder under RUN_DIR/checkpoints")
    parser.add_argument("out", help="the Hugging Face folder to write")
    args = parser.parse_args(argv)
    try:
        export_kept(args.run_dir, args.tag, os.path.abspath(args.out))
    except (ValueError, OSError) as error:
        exit_with_error(parser.prog, str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
