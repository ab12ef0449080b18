"""Beam wiring of near-duplicate removal (`pipelines.corpus.near_duplicates`): documents rows in,
one row kept per cluster and a JSON line per row removed out.

    pairs = documents | "NearPairs" >> NearDuplicatePairs(NearDuplicateConfig())
    removed = documents | "Near" >> RemoveNearDuplicates(NearDuplicateConfig())
    removed["kept"], removed["removed"]

`NearDuplicatePairs`: each row's LSH band keys with (doc_id, signature as text), a GroupByKey on
the band key (the values are ids and signatures of 128 uint32, never whole documents, so the
shuffle stays small on Dataflow), `cluster_removals` per bucket, then the smallest duplicate_of
per removed doc_id (`CombinePerKey(min)`, as `near_duplicates.resolve`): one
`(removed_id, duplicate_of_id)` per removed document.

`RemoveNearDuplicates`: those pairs joined back to the rows by doc_id (CoGroupByKey); a removed
row becomes the line `{"removed", "duplicate_of", "source", "source_file"}`. Counters:
`near_duplicates_removed` in build_corpus's namespace and `<source>/near_duplicates_removed` in
its per-source one. Document ids must be unique on input (build_corpus removes doc_id conflicts
first). Kept apart from `near_duplicates` so that the flow's config does not import Beam.
"""
from __future__ import annotations

import json

import apache_beam as beam
from apache_beam import pvalue

from pipelines.corpus import near_duplicates as near
from pipelines.corpus.near_duplicates import NearDuplicateConfig

NAMESPACE = "build_corpus"
LEDGER_NAMESPACE = "build_corpus.sources"
"""pipelines/build_corpus.py's counter namespaces (that job imports this module)."""


def removed_line(row: dict, duplicate_of: str) -> str:
    """The side output's line for a documents row removed as a near-duplicate."""
    return json.dumps({"removed": row["doc_id"], "duplicate_of": duplicate_of,
                       "source": row["source"], "source_file": row["source_file"]},
                      ensure_ascii=False)


class NearDuplicatePairs(beam.PTransform):
    """Documents rows -> (removed doc_id, duplicate_of doc_id), one per removed document."""

    def __init__(self, config: NearDuplicateConfig):
        super().__init__()
        self.config = config

    def expand(self, rows):
        return (rows
                | "Bands" >> beam.FlatMap(near.band_records, self.config)
                | "GroupBand" >> beam.GroupByKey()
                | "Confirm" >> beam.FlatMap(lambda kv, c: near.bucket_pairs(kv[1], c),
                                            self.config)
                | "Smallest" >> beam.CombinePerKey(min))


class RemoveFn(beam.DoFn):
    """(doc_id, {"rows", "duplicate_of"}) -> the row, or a "removed" line naming the doc_id it
    duplicates."""

    def __init__(self):
        self.removed = beam.metrics.Metrics.counter(NAMESPACE, "near_duplicates_removed")

    def process(self, element):
        _, joined = element
        duplicate_of = sorted(joined["duplicate_of"])
        for row in joined["rows"]:
            if not duplicate_of:
                yield row
                continue
            self.removed.inc()
            beam.metrics.Metrics.counter(LEDGER_NAMESPACE,
                                         f"{row['source']}/near_duplicates_removed").inc()
            yield pvalue.TaggedOutput("removed", removed_line(row, duplicate_of[0]))


class RemoveNearDuplicates(beam.PTransform):
    """Documents rows -> {"kept": rows, "removed": JSON lines} (`NearDuplicatePairs` joined back
    to the rows by doc_id)."""

    def __init__(self, config: NearDuplicateConfig):
        super().__init__()
        self.config = config

    def expand(self, rows):
        pairs = rows | "Pairs" >> NearDuplicatePairs(self.config)
        by_id = rows | "ById" >> beam.Map(lambda r: (r["doc_id"], r))
        joined = ({"rows": by_id, "duplicate_of": pairs}
                  | "Join" >> beam.CoGroupByKey()
                  | "Remove" >> beam.ParDo(RemoveFn()).with_outputs("removed", main="kept"))
        return {"kept": joined.kept, "removed": joined.removed}
