"""`--help` of every Beam job, as `beam run pipelines/<job>.py --help` and
`python -m pipelines.<job> --help`: every setting of the job's config (a flag, its docstring's
first sentence, grouped under the config's name), and the job's docstring with its usage
examples exactly as the source writes them (a `\\` continuation that Python swallowed would
join two lines)."""
from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.settings import field_docs
from pipelines import cli
from pipelines.build_corpus import BuildCorpusConfig
from pipelines.documents.source import SourceConfig
from pipelines.extract_books import ExtractBooksConfig
from pipelines.extract_documents import ExtractDocumentsConfig
from pipelines.extract_wikipedia import WikipediaConfig
from pipelines.shards.config import ShardsConfig
from pipelines.vocab.wordpiece import VocabConfig

REPO = Path(__file__).resolve().parents[2]
# job -> (config class, its fields that are no flag of their own (--input/--output), and
# (config class, fields) of further flags)
JOBS = {
    "extract_wikipedia": [(WikipediaConfig, ())],
    "extract_books": [(ExtractBooksConfig, ("input", "output"))],
    "extract_documents": [(SourceConfig, ("path", "weight")),
                          (ExtractDocumentsConfig, ("sources", "output"))],
    "build_corpus": [(BuildCorpusConfig, ("input", "output"))],
    "train_vocab": [(VocabConfig, ())],
    "make_shards": [(ShardsConfig, ())],
}
ALL_JOBS = [*JOBS, "verify_shards"]


def _flat(text: str) -> str:
    """`text` without whitespace: argparse wraps help text at any space (and after hyphens)."""
    return re.sub(r"\s+", "", text)


def _first_sentence(doc: str) -> str:
    return re.split(r"\.\s+(?=[A-Z`\"(])", doc)[0]


def _docstring_lines(job: str) -> list[str]:
    """The job module's docstring lines as the source file writes them, `\\\\` printed as `\\`."""
    source = (REPO / "pipelines" / f"{job}.py").read_text()
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    raw = source.splitlines()[node.lineno - 1:node.end_lineno]
    raw[0], raw[-1] = raw[0].removeprefix('"""'), raw[-1].removesuffix('"""')
    return [line.replace("\\\\", "\\") for line in raw if line.strip()]


def _beam_run_help(job: str, capsys) -> str:
    assert cli.main(["run", f"pipelines/{job}.py", "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("job", JOBS)
def test_beam_run_help_lists_every_setting_with_its_docstring(job, capsys):
    text = _beam_run_help(job, capsys)
    assert text.startswith(f"usage: beam run pipelines/{job}.py [-h] --input INPUT")
    flat = _flat(text)
    for config, not_flags in JOBS[job]:
        docs = field_docs(config)
        names = [f.name for f in dataclasses.fields(config) if f.name not in not_flags]
        assert names
        missing = [n for n in names if f"--{n}" not in text
                   or _flat(_first_sentence(docs[n])) not in flat]
        assert missing == [], f"{job}: settings missing from --help: {missing}"
    config = JOBS[job][0][0]
    assert f"\nsettings ({config.__name__}, {config.__module__.replace('.', '/')}.py):\n" in text
    assert "\ninput and output:\n  --input INPUT" in text


@pytest.mark.parametrize("job", ALL_JOBS)
def test_beam_run_help_prints_the_docstring_and_its_examples_as_written(job, capsys):
    lines = _beam_run_help(job, capsys).splitlines()
    missing = [line for line in _docstring_lines(job) if line not in lines]
    assert missing == [], f"{job}: docstring lines printed otherwise: {missing}"
    examples = [i for i, line in enumerate(lines) if line.startswith("    ")
                and line.split()[0] in ("beam", "python")]
    assert examples, f"{job}: no usage example in --help"
    for i in examples:  # a continued example goes on, indented, on the next line
        while lines[i].endswith(" \\"):
            assert lines[i + 1].startswith("        ") and "  " not in lines[i + 1].strip()
            i += 1


def test_help_shows_defaults_and_the_beam_options_note(capsys):
    text = _beam_run_help("make_shards", capsys)
    assert ("  --dupe_factor DUPE_FACTOR\n                        Passes over the corpus, each "
            "with different splits and\n                        masks. (default: 10)\n") in text
    assert text.endswith("Any other flag is a standard Apache Beam pipeline option (--runner,\n"
                         "--direct_num_workers, --project, --region, --temp_location, ...).\n")


@pytest.mark.parametrize("job", ALL_JOBS)
def test_python_m_help_names_itself_and_prints_the_examples(job):
    done = subprocess.run([sys.executable, "-m", f"pipelines.{job}", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: python -m pipelines.{job} [-h]")
    lines = done.stdout.splitlines()
    assert [line for line in _docstring_lines(job) if line not in lines] == []


def test_beam_run_exits_with_the_code_a_command_returns(tmp_path, capsys):
    """verify_shards returns 1 for a folder with problems: `beam run` exits with it too."""
    assert cli.main(["run", "pipelines/verify_shards.py", str(tmp_path / "none"), "--quiet"]) == 1
    assert capsys.readouterr().out.startswith("FAILED: ")


def test_the_audits_command_line_is_its_flows_file(capsys):
    """The audit's Beam job is handed its evaluation sets: `beam run` takes its command line,
    flows/audit_contamination.py (which reads them with the fine-tuning families), by file
    path as a job's; the job's own file says so in one line."""
    from pipelines.audit_contamination import AuditConfig

    assert cli.main(["run", "flows/audit_contamination.py", "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: beam run flows/audit_contamination.py [-h] --input INPUT")
    docs = field_docs(AuditConfig)
    flat = _flat(text)
    assert [n for n in ("eval_data", "tasks", "ngram") if f"--{n}" not in text
            or _flat(_first_sentence(docs[n])) not in flat] == []
    assert "--tasks_file FILE" in text
    assert cli.main(["run", "pipelines/audit_contamination.py", "--input", "corpus",
                     "--output", "audit"]) == 2
    assert capsys.readouterr().err == (
        "audit_contamination: error: this job is handed the evaluation sets it audits; run "
        "`beam run flows/audit_contamination.py` with the same flags, which reads them with "
        "the fine-tuning families\n")
