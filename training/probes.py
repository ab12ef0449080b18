"""Probe exports: the weights of chosen steps as Hugging Face folders, for the flow's probes.

With `cadence.probe_every` N (optimizer steps counted across phases), pre-training writes a
checkpoint at every N-th global step and then the same consolidated fp32 export as the run's
final one (`training.pretrain.export`: the checkpoint's fp32 weights, whatever the ZeRO stage)
to

    <output_dir>/probes/step-<global step, 7 digits>/hf/         transformers folder
    <output_dir>/probes/step-<global step, 7 digits>/manifest.json

The folder is built as `probes/.tmp-step-NNNNNNN`, its manifest (step, checkpoint tag, sha256 of
`model.safetensors`) written last, then renamed: a folder named `step-*` is complete. The
trainer never waits for a probe: the flow's watcher (flows/probes.py) fine-tunes each export in
processes of its own. A run resumed at a probe step whose export is missing (killed between the
checkpoint and the export) writes it first. Probes are observers: the export draws nothing from
the run's random streams (`training.checkpoint.rng_untouched`), so `probe_every` N or 0, killed
and resumed or not, trains the same weights bit for bit (tests/training/test_resume.py).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable

from common import storage
from common.errors import disk_full

log = logging.getLogger("training.probes")

PROBES = "probes"
"""The folder of the probe exports in a run's output_dir."""
WEIGHTS = "model.safetensors"
"""The export's weights file (model/hf.py `export_hf_folder`), whose sha256 names the weights."""


def is_probe_step(probe_every: int, global_step: int) -> bool:
    """Whether the run exports a probe at `global_step` (counted across phases; 0 = off)."""
    return bool(probe_every) and global_step > 0 and global_step % probe_every == 0


def probe_dir(output_dir: str, global_step: int) -> str:
    """`<output_dir>/probes/step-NNNNNNN`."""
    return os.path.join(output_dir, PROBES, f"step-{global_step:07d}")


def is_exported(output_dir: str, global_step: int) -> bool:
    return os.path.exists(os.path.join(probe_dir(output_dir, global_step),
                                       storage.MANIFEST_NAME))


def write_probe_export(output_dir: str, global_step: int, tag: str,
                       export: Callable[[str], object]) -> str:
    """Call `export(folder)` into a temporary folder, write its manifest last, rename it to
    `probe_dir`; returns that folder. An existing complete export is kept (a resumed run)."""
    final = probe_dir(output_dir, global_step)
    if is_exported(output_dir, global_step):
        return final
    tmp = os.path.join(output_dir, PROBES, f".tmp-step-{global_step:07d}")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed attempt
    started = time.perf_counter()
    try:
        export(os.path.join(tmp, "hf"))
        manifest = {"global_step": global_step, "checkpoint": tag,
                    "weights_sha256": storage.sha256_file(os.path.join(tmp, "hf", WEIGHTS)),
                    "seconds": round(time.perf_counter() - started, 3)}
        storage.write_manifest(tmp, manifest)
        shutil.rmtree(final, ignore_errors=True)  # an incomplete one (no manifest)
        os.replace(tmp, final)
    except BaseException as error:  # the run may go on: no partial export is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(error, tmp)
        if full is not None:
            raise full from None
        raise
    log.info("probe export of step %d (%s) in %s: %.2f s", global_step, tag, final,
             manifest["seconds"])
    return final
