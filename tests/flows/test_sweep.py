"""`bert-dag --sweep`: the sweep file's checks, the table, and a two-variant sweep end to end.

The end-to-end test runs the real command twice (Prefect's temporary server, Beam, DeepSpeed
pre-training, GLUE fine-tuning) on the bundled sample: two learning rates share every data
stage, and the second run reuses every stage.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.sweep import (
    SweepError,
    VariantResult,
    load_sweep,
    markdown_table,
    shared_stages,
)

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
name: lr
preset: tiny
overrides:
  pretrain.engine.precision: fp32
  finetune: {tasks: [rte], seeds: [1]}
variants:
  - name: high
    overrides: {pretrain.phase1.learning_rate: 1e-3}
  - name: low
    overrides:
      pretrain:
        phase1: {learning_rate: 3e-4}
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_sweep_file_gives_each_variant_the_shared_settings_and_its_own(tmp_path):
    path = _write(tmp_path, GOOD)
    sweep = load_sweep(path, {"shards": {"dupe_factor": "1"}})
    assert (sweep.name, sweep.preset, [v.name for v in sweep.variants]) == ("lr", "tiny",
                                                                         ["high", "low"])
    assert sweep.varied == ["pretrain.phase1.learning_rate"]
    assert sweep.overrides(sweep.variants[1]) == {
        "pretrain": {"engine": {"precision": "fp32"}, "phase1": {"learning_rate": "3e-4"}},
        "finetune": {"tasks": ["rte"], "seeds": [1]}, "shards": {"dupe_factor": "1"}}
    assert sweep.shared == {"pretrain.engine.precision": "fp32", "finetune.tasks": "rte",
                            "finetune.seeds": "1", "shards.dupe_factor": "1"}
    assert sweep.folder == str(REPO / "runs" / "tiny" / "sweeps" / "lr")
    # JSON is read as JSON, and a mapping passes as it is (a deployment's parameter)
    as_json = load_sweep(_write(tmp_path, json.dumps({"variants": [
        {"name": "a", "overrides": {"pretrain.phase1.learning_rate": 1e-3}},
        {"name": "b", "overrides": {"pretrain.phase1.learning_rate": 3e-4}}]}), "t8.json"))
    assert (as_json.name, as_json.preset, as_json.varied) == ("t8", "tiny",
                                                              ["pretrain.phase1.learning_rate"])
    assert load_sweep({"name": "m", "variants": [{"name": "a"}]}).source == "sweep parameter"


VARIANTS = """\
variants:
  - name: a
    overrides: {pretrain.phase1.learning_rate: 1e-3}
"""


@pytest.mark.parametrize(("text", "message"), [
    (VARIANTS + "  - name: b\n    overrides: {pretrain.phase1.learning_rat: 3e-4}\n",
     "{path}: variant 'b': setting pretrain.phase1.learning_rat: unknown field (known: "),
    (VARIANTS + "  - name: a\n    overrides: {pretrain.phase1.learning_rate: 3e-4}\n",
     "{path}: variant 'a' (variants[1]) repeats the name of variants[0]"),
    (VARIANTS + "  - name: b\n    overrides: {pretrain.phase1.learning_rate: 0.001}\n",
     "{path}: variant 'b': its settings come out the same as variant 'a''s"),
    (VARIANTS + "  - name: b\n    overrides: {pretrain.phase1.learning_rate: fast}\n",
     "{path}: variant 'b': setting pretrain.phase1.learning_rate='fast': 'fast' is not a"),
    (VARIANTS + "  - name: b\n    overrides: {pretrain.phase2.steps: 0}\n",
     "{path}: variant 'b': setting pretrain.phase2.steps: must be positive"),
    (VARIANTS + "  - name: b\n    overrides: {output: /elsewhere}\n",
     "{path}: variant 'b': sets output, which every variant shares"),
    (VARIANTS + "  - name: b\n    overrides:\n      pretrain.model.preset: bert_mini\n"
     "      pretrain: {model: {preset: bert_tiny}}\n",
     "{path}: variant 'b': overrides: setting pretrain.model.preset is given twice"),
    (VARIANTS + "  - name: b\n    overrides:\n      pretrain.model.preset: bert_mini\n"
     "      pretrain.model.preset: bert_tiny\n",
     ("{path}: line 7: key 'pretrain.model.preset' is given twice in one mapping (first on "
      "line 6)")),
    (VARIANTS + "  - name: b c\n", "{path}: variants[1]: name: 'b c' is not a name"),
    (VARIANTS + "  - overrides: {}\n", "{path}: variants[1]: expected a mapping with a 'name'"),
    (VARIANTS + "  - name: b\n    override: {}\n",
     "{path}: variants[1]: unknown key 'override'; known: name, overrides"),
    ("varients: []\n", "{path}: unknown key 'varients'; known: name, description, preset"),
    ("variants: []\n", "{path}: 'variants' must be a non-empty list"),
    ("preset: huge\n" + VARIANTS, "{path}: preset 'huge': choose one of ['base', 'continue', 'large', "),
    ("variants:\n  - name: a\n   overrides: {}\n", "{path}: not valid YAML: "),
])
def test_a_bad_sweep_file_is_refused_naming_the_file_and_variant(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(SweepError) as error:
        load_sweep(path)
    assert str(error.value).startswith(message.format(path=path)), str(error.value)


def test_the_command_line_cannot_override_what_a_variant_varies(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(SweepError, match=f"^{path}: variant 'high': --set "
                                         "pretrain.phase1.learning_rate is a setting this variant"):
        load_sweep(path, {"pretrain": {"phase1": {"learning_rate": "1e-4"}}})
    with pytest.raises(SweepError, match=f"^{path}: preset 'tiny', but --preset base"):
        load_sweep(path, preset="base")
    duplicate = _write(tmp_path, '{"variants": [], "variants": []}', "d.json")
    with pytest.raises(SweepError, match="key 'variants' is given twice in one object"):
        load_sweep(duplicate)
    with pytest.raises(SweepError, match=f"^sweep file {tmp_path}/none.yaml: No such file"):
        load_sweep(str(tmp_path / "none.yaml"))


def test_bert_dag_reports_a_bad_sweep_file_as_a_usage_error(tmp_path, capsys):
    from flows.cli import main

    path = _write(tmp_path, VARIANTS + "  - name: a\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--sweep", path])
    assert exit_.value.code == 2
    assert f"{path}: variant 'a' (variants[1]) repeats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--sweep", _write(tmp_path, GOOD), "--data_only"])
    assert "--data_only: a sweep compares pre-trained variants" in capsys.readouterr().err


def test_the_shipped_sweep_files_resolve_or_name_the_settings_they_wait_for():
    sweeps = REPO / "flows" / "sweeps"
    size = load_sweep(str(sweeps / "model_size.yaml"))
    assert (size.varied, [v.name for v in size.variants]) == (
        ["pretrain.model.preset"], ["tiny-L2-H128", "mini-L4-H256"])
    assert load_sweep(str(sweeps / "learning_rate.yaml")).varied == [
        "pretrain.phase1.learning_rate", "pretrain.phase2.learning_rate"]
    masking = load_sweep(str(sweeps / "masking.yaml"))  # Table 8's splits, one shard set
    assert masking.varied == ["pretrain.data.mask_fraction", "pretrain.data.same_fraction",
                              "pretrain.data.random_fraction"] and len(masking.variants) == 6
    tasks = load_sweep(str(sweeps / "pretraining_tasks.yaml"))  # Table 5's rows
    assert [v.name for v in tasks.variants] == ["mlm-nsp", "mlm-no-nsp", "ltr-no-nsp"]


def _result(name, lr, mlm_loss, nsp_loss, seconds, scores, split="validation", **kw):
    return VariantResult(name, {"pretrain.phase1.learning_rate": lr}, final={
        "mlm_loss": mlm_loss, "nsp_loss": nsp_loss, "mlm_accuracy": 0.25, "loss": 1.0},
        final_split=split, pretrain_seconds=seconds, scores=scores, **kw)


def test_the_table_has_a_row_per_variant_and_a_column_per_varied_setting_and_task():
    results = [
        _result("high", "0.001", 2.0, 0.5, 90.0, {"RTE": 0.5625, "MRPC": 0.7},
                glue_score=0.63125),
        _result("low", "0.0003", 3.0, 0.25, 30.0, {"RTE": 0.5}, split="train"),
        VariantResult("broken", {"pretrain.phase1.learning_rate": "0.1"},
                      error="pretrain exited with status 1\nTraceback ..."),
    ]
    assert markdown_table(["pretrain.phase1.learning_rate"], results) == (
        "| variant | pretrain.phase1.learning_rate | MLM loss | MLM ppl | NSP loss | MLM acc | "
        "pretrain min | RTE | MRPC | GLUE score |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| high | 0.001 | 2.000 | 7.4 | 0.500 | 0.250 | 1.5 | 56.2 | 70.0 | 63.1 |\n"
        "| low | 0.0003 | 3.000 (train) | 20.1 | 0.250 | 0.250 | 0.5 | 50.0 | — | — |\n"
        "| broken | 0.1 | failed: pretrain exited with status 1 |  |  |  |  |  |  |  |\n")
    assert f"{math.exp(3.0):.1f}" == "20.1"


def test_shared_stages_count_the_folders_of_each_stage():
    def stages(*pairs):
        return tuple({"stage": s, "output": f"/r/{o}", "cached": False, "seconds": 0.0}
                     for s, o in pairs)

    results = [VariantResult("a", {}, stages=stages(("corpus", "corpus-1"), ("pretrain", "p-a"))),
               VariantResult("b", {}, stages=stages(("corpus", "corpus-1"), ("pretrain", "p-b")))]
    assert shared_stages(results, "/r") == [
        {"stage": "corpus", "folders": 1, "variants": {"corpus-1": ["a", "b"]}},
        {"stage": "pretrain", "folders": 2, "variants": {"p-a": ["a"], "p-b": ["b"]}}]


# ---------------------------------------------------------------- end to end

TWO_RATES = """\
name: rates
description: two peak learning rates, tiny scale
preset: tiny
overrides:
  shards.dupe_factor: 1
  pretrain:
    engine: {precision: fp32}          # bf16 is slow on CPUs without bf16 matrix units
    phase1: {steps: 20, warmup_steps: 2, global_batch_size: 8, micro_batch_size: 8}
    phase2: {steps: 4, warmup_steps: 0, global_batch_size: 4, micro_batch_size: 4}
  finetune: {tasks: [rte], learning_rates: [1e-4], seeds: [1], epochs: 1,
             max_train_examples: 32, max_eval_examples: 32}
variants:
  - name: lr1e-3
    overrides: {pretrain.phase1.learning_rate: 1e-3}
  - name: lr3e-4
    overrides: {pretrain.phase1.learning_rate: 3e-4}
"""

DATA_STAGES = ("wikipedia", "books", "documents-poems", "corpus", "audit", "vocab", "shards128",
               "shards256")


def _bert_dag(args: list[str], prefect_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(prefect_home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1",
           "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false",
           # a fresh database's migrations on a loaded machine (as `make demo` allows)
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    env.pop("PREFECT_API_URL", None)  # Prefect's temporary server, as `bert-dag` starts it
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out


def _manifest_times(root: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in root.glob("*/manifest.json")}


def test_two_variant_sweep_shares_the_data_stages_and_a_rerun_reuses_everything(tmp_path):
    sweep_file, root = _write(tmp_path, TWO_RATES), tmp_path / "run"
    args = ["--sweep", sweep_file, "--output", str(root)]
    first = _bert_dag(args, tmp_path / "prefect")
    folder = root / "sweeps" / "rates"
    results = json.loads((folder / "results.json").read_text())
    by_name = {v["name"]: v for v in results["variants"]}
    assert list(by_name) == ["lr1e-3", "lr3e-4"]

    # one folder per data stage, two pre-training runs and their fine-tuning runs
    kinds: dict[str, int] = {}
    for path in root.iterdir():
        if path.name not in ("sweeps",):
            kind = path.name.rsplit("-", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {**dict.fromkeys(DATA_STAGES, 1), "pretrain": 2, "export": 2,
                     "glue-rte-lr0.0001-seed1": 2}
    assert {s["stage"]: s["folders"] for s in results["stages"]} == {
        **dict.fromkeys(DATA_STAGES, 1), "pretrain": 2, "export": 2}
    # the first variant built everything; the second reused the data and trained its own
    cached = {name: {s["stage"]: s["cached"] for s in v["stages"]} for name, v in by_name.items()}
    assert cached["lr1e-3"] == dict.fromkeys([*DATA_STAGES, "pretrain", "export"], False)
    assert cached["lr3e-4"] == {**dict.fromkeys(DATA_STAGES, True), "pretrain": False,
                                "export": False}

    rows = {}
    for name, v in by_name.items():
        assert v["error"] == "" and v["final_split"] == "validation"
        assert v["settings"] == {"pretrain.phase1.learning_rate": {"lr1e-3": "0.001",
                                                            "lr3e-4": "0.0003"}[name]}
        final = v["final"]
        assert 0 < final["mlm_loss"] < 10 and 0 < final["nsp_loss"] < 2
        assert 0 <= final["mlm_accuracy"] <= 1 and v["pretrain_seconds"] > 0
        assert set(v["scores"]) == {"RTE"} and 0 <= v["scores"]["RTE"] <= 1
        # RTE's score is a share of its 32 dev examples
        assert (v["scores"]["RTE"] * 32) == pytest.approx(round(v["scores"]["RTE"] * 32))
        rows[name] = (f"| {name} | {v['settings']['pretrain.phase1.learning_rate']} | "
                      f"{final['mlm_loss']:.3f} | {math.exp(final['mlm_loss']):.1f} | "
                      f"{final['nsp_loss']:.3f} | {final['mlm_accuracy']:.3f} | "
                      f"{v['pretrain_seconds'] / 60:.1f} | {100 * v['scores']['RTE']:.1f} |")
    # the two rates trained two different models: ten times 3e-4's steps apart in MLM loss
    assert by_name["lr1e-3"]["final"]["mlm_loss"] != by_name["lr3e-4"]["final"]["mlm_loss"]
    report = (folder / "report.md").read_text()
    for row in rows.values():
        assert row in report and row in first.stdout
    assert (folder / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in by_name:  # each variant's own report and fine-tuning summary
        assert (folder / name / "report.md").is_file()
        assert (folder / name / "finetune" / "results.json").is_file()
    assert not (root / "report.md").exists() and not (root / "finetune").exists()

    built = _manifest_times(root)
    _bert_dag(args, tmp_path / "prefect")
    again = json.loads((folder / "results.json").read_text())
    assert all(s["cached"] for v in again["variants"] for s in v["stages"])
    assert _manifest_times(root) == built  # no stage, fine-tuning runs included, was rebuilt
    assert [(v["final"], v["scores"]) for v in again["variants"]] == [
        (v["final"], v["scores"]) for v in results["variants"]]
