"""The real enwiki excerpt (shared/data/wiki) and one extraction job run on it."""

from __future__ import annotations

import bz2
from pathlib import Path

import pytest

from tests.pipelines.wikipedia.wiki_runs import (
    run_job,
)

DUMP = "wiki/enwiki-dbpedia-minidump-pages-articles.xml.bz2"


@pytest.fixture(scope="package")
def dump(shared_data) -> Path:
    return shared_data / DUMP


@pytest.fixture(scope="package")
def dump_xml(dump) -> bytes:
    return bz2.decompress(dump.read_bytes())


@pytest.fixture(scope="package")
def job_output(dump, tmp_path_factory) -> tuple[Path, dict]:
    output = tmp_path_factory.mktemp("wiki_out")
    return output, run_job(dump, output)
