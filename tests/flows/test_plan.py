"""`bert-dag --plan` (flows/plan.py): the data sizes come from the stages' manifests where the
run folder holds them built, else from the inputs' sizes; the report's "Forecast vs actual"
table reads the pre-training stage's forecast.json and metrics.jsonl."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows import dag, steps
from flows.config import resolve
from flows.stage_forecast import forecast_vs_actual, write_stage_forecast
from training import config as training
from training import forecast as fc

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
TINY = ["--preset", "tiny", "--set", "shards.dupe_factor=1"]


def bert_dag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


def train_split(manifest: dict) -> tuple[int, int]:
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    return sum(s["num_instances"] for s in train), sum(s["num_rows"] for s in train)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The tiny run's data stages (the bundled sample, dupe_factor 1), built by the flow's own
    stage functions (Beam's local runner), without Prefect."""
    root = tmp_path_factory.mktemp("plan") / "run"
    cfg = resolve("tiny", {"output": str(root), "shards": {"dupe_factor": 1}}, data_only=True)
    sources = [steps.extract_wikipedia(cfg), steps.extract_books(cfg),
               *(steps.extract_documents(cfg, s) for s in cfg.data.all_sources() if s.generic)]
    sources = [s for s in sources if s is not None]
    corpus = steps.build_corpus(cfg, sources)
    vocab = steps.train_vocab(cfg, corpus)
    shards = [steps.make_shards(cfg, corpus, vocab, phase) for phase in (1, 2)]
    return {"root": root, "cfg": cfg, "vocab": vocab, "shards": shards,
            "stages": [*sources, corpus, vocab, *shards]}


def test_plan_reads_the_built_shards_manifests(built):
    run = bert_dag(*TINY, "--output", str(built["root"]), "--plan", "--json",
                   "--hardware", "h200")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    for phase, stage in zip(result["phases"], built["shards"]):
        instances, rows = train_split(stage.manifest)
        assert (phase["data"]["instances"], phase["data"]["rows"]) == (instances, rows)
        assert phase["data"]["source"] == f"manifest {stage.path}"
        assert phase["epochs"] == phase["steps"] * phase["global_batch_size"] / rows
    assert [s["source"] for s in result["stages"] if s["stage"] == "vocab"] == [
        f"manifest {built['vocab'].path}"]


def test_the_stages_are_found_by_the_keys_the_flow_computes(built):
    """The plan reads exactly the folders a run would reuse: the flow's chain of stage keys,
    nothing built. With decontamination on, the vocabulary and shards read another corpus,
    so the built ones are not this run's (their manifests would tell the wrong sizes)."""
    found = dag.look_up_data_stages(built["cfg"])
    assert (found.vocab.path, found.vocab.cached) == (built["vocab"].path, True)
    assert [(s.path, s.cached) for s in found.shards] == [(s.path, True) for s in built["shards"]]
    assert found.corpus.stage == "corpus" and found.corpus.cached

    cleaned = dataclasses.replace(built["cfg"], data=dataclasses.replace(
        built["cfg"].data, audit=True, decontaminate=True))
    found = dag.look_up_data_stages(cleaned)
    assert (found.corpus.stage, found.corpus.cached) == ("corpus-clean", False)
    assert not found.vocab.cached and not any(s.cached for s in found.shards)
    assert {s.path for s in found.shards}.isdisjoint(s.path for s in built["shards"])
    assert sorted(p.name.split("-")[0] for p in built["root"].iterdir()) == sorted(
        ["books", "corpus", "documents", "shards128", "shards256", "vocab", "wikipedia"])  # none made


def test_without_built_stages_the_instances_are_estimated_from_the_input_bytes(built, tmp_path):
    run = bert_dag(*TINY, "--output", str(tmp_path / "empty"), "--plan", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    estimated = result["phases"][0]["data"]
    # the sample: 51,622 B of .xml.bz2 x 1.31 + 804,186 B of books + 5,788 B of JSONL; tiny's
    # phase-1 shards hold out 20% of the documents for validation
    text = 51_622 * 1.31 + 804_186 + 5_788
    assert estimated["tokens"] == round(text / 4.19 * 0.8)
    assert estimated["instances"] == round(text / 4.19 * 0.8 / (128 * 0.914))
    actual, _ = train_split(built["shards"][0].manifest)
    ratio = estimated["instances"] / actual
    print(f"phase-1 instances: estimate {estimated['instances']}, built {actual}, "
          f"ratio {ratio:.3f}")
    assert 0.5 < ratio < 2.0


def test_an_unknown_profile_is_one_line_listing_the_profiles():
    run = bert_dag("--preset", "tiny", "--plan", "--hardware", "nosuch")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        ("bert-dag: error: --hardware 'nosuch': unknown profile (known: h200, h100, a100-80gb, "
        "a100-40gb, cpu-this-machine)")]


def test_the_report_sets_the_forecast_beside_the_run_figures(built, tmp_path):
    cfg = built["cfg"]
    config = steps.pretrain_config(cfg, built["vocab"], built["shards"], str(tmp_path))
    config = training.apply_overrides(config, ["phase1.steps=20", "phase2.steps=4"])
    write_stage_forecast(cfg, config, str(tmp_path))
    saved = json.loads((tmp_path / "forecast.json").read_text())
    assert [p["steps"] for p in saved["phases"]] == [20, 4]
    if not fc.PROFILES[saved["hardware"]].memory_gib:  # a CPU: phase 1 measured here
        assert saved["calibrated_rows_per_s"] > 0
        assert saved["phases"][0]["rate_basis"] == "calibrated (measured here)"
    records = [{"split": "train", "phase": "phase1", "step": s, "samples_per_s": r}
               for s, r in ((10, 100.0), (20, 300.0))]
    records.append({"split": "validation", "phase": "phase1", "step": 20, "loss": 1.0})
    records.append({"split": "train", "phase": "phase2", "step": 4, "samples_per_s": 50.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = forecast_vs_actual(str(tmp_path))

    def forecast(phase: dict) -> str:  # this machine's profile: "-" where it has no figure
        rate = phase["rows_per_s_per_gpu"]
        return "- | -" if rate is None else \
            f"{rate * saved['gpus']:,.1f} | {phase['hours']:,.4f}"
    one, two = (forecast(p).split(" | ") for p in saved["phases"])
    assert lines[2:] == [
        "| phase | steps | forecast rows/s | actual rows/s | forecast hours | actual hours |",
        "|---|---:|---:|---:|---:|---:|",
        f"| phase1 | 20 of 20 | {one[0]} | 200.0 | {one[1]} | {20 * 32 / 200 / 3600:,.4f} |",
        f"| phase2 | 4 of 4 | {two[0]} | 50.0 | {two[1]} | {4 * 16 / 50 / 3600:,.4f} |"]


def test_a_continued_run_is_planned_with_the_checkpoints_vocabulary(built, tmp_path):
    """Continued pre-training keeps the checkpoint's vocabulary: the plan sizes the model with
    it (here 4,000 tokens, where vocab.vocab_size says 30,522), before any stage is built."""
    import shutil

    import transformers

    checkpoint = tmp_path / "checkpoint"
    config = transformers.BertConfig(vocab_size=4000, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256)
    transformers.BertForPreTraining(config).save_pretrained(checkpoint)
    shutil.copy(Path(built["vocab"].path) / "vocab.txt", checkpoint / "vocab.txt")
    sample = REPO / "data" / "sample"
    run = bert_dag("--preset", "continue", "--set", f"pretrain.model.init_from={checkpoint}",
                   "--set", "pretrain.model.preset=bert_tiny",
                   "--set", f"data.wikipedia={sample / 'wiki'}",
                   "--set", f"data.books={sample / 'books'}", "--set", "finetune.data=",
                   "--output", str(tmp_path / "out"), "--plan", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    (vocab,) = [s for s in result["stages"] if s["stage"] == "vocab"]
    assert (vocab["size"], vocab["source"]) == (
        "4,000 tokens", f"the checkpoint's vocabulary ({checkpoint})")
    # bert_tiny at 4,000 tokens, its embedding padded to 4,032 rows as the run builds it
    assert result["parameters"] == 1_012_130 + 32 * 128
    assert not (tmp_path / "out").exists()  # a plan builds nothing


def test_a_bpe_vocabulary_is_planned_at_its_padded_size():
    """Before its stage is built, a BPE vocabulary is planned (the plan's vocab row and the
    model it sizes) at the size train_vocab writes: vocab.vocab_size padded with unused tokens
    to a multiple of 64, tiny's 4,000 -> 4,032; a WordPiece one at the setting."""
    from flows.plan import vocab_size
    from flows.stages import StageResult

    unbuilt = dag.DataStages([], None, StageResult("vocab", "vocab-?", "", False, 0.0), [])
    assert vocab_size(resolve("tiny", {"vocab": {"kind": "bpe"}}), unbuilt) == (
        4032, "the vocab.vocab_size setting, padded to a multiple of 64 (BPE)")
    assert vocab_size(resolve("tiny"), unbuilt) == (4000, "the vocab.vocab_size setting")


@pytest.mark.parametrize("output", ["local", "gs://my-bucket/runs/large"])
def test_a_plan_over_cloud_inputs_makes_no_cloud_call(output, tmp_path, monkeypatch):
    """gs:// inputs (and a gs:// output) are neither listed nor read while the stages are
    looked up: without credentials a listing retries for minutes, then fails. The stages over
    them are estimated from --input_bytes."""
    from apache_beam.io.filesystems import FileSystems

    def no_cloud(*args, **kwargs):
        raise AssertionError(f"a cloud call while planning: {args}")

    monkeypatch.setattr(FileSystems, "match", no_cloud)
    monkeypatch.setattr(FileSystems, "exists", no_cloud)
    output = str(tmp_path / "out") if output == "local" else output
    cfg = resolve("large", {"output": output, "finetune": {"data": ""}, "data": {
        "wikipedia": "gs://my-bucket/enwiki.xml.bz2", "books": "gs://my-bucket/books/"}},
                  data_only=True)  # a gs:// root holds the data stages alone
    found = dag.look_up_data_stages(cfg)
    assert not found.corpus.cached and not any(s.cached for s in found.shards)
    run = bert_dag("--preset", "large", "--plan", "--json", "--output", output,
                   "--set", "data.wikipedia=gs://my-bucket/enwiki.xml.bz2",
                   "--set", "data.books=gs://my-bucket/books/", "--set", "finetune.data=",
                   "--input_bytes", "18.5e9")
    assert run.returncode == 0, run.stderr
    sources = {s["stage"]: s["source"] for s in json.loads(run.stdout)["stages"]}
    assert sources["shards128"].startswith("estimate: 10 x 18,500.00 MB text")


# ---------------------------------------------------------------- the report's next commands

def printed_command(markdown: str, bullet: str) -> list[str]:
    """The arguments of the command on the report's line starting `- <bullet>`."""
    import shlex

    (line,) = [line for line in markdown.splitlines() if line.startswith(f"- {bullet}")]
    return shlex.split(line.split("`")[1])[1:]


def planned_stages(argv: list[str], capsys) -> dict[str, str]:
    """`bert-dag <argv> --plan --json` in this process: each data stage's source."""
    from flows.cli import main

    capsys.readouterr()
    assert main([*argv, "--plan", "--json", "--hardware", "h200"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    return {s["stage"]: s["source"] for s in stages if not s["stage"].startswith("input")}


@pytest.mark.parametrize("given", ["set", "config"])
def test_the_reports_next_commands_plan_the_stages_of_the_run_they_came_from(
        built, given, tmp_path, capsys):
    """The full run a data-only report names and the longer run a full report names, run with
    --plan, find this run's data stages (built with shards.dupe_factor=1, by a --set or a
    settings file): the preset alone would plan the sample's stages at dupe_factor 10."""
    from flows.report import Invocation, report
    from flows.stages import StageResult

    root, cfg = built["root"], built["cfg"]
    if given == "set":
        invocation = Invocation("tiny", {"output": str(root), "shards": {"dupe_factor": "1"}})
    else:
        (tmp_path / "own.yaml").write_text("shards:\n  dupe_factor: 1\n")
        invocation = Invocation("tiny", {"shards": {"dupe_factor": 1}, "output": str(root)},
                                str(tmp_path / "own.yaml"))
    export = StageResult("export", str(root / "export-0"), "0", cached=True, seconds=0.0)
    data_only = report(cfg, built["stages"], None, "report-data.md", str(tmp_path),
                       invocation)["markdown"]
    full = report(cfg, [*built["stages"], export], None, folder=str(tmp_path),
                  invocation=invocation)["markdown"]
    again = printed_command(data_only, "the full run reuses these stages")
    longer = printed_command(full, "train longer")
    assert ("--config" in again) == (given == "config")
    assert longer[-2:] == ["--set", "pretrain.phase1.steps=N"]
    want = {p.name.split("-")[0]: f"manifest {p}" for p in root.iterdir()
            if p.name.split("-")[0] in ("corpus", "vocab", "shards128", "shards256")}
    assert len(want) == 4
    assert planned_stages(again, capsys) == want
    assert planned_stages([*longer[:-1], "pretrain.phase1.steps=7"], capsys) == want


def test_the_fine_tuning_command_repeats_the_runs_recipe(built, tmp_path):
    """bert-finetune, given the printed arguments, fine-tunes as the run did: the tiny preset's
    recipe and the run's own --sets, not bert-finetune's defaults."""
    from finetune.cli import CommandConfig, build_parser, command_config
    from finetune.config import TasksConfig
    from flows.report import Invocation, report
    from flows.stages import StageResult

    overrides = {"output": str(tmp_path), "finetune": {"epochs": "1", "tasks": "rte,mrpc",
                                                       "max_train_examples": "16"}}
    cfg = resolve("tiny", overrides)
    export = StageResult("export", str(tmp_path / "export-0"), "0", cached=True, seconds=0.0)
    markdown = report(cfg, [export], None, invocation=Invocation("tiny", overrides))["markdown"]
    argv = printed_command(markdown, "fine-tune the model")
    assert argv[argv.index("--set"):argv.index("--output")] == [
        "--set", "seeds=1", "--set", "max_train_examples=16", "--set", "batch_size=32",
        "--set", "epochs=1.0", "--set", "learning_rates=0.0001,5e-05"]
    given = command_config(build_parser().parse_args(argv), CommandConfig(data=None, tasks=()))
    assert [f.name for f in dataclasses.fields(TasksConfig)
            if getattr(given, f.name) != getattr(cfg.finetune, f.name)] == []


def test_the_data_section_is_a_table_per_stage(built):
    """The sample's data stages at dupe_factor 1: what each read, made and dropped, in one
    row each (the raw counters stay in the manifests)."""
    from flows.report import DATA_NOTE, data_table

    assert data_table(built["stages"]) == [
        "| stage | read | documents | sentences | tokens | instances | dropped |",
        "|---|---:|---:|---:|---:|---:|---|",
        ("| wikipedia | 10 pages | 7 | - | - | - | 3: redirect 1, disambiguation 1, "
         "other namespace 1 |"),
        "| books | 4 files | 4 | - | - | - | 0 |",
        "| documents-poems | 8 records | 8 | - | - | - | 0 |",
        "| corpus | 19 documents | 19 | 8,670 | - | - | 0 |",
        "| shards128 | 19 documents | 19 | - | 228,481 | 2,142 | 0 |",
        "| shards256 | 19 documents | 19 | - | 228,481 | 1,151 | 0 |",
        "", DATA_NOTE]
