"""build_corpus' data work on documents rows, as Beam composites over pure functions:
`Dedupe` (exact duplicates by normalized text, `keep_first`), then `Finish` (unique doc_ids,
the sources' quality filters, sentences, the mixture's weights), together `BuildCorpus`. The
job (`pipelines/build_corpus.py`) reads, writes and runs them, in one pipeline or in waves.

Every count is a Beam counter: the job's `COUNTERS` in `NAMESPACE`, and the ledger's per source
(`LEDGER_COUNTS`, named `<source>/<counter>` in `LEDGER_NAMESPACE`).
"""
from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue

from common import errors
from pipelines.corpus import sentences
from pipelines.corpus.filter_quality import FilterQuality
from pipelines.corpus.near_duplicates import NearDuplicateConfig
from pipelines.corpus.quality import QualityConfig
from pipelines.corpus.remove_near_duplicates import NearDuplicatePairs, removed_line
from pipelines.documents import source as mixture

NAMESPACE = "build_corpus"
COUNTERS = ("input_files", "documents_read", "duplicates_removed", "doc_id_conflicts",
            "documents_without_sentences", "near_duplicates_removed", "quality_dropped",
            "bad_records", "documents", "passages", "sentences")
LEDGER_NAMESPACE = "build_corpus.sources"
"""Per-source counters, named `<source>/<counter>`."""
LEDGER_COUNTS = ("documents_in", "bytes_in", "duplicates_removed", "doc_id_conflicts",
                 "near_duplicates_removed", "without_sentences", "sentences_in", "words_in",
                 "sampled_out", "repeats_added", "documents_out", "bytes_out", "sentences_out",
                 "words_out")



def count_in_ledger(source: str, name: str, value: int = 1) -> None:
    """Bump ledger counter `<source>/<name>`."""
    beam.metrics.Metrics.counter(LEDGER_NAMESPACE, f"{source}/{name}").inc(value)


def text_bytes(passages: Iterable[str]) -> int:
    return sum(len(p.encode("utf-8")) for p in passages)


def words(sentences_: Iterable[str]) -> int:
    return sum(len(s.split()) for s in sentences_)


def weighted(row: dict, weight: float) -> list[dict]:
    """A corpus row's copies under its source's weight (pipelines/documents/source.py)."""
    return [{**row, "doc_id": doc_id}
            for doc_id in mixture.copy_ids(row["source"], row["doc_id"], weight)]


def corpus_shard_key(doc_id: str) -> str:
    """What a row's corpus shard is the hash of: its original's doc_id, so a weighted source's
    copies are made and written by the id wave of their original (waves write whole shards)."""
    return mixture.original_id(doc_id)


def normalized_text(passages: Iterable[str]) -> str:
    """What "the same document" means: NFKC, case folded, every whitespace run one space."""
    text = unicodedata.normalize("NFKC", " ".join(passages)).casefold()
    return " ".join(text.split())


def dedupe_key(record: dict) -> str:
    return hashlib.sha256(normalized_text(record["passages"]).encode("utf-8")).hexdigest()


def _order(record: dict) -> tuple:
    # A total order: GroupByKey hands records over in any order, and two inputs may give the
    # same doc_id and source_file (one documents folder passed twice, re-extracted differently).
    return record["doc_id"], record["source_file"], record["title"], list(record["passages"])


def keep_first(records: Iterable[dict]) -> tuple[dict, list[dict]]:
    """(the record kept: smallest doc_id, then source_file, title, passages; the others)."""
    ordered = sorted(records, key=_order)
    return ordered[0], ordered[1:]


def corpus_record(record: dict) -> dict:
    """A documents row -> a corpus row: the same fields plus the passages' sentences."""
    return {"doc_id": record["doc_id"], "source": record["source"],
            "source_file": record["source_file"], "title": record["title"],
            "passages": list(record["passages"]),
            "sentences": sentences.split_passages(record["passages"])}


class KeepFirstFn(beam.DoFn):
    """(key, records with that key) -> the record `keep_first` keeps; each other one bumps the
    `COUNTERS` (the first also per source) and is tagged as `set_aside` makes it."""

    COUNTERS: tuple[str, ...] = ()

    def __init__(self):
        self.counters = [beam.metrics.Metrics.counter(NAMESPACE, name) for name in self.COUNTERS]

    def process(self, element):
        key, records = element
        kept, others = keep_first(records)
        for other in others:
            for counter in self.counters:
                counter.inc()
            count_in_ledger(other["source"], self.COUNTERS[0])
            yield self.set_aside(key, other, kept)
        yield kept

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        raise NotImplementedError


class DedupeFn(KeepFirstFn):
    """(content hash, records with that content) -> the kept record; duplicates tagged."""

    COUNTERS = ("duplicates_removed",)

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        return pvalue.TaggedOutput("duplicates", _duplicate_line(other, kept))


def _duplicate_line(removed: dict, kept: dict) -> str:
    return json.dumps({"removed": removed["doc_id"], "removed_file": removed["source_file"],
                       "kept": kept["doc_id"], "kept_file": kept["source_file"]}, ensure_ascii=False)


class UniqueIdFn(KeepFirstFn):
    """(doc_id, records) -> one record; a doc_id used for two different texts is a dead letter."""

    COUNTERS = ("doc_id_conflicts", "bad_records")

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        reason = f"doc_id also used by {kept['source_file']} for a different text (kept that one)"
        return pvalue.TaggedOutput("dead_letter",
                                   errors.BadRecord(other["source_file"], key, reason).to_json())


class SplitSentencesFn(beam.DoFn):
    """documents row -> corpus row; a document with no sentence is a dead letter."""

    def __init__(self):
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, record: dict):
        row = corpus_record(record)
        if not row["sentences"]:
            count_in_ledger(record["source"], "without_sentences")
            self.counters["documents_without_sentences"].inc()
            self.counters["bad_records"].inc()
            yield pvalue.TaggedOutput("dead_letter", errors.BadRecord(
                record["source_file"], record["doc_id"], "document has no sentence").to_json())
            return
        count_in_ledger(row["source"], "sentences_in", len(row["sentences"]))
        count_in_ledger(row["source"], "words_in", words(row["sentences"]))
        yield row


class MixFn(beam.DoFn):
    """corpus row -> its copies under its source's weight (none: sampled out)."""

    def __init__(self, weights: dict[str, float]):
        self.weights = weights
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, row: dict):
        kept = weighted(row, self.weights.get(row["source"], 1.0))
        source, size = row["source"], text_bytes(row["passages"])
        if not kept:
            count_in_ledger(source, "sampled_out")
        count_in_ledger(source, "repeats_added", max(len(kept) - 1, 0))
        for name, value in (("documents_out", 1), ("bytes_out", size),
                            ("sentences_out", len(row["sentences"])),
                            ("words_out", words(row["sentences"]))):
            count_in_ledger(source, name, value * len(kept))
        self.counters["documents"].inc(len(kept))
        self.counters["passages"].inc(len(row["passages"]) * len(kept))
        self.counters["sentences"].inc(len(row["sentences"]) * len(kept))
        yield from kept


class NearDuplicateFn(beam.DoFn):
    """(doc_id, {"rows", "near"}) -> (doc_id, rows), or a "near_duplicates" line naming the
    smallest doc_id it duplicates."""

    def __init__(self):
        self.removed = beam.metrics.Metrics.counter(NAMESPACE, "near_duplicates_removed")

    def process(self, element):
        doc_id, joined = element
        rows, kept = list(joined["rows"]), sorted(joined["near"])
        if not rows:
            return
        if not kept:
            yield doc_id, rows
            return
        for row in rows:
            self.removed.inc()
            count_in_ledger(row["source"], "near_duplicates_removed")
            yield pvalue.TaggedOutput("near_duplicates", removed_line(row, kept[0]))


class Dedupe(beam.PTransform):
    """Documents rows -> {"kept": one row per text (`keep_first`), "duplicates": JSON lines}.
    Groups by content: every copy of a text must reach it (one pipeline, or one content wave)."""

    def expand(self, documents):
        deduped = (documents
                   | "ByContent" >> beam.Map(lambda r: (dedupe_key(r), r))
                   | "GroupContent" >> beam.GroupByKey()
                   | "Dedupe" >> beam.ParDo(DedupeFn()).with_outputs("duplicates", main="kept"))
        return {"kept": deduped.kept, "duplicates": deduped.duplicates}


class Finish(beam.PTransform):
    """Rows of distinct texts -> {"corpus": unique doc_ids that pass their source's quality
    filters (`quality`, by source; none when absent), split into sentences, repeated or
    sampled by their source's weight (`weights`, by source; 1 when absent), "dead_letter" and
    "quality_dropped": JSON lines}. Groups by doc_id: every row of a doc_id must reach it (one
    pipeline, or one id wave)."""

    def __init__(self, weights: dict[str, float] | None = None,
                 quality: dict[str, QualityConfig] | None = None):
        super().__init__()
        self.weights, self.quality = weights or {}, quality or {}

    def expand(self, inputs):
        """`inputs`: the rows, or {"kept": rows, "near": `NearDuplicatePairs`' pairs}."""
        kept, pairs = (inputs["kept"], inputs["near"]) if isinstance(inputs, dict) else (inputs,
                                                                                         None)
        by_id = kept | "ById" >> beam.Map(lambda r: (r["doc_id"], r))
        if pairs is None:
            grouped, removed = by_id | "GroupId" >> beam.GroupByKey(), None
        else:
            joined = ({"rows": by_id, "near": pairs} | "JoinNear" >> beam.CoGroupByKey()
                      | "Near" >> beam.ParDo(NearDuplicateFn()).with_outputs(
                          "near_duplicates", main="grouped"))
            grouped, removed = joined.grouped, joined.near_duplicates
        unique = grouped | "UniqueId" >> beam.ParDo(UniqueIdFn()).with_outputs(
            "dead_letter", main="unique")
        filtered = unique.unique | "Quality" >> FilterQuality(self.quality)
        split = (filtered["kept"]
                 | "Sentences" >> beam.ParDo(SplitSentencesFn()).with_outputs("dead_letter",
                                                                                main="corpus"))
        mixed = split.corpus | "Mix" >> beam.ParDo(MixFn(self.weights))
        dead = (unique.dead_letter, split.dead_letter) | "DeadLetters" >> beam.Flatten()
        return {"corpus": mixed, "dead_letter": dead, "quality_dropped": filtered["dropped"],
                "near_duplicates": removed}


class BuildCorpus(beam.PTransform):
    """Composite: documents rows -> `Dedupe` -> `Finish`: {"corpus": rows, "duplicates" and
    "dead_letter", "quality_dropped": JSON lines}."""

    def __init__(self, weights: dict[str, float] | None = None,
                 quality: dict[str, QualityConfig] | None = None,
                 near_duplicates: NearDuplicateConfig | None = None):
        super().__init__()
        self.weights, self.quality = weights or {}, quality or {}
        self.near_duplicates = near_duplicates

    def expand(self, documents):
        deduped = documents | "Dedupe" >> Dedupe()
        inputs = deduped["kept"]
        if self.near_duplicates is not None:
            inputs = {"kept": inputs, "near": deduped["kept"] | "NearDuplicates"
                      >> NearDuplicatePairs(self.near_duplicates)}
        finished = inputs | "Finish" >> Finish(self.weights, self.quality)
        return {**finished, "duplicates": deduped["duplicates"]}

