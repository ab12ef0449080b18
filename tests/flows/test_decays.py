"""WSD decays in the flow (`decays`): a stable run (`pretrain.optimizer.schedule=wsd`, its last
phase at the peak), then decays from two of its kept checkpoints, one on the run's shards and
one on another source; a second decay added later reuses the data stages, the stable run and
the first decay, and the report shows each decay beside the stable run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.config import SAMPLE, resolve

REPO = Path(__file__).resolve().parents[2]
STABLE = {"pretrain": {
    "optimizer": {"schedule": "wsd"}, "engine": {"precision": "fp32", "zero_stage": 0},
    "cadence": {"checkpoint_every": 2, "keep_checkpoints": 5, "eval_every": 2, "log_every": 1,
                "eval_batches": 1, "probe_every": 0},
    "phase1": {"steps": 4, "warmup_steps": 0, "micro_batch_size": 4, "global_batch_size": 4},
    "phase2": {"steps": 2, "warmup_steps": 0, "micro_batch_size": 2, "global_batch_size": 2}},
    "finetune": {"data": ""}}
BOOKS = {"name": "books", "from_step": 4, "steps": 2}
POEMS = {"name": "poems", "from_step": 2, "steps": 2, "sources": [
    {"name": "poems-decay", "kind": "jsonl", "path": str(SAMPLE / "jsonl"), "id_field": "id",
     "title_field": "title"}]}


def _flow(out: Path, decays: list[dict]) -> list[tuple[str, bool, str]]:
    """bert-dag on the bundled sample; (stage, cached, folder) of the report's stage table."""
    config = out.parent / f"run-{len(decays)}.yaml"
    config.write_text(yaml.safe_dump({**STABLE, "decays": decays}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    subprocess.run([sys.executable, "-m", "flows.cli", "--preset", "tiny", "--output", str(out),
                    "--config", str(config)], check=True, timeout=900, env=env, cwd=REPO,
                   capture_output=True)
    rows = [line.split(" | ") for line in (out / "report.md").read_text().splitlines()
            if line.startswith("| ") and line.endswith("` |")]
    return [(r[0][2:], r[1] == "yes", r[3].strip("`| ")) for r in rows]


def test_two_decays_from_two_checkpoints_reuse_the_stable_run_and_the_data(tmp_path):
    out = tmp_path / "run"
    first = _flow(out, [BOOKS])
    assert [stage for stage, _, _ in first][-3:] == ["export", "stable", "decay"]
    second = _flow(out, [BOOKS, POEMS])
    reused = {folder for stage, cached, folder in second if cached}
    assert reused == {folder for _, _, folder in first}  # data, stable run, first decay
    built = [stage for stage, cached, _ in second if not cached]
    assert built == ["documents-poems-decay", "corpus", "shards256", "stable", "decay"]
    decays = [folder for stage, _, folder in second if stage == "decay"]
    configs = [json.loads((Path(d) / "manifest.json").read_text())["config"]["decay"]
               for d in decays]
    assert [(c["model"]["init_from"].rpartition("/")[2].split("-")[0], c["phases"][0]["name"],
             c["optimizer"]["schedule"], c["phases"][0]["decay_steps"]) for c in configs] == [
        ("stable", "books", "wsd", 2), ("stable", "poems", "wsd", 2)]
    rates = [[r["lr"] for r in map(json.loads, (Path(d) / "metrics.jsonl").read_text()
                                   .splitlines()) if r["split"] == "train"] for d in decays]
    assert rates == [[1e-3 * (1 - 0.5 ** 0.5), 0.0]] * 2  # 1-sqrt from the peak, after steps
    report = (out / "report.md").read_text()
    assert "| books | 00-phase1-step00000004 (step 4) | 2 |" in report
    assert "| poems | 00-phase1-step00000002 (step 2) | 2 |" in report
    assert (out / "decay_curves.png").stat().st_size > 10_000


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
