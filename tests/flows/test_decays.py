"""WSD decays in the flow (`decays`), run as the README says: a stable run
(`pretrain.optimizer.schedule=wsd`, its last phase at the peak), then decays from two of its
kept checkpoints, one on the run's shards and one on another source, reusing the data stages
and the stable run; the report shows each decay beside the stable run: its MLM loss, and the
probe scores of its two ends beside the stable run's probes."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.config import SAMPLE, resolve

REPO = Path(__file__).resolve().parents[2]
# The README's commands at test scale: a few steps, a kept checkpoint every 2, probes (the
# stable run's one export, at step 4, and each decay's two ends) and the fine-tuning stage, each
# on 8 SST-2 examples
SCALE = {"pretrain": {
    "engine": {"precision": "fp32", "zero_stage": 0},
    "cadence": {"checkpoint_every": 2, "keep_checkpoints": 5, "eval_every": 2, "log_every": 1,
                "eval_batches": 1, "probe_every": 4},
    "phase1": {"steps": 4, "warmup_steps": 0, "micro_batch_size": 4, "global_batch_size": 4},
    "phase2": {"steps": 2, "warmup_steps": 0, "micro_batch_size": 2, "global_batch_size": 2}},
    "data": {"audit": False},
    "finetune": {"data": str(SAMPLE), "tasks": ["sst-2"], "learning_rates": [1e-4], "seeds": [1],
                 "epochs": 1, "max_train_examples": 8, "max_eval_examples": 8, "probe": {
                     "tasks": ["sst-2"], "max_train_examples": 8, "max_eval_examples": 8,
                     "batch_size": 8}}}
DECAYS_SCALE = {"decays": {"general": {"from_step": 4, "steps": 2},
                           "domain": {"from_step": 2, "steps": 2}}}
BOOKS = {"name": "books", "from_step": 4, "steps": 2}
POEMS = {"name": "poems", "from_step": 2, "steps": 2, "sources": [
    {"name": "poems-decay", "kind": "jsonl", "path": str(SAMPLE / "jsonl"), "id_field": "id",
     "title_field": "title"}]}


def readme_decays() -> tuple[str, list[list[str]]]:
    """The README's `decays.yaml` and the two bert-dag commands below it, as written."""
    text = (REPO / "README.md").read_text()
    start = text.index("```yaml\n", text.index("in `decays.yaml`:")) + len("```yaml\n")
    config = text[start:text.index("```", start)]
    start = text.index("```bash\n", start) + len("```bash\n")
    commands = [shlex.split(line.partition("#")[0]) for line in
                text[start:text.index("```", start)].splitlines()]
    return config, commands


def set_flags(overrides: dict, prefix: str = "") -> list[str]:
    """A nested mapping as `--set dotted=value` flags (a list comma-separated)."""
    flags = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            flags += set_flags(value, f"{prefix}{key}.")
        else:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            flags += ["--set", f"{prefix}{key}={text}"]
    return flags


def _flow(out: Path, command: list[str]) -> list[tuple[str, bool, str]]:
    """A README bert-dag command at test scale; (stage, cached, folder) of the report's table."""
    assert command[0] == "bert-dag"
    (out.parent / "decays.yaml").write_text(readme_decays()[0])
    scale = set_flags(SCALE) + ([] if "decays=" in command else set_flags(DECAYS_SCALE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    subprocess.run([sys.executable, "-m", "flows.cli", *command[1:], "--output", str(out),
                    *scale], check=True, timeout=900, env=env, cwd=out.parent,
                   capture_output=True)
    rows = [line.split(" | ") for line in (out / "report.md").read_text().splitlines()
            if line.startswith("| ") and line.endswith("` |")]
    return [(r[0][2:], r[1] == "yes", r[3].strip("`| ")) for r in rows]


def test_the_readmes_stable_run_then_two_decays_reuse_the_stable_run_and_the_data(tmp_path):
    (tmp_path / "data").symlink_to(REPO / "data")  # the README's paths are the repository's
    out = tmp_path / "run"
    stable, decays = readme_decays()[1]
    first = _flow(out, stable)
    assert [stage for stage, _, _ in first][-2:] == ["pretrain", "export"]
    second = _flow(out, decays)
    reused = {folder for stage, cached, folder in second if cached}
    assert reused == {folder for _, _, folder in first}  # the data stages, the stable run
    built = [stage for stage, cached, _ in second if not cached]
    assert built == ["stable", "decay", "documents-domain", "corpus", "shards256", "stable",
                     "decay"]
    decays = [folder for stage, _, folder in second if stage == "decay"]
    configs = [json.loads((Path(d) / "manifest.json").read_text())["config"]["decay"]
               for d in decays]
    assert [(c["model"]["init_from"].rpartition("/")[2].split("-")[0], c["phases"][0]["name"],
             c["optimizer"]["schedule"], c["phases"][0]["decay_steps"]) for c in configs] == [
        ("stable", "general", "wsd", 2), ("stable", "domain", "wsd", 2)]
    rates = [[r["lr"] for r in map(json.loads, (Path(d) / "metrics.jsonl").read_text()
                                   .splitlines()) if r["split"] == "train"] for d in decays]
    assert rates == [[1e-3 * (1 - 0.5 ** 0.5), 0.0]] * 2  # 1-sqrt from the peak, after steps
    report = (out / "report.md").read_text().splitlines()
    (general,) = [r for r in report if r.startswith("| general | 00-phase1-step00000004 (step 4) | 2 |")]
    (domain,) = [r for r in report if r.startswith("| domain | 00-phase1-step00000002 (step 2) | 2 |")]
    assert "| sst-2 (dev), start -> end |" in report[report.index(general) - 2]
    # probed: the stable run at step 4, which is the general decay's start (one weights file,
    # one result), the domain decay's start (step 2) and each decay's end
    results = {r["hf_dir"]: r for r in (json.loads(p.read_text()) for p in
                                        (out / "probes").glob("sst-2-*/results.json"))}
    assert sorted(r["global_step"] for r in results.values()) == [2, 4, 4, 6]
    ends = [results.pop(os.path.join(d, "hf"))["score"] for d in decays]
    starts = {r["global_step"]: r["score"] for r in results.values()}
    assert general.endswith(f"| {starts[4]:.4f} -> {ends[0]:.4f} |")
    assert domain.endswith(f"| {starts[2]:.4f} -> {ends[1]:.4f} |")
    assert (out / "decay_curves.png").stat().st_size > 20_000  # the losses and the scores


def test_decays_need_a_stable_phase_and_a_kept_checkpoint(tmp_path):
    with pytest.raises(ValueError) as refused:
        resolve("tiny", {"decays": [BOOKS]})
    assert str(refused.value) == (
        "setting decays: decay a stable phase: pretrain.optimizer.schedule=wsd and "
        "pretrain.phase2.decay_steps=0 (got schedule=linear, decay_steps=0)")
    from training.export_checkpoint import kept_tag
    run = tmp_path / "pretrain"
    (run / "checkpoints" / "00-phase1-step00000002").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("00-phase1-step00000002")
    (run / "config.json").write_text(json.dumps({"phases": [{"name": "phase1", "steps": 4}]}))
    with pytest.raises(ValueError) as missing:
        kept_tag(str(run), 3)
    assert str(missing.value) == (
        f"{run / 'checkpoints'}: no kept checkpoint at global step 3 (kept: 2; "
        "pretrain.cadence.checkpoint_every and keep_checkpoints decide them)")


def test_the_plan_forecasts_each_decay_at_the_last_phases_rate(tmp_path, capsys):
    """`bert-dag --plan` with decays: a row each, at the stable run's last phase's batch,
    length and rate (h200: MFU-based); a decay on other sources has no data estimate."""
    from flows import cli

    config = tmp_path / "plan.yaml"
    config.write_text(yaml.safe_dump({"pretrain": {"optimizer": {"schedule": "wsd"}},
                                      "decays": [{**BOOKS, "steps": 100}, {**POEMS, "steps": 50}]}))
    assert cli.main(["--preset", "tiny", "--config", str(config), "--output", str(tmp_path / "o"),
                     "--plan", "--json", "--hardware", "h200"]) == 0
    plan = json.loads(capsys.readouterr().out)
    phases = {p["phase"]: p for p in plan["phases"]}
    assert list(phases) == ["phase1", "phase2", "decay books", "decay poems"]
    books, poems, last = phases["decay books"], phases["decay poems"], phases["phase2"]
    assert (books["steps"], books["rows_trained"], poems["rows_trained"]) == (100, 1600, 800)
    assert books["rows_per_s_per_gpu"] == last["rows_per_s_per_gpu"] > 0
    assert books["hours"] == pytest.approx(last["hours"] * 100 / 60)
    assert books["data"] == last["data"] and poems["data"] is None


def test_a_checkpoint_past_the_peak_is_not_a_stable_one(tmp_path):
    from training import config as cfg
    from training.export_checkpoint import check_stable

    run = tmp_path / "pretrain"
    run.mkdir()
    config = cfg.resolve("tiny", None, ["optimizer.schedule=wsd", "phase1.decay_steps=100"])
    cfg.save(config, str(run / "config.json"))
    check_stable(str(run), "00-phase1-step00000500")  # the peak's last step
    with pytest.raises(ValueError) as refused:
        check_stable(str(run), "00-phase1-step00000501")
    assert str(refused.value) == (
        f"{run / 'checkpoints' / '00-phase1-step00000501'}: not a stable-phase checkpoint: "
        "step 501 of phase1 falls in its decay (its last 100 steps)")
    cfg.save(cfg.tiny(), str(run / "config.json"))
    with pytest.raises(ValueError, match="the run's schedule is linear"):
        check_stable(str(run), "00-phase1-step00000100")
