"""Beam wiring of the quality filters (`pipelines.corpus.quality`): documents rows in, the rows
kept and a JSON line per row dropped out.

    filtered = documents | "Quality" >> FilterQuality({"news": QualityConfig(languages=("en",))})
    filtered["kept"], filtered["dropped"]

A dropped line is `{"doc_id", "source", "source_file", "filter", "detail"}` (filter: the rule, one
of `quality.RULES`). Counters: `<source>/dropped_<rule>` in build_corpus's per-source namespace
and `quality_dropped` in build_corpus's. A row whose source has no config passes untouched (one
dict lookup). Kept apart from `quality` so that declaring a source (pipelines/documents/source.py,
the flow's settings) does not import Beam.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

import apache_beam as beam
from apache_beam import pvalue

from pipelines.corpus import quality
from pipelines.corpus.quality import QualityConfig

NAMESPACE = "build_corpus"
LEDGER_NAMESPACE = "build_corpus.sources"
"""pipelines/build_corpus.py's counter namespaces (that job imports this module)."""


def dropped_line(row: dict, drop: quality.Drop) -> str:
    """The side output's line for a dropped documents row."""
    return json.dumps({"doc_id": row["doc_id"], "source": row["source"],
                       "source_file": row["source_file"], "filter": drop.rule,
                       "detail": drop.detail}, ensure_ascii=False)


class QualityFn(beam.DoFn):
    """documents row -> itself, or a "dropped" line when its source's config refuses it."""

    def __init__(self, configs: Mapping[str, QualityConfig]):
        self.configs = dict(configs)
        self.dropped = beam.metrics.Metrics.counter(NAMESPACE, "quality_dropped")

    def setup(self):
        # The language model loads once per worker process, before the first bundle.
        if any(config.languages for config in self.configs.values()):
            quality.known_languages()

    def process(self, row: dict):
        config = self.configs.get(row["source"])
        drop = None if config is None else quality.check(row["passages"], config)
        if drop is None:
            yield row
            return
        self.dropped.inc()
        beam.metrics.Metrics.counter(LEDGER_NAMESPACE,
                                     f"{row['source']}/dropped_{drop.rule}").inc()
        yield pvalue.TaggedOutput("dropped", dropped_line(row, drop))


class FilterQuality(beam.PTransform):
    """Documents rows -> {"kept": rows, "dropped": JSON lines}, by each source's config
    (`configs`: source name -> QualityConfig; a source not in it is not filtered)."""

    def __init__(self, configs: Mapping[str, QualityConfig]):
        super().__init__()
        self.configs = dict(configs)
        for name, config in self.configs.items():
            quality.check_languages(config, f"sources.{name}.quality.languages")

    def expand(self, documents):
        filtered = documents | "Check" >> beam.ParDo(QualityFn(self.configs)).with_outputs(
            "dropped", main="kept")
        return {"kept": filtered.kept, "dropped": filtered.dropped}
