"""Beam job: a corpus folder (build_corpus) x the evaluation sets -> their n-gram overlap.

    beam run flows/audit_contamination.py --input out/corpus --output out/audit \\
        --eval_data /data/finetune --tasks rte,mrpc,squad1,swag,conll2003 --ngram 13

How much of every evaluation set the fine-tuning flow scores is in the pre-training corpus, by
the n-gram overlap of GPT-3's study (Brown et al. 2020, appendix C): words are lower case with
punctuation deleted (pipelines/contamination/ngrams.py), and an evaluation example overlaps
when any of its n-grams (`--ngram`, 13 by default, GPT-3's filtering size) is in a corpus
passage. The job reads no evaluation file: `run` is handed the splits (`eval_splits`), which
its command line (flows/audit_contamination.py) and the flow read with each task's fine-tuning
family (finetune/eval_sets.py: GLUE dev and test, SQuAD dev contexts and questions, SWAG and
Cosmos QA dev and test, CoNLL-2003 and WNUT-17 dev and test, a task file's tasks), so Beam's
side knows no task, family or file format.

How it scales: the evaluation sets' n-gram -> example index is built once on the launcher and
written to `<output>/index/eval_ngrams.npz` (tens of MB for every task); each worker loads it
in `setup()` and the corpus passages stream past it (`AuditFn`, no grouping of the corpus), so
a worker's memory is the index plus one Parquet row group, whatever the corpus size. Only the
overlaps are grouped, to be written sorted.

Outputs in `--output`:
- `report.json`: per task (and per split under `splits`), `examples`, `examples_overlapping`
  and its `examples_overlapping_share`, `examples_without_ngrams` (every field shorter than
  n words: they cannot overlap), `ngrams` (distinct), `ngrams_overlapping` and its
  `ngrams_overlapping_share`; and the corpus counts (documents, passages,
  passages_contaminated).
- `overlaps/overlaps-00000-of-00001.jsonl`: one JSON line per (example, corpus passage) pair
  that share an n-gram: task, split, example_id, doc_id, passage (its index in the document),
  ngram (the first shared n-gram, as normalized words).
- `contaminated_passages.jsonl`: one JSON line per corpus passage with any overlap (doc_id,
  passage), what pipelines/decontaminate.py removes.
- `matched_ngrams.txt`: the shared n-gram hashes (16 hex digits), one per line.
- `dead_letter/`: unreadable corpus files, counted.

`manifest.json` is written last: config, its hash (with the corpus's config_hash and the
sha256 of every evaluation file read), counts and the outputs with their sha256.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
from apache_beam import pvalue

from common import storage
from common.settings import check
from pipelines import jobs, parquet_io
from pipelines.build_corpus import select_inputs
from pipelines.contamination import index as eval_index
from pipelines.contamination import ngrams
from pipelines.contamination.eval_sets import EvalSplit, keyed_examples
from pipelines.disk_full import disk_full_reported

NAMESPACE = "audit_contamination"
PREFIX = "audit"
INDEX_FILE = "index/eval_ngrams.npz"
OVERLAPS_FILE = "overlaps/overlaps-00000-of-00001.jsonl"
PASSAGES_FILE = "contaminated_passages.jsonl"
MATCHED_FILE = "matched_ngrams.txt"
REPORT_FILE = "report.json"
COUNTERS = ("input_files", "documents", "passages", "passages_contaminated", "overlaps",
            "bad_records")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditConfig:
    """Resolved options of one audit_contamination run (saved in the manifest, hashed)."""
    input: str
    """The corpus folder (build_corpus's output) or its Parquet files, separated by commas."""
    output: str
    """The audit's folder."""
    eval_data: str = ""
    """Folder of the evaluation sets, one folder per family or task (glue/, squad/, swag/,
    conll2003/, ...), as the flow's finetune.data."""
    tasks: tuple[str, ...] = ("glue",)
    """Tasks whose evaluation sets are audited: task names (squad1,rte), family names (glue:
    its nine tasks) or all, as the flow's finetune.tasks; with --tasks_file, a task file's
    tasks too. The manifest records the built-in ones here, hashed by their files under
    eval_data; a task file's are its handed_tasks, hashed by their texts (the file may hold
    columns its task does not read)."""
    ngram: int = ngrams.DEFAULT_NGRAM
    """Words per n-gram: an example overlaps when any of its n-grams is in a corpus passage
    (GPT-3's filtering used 13)."""

    def __post_init__(self):
        check(self.ngram >= 1, "ngram", f"must be >= 1, got {self.ngram}")


def passage_overlaps(index: eval_index.EvalIndex, doc_id: str, number: int,
                     passage: str) -> tuple[list[dict], np.ndarray]:
    """(overlap records, shared n-gram hashes) of one corpus passage against `index`."""
    tokens = ngrams.words(passage)
    match = index.lookup(ngrams.ngram_hashes(tokens, index.n))
    records = []
    for example, position in sorted(match.examples.items()):
        key = index.examples[example]
        records.append({"task": key.task, "split": key.split, "example_id": key.example_id,
                        "doc_id": doc_id, "passage": number,
                        "ngram": ngrams.ngram_text(tokens, position, index.n)})
    return records, match.ngrams


class AuditFn(beam.DoFn):
    """Corpus row -> JSON lines of its overlaps (main), its contaminated passages ("passages")
    and the shared n-gram hashes ("ngrams"); the index is loaded once per worker."""

    def __init__(self, index_path: str):
        self.index_path = index_path
        self.index = None
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name)
                         for name in ("passages", "passages_contaminated", "overlaps")}

    def setup(self):
        self.index = eval_index.load(self.index_path)

    def process(self, row: dict):
        for number, passage in enumerate(row["passages"]):
            self.counters["passages"].inc()
            records, shared = passage_overlaps(self.index, row["doc_id"], number, passage)
            if not records:
                continue
            self.counters["passages_contaminated"].inc()
            self.counters["overlaps"].inc(len(records))
            yield pvalue.TaggedOutput("passages", passage_line(row["doc_id"], number))
            for value in shared:
                yield pvalue.TaggedOutput("ngrams", f"{int(value):016x}")
            for record in records:
                yield json.dumps(record, ensure_ascii=False, sort_keys=True)


def passage_line(doc_id: str, number: int) -> str:
    return json.dumps({"doc_id": doc_id, "passage": number}, ensure_ascii=False, sort_keys=True)


class Audit(beam.PTransform):
    """Corpus rows -> {"overlaps", "passages", "ngrams": JSON lines / hex hashes, each once}
    against the index saved at `index_path`. Groups only what overlaps, never the corpus."""

    def __init__(self, index_path: str):
        super().__init__()
        self.index_path = index_path

    def expand(self, rows):
        found = rows | "Lookup" >> beam.ParDo(AuditFn(self.index_path)).with_outputs(
            "passages", "ngrams", main="overlaps")
        return {"overlaps": found.overlaps, "passages": found.passages,
                "ngrams": found.ngrams | "DistinctNgrams" >> beam.Distinct()}


def main(argv: Sequence[str] | None = None) -> dict:
    """The job reads no evaluation file: its command line is flows/audit_contamination.py."""
    raise ValueError("this job is handed the evaluation sets it audits; run "
                     "`beam run flows/audit_contamination.py` with the same flags, which reads "
                     "them with the fine-tuning families")


def output_path(output: str, name: str) -> str:
    return storage.join(output, *name.split("/"))


def run(config: AuditConfig, beam_args: Sequence[str] = (), *,
        eval_splits: Sequence[EvalSplit]) -> dict:
    """Audit `config.input`'s passages against `eval_splits` into `config.output`; returns the
    manifest (a summary on a dry run). The splits are texts, not settings, so they stay out of
    the config (the manifest hashes what they hold)."""
    jobs.configure_logging()
    splits = list(eval_splits)
    check(bool(splits), "tasks", "no evaluation split given")
    unread = sorted(set(config.tasks) - {s.task for s in splits})
    check(not unread, "tasks", f"no evaluation split handed for {', '.join(unread)}")
    options = jobs.beam_pipeline_options(beam_args)
    listed, folders = select_inputs(config.input)
    files = [f.path for f in listed]
    index = eval_index.build(keyed_examples(splits), config.ngram)
    log.info("audit_contamination: %d corpus files; %d evaluation examples in %d splits, "
             "%d n-gram rows", len(files), len(index.examples), len(splits), len(index.hashes))
    index_path = output_path(config.output, INDEX_FILE)
    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.makedirs(config.output)
        parquet_io.clear_previous_output(config.output, PREFIX, [
            output_path(config.output, name)
            for name in (INDEX_FILE, OVERLAPS_FILE, PASSAGES_FILE, MATCHED_FILE, REPORT_FILE)])
        storage.makedirs(output_path(config.output, "index"))
        eval_index.save(index, index_path)
    with disk_full_reported(config.output):
        pipeline = _run_pipeline(config, files, index_path, options)
    if dry_run:
        return jobs.dry_run_summary(NAMESPACE, pipeline)
    counts = parquet_io.query_counters(pipeline.result, NAMESPACE, COUNTERS)
    return finish(config, splits, index, folders, counts)


def _run_pipeline(config: AuditConfig, files: list[str], index_path: str, options):
    with beam.Pipeline(runner=jobs.local_runner(options), options=options) as pipeline:
        read = (pipeline
                | "Files" >> beam.Create(files)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(parquet_io.ReadRowsFn(NAMESPACE, ["doc_id", "passages"], "documents"))
                .with_outputs("dead_letter", main="rows"))
        found = read.rows | "Audit" >> Audit(index_path)
        for name, lines in (("Overlaps", found["overlaps"]), ("Passages", found["passages"]),
                            ("Ngrams", found["ngrams"]), ("DeadLetters", read.dead_letter)):
            _ = lines | f"Write{name}" >> parquet_io.WriteSortedLines(
                _lines_path(config.output, name))
    return pipeline


def _lines_path(output: str, name: str) -> str:
    if name == "DeadLetters":
        return parquet_io.dead_letter_path(output)
    return output_path(output, {"Overlaps": OVERLAPS_FILE, "Passages": PASSAGES_FILE,
                                "Ngrams": MATCHED_FILE}[name])


def read_lines(path: str) -> list[str]:
    with storage.open_read(path) as f:
        return [line for line in f.read().split("\n") if line]


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def split_report(index: eval_index.EvalIndex, task: str, split: str | None,
                 overlapping: set[tuple[str, str, str]], matched: np.ndarray) -> dict:
    """The report entry of one task (`split` None) or one of its splits."""
    chosen = [i for i, k in enumerate(index.examples)
              if k.task == task and (split is None or k.split == split)]
    hit = sum((index.examples[i].task, index.examples[i].split, index.examples[i].example_id)
              in overlapping for i in chosen)
    grams = eval_index.task_ngrams(index, task, split)
    shared = int(np.isin(grams, matched).sum())
    return {"examples": len(chosen), "examples_overlapping": hit,
            "examples_overlapping_share": _share(hit, len(chosen)),
            "examples_without_ngrams": int((index.ngram_counts[chosen] == 0).sum()),
            "ngrams": len(grams), "ngrams_overlapping": shared,
            "ngrams_overlapping_share": _share(shared, len(grams))}


def build_report(index: eval_index.EvalIndex, overlap_lines: Iterable[str],
                 matched_lines: Iterable[str], counts: dict[str, int]) -> dict:
    """report.json: per task and split, the examples and n-grams found in the corpus."""
    overlapping = {(r["task"], r["split"], r["example_id"])
                   for r in map(json.loads, overlap_lines)}
    matched = np.array(sorted(int(h, 16) for h in matched_lines), dtype=np.uint64)
    tasks: dict[str, dict] = {}
    for key in index.examples:
        tasks.setdefault(key.task, {}).setdefault(key.split, None)
    return {"ngram": index.n,
            "corpus": {k: counts[k] for k in ("documents", "passages", "passages_contaminated")},
            "tasks": {task: {**split_report(index, task, None, overlapping, matched),
                             "splits": {s: split_report(index, task, s, overlapping, matched)
                                        for s in names}}
                      for task, names in tasks.items()}}


def finish(config: AuditConfig, splits: list, index: eval_index.EvalIndex,
           folders: dict[str, str], counts: dict[str, int]) -> dict:
    """After the pipeline: the empty line files, report.json, then the manifest."""
    written = {name: parquet_io.finish_lines_file(output_path(config.output, name), True)
               for name in (OVERLAPS_FILE, PASSAGES_FILE, MATCHED_FILE)}
    dead_letters = parquet_io.finish_dead_letters(config.output, counts["bad_records"] > 0)
    if counts["documents"] == 0:
        raise jobs.nothing_produced("documents", config.input, counts["bad_records"],
                                    dead_letters)
    report = build_report(index, read_lines(written[OVERLAPS_FILE]),
                          read_lines(written[MATCHED_FILE]), counts)
    report_path = output_path(config.output, REPORT_FILE)
    storage.atomic_write_json(report_path, report)
    eval_files = {path: storage.sha256_file(path) for s in splits for path in s.files}
    handed = sorted({s.task for s in splits} - set(config.tasks))
    # the handed splits' texts are hashed: a task file may read other fields of the same files
    extra = {"handed_splits": storage.config_hash([
        (s.task, s.split, list(s.examples))
        for s in splits if s.task in handed])} if handed else {}
    manifest = jobs.stage_manifest(
        NAMESPACE, config, parquet_io.content_hash(
            {**dataclasses.asdict(config), "inputs": sorted(folders.values()),
             "eval_files": sorted(eval_files.values()), **extra}),
        counts=counts, inputs=None,
        outputs=parquet_io.output_records(config.output, [
            output_path(config.output, INDEX_FILE), *written.values(), dead_letters,
            report_path]),
        **({"handed_tasks": handed} if handed else {}), report=report["tasks"],
        input_config_hashes=folders, eval_files=eval_files)
    return jobs.publish_manifest(log, NAMESPACE, manifest, counts, dead_letters)


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
