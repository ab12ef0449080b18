"""Every `--flag` a console script's docstring or `--help` names exists in the parser of the
command it is given to: an example's flags in that example's command (`bert-pretrain ...`,
`beam run pipelines/<job>.py ...`, `python -m pipelines.<job> ...`; other programs, such as
torchrun or deepspeed, are not checked), the prose's in the module's own command. Beam jobs
also take Beam's pipeline options; a flow setting's help names the flag of the stage command
it comes from, so there any command of ours counts."""
from __future__ import annotations

import argparse
import importlib
import re

import pytest

JOBS = ("extract_wikipedia", "extract_books", "extract_documents", "build_corpus",
        "train_vocab", "make_shards", "verify_shards")
SCRIPTS = {"bert-pretrain": "training.pretrain", "bert-finetune": "finetune.cli",
           "bert-glue": "finetune.glue.cli", "bert-features": "finetune.features.cli",
           "bert-dag": "flows.cli"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
OTHER_PROGRAMS = ("torchrun", "deepspeed", "gcloud", "gsutil", "pip", "docker", "kubectl",
                  "srun", "sbatch", "prefect", "pytest", "make")


def _beam_options() -> set[str]:
    from apache_beam.options.pipeline_options import PipelineOptions

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    flags: set[str] = set()
    for cls in (PipelineOptions, *subclasses(PipelineOptions)):
        parser = argparse.ArgumentParser()
        cls._add_argparse_args(parser)
        flags |= set(parser._option_string_actions)
    return flags


def _flags(module: str) -> set[str]:
    parser = importlib.import_module(module).build_parser()
    return set(parser._option_string_actions) | {"--debug"}


@pytest.fixture(scope="module")
def commands() -> dict[str, set[str]]:
    """module -> the flags its command takes."""
    beam = _beam_options()
    found = {module: _flags(module) for module in SCRIPTS.values()}
    found |= {f"pipelines.{job}": _flags(f"pipelines.{job}") | beam for job in JOBS}
    found["pipelines.cli"] = beam | {"--debug", "--help"}
    return found


def _command_of(text: str, own: str) -> str | None:
    """The module whose command `text` (an example or a code span) runs; `own` for prose;
    None for another program's."""
    words = text.split()
    if not words:
        return own
    for name, module in SCRIPTS.items():
        if words[0] == name:
            return module
    job = re.match(r"(?:beam run |python )pipelines/(\w+)\.py|python -m (pipelines\.\w+)", text)
    if job:
        return f"pipelines.{job.group(1)}" if job.group(1) else job.group(2)
    if words[0] in OTHER_PROGRAMS or words[:2] == ["python", "-m"]:
        return None
    return own


def _units(doc: str) -> list[str]:
    """`doc`'s examples (an indented line and its continuations: a `\\` or an open quote; the
    quoted values, such as Beam options in a `--set`, left out), its prose paragraphs' code
    spans, and the prose without them."""
    units, prose, lines = [], [], doc.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("    "):
            prose.append(lines[i])
            i += 1
            continue
        example = [lines[i].strip()]
        while (example[-1].endswith("\\") or " ".join(example).count("'") % 2) \
                and i + 1 < len(lines):
            i += 1
            example.append(lines[i].strip())
        units.append(re.sub(r"'[^']*'", "''", " ".join(example)))
        i += 1
    text = "\n".join(prose)
    return [*units, *re.findall(r"`([^`]+)`", text), re.sub(r"`[^`]+`", "", text)]


def _unknown(doc: str, own: str, commands: dict[str, set[str]]) -> list[str]:
    wrong = []
    for unit in _units(doc):
        module = _command_of(unit.strip().lstrip("$ "), own)
        if module is None:
            continue
        known = commands.get(module)
        assert known is not None, f"{own}: example of a command not checked here: {unit}"
        wrong += [f"{flag} ({module})" for flag in FLAG.findall(unit) if flag not in known]
    return wrong


@pytest.mark.parametrize("module", [*SCRIPTS.values(), "pipelines.cli",
                                    *(f"pipelines.{job}" for job in JOBS)])
def test_docstring_names_only_flags_that_exist(module, commands):
    doc = importlib.import_module(module).__doc__
    assert _unknown(doc, module, commands) == []


@pytest.mark.parametrize("module", [*SCRIPTS.values(), *(f"pipelines.{job}" for job in JOBS)])
def test_help_names_only_flags_that_exist(module, commands):
    """The help's own text (description, each flag's help, epilog): a flow setting's help is
    its stage's field docstring, which names that stage command's flag."""
    parser = importlib.import_module(module).build_parser()
    texts = [parser.description or "", parser.epilog or "",
             *(action.help or "" for action in parser._actions)]
    anywhere = set().union(*commands.values())
    own = commands[module] if module != "flows.cli" else anywhere
    wrong = [f for text in texts for f in FLAG.findall(text) if f not in own]
    assert wrong == []


def test_the_check_finds_a_flag_that_exists_nowhere(commands):
    doc = ("Tokens per row (`--max_seq_lenght`).\n\n"
           "    bert-pretrain --preset tiny --set engine.zero_stage=0 \\\n        --stop_after 3\n"
           "    torchrun --nproc_per_node 2 -m training.pretrain --preset tiny\n")
    assert _unknown(doc, "finetune.cli", commands) == [
        "--stop_after (training.pretrain)", "--max_seq_lenght (finetune.cli)"]
