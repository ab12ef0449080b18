"""The package layering (docs/design.md, the package table): `common` and the model/training/
fine-tuning code never import Beam or a Beam job, so a training or fine-tuning machine needs
neither (in a fresh interpreter); and, read statically from every product module's imports
(lazy and type-checking ones too), no import circle and no import the table rules out."""
import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import common

REPO = Path(__file__).resolve().parents[2]
COMMON_MODULES = sorted(f"common.{m.name}" for m in pkgutil.iter_modules(common.__path__))


def imported_after(module: str) -> set[str]:
    """The top-level packages in sys.modules after `import module` in a fresh interpreter."""
    code = (f"import sys, {module}\n"
            "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_common_holds_the_shared_library():
    assert COMMON_MODULES == ["common.bin_packing", "common.errors", "common.extras",
                              "common.logs", "common.manifest", "common.masking",
                              "common.optimizer", "common.settings", "common.shard_format",
                              "common.storage", "common.tokenization"]


@pytest.mark.parametrize("module", COMMON_MODULES)
def test_common_imports_neither_beam_nor_a_job(module):
    loaded = imported_after(module)
    assert "common" in loaded
    assert not loaded & {"apache_beam", "pipelines", "torch"}, sorted(loaded)


@pytest.mark.parametrize("module", ["model", "training.config", "training.loader",
                                    "finetune.loop", "finetune.packing", "finetune.glue.family",
                                    "finetune.squad.family", "finetune.multiple_choice.family",
                                    "finetune.ner.family"])
def test_model_training_and_finetuning_import_no_beam(module):
    loaded = imported_after(module)
    assert module.split(".")[0] in loaded
    assert not loaded & {"apache_beam", "pipelines"}, sorted(loaded & {"apache_beam", "pipelines"})


# ---------------------------------------------------------------- the import graph, read statically

PACKAGES = ("common", "pipelines", "model", "training", "finetune", "flows")
"""The product packages; tests, benchmarks, peers and scripts may import anything."""

THIRD_PARTY = {"Beam": "apache_beam", "DeepSpeed": "deepspeed", "Prefect": "prefect",
               "torch": "torch"}
"""The libraries the package table names in its "never" clauses, by their import names."""

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()
"""(module, package) imports the package table forbids that are still there; each must still
be needed, so the list only shrinks. None is left."""


def product_modules() -> dict[str, Path]:
    """Every module of the product packages by dotted name (a package by its own name)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = product_modules()


def imported_names(module: str, path: Path) -> set[str]:
    """Every module `module` imports, wherever the import is: at module level, inside a
    function (lazy), under `if TYPE_CHECKING:`. `from pkg import x` is `pkg.x` when x is a
    submodule, else `pkg`."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in MODULES else base)
    return names


def product_imports(module: str, path: Path) -> set[str]:
    """The product modules `module` imports (an import of `a.b.c` names the innermost product
    module it reaches)."""
    targets = set()
    for name in imported_names(module, path):
        parts = name.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        if parts and ".".join(parts) != module:
            targets.add(".".join(parts))
    return targets


def import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports."""
    return {module: product_imports(module, path) for module, path in MODULES.items()}


def third_party(path: Path) -> set[str]:
    """The top-level names of everything a module imports outside the product packages."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - set(PACKAGES)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per strongly connected component of more than one module (Tarjan),
    each as the modules around it, back to the first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            member = None
            while member != node:
                member = stack.pop()
                component.add(member)
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:  # a shortest way back to its first module, for the message
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for target in sorted(graph[node] & component):
                if target == start:
                    queue = []
                    found.append(paths[node] + [start])
                    break
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    queue.append(target)
    return sorted(found)


def package_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/design.md's package table: package -> (the product packages or modules it may
    import, the third-party import names it never imports). "everything": every package."""
    rows = {}
    for line in (REPO / "docs" / "design.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 3 or not re.fullmatch(r"`\w+/`", cells[0]):
            continue
        package, rule = cells[0].strip("`/"), cells[2]
        if package not in PACKAGES:
            continue
        allowed_part, _, never_part = rule.partition("never ")
        if allowed_part.strip() == "everything":
            allowed = set(PACKAGES)
        else:
            allowed = {name.strip(" —") for name in re.split(r"[,;]", allowed_part)
                       if name.strip(" —").split(".")[0] in PACKAGES}
        never = {THIRD_PARTY[word] for word in re.findall(r"\w+", never_part)
                 if word in THIRD_PARTY}
        rows[package] = (allowed, never)
    return rows


def allowed(module: str, target: str, may: set[str]) -> bool:
    """Whether `module` may import `target`: its own package, or a package or module the table
    names for it (`training.optim` allows that module only)."""
    if target.split(".")[0] == module.split(".")[0]:
        return True
    return any(target == name or target.startswith(name + ".") for name in may)


def test_the_import_graph_has_no_circles():
    """No two product modules import each other, directly or round a longer circle, however
    they import (lazily in a function, or only for type checking): a circle means neither can
    be read, tested or moved without the other."""
    found = [" -> ".join(circle) for circle in cycles(import_graph())]
    assert not found, "import circles:\n  " + "\n  ".join(found)


def test_the_circle_finder_names_each_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]


def crossing_imports(graph: dict[str, set[str]],
                     table: dict[str, tuple[set[str], set[str]]]) -> set[tuple[str, str]]:
    """(module, imported module) pairs the table's "may import" column leaves out."""
    return {(module, target) for module, targets in graph.items() for target in targets
            if not allowed(module, target, table[module.split(".")[0]][0])}


def test_the_package_table_holds_for_every_import():
    """docs/design.md's package table, its "may import" column, for every import of every
    product module (flows may import everything); the known exceptions are listed above."""
    table = package_table()
    assert set(table) == set(PACKAGES), sorted(table)
    crossing = crossing_imports(import_graph(), table)
    excused = {(module, target) for module, target in crossing
               if (module, target.split(".")[0]) in KNOWN_EXCEPTIONS}
    wrong = [f"{module} -> {target}" for module, target in sorted(crossing - excused)]
    assert not wrong, "imports the package table rules out:\n  " + "\n  ".join(wrong)
    still_needed = {(module, target.split(".")[0]) for module, target in excused}
    assert still_needed == KNOWN_EXCEPTIONS, "drop the exceptions no module needs any more"


def test_a_crossing_import_is_found_wherever_it_is(tmp_path):
    """The check itself: a pipelines module importing finetune lazily, inside a function, and
    a finetune module importing pipelines for type checking are both caught; flows may import
    both."""
    (tmp_path / "lazy.py").write_text(
        "def read():\n    from finetune.tasks import parse_tasks\n    return parse_tasks\n")
    (tmp_path / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pipelines.contamination.eval_sets import EvalSplit\n")
    graph = {module: product_imports(module, tmp_path / name)
             for module, name in (("pipelines.lazy", "lazy.py"), ("finetune.typed", "typed.py"),
                                  ("flows.wiring", "lazy.py"))}
    assert crossing_imports(graph, package_table()) == {
        ("pipelines.lazy", "finetune.tasks"),
        ("finetune.typed", "pipelines.contamination.eval_sets")}


def test_no_package_imports_a_library_its_row_rules_out():
    """The table's "never" clauses (Beam, DeepSpeed, Prefect, torch), for every import; and
    common imports Beam only inside a function (for `gs://` paths)."""
    table = package_table()
    broken = sorted((module, name) for module, path in MODULES.items()
                    for name in third_party(path) & table[module.split(".")[0]][1])
    assert not broken, "libraries the package table rules out: " + ", ".join(
        f"{module} imports {name}" for module, name in broken)
    for module, path in MODULES.items():
        if module.split(".")[0] != "common":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_functions = {id(node) for function in ast.walk(tree)
                        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for node in ast.walk(function)}
        beam = [node.lineno for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in in_functions
                and "apache_beam" in ast.unparse(node)]
        assert beam == [], f"{module} imports Beam at module level (lines {beam})"


# ---------------------------------------------------------------- file length

LONG_FILE = 600
"""Lines past which a product file states why it is one file: a paragraph of its module
docstring starting "Kept whole:" (the one readable model file, as nanoGPT's model.py, or an
algorithm best read in one place); under it, a file simply does one thing."""


def kept_whole_reason(source: str) -> str | None:
    """The text after "Kept whole:" in the paragraph of the module docstring that starts with
    it, or None when no paragraph does (or it gives no reason)."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    for paragraph in re.split(r"\n\s*\n", docstring):
        if paragraph.startswith("Kept whole:"):
            return paragraph.removeprefix("Kept whole:").strip() or None
    return None


def test_every_long_product_file_states_why_it_is_kept_whole():
    """A product module over LONG_FILE lines either splits into modules that each do one thing
    or says in its docstring why it does not ("Kept whole: ...")."""
    unexplained = []
    for path in sorted(MODULES.values()):
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > LONG_FILE and kept_whole_reason(source) is None:
            unexplained.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert not unexplained, (f"product files over {LONG_FILE} lines without a \"Kept whole:\" "
                             "paragraph in their module docstring:\n  " + "\n  ".join(unexplained))


def test_the_reason_is_a_docstring_paragraph_of_its_own():
    reason = '"""A model.\n\nKept whole: the one model file.\n"""\nx = 1\n'
    assert kept_whole_reason(reason) == "the one model file."
    assert kept_whole_reason('"""A model. Kept whole: mid-paragraph."""\n') is None
    assert kept_whole_reason('"""A model.\n\nKept whole:\n"""\n') is None
    assert kept_whole_reason('# Kept whole: a comment, not the docstring\nx = 1\n') is None
