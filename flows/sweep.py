"""`bert-dag --sweep FILE`: pre-train and fine-tune several variants of one preset, one report.

The paper's ablations (section 5: NSP in Table 5, model size in Table 6, masking in Table 8) are
runs of the same DAG that differ in a few settings. A sweep file names them:

    name: lr                        # the report's folder: <output>/sweeps/<name>/ (default: the
                                    # file's stem)
    description: Peak pre-training learning rate (tiny scale)
    preset: tiny                    # default tiny
    overrides:                      # settings every variant shares (dotted or nested)
      pretrain.engine.precision: fp32
      finetune: {tasks: [rte], learning_rates: [1e-4], seeds: [1]}
    variants:                       # each: a name and the settings it changes
      - name: lr1e-3
        overrides: {pretrain.phase1.learning_rate: 1e-3}
      - name: lr3e-4
        overrides: {pretrain.phase1.learning_rate: 3e-4}

Settings are the flow's (`pretrain.phase1.steps`, `shards.dupe_factor`, `pretrain.model.preset`,
..., flows/config.py), typed as `--set` values are. The whole file is checked before anything runs:
unknown keys and settings, repeated variant names, a setting given twice, variants whose settings
come out the same, a variant moving the run root (`output`), a `--set` of a setting that a variant
varies; each error names the file and the variant.

Each variant is one `pretrain-bert` subflow over the same run root. Stages are addressed by
content (flows/stages.py), so variants that differ only in pre-training settings share the
corpus, vocabulary and shard stages, variants that differ in `shards.*` share the corpus and
vocabulary, and a re-run of the sweep reuses every finished stage. Each variant's own report
and fine-tuning summary go to `<output>/sweeps/<name>/<variant>/`; the sweep's table (variant x
task dev scores, the last held-out MLM/NSP loss, pre-training time: the form of the paper's
Tables 5, 6 and 8), its plot and its results go to `report.md`, `report.png` and
`results.json` beside them, each written atomically.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from common import settings, storage

SWEEP_KEYS = ("name", "description", "preset", "overrides", "variants")
VARIANT_KEYS = ("name", "overrides")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
"""Sweep and variant names: they name folders and table rows."""
FIXED_SETTINGS = ("output", "name")
"""Settings a variant may not change: its stages must live beside the others' (`output`), and
`name` is the preset's."""


class SweepError(ValueError):
    """A sweep file that cannot run as written; the message names the file and the variant."""


@dataclass(frozen=True)
class Variant:
    name: str
    """Its row in the table and its report folder (letters, digits, '.', '_', '-')."""
    settings: dict[str, Any]
    """Dotted setting -> value as written, applied over the sweep's shared settings."""


@dataclass(frozen=True)
class Sweep:
    name: str
    """Names the report folder `<output>/sweeps/<name>/`."""
    preset: str
    """The preset every variant starts from (flows/config.py PRESETS)."""
    base: dict[str, Any]
    """Dotted setting -> value shared by every variant (the file's, then `--set` and --output)."""
    variants: tuple[Variant, ...]
    """In the file's order; each resolves to a different configuration."""
    source: str
    """The file (or "sweep parameter"), for messages."""
    description: str = ""
    """Free text, the report's first line."""
    output: str = ""
    """The run root every variant's stages share."""
    shared: dict[str, str] = field(default_factory=dict)
    """The shared settings' resolved values, as the report shows them."""

    def overrides(self, variant: Variant) -> dict[str, Any]:
        """The nested overrides (flows/config.py `resolve`) of one variant."""
        return nested({**self.base, **variant.settings}, f"{self.source}: variant {variant.name!r}")

    @property
    def varied(self) -> list[str]:
        """The settings any variant sets, in order of first appearance: the table's columns."""
        return list(dict.fromkeys(k for v in self.variants for k in v.settings))

    @property
    def folder(self) -> str:
        return storage.join(self.output, "sweeps", self.name)


# ---------------------------------------------------------------- reading and checking

def read_sweep_file(path: str) -> dict[str, Any]:
    """The file's mapping (YAML, or JSON by a .json suffix); a key repeated in one mapping is an
    error naming its line, not a silent last-one-wins."""
    try:
        text = storage.read_utf8(path, SweepError)
    except OSError as e:
        raise SweepError(f"sweep file {path}: {e.strerror}") from None
    try:
        if path.endswith(".json"):
            return json.loads(text, object_pairs_hook=_json_object(path))
        return yaml.load(text, Loader=StrictLoader)
    except ValueError as e:
        raise SweepError(f"{path}: {e}") from None
    except yaml.YAMLError as e:  # its text names the line and column
        raise SweepError(f"{path}: not valid YAML: {e}") from None


def _json_object(path: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise SweepError(f"{path}: key {repeated[0]!r} is given twice in one object")
        return dict(pairs)
    return hook


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SweepError(f"line {line}: key {key!r} is given twice in one mapping "
                                 f"(first on line {seen[key]})")
            seen[key] = line
        return super().construct_mapping(node, deep)


def flatten(tree: Any, where: str) -> dict[str, Any]:
    """`{"pretrain": {"learning_rate": 1e-3}, "shards.dupe_factor": 1}` -> dotted keys
    (`common.settings.dotted`), its errors named by `where`."""
    if not isinstance(tree, dict):
        raise SweepError(f"{where}: expected a mapping of settings (e.g. "
                         f"pretrain.phase1.learning_rate: 1e-4), got {tree!r}")
    try:
        return settings.dotted(tree)
    except ValueError as e:
        raise SweepError(f"{where}: {e}") from None


def nested(flat: dict[str, Any], where: str) -> dict[str, Any]:
    """Dotted keys -> the nested mapping `resolve` takes (`common.settings.undotted`)."""
    try:
        return settings.undotted(flat)
    except ValueError as e:
        raise SweepError(f"{where}: {e}") from None


def load_sweep(sweep: str | dict[str, Any], overrides: dict[str, Any] | None = None,
               preset: str | None = None) -> Sweep:
    """A sweep file (path) or its mapping, checked whole: every variant resolves, and no two
    alike. `overrides` (nested, from `--set`/`--output`) join the shared settings; `preset`
    (`--preset`) must agree with the file's."""
    if isinstance(sweep, str):
        return parse_sweep(read_sweep_file(sweep), sweep, overrides, preset)
    return parse_sweep(sweep, "sweep parameter", overrides, preset)


def parse_sweep(data: Any, source: str, overrides: dict[str, Any] | None = None,
                preset: str | None = None) -> Sweep:
    from flows.config import PRESETS, resolve

    if not isinstance(data, dict):
        raise SweepError(f"{source}: expected a mapping with 'variants', got "
                         f"{type(data).__name__}")
    _known_keys(data, SWEEP_KEYS, source)
    stem = os.path.splitext(os.path.basename(source))[0]
    name = _name(data.get("name", stem), f"{source}: name")
    file_preset = data.get("preset", preset or "tiny")
    if file_preset not in PRESETS:
        raise SweepError(f"{source}: preset {file_preset!r}: choose one of {sorted(PRESETS)}")
    if preset and preset != file_preset:
        raise SweepError(f"{source}: preset {file_preset!r}, but --preset {preset} was given")
    given = flatten(overrides or {}, "--set")
    base = {**flatten(data.get("overrides") or {}, f"{source}: overrides"), **given}
    raw_variants = data.get("variants")
    if not isinstance(raw_variants, list) or not raw_variants:
        raise SweepError(f"{source}: 'variants' must be a non-empty list of "
                         "{name: ..., overrides: {...}}")
    variants: list[Variant] = []
    configs: dict[Any, str] = {}  # resolved config -> the variant that has it
    for index, raw in enumerate(raw_variants):
        variant = _variant(raw, index, source, [v.name for v in variants], given)
        where = f"{source}: variant {variant.name!r}"
        try:
            cfg = resolve(file_preset, nested({**base, **variant.settings}, where))
        except SweepError:
            raise
        except (TypeError, ValueError) as e:
            raise SweepError(f"{where}: {e}") from None
        if cfg in configs:
            raise SweepError(f"{where}: its settings come out the same as variant "
                             f"{configs[cfg]!r}'s")
        configs[cfg] = variant.name
        variants.append(variant)
    shown = {k: setting_text(cfg, k) for k in base}
    return Sweep(name, file_preset, base, tuple(variants), source,
                 str(data.get("description") or ""), cfg.output, shown)


def _variant(raw: Any, index: int, source: str, earlier: list[str],
             given: dict[str, Any]) -> Variant:
    """One entry of `variants`, its name and settings checked (not yet resolved)."""
    where = f"{source}: variants[{index}]"
    if not isinstance(raw, dict) or "name" not in raw:
        raise SweepError(f"{where}: expected a mapping with a 'name', got {raw!r}")
    _known_keys(raw, VARIANT_KEYS, where)
    name = _name(raw["name"], f"{where}: name")
    where = f"{source}: variant {name!r}"
    if name in earlier:
        raise SweepError(f"{where} (variants[{index}]) repeats the name of "
                         f"variants[{earlier.index(name)}]")
    settings = flatten(raw.get("overrides") or {}, f"{where}: overrides")
    fixed = [k for k in settings if k.split(".")[0] in FIXED_SETTINGS]
    if fixed:
        raise SweepError(f"{where}: sets {fixed[0]}, which every variant shares (set it in the "
                         "sweep's overrides or with --output)")
    clash = [k for k in settings if k in given]
    if clash:
        raise SweepError(f"{where}: --set {clash[0]} is a setting this variant varies")
    return Variant(name, settings)


def _known_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    unknown = [k for k in data if k not in known]
    if unknown:
        raise SweepError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(known)}")


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise SweepError(f"{where}: {value!r} is not a name (letters, digits, '.', '_', '-'; "
                         "it names a folder)")
    return value


# ---------------------------------------------------------------- results and the report

@dataclass(frozen=True)
class VariantResult:
    """One variant's row: its settings, pre-training outcome and dev scores."""
    name: str
    settings: dict[str, str]
    """The varied settings' resolved values, as shown."""
    error: str = ""
    """Why the variant failed ("" when it ran)."""
    stages: tuple[dict, ...] = ()
    """Its DAG's stages (stage, cached, seconds, output) as its report lists them."""
    pretrain_dir: str = ""
    pretrain_seconds: float | None = None
    """Pre-training's wall time when the stage was built (a reused stage keeps its time)."""
    final: dict[str, float] = field(default_factory=dict)
    """The last evaluation's loss, mlm_loss, nsp_loss, mlm_accuracy (held-out split)."""
    final_split: str = ""
    """"validation" (held-out documents), or "train" where the run had no validation shards."""
    scores: dict[str, float] = field(default_factory=dict)
    """Task -> dev score (fraction; the task's main metric at its best learning rate)."""
    glue_score: float | None = None
    report: str = ""


FINAL_KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy")
PLOT_LINE = "![loss curves and dev scores](report.png)"
NOTE = ("Losses and MLM accuracy: the last evaluation on the held-out validation shards "
        "(\"(train)\": the last training window, where there were none); MLM ppl = "
        "exp(MLM loss); dev scores in points, each task at its best fine-tuning learning rate.")


def setting_text(cfg: Any, key: str) -> str:
    """A resolved setting as the table shows it (`pretrain.phase1.learning_rate` -> "0.001")."""
    value = _setting_value(cfg, key.split("."))
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def _setting_value(node: Any, parts: list[str]) -> Any:
    """The value at a dotted setting path, read as `common.settings.apply` writes it: a
    phase by name (`pretrain.phase1.steps`) or index, and `shards.<field>` (both phases' shards)
    as "phase1/phase2" where the two differ."""
    if not parts:
        return node
    head, rest = parts[0], parts[1:]
    if dataclasses.is_dataclass(node) and hasattr(node, head):
        return _setting_value(getattr(node, head), rest)
    if isinstance(node, tuple):  # named items (phases)
        for i, item in enumerate(node):
            if getattr(item, "name", None) == head or str(i) == head:
                return _setting_value(item, rest)
    if dataclasses.is_dataclass(node):  # `pretrain.phase1`: an item of its `phases`
        for f in dataclasses.fields(node):
            items = getattr(node, f.name)
            if isinstance(items, tuple) and any(getattr(i, "name", None) == head for i in items):
                return _setting_value(items, parts)
    phases = [getattr(node, f.name) for f in dataclasses.fields(node)] \
        if dataclasses.is_dataclass(node) else []
    values = [_setting_value(p, parts) for p in phases if hasattr(p, head)]
    if not values:
        raise KeyError(".".join(parts))
    return values[0] if all(v == values[0] for v in values) else \
        "/".join(str(v) for v in values)


def variant_result(variant: Variant, settings: dict[str, str], run: dict,
                   report_dir: str) -> VariantResult:
    """A finished variant's row, from its report (`flows.report.report`'s result), its pre-training
    stage's manifest and its fine-tuning `results.json`."""
    stages = tuple(run["stages"])
    pretrain = next((s for s in stages if s["stage"] == "pretrain"), None)
    manifest = storage.read_manifest(pretrain["output"]) if pretrain else None
    manifest = manifest or {}
    metrics = manifest.get("final_metrics", {})
    split = "validation" if "validation" in metrics else "train" if "train" in metrics else ""
    final = {k: float(metrics[split][k]) for k in FINAL_KEYS if split and k in metrics[split]}
    results = os.path.join(report_dir, "finetune", "results.json")
    scores, glue = {}, None
    if os.path.exists(results):
        summary = storage.read_json(results)
        scores = {t["task"]: float(t["score"]) for t in summary["tasks"]}
        glue = summary.get("glue_score")
    return VariantResult(variant.name, settings, stages=stages,
                         pretrain_dir=pretrain["output"] if pretrain else "",
                         pretrain_seconds=manifest.get("seconds"), final=final,
                         final_split=split, scores=scores, glue_score=glue,
                         report=run.get("path", ""))


def markdown_table(varied: list[str], results: list[VariantResult]) -> str:
    """variant | varied settings | MLM loss | MLM ppl | NSP loss | MLM acc | pretrain min |
    task dev scores | GLUE score (with two GLUE tasks or more)."""
    tasks = list(dict.fromkeys(t for r in results for t in r.scores))
    glue = len(tasks) > 1 and any(r.glue_score is not None for r in results)
    columns = ["variant", *varied, "MLM loss", "MLM ppl", "NSP loss", "MLM acc",
               "pretrain min", *tasks, *(["GLUE score"] if glue else [])]
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join(["---"] * (1 + len(varied)) + ["---:"] * (len(columns) - 1 -
                                                                    len(varied))) + "|"]
    for r in results:
        if r.error:
            first = r.error.strip().splitlines()[0] if r.error.strip() else "failed"
            first = first.replace("|", "\\|")  # a cell of the Markdown table
            cells = [r.name, *(r.settings.get(k, "") for k in varied),
                     f"failed: {first}"] + [""] * (len(columns) - len(varied) - 2)
        else:
            mark = "" if r.final_split == "validation" else " (train)"
            final = r.final
            mlm = final.get("mlm_loss")
            cells = [r.name, *(r.settings.get(k, "") for k in varied),
                     _number(mlm, "{:.3f}") + mark,
                     _number(math.exp(mlm) if mlm is not None else None, "{:.1f}"),
                     _number(final.get("nsp_loss"), "{:.3f}"),
                     _number(final.get("mlm_accuracy"), "{:.3f}"),
                     _number(r.pretrain_seconds / 60 if r.pretrain_seconds is not None
                             else None, "{:.1f}"),
                     *(_number(100 * r.scores[t] if t in r.scores else None, "{:.1f}")
                       for t in tasks),
                     *([_number(100 * r.glue_score if r.glue_score is not None else None,
                                "{:.1f}")] if glue else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: float | None, form: str) -> str:
    return "—" if value is None else form.format(value)


def shared_stages(results: list[VariantResult], root: str) -> list[dict[str, Any]]:
    """Per stage kind (corpus, vocab, shards128, pretrain, ...): its folders (below `root`) and
    the variants that used each; the data stages of variants that differ only in training are
    one."""
    kinds: dict[str, dict[str, list[str]]] = {}
    for r in results:
        for s in r.stages:
            kinds.setdefault(s["stage"], {}).setdefault(s["output"], []).append(r.name)
    return [{"stage": stage, "folders": len(folders),
             "variants": {os.path.relpath(path, root): names for path, names in folders.items()}}
            for stage, folders in kinds.items()]


def plot_sweep(results: list[VariantResult], path: str) -> None:
    """Left: each variant's training loss over optimizer steps (validation points marked);
    right: dev scores, one group per task, one bar per variant."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    from training.pretrain import read_metrics

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    ran = [r for r in results if not r.error and r.pretrain_dir]
    for i, r in enumerate(ran):
        records = read_metrics(r.pretrain_dir)
        color = f"C{i}"
        train = [x for x in records if x.get("split", "train") == "train"]
        held = [x for x in records if x.get("split") == "validation"]
        curves.plot([x["global_step"] for x in train], [x["loss"] for x in train], "-",
                    color=color, label=r.name)
        curves.plot([x["global_step"] for x in held], [x["loss"] for x in held], "o",
                    color=color)
    curves.set_xlabel("optimizer step (both phases)")
    curves.set_title("pre-training loss (MLM + NSP; dots: validation)")
    tasks = list(dict.fromkeys(t for r in ran for t in r.scores))
    width = 0.8 / max(len(ran), 1)
    for i, r in enumerate(ran):
        xs = [j + (i - (len(ran) - 1) / 2) * width for j in range(len(tasks))]
        bars.bar(xs, [100 * r.scores.get(t, float("nan")) for t in tasks], width,
                 color=f"C{i}", label=r.name)
    bars.set_xticks(range(len(tasks)), tasks)
    bars.set_ylabel("dev score (points)")
    bars.set_title("fine-tuning dev score" if tasks else "no fine-tuning tasks")
    for ax in (curves, bars):
        ax.grid(alpha=0.3)
        if ran:
            ax.legend(fontsize="small")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    storage.atomic_write_bytes(path, buffer.getvalue())


def write_report(sweep: Sweep, results: list[VariantResult]) -> dict[str, Any]:
    """`report.md`, `report.png` and `results.json` in the sweep's folder (each atomically;
    the Markdown last, so a report names a plot and results that exist)."""
    folder = sweep.folder
    paths = {name: storage.join(folder, f"report.{ext}") for name, ext in
             (("markdown", "md"), ("plot", "png"))}
    paths["json"] = storage.join(folder, "results.json")
    table = markdown_table(sweep.varied, results)
    sharing = shared_stages(results, sweep.output)
    plot_sweep(results, paths["plot"])
    storage.atomic_write_json(paths["json"], {
        "sweep": sweep.name, "description": sweep.description, "preset": sweep.preset,
        "source": sweep.source, "base": sweep.base, "output": sweep.output,
        "variants": [{**dataclasses.asdict(r), "overrides": variant.settings}
                     for r, variant in zip(results, sweep.variants)],
        "stages": sharing})
    lines = [f"# sweep {sweep.name} ({sweep.preset})", ""]
    lines += [sweep.description, ""] if sweep.description else []
    lines += [f"From `{sweep.source}`; shared settings: "
              + (", ".join(f"`{k}={v}`" for k, v in sweep.shared.items()) or "none"), "",
              table,
              NOTE, "", PLOT_LINE, "",
              "## Stages", "", "| stage | folders | used by |", "|---|---:|---|"]
    lines += [f"| {s['stage']} | {s['folders']} | " + "; ".join(
        f"`{folder_name}`: {', '.join(names)}" for folder_name, names in s["variants"].items())
        + " |" for s in sharing]
    lines += ["", "## Variants", ""]
    lines += [f"- {r.name}: " + (f"FAILED: {r.error}" if r.error else f"[report]({r.report})")
              for r in results]
    text = "\n".join(lines) + "\n"
    storage.atomic_write_text(paths["markdown"], text)
    return {"markdown": text, "table": table, "paths": paths,
            "results": [dataclasses.asdict(r) for r in results], "stages": sharing}


# ---------------------------------------------------------------- the flow

@flow(name="pretrain-bert-sweep", log_prints=True)
def pretrain_bert_sweep(sweep: str | dict[str, Any], overrides: dict[str, Any] | None = None,
                        output: str | None = None, preset: str | None = None) -> dict:
    """Every variant as a `pretrain-bert` subflow over one run root, then the sweep's report.

    `sweep`: a sweep file's path (YAML/JSON) or its mapping; `overrides`: nested settings every
    variant shares (over the file's); `output`: the run root; `preset`: must agree with the
    file's. A failed variant is reported as failed and the others still run; the flow then
    fails naming it."""
    from flows.config import check_inputs_exist, resolve
    from flows.pretrain_bert import pretrain_bert

    given = {**(overrides or {}), **({"output": output} if output else {})}
    spec = load_sweep(sweep, given, preset)
    configs = {v.name: resolve(spec.preset, spec.overrides(v)) for v in spec.variants}
    for name, cfg in configs.items():  # every variant's inputs, before the first one trains
        try:
            check_inputs_exist(cfg)
        except (FileNotFoundError, ValueError) as e:
            raise SweepError(f"{spec.source}: variant {name!r}: {e}") from None
    logger = get_run_logger()
    logger.info("sweep %s: %d variants of %s in %s", spec.name, len(spec.variants),
                spec.preset, spec.output)
    results = []
    for variant in spec.variants:
        report_dir = storage.join(spec.folder, variant.name)
        settings = {k: setting_text(configs[variant.name], k) for k in spec.varied}
        state = pretrain_bert.with_options(flow_run_name=f"{spec.name}-{variant.name}")(
            preset=spec.preset, overrides=spec.overrides(variant), report_dir=report_dir,
            return_state=True)
        if state.is_completed():
            results.append(variant_result(variant, settings, state.result(), report_dir))
        else:
            logger.error("sweep %s: variant %s failed: %s", spec.name, variant.name,
                         state.message)
            results.append(VariantResult(variant.name, settings,
                                         error=str(state.message or state.name)))
    report = sweep_report(spec, results)
    failed = [r.name for r in results if r.error]
    if failed:
        raise RuntimeError(f"sweep {spec.name}: variant(s) {', '.join(failed)} failed; "
                           f"{report['paths']['markdown']} reports the others")
    return report


@task(name="sweep-report", cache_policy=NO_CACHE)
def sweep_report(spec: Sweep, results: list[VariantResult]) -> dict:
    from flows.report import image_markdown

    report = write_report(spec, results)
    inline = image_markdown(report["paths"]["plot"])  # the UI has no file server
    create_markdown_artifact(report["markdown"].replace(PLOT_LINE, inline), key="sweep-report",
                             description=f"Sweep {spec.name}: variants x dev scores")
    return report
