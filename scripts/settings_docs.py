"""Write docs/settings.md: every setting of the flow and of each command, with its default and
its docstring, generated from the config dataclasses.

    .venv/bin/python scripts/settings_docs.py            # rewrite docs/settings.md
    .venv/bin/python scripts/settings_docs.py --check    # exit 1 if docs/settings.md is stale

The text of each setting is its field's docstring as `common/settings.py` `field_docs` reads it
for `--help`, so the page, the flags' help and `bert-dag --help` say the same thing;
tests/test_readme.py regenerates the page in memory and fails when the file differs. The flow's
settings are listed per section with the `base` preset's value and, where they differ, the
other presets' (`flows/config.py` `PRESETS`); each command's flags with its config class's
defaults. Paths inside this checkout are shown relative to it, so the page does not depend on
where the repository lies.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import settings

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "settings.md"
BASE_PRESET = "base"


@dataclass(frozen=True)
class Row:
    """One setting: its dotted name, its value in a config, its docstring."""
    name: str
    value: Any
    doc: str


@dataclass(frozen=True)
class Items:
    """A list setting shown by its length (its items' fields have a table of their own)."""
    count: int

    def __repr__(self) -> str:
        return f"{self.count} item(s)"


@dataclass(frozen=True)
class Command:
    """A command whose flags are the fields of one config class."""
    title: str
    config_class: type
    skip: tuple[str, ...] = ()
    note: str = ""


def _commands() -> list[Command]:
    # Imported here: the job modules import Beam, which `--help` of this script does not need.
    from finetune.cli import CommandConfig
    from finetune.config import TasksConfig
    from finetune.features.cli import FeaturesConfig
    from pipelines.audit_contamination import AuditConfig
    from pipelines.build_corpus import BuildCorpusConfig
    from pipelines.corpus.quality import QualityConfig
    from pipelines.decontaminate import DecontaminateConfig
    from pipelines.documents.source import SourceConfig
    from pipelines.extract_books import ExtractBooksConfig
    from pipelines.extract_documents import ExtractDocumentsConfig
    from pipelines.extract_wikipedia import WikipediaConfig
    from pipelines.shards.config import ShardsConfig
    from pipelines.vocab.wordpiece import VocabConfig

    io = ("input", "output")
    task_fields = tuple(f.name for f in dataclasses.fields(TasksConfig))
    return [
        Command("A source (`data.sources` items; `extract_documents` flags)", SourceConfig,
                note="In the flow: `--set data.sources.<name>.<field>=...`, or the whole list "
                     "from a settings file. `extract_documents` takes `path` as `--input` and "
                     "has no `weight` (build_corpus applies it)."),
        Command("Quality filters of a source (`data.sources.<name>.quality`)", QualityConfig),
        Command("`beam run pipelines/extract_wikipedia.py`", WikipediaConfig, io),
        Command("`beam run pipelines/extract_books.py`", ExtractBooksConfig, io),
        Command("`beam run pipelines/extract_documents.py` (besides a source's fields)",
                ExtractDocumentsConfig, ("sources", "output")),
        Command("`beam run pipelines/build_corpus.py`", BuildCorpusConfig, io),
        Command("`beam run pipelines/train_vocab.py` (the flow's `vocab.*`)", VocabConfig),
        Command("`beam run pipelines/make_shards.py` (the flow's `shards.phase1.*`, "
                "`shards.phase2.*`)", ShardsConfig),
        Command("`beam run flows/audit_contamination.py`", AuditConfig, io,
                note="Besides: `--tasks_file FILE`, your own tasks (finetune/user), which "
                     "`--tasks` may name."),
        Command("`beam run pipelines/decontaminate.py`", DecontaminateConfig, io),
        Command("`bert-finetune` and `bert-glue` (besides the flow's `finetune.*` fields)",
                CommandConfig, task_fields,
                note="`bert-glue` takes the same flags, its `--data` the GLUE folder itself."),
        Command("`bert-features`", FeaturesConfig),
    ]


def _relative(value: Any) -> Any:
    """`value` with this checkout's absolute paths made relative to it."""
    if isinstance(value, str) and value.startswith(str(REPO) + "/"):
        return value[len(str(REPO)) + 1:]
    if isinstance(value, tuple):
        return tuple(_relative(v) for v in value)
    return value


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _shown(value: Any) -> str:
    return _cell(f"`{_relative(value)!r}`")


def _item_lists(config: Any) -> Iterator[str]:
    """Fields holding a tuple of dataclasses (a run's phases, a flow's sources)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, tuple) and value and all(map(dataclasses.is_dataclass, value)):
            yield f.name


def flatten(config: Any, prefix: str = "", lists: frozenset[str] = frozenset()) -> list[Row]:
    """Every setting of `config` as `--set` names it. Nested sections recurse; a tuple of
    named items is listed per item by its name (`pretrain.phase1.steps`), except the fields in
    `lists` (documented once as their item class); an unset optional section is one row."""
    docs = settings.field_docs(type(config))
    rows: list[Row] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            rows += flatten(value, f"{prefix}{f.name}.", lists)
        elif f.name in lists:
            rows.append(Row(f"{prefix}{f.name}", Items(len(value)), docs.get(f.name, "")))
        elif f.name in _item_lists(config):
            for item in value:
                rows += flatten(item, f"{prefix}{item.name}.", lists)
        else:
            rows.append(Row(f"{prefix}{f.name}", value, docs.get(f.name, "")))
    return rows


def flow_tables(presets: dict[str, Any]) -> list[str]:
    """One table per section of the flow's config (in the order sections first appear):
    setting, the base preset's value, the other presets' values where they differ, the
    docstring."""
    flat = {name: flatten(make(), lists=frozenset({"sources"})) for name, make in presets.items()}
    by_preset = {name: {row.name: row.value for row in rows} for name, rows in flat.items()}
    sections: dict[str, list[Row]] = {}
    for row in flat[BASE_PRESET]:
        sections.setdefault(row.name.rpartition(".")[0], []).append(row)
    lines: list[str] = []
    for section, rows in sections.items():
        lines += ["", f"### `{section}`" if section else "### Top level", "",
                  f"| setting | {BASE_PRESET} | other presets | what |", "|---|---|---|---|"]
        for row in rows:
            others = "; ".join(f"{name}: {_shown(values[row.name])}"
                               for name, values in by_preset.items()
                               if name != BASE_PRESET and values.get(row.name) != row.value)
            lines.append(f"| `{row.name}` | {_shown(row.value)} | {others} | {_cell(row.doc)} |")
    return lines


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _shown(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _shown(f.default_factory())
    return "required"


def command_table(command: Command) -> list[str]:
    """A command's flags: `--<field>`, the class default, the docstring."""
    docs = settings.field_docs(command.config_class)
    lines = ["", f"### {command.title}", "",
             f"`{command.config_class.__name__}`, "
             f"{command.config_class.__module__.replace('.', '/')}.py."
             + (f" {command.note}" if command.note else ""),
             "", "| field | default | what |", "|---|---|---|"]
    for f in dataclasses.fields(command.config_class):
        if f.name not in command.skip:
            lines.append(f"| `{f.name}` | {_default(f)} | {_cell(docs.get(f.name, ''))} |")
    return lines


HEADER = """\
# Settings

Generated by `scripts/settings_docs.py` from the config dataclasses' field docstrings (the text
`--help` shows); do not edit by hand: change the docstring, then run
`.venv/bin/python scripts/settings_docs.py` (tests/test_readme.py fails while this page is stale).
How settings are given (`--set`, `--config`, deployment parameters) is in
[design.md](design.md#configuration); renamed settings are in [../CHANGELOG.md](../CHANGELOG.md).

## The flow: `bert-dag --set <setting>=<value>`

Presets: `tiny` (the bundled sample, CPU), `base`, `large` (8 GPUs), `continue` (`base` from a
checkpoint, `pretrain.model.init_from`). `shards.<field>` sets both phases. `bert-pretrain --set
<setting>=...` takes the `pretrain.*` settings without the prefix (`--set phase1.steps=20`,
`--set engine.zero_stage=2`), with the same presets.
"""


def render() -> str:
    """The whole page."""
    from flows.config import PRESETS

    lines = [HEADER.rstrip("\n")]
    lines += flow_tables(dict(PRESETS))
    lines += ["", "## The commands' flags", "",
              "Each flag `--<field>` is also `--set <field>=...` and a key of `--config FILE`."]
    for command in _commands():
        lines += command_table(command)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/settings.md differs from what would be written")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not TARGET.exists() or TARGET.read_text() != text
        if stale:
            print(f"{TARGET.relative_to(REPO)} is stale: run scripts/settings_docs.py",
                  file=sys.stderr)
        return int(stale)
    from common.storage import atomic_write_text

    atomic_write_text(str(TARGET), text)
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
