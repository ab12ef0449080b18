"""The jobs warn before starting when the input clearly needs more memory than the local runner
has (an estimate from the input size and the factors measured by bench_local_memory.py)."""
from __future__ import annotations

import logging

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import extract_books, jobs

BOOK = "It was a dark and stormy night. The rain fell in torrents.\n"


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_of_extract_books():
    # On the job's own logger: configure_logging() replaces the root logger's handlers.
    handler = Records()
    logger = logging.getLogger(extract_books.__name__)
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_estimates_grow_with_input_and_dupe_factor():
    base, factor = jobs.LOCAL_MEMORY_FIT["build_corpus"]
    assert jobs.local_memory_estimate("build_corpus", 10**9) == int(base + factor * 10**9)
    assert jobs.local_memory_estimate("make_shards", 10**9, scale=5 / 2) > \
        jobs.local_memory_estimate("make_shards", 10**9)
    assert jobs.local_memory_estimate("train_vocab", 10**9) is None  # not measured: no warning


def test_warns_only_when_the_estimate_exceeds_the_memory(monkeypatch):
    log = logging.getLogger("test_local_memory")
    local = PipelineOptions([])
    one_gb_corpus = 10**9  # a full English Wikipedia's corpus Parquet is ~10x this
    need = jobs.local_memory_estimate("build_corpus", one_gb_corpus)
    monkeypatch.setenv(jobs.LOCAL_MEMORY_ENV, str(need + 1))
    assert not jobs.warn_if_too_large_for_local_runner(log, "build_corpus", one_gb_corpus, local)
    monkeypatch.setenv(jobs.LOCAL_MEMORY_ENV, str(need - 1))
    assert jobs.warn_if_too_large_for_local_runner(log, "build_corpus", one_gb_corpus, local)
    # a cluster runner holds the data on its workers: no warning
    dataflow = PipelineOptions(["--runner=DataflowRunner"])
    assert not jobs.warn_if_too_large_for_local_runner(log, "build_corpus", one_gb_corpus,
                                                       dataflow)


def test_job_warns_before_it_starts_and_still_runs(tmp_path, monkeypatch,
                                                   warnings_of_extract_books):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(BOOK)
    monkeypatch.setenv(jobs.LOCAL_MEMORY_ENV, "1000")  # 1 kB of memory: any input is too big
    manifest = extract_books.main(["--input", str(tmp_path / "books"),
                                  "--output", str(tmp_path / "out")])
    assert manifest["counts"]["documents"] == 1  # a warning, not a refusal
    [warning] = [m for m in warnings_of_extract_books if "local runner" in m]
    assert warning.startswith(f"extract_books: 0.00 GB of input needs about "
                              f"{jobs.local_memory_estimate('extract_books', len(BOOK)) / 1e9:.1f}"
                              " GB on Beam's local runner")
    assert "--runner=DataflowRunner" in warning and "--runner=PortableRunner" in warning
    monkeypatch.setenv(jobs.LOCAL_MEMORY_ENV, str(10**12))
    warnings_of_extract_books.clear()
    extract_books.main(["--input", str(tmp_path / "books"), "--output", str(tmp_path / "out2")])
    assert not [m for m in warnings_of_extract_books if "local runner" in m]
