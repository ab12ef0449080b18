"""The README stays a one-sitting read that points at the reference, and the reference stays true.

- README.md has at most 300 lines, and its two commands are the Makefile's targets CI runs.
- Its folder table names every package folder. The rule: every top-level folder git tracks
  (or, without git, every one on disk but hidden, ignored and build folders), every package
  under them (a folder with `__init__.py`; the tests' own folders aside, which the `tests/` row
  describes), and every module of `model/`, which the table describes file by file. A sub-package
  is named by its path (`pipelines/wikipedia/`) anywhere in the table, or by `wikipedia/` in the
  row of its parent.
- docs/settings.md is what scripts/settings_docs.py writes now.
- Every relative link in README.md, CHANGELOG.md and docs/*.md resolves to a file, and a
  `#fragment` to a heading of it (GitHub's anchors).
- Every Dataflow command in them passes the job's own Dataflow check (`--project` a project ID,
  buckets Beam accepts), so it runs as written.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_SOURCE = {"runs", "build", "dist", "__pycache__", "out"}


def _folder_table() -> list[str]:
    """The rows of README's `| folder | what |` table."""
    lines = README.read_text().splitlines()
    start = lines.index("| folder | what |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _top_level_folders() -> set[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # no git, or not a clone
        return {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")
                and p.name not in NOT_SOURCE and not p.name.endswith(".egg-info")}
    return {path.split("/")[0] for path in listed if "/" in path and not path.startswith(".")}


def _packages() -> set[str]:
    """Package folders below the top level, as `parent/child` paths."""
    return {str(init.parent.relative_to(REPO)) for init in REPO.glob("*/*/**/__init__.py")
            if init.parts[len(REPO.parts)] not in ("tests", ".venv")
            and not any(part.startswith(".") for part in init.relative_to(REPO).parts)}


def _named(path: str, rows: list[str]) -> bool:
    """`path` (a/b/c) in the table: `a/b/c/` anywhere, or `c/` in the row of `a/b/`."""
    parent, _, name = path.rpartition("/")
    if f"`{path}/`" in "\n".join(rows) or f"`{path}`" in "\n".join(rows):
        return True
    return any(row.split("|")[1].count(f"`{parent}/`") and (f"`{name}/`" in row
                                                           or f" {name}/ " in row)
               for row in rows)


def test_readme_is_read_in_one_sitting():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference to docs/"


def test_the_two_commands_are_the_makefile_targets_ci_runs():
    readme, makefile = README.read_text(), (REPO / "Makefile").read_text()
    assert "make demo    # set up .venv, then run the whole DAG" in readme
    assert "make test    # set up .venv, then run the default test suite" in readme
    for target in ("demo", "test"):
        assert re.search(rf"^{target}: setup$", makefile, re.MULTILINE), target
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("make test")


def test_the_python_the_readme_asks_for_is_the_one_pyproject_requires():
    import tomllib

    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required.startswith(">=")
    assert f"`python3` ({required[2:]} or later)" in README.read_text()


def test_the_bundled_sample_row_names_what_data_sample_holds():
    (row,) = [r for r in _folder_table() if r.startswith("| `data/` ")]
    glue = sorted(p.name for p in (REPO / "data" / "sample" / "glue").iterdir() if p.is_dir())
    assert f"({', '.join(glue)})" in row
    assert (REPO / "data" / "sample" / "squad").is_dir() and "SQuAD" in row


def test_the_folder_table_names_every_package_folder():
    rows = _folder_table()
    first_cells = " ".join(row.split("|")[1] for row in rows)
    missing = sorted(f"{name}/" for name in _top_level_folders() if f"`{name}/`" not in first_cells)
    missing += sorted(f"{path}/" for path in _packages() if not _named(path, rows))
    missing += sorted(f"model/{p.name}" for p in (REPO / "model").glob("*.py")
                      if p.name != "__init__.py"
                      and not any(f"`{p.name}`" in row for row in rows if "`model/`" in row))
    assert missing == [], f"README.md's folder table does not name {missing}"


def test_the_rule_finds_the_folders_the_table_once_missed():
    """The issue's list: a table without these rows or names fails."""
    packages = _packages()
    assert {"finetune/ner", "finetune/features", "pipelines/documents"} <= packages
    assert "peers" in _top_level_folders()
    rows = [row.replace("`ner/` (CoNLL", "(CoNLL") for row in _folder_table()]
    assert not _named("finetune/ner", rows)


def _settings_docs():
    spec = importlib.util.spec_from_file_location("settings_docs",
                                                  REPO / "scripts" / "settings_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_settings_page_is_what_the_generator_writes():
    text = _settings_docs().render()
    assert (REPO / "docs" / "settings.md").read_text() == text, (
        "docs/settings.md is stale: run .venv/bin/python scripts/settings_docs.py")


def test_settings_page_has_each_setting_once_with_its_docstring():
    text = _settings_docs().render()
    assert text.count("| `pretrain.phase2.warmup_steps` | `10000` | tiny: `6`; modernbert_tiny: `6`; continue: `60` |") \
        == 1
    assert ("| `shards.phase1.random_next_prob` | `0.5` |  | Probability that B is drawn from "
            "another document when A's chunk has two or more segments") in text
    assert "| `data.poems.name`" not in text  # sources have a table of their own
    assert str(REPO) not in text  # no absolute paths of this checkout


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code is not links
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (fragment and target.suffix == ".md"
                                   and fragment not in _anchors(target)):
            broken.append(link)
    assert broken == [], f"{page.relative_to(REPO)}: links to nothing: {broken}"


def _dataflow_commands(page: Path) -> list[list[str]]:
    """Each shell command of the page's code blocks that names the DataflowRunner, as argv."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split(" # ")[0]
            if "DataflowRunner" in command:
                commands.append(shlex.split(command))
    return commands


def test_every_dataflow_example_passes_the_jobs_dataflow_check():
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient",
                        reason="needs the gcp extra: pip install 'apache-beam[gcp]==2.77.0'")
    from pipelines import dataflow

    commands = [(page, argv) for page in PAGES for argv in _dataflow_commands(page)]
    assert len(commands) >= 3  # make_shards, the dry run, "Beyond one machine"
    for page, argv in commands:
        try:
            dataflow.dataflow_preflight([*argv, "--no_auth"])
        except ValueError as error:
            pytest.fail(f"{page.relative_to(REPO)}: {' '.join(argv)}: {error}")
