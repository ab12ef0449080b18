"""Logs a person reads (common/logs.py): a real `bert-dag` run, its output counted by kind.

One small full run (Prefect's temporary server, Beam data stages, a DeepSpeed pre-training
subprocess with its loss curve, one GLUE fine-tuning run, the report) prints no transport
lines, no matplotlib or Beam INFO lines, no config dump, a few lines per progress bar, and ends
naming where the report is saved. The same command with BERT_LOG_LEVEL=DEBUG (every stage
reused) brings the library lines and the config dump back.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SMALL_RUN = [
    "--preset", "tiny", "--set", "shards.dupe_factor=1", "--set", "pretrain.engine.precision=fp32",
    "--set", "pretrain.phase1.steps=6", "--set", "pretrain.phase1.warmup_steps=2",
    "--set", "pretrain.phase1.global_batch_size=8", "--set", "pretrain.phase1.micro_batch_size=8",
    "--set", "pretrain.phase2.steps=2", "--set", "pretrain.phase2.warmup_steps=0",
    "--set", "pretrain.phase2.global_batch_size=4", "--set", "pretrain.phase2.micro_batch_size=4",
    "--set", "pretrain.cadence.log_every=2", "--set", "finetune.tasks=rte",
    "--set", "finetune.learning_rates=1e-4", "--set", "finetune.epochs=1",
    "--set", "finetune.max_train_examples=16", "--set", "finetune.max_eval_examples=16",
]

KINDS = {
    "transport": re.compile(r"\b(httpx|httpcore|urllib3)\b|HTTP Request:"),
    "matplotlib": re.compile(r"\bmatplotlib\b|\bPIL\b"),
    "beam_info": re.compile(r"INFO.{0,40}apache_beam"),
    # every config dump (the flow's JSON, make_shards' and the trainer's YAML) has this field
    "config_dump": re.compile(r"mask_fraction|resolved config"),
}
PROGRESS = re.compile(r"(?:^|[-|:] )([\w .]+?): +(\d+)%\|")
"""A tqdm line; group 1 is the bar's description (`phase1:  40%|...`), group 2 its percent."""
MAX_LINES_PER_BAR = 3  # the first line, the last, and at most one a minute between


def bert_dag(args: list[str], prefect_home: Path, **env: str) -> list[str]:
    """`bert-dag` as a user runs it, its stdout and stderr together, line by line."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(prefect_home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1",
                "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", **env}
    for name in ("PREFECT_API_URL", "BERT_LOG_LEVEL"):
        if name not in env:
            full_env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=full_env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-4000:]
    return run.stdout.splitlines()


def count(lines: list[str]) -> Counter:
    """Lines by kind (KINDS), and `progress:<bar>` per progress bar."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(kind for kind, pattern in KINDS.items() if pattern.search(line))
        bar = PROGRESS.search(line)
        if bar:
            counts[f"progress:{bar.group(1).strip()}"] += 1
            counts[f"bars:{bar.group(1).strip()}"] += bar.group(2) == "0"  # a bar starts at 0%
    return counts


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The small run, then the same run again with BERT_LOG_LEVEL=DEBUG (stages reused)."""
    tmp = tmp_path_factory.mktemp("quiet_logs")
    root = tmp / "run"
    args = [*SMALL_RUN, "--output", str(root)]
    quiet = bert_dag(args, tmp / "prefect")
    verbose = bert_dag(args, tmp / "prefect", BERT_LOG_LEVEL="DEBUG")
    return {"root": root, "quiet": quiet, "verbose": verbose}


def test_a_run_prints_no_library_lines_no_config_dump_and_few_progress_lines(runs):
    lines = runs["quiet"]
    counts = count(lines)
    shown = f"{len(lines)} lines, {dict(counts)}:\n" + "\n".join(lines)
    assert {k: counts[k] for k in KINDS} == dict.fromkeys(KINDS, 0), shown
    bars = {k.removeprefix("bars:"): v for k, v in counts.items() if k.startswith("bars:")}
    assert bars["phase1"] == bars["phase2"] == 1, shown  # the trainer's bars reach the output
    for name, started in bars.items():
        assert 0 < counts[f"progress:{name}"] <= MAX_LINES_PER_BAR * started, shown
    assert not [line for line in lines if line.rstrip().endswith(" - ")], shown  # no empty lines
    assert not [line for line in lines if "View at http" in line], shown  # the server has no UI
    # the report's stage table says what ran: no Prefect line per completed task
    assert not [line for line in lines if "Finished in state Completed()" in line], shown
    # a relayed job's line is timed once (by the flow), and no log line runs into a bar's line
    assert not [line for line in lines if re.search(r" - \d{4}-\d\d-\d\d \d\d:", line)], shown
    assert all(line.rstrip().endswith("]") for line in lines if PROGRESS.search(line)), shown
    assert not [line for line in lines if len(PROGRESS.findall(line)) > 1], shown


def test_a_run_ends_naming_its_report_and_what_to_run_next(runs, monkeypatch):
    """The commands as they run here: the console scripts bare where PATH finds them, else
    their path (an unactivated virtualenv), the run's own fine-tuning data folder and recipe,
    and the run's own settings (tests/flows/test_plan.py plans them)."""
    import shlex

    from flows.report import command

    monkeypatch.chdir(REPO)  # where the run was started: the scripts' paths are relative to it
    finetune, dag = command("bert-finetune"), command("bert-dag")
    root = runs["root"]
    report = root / "report.md"
    tail = [line for line in runs["quiet"] if line.strip()][-4:]
    assert tail[-1] == f"Report saved to {report} (run folder {root})", tail
    assert tail[0] == "## Next"
    assert tail[1].startswith(f"- fine-tune the model on your tasks: `{finetune} --model "
                              f"{root}/pretrain-"), tail
    assert tail[1].endswith(f"/hf --data {REPO}/data/sample --tasks rte --set seeds=1 "
                            "--set max_train_examples=16 --set max_eval_examples=16 --set "
                            "batch_size=32 --set epochs=1.0 --set learning_rates=0.0001 "
                            f"--output {root}/finetune-more`")
    sets = [arg for value in SMALL_RUN[3::2] if value != "pretrain.phase1.steps=6"
            for arg in ("--set", value)]  # the --sets but the one the command sets to N
    assert tail[2] == ("- train longer (the data stages are reused): `" + shlex.join(
        [dag, "--preset", "tiny", *sets, "--output", str(root)])
        + " --set pretrain.phase1.steps=N`")
    saved = report.read_text(encoding="utf-8")
    assert saved.endswith(f"\n{tail[-1]}\n") and f"\n{tail[1]}\n" in saved


def test_bert_log_level_debug_brings_the_library_lines_and_the_config_back(runs):
    counts = count(runs["verbose"])
    assert counts["transport"] > 0 and counts["config_dump"] > 0, dict(counts)
    # every stage was reused: the report says so, and ends the same way
    assert runs["verbose"][-1] == runs["quiet"][-1]


def test_a_data_only_report_ends_with_the_full_run_that_reuses_its_stages(tmp_path):
    from flows.config import resolve
    from flows.report import command, report
    from flows.stages import StageResult

    cfg = resolve("tiny", {"output": str(tmp_path)}, data_only=True)
    corpus = StageResult("corpus", str(tmp_path / "corpus-1"), "1", cached=False, seconds=1.0)
    result = report(cfg, [corpus], None, "report-data.md")
    assert result["markdown"].endswith(
        f"## Next\n\n- the full run reuses these stages: `{command('bert-dag')} --preset tiny --output "
        f"{tmp_path}` (this run's command without `--data_only`)\n\n"
        f"Report saved to {tmp_path}/report-data.md (run folder {tmp_path})\n")
    assert (tmp_path / "report-data.md").read_text(encoding="utf-8") == result["markdown"]


def test_a_console_script_is_named_as_the_shell_here_finds_it(tmp_path, monkeypatch):
    """On PATH: bare. Not on PATH (a virtualenv never activated): its path, relative under the
    working folder. Another installation's script first on PATH: ours, by its path."""
    from flows.report import command

    script = Path(sys.executable).parent / "bert-finetune"
    assert script.exists()
    monkeypatch.chdir(script.parent.parent.parent)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert command("bert-finetune") == f"{script.parent.parent.name}/bin/bert-finetune"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert command("bert-finetune") == "bert-finetune"
    other = tmp_path / "bin"
    other.mkdir()
    (other / "bert-finetune").write_text("#!/bin/sh\n")
    (other / "bert-finetune").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{script.parent}")
    monkeypatch.chdir(tmp_path)
    assert command("bert-finetune") == str(script)


def test_the_plan_finds_every_stage_the_flow_built(runs, tmp_path):
    """`--plan` on the run folder the real flow built: the corpus, vocabulary and both shard
    stages are read from the folders the flow made (their keys computed as the flow does, the
    contamination audit included), none estimated."""
    root = runs["root"]
    lines = bert_dag([*SMALL_RUN, "--output", str(root), "--plan", "--json"], tmp_path / "p")
    stages = json.loads("\n".join(lines))["stages"]
    built = {p.name.split("-")[0]: str(p) for p in root.iterdir() if (p / "manifest.json").exists()}
    assert {s["stage"]: s["source"] for s in stages if not s["stage"].startswith("input")} == {
        stage: f"manifest {built[stage]}" for stage in ("corpus", "vocab", "shards128", "shards256")}
