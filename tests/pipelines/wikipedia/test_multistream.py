"""Multistream dumps: one split per bz2 stream gives the same documents as the plain file, the index
file, folders of partitioned dumps and their indexes."""

from __future__ import annotations

import bz2
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from common import storage
from common.errors import BadRecord
from pipelines.wikipedia.dump import Page, bz2_stream_offsets, iter_pages, plan_splits
from tests.pipelines.wikipedia.wiki_runs import (
    DEBUG_ARGS,
    REPO,
    build_multistream,
    file_bytes,
    read_documents,
    run_job,
    without_source,
)


def test_reader_per_stream_splits_equal_plain_file(dump_xml, tmp_path):
    plain = tmp_path / "mini.xml"
    plain.write_bytes(dump_xml)
    expected = [p for s in plan_splits(str(plain), 1 << 30) for p in iter_pages(s)]
    assert len(expected) == 27 and all(isinstance(p, Page) for p in expected)

    multistream = build_multistream(dump_xml, tmp_path)
    splits = plan_splits(str(multistream), 0)
    assert len(splits) == 8  # header, 6 streams of <= 5 pages, footer
    assert [p for s in splits for p in iter_pages(s)] == expected
    # pbzip2-style streams cut mid-page: each page still read exactly once.
    cut = tmp_path / "pbzip2.xml.bz2"
    cut.write_bytes(b"".join(bz2.compress(dump_xml[i:i + 100_000])
                             for i in range(0, len(dump_xml), 100_000)))
    assert len(plan_splits(str(cut), 0)) == 16
    assert [p for s in plan_splits(str(cut), 0) for p in iter_pages(s)] == expected
    # Byte ranges of the plain file, cut anywhere, too.
    assert [p for s in plan_splits(str(plain), 40_000) for p in iter_pages(s)] == expected


def test_reader_tags_cut_by_any_chunk_boundary(dump_xml, tmp_path):
    plain = tmp_path / "mini.xml"
    plain.write_bytes(dump_xml)
    expected = [p for s in plan_splits(str(plain), 1 << 30) for p in iter_pages(s)]
    # 7-byte reads cut every "<page>"/"</page>" tag somewhere; 61 and 4099 land elsewhere.
    for chunk_bytes, split_bytes in ((7, 1 << 30), (61, 40_000), (4099, 40_000)):
        got = [p for s in plan_splits(str(plain), split_bytes)
               for p in iter_pages(s, chunk_bytes=chunk_bytes)]
        assert got == expected, chunk_bytes
    multistream = build_multistream(dump_xml, tmp_path)
    assert [p for s in plan_splits(str(multistream), 0)
            for p in iter_pages(s, chunk_bytes=61)] == expected


def test_corrupt_stream_costs_only_its_own_pages(dump_xml, tmp_path):
    multistream = build_multistream(dump_xml, tmp_path)
    offsets = bz2_stream_offsets(str(multistream))
    data = bytearray(multistream.read_bytes())
    data[(offsets[3] + offsets[4]) // 2] ^= 0x55  # the stream of pages 11-15
    multistream.write_bytes(bytes(data))
    [split] = plan_splits(str(multistream), 1 << 30)  # one split reads all 8 streams
    items = list(iter_pages(split))
    titles = [i.title for i in items if isinstance(i, Page)]
    lost = ["Ferdinand Piëch", "Food (disambiguation)", "IBM", "IKEA", "Ingoldiomyces"]
    assert len(titles) == 22 and not set(lost) & set(titles)
    assert "Jim Pewter" in titles and "Dahlak SC" in titles  # the neighbours either side
    assert [i for i in items if isinstance(i, BadRecord)] == [BadRecord(
        str(multistream), f"bz2 stream at byte {offsets[3]}",
        "corrupt compressed data (Invalid data stream); the pages in it are lost")]


def test_multistream_index_file_gives_the_same_stream_offsets(dump_xml, tmp_path):
    multistream = build_multistream(dump_xml, tmp_path)
    scanned = bz2_stream_offsets(str(multistream))
    index_lines = [f"{offset}:{n}:Title {n}" for n, offset in enumerate(scanned[1:-1])]
    index = tmp_path / "mini-multistream-index.txt.bz2"
    index.write_bytes(bz2.compress("\n".join(index_lines).encode() + b"\n"))
    # The index lists page streams only; the footer stream then joins the last split.
    assert bz2_stream_offsets(str(multistream)) == scanned[:-1]


@pytest.fixture(scope="module")
def multistream_output(dump_xml, tmp_path_factory) -> tuple[Path, Path, dict]:
    folder = tmp_path_factory.mktemp("multistream")
    path = build_multistream(dump_xml, folder)
    output = folder / "out"
    return path, output, run_job(path, output, *DEBUG_ARGS)


def test_job_multistream_per_stream_same_documents(multistream_output, job_output):
    _path, output, manifest = multistream_output
    assert len(manifest["outputs"]) == 8
    assert manifest["config"]["row_group_docs"] == 4
    row_groups = [pq.ParquetFile(output / o["path"]).num_row_groups for o in manifest["outputs"]]
    # Articles per stream of 5 pages: 4, 4, 4, 5, 4, 2 (the header and footer streams: none).
    assert row_groups == [0, 1, 1, 1, 2, 1, 1, 0]
    assert manifest["counts"] == job_output[1]["counts"]
    assert without_source(read_documents(output)) == without_source(read_documents(job_output[0]))


def test_job_command_line_multi_processing_gives_the_same_bytes(multistream_output, tmp_path):
    # `python pipelines/extract_wikipedia.py ...` as a user types it: two worker processes
    # must unpickle the job's classes, so the script must not define them in __main__.
    path, output, manifest = multistream_output
    parallel = tmp_path / "parallel"
    command = [sys.executable, str(REPO / "pipelines" / "extract_wikipedia.py"),
               "--input", str(path), "--output", str(parallel), *DEBUG_ARGS,
               "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert storage.read_manifest(str(parallel)) == manifest
    assert file_bytes(parallel) == file_bytes(output)


def test_rerun_with_another_split_plan_removes_stale_shards(multistream_output, tmp_path):
    path, output, _ = multistream_output
    folder = tmp_path / "restale"
    for name, data in file_bytes(output).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    manifest = run_job(path, folder)  # default split_bytes: one split for this small file
    assert sorted(p.name for p in folder.glob("documents-*")) == [
        "documents-00000-of-00001.parquet"]
    assert manifest["counts"]["articles_kept"] == 23


def test_a_folder_with_a_multistream_dump_and_its_index_reads_the_dump_once(
        multistream_output, job_output, tmp_path):
    """Wikimedia publishes the index beside the dump: the index is how the dump is cut, not
    a second input (read as a dump it would be a dead letter)."""
    path, _, _ = multistream_output
    folder = tmp_path / "dumps"
    (folder / "enwiki").mkdir(parents=True)
    dump = folder / "enwiki" / path.name
    dump.write_bytes(path.read_bytes())
    offsets = bz2_stream_offsets(str(dump))
    (folder / "enwiki" / "mini-multistream-index.txt.bz2").write_bytes(bz2.compress("".join(
        f"{offset}:{n}:Title {n}\n" for n, offset in enumerate(offsets[1:-1])).encode()))
    manifest = run_job(folder, tmp_path / "out", *DEBUG_ARGS)
    assert [i["path"] for i in manifest["inputs"]] == [str(dump)]
    assert manifest["counts"] == job_output[1]["counts"]


PARTITIONS = ("enwiki-20240101-pages-articles-multistream1.xml-p1p41242.bz2",
              "enwiki-20240101-pages-articles-multistream2.xml-p41243p151573.bz2")


PARTITION_INDEXES = ("enwiki-20240101-pages-articles-multistream-index1.txt-p1p41242.bz2",
                     "enwiki-20240101-pages-articles-multistream-index2.txt-p41243p151573.bz2")


def test_partitioned_dump_names_and_their_index_names():
    from pipelines.wikipedia.dump import index_name_for, is_index_file

    assert [index_name_for(f"gs://b/{name}") for name in PARTITIONS] == [
        f"gs://b/{name}" for name in PARTITION_INDEXES]
    assert index_name_for("enwiki-20240101-pages-articles-multistream.xml.bz2") == \
        "enwiki-20240101-pages-articles-multistream-index.txt.bz2"
    assert index_name_for("wiki2024.xml.bz2") == "wiki2024-index.txt.bz2"
    assert index_name_for("dump.xml") is None
    assert [is_index_file(n) for n in (*PARTITION_INDEXES, "a-multistream-index.txt.bz2",
                                       *PARTITIONS, "enwiki-pages-articles.xml.bz2",
                                       "index.txt.bz2")] == [True] * 3 + [False] * 4


def test_a_folder_of_partitioned_multistream_dumps_skips_their_indexes(
        multistream_output, job_output, tmp_path):
    """enwiki is published in partitions, each with its own index
    (...-multistream-index1.txt-p1p41242.bz2): each index cuts its partition and is no input."""
    path, _, _ = multistream_output
    folder = tmp_path / "enwiki"
    folder.mkdir()
    offsets = bz2_stream_offsets(str(path))
    for dump, index in zip(PARTITIONS, PARTITION_INDEXES):
        (folder / dump).write_bytes(path.read_bytes())
        (folder / index).write_bytes(bz2.compress("".join(
            f"{offset}:{n}:Title {n}\n" for n, offset in enumerate(offsets[1:-1])).encode()))
    # The index lists page streams only (no footer stream): read from it, not scanned.
    assert bz2_stream_offsets(str(folder / PARTITIONS[0])) == offsets[:-1]
    manifest = run_job(folder, tmp_path / "out", *DEBUG_ARGS)
    assert [i["path"] for i in manifest["inputs"]] == [str(folder / name) for name in PARTITIONS]
    assert [i["size_bytes"] for i in manifest["inputs"]] == [path.stat().st_size] * 2
    assert manifest["counts"] == {k: 2 * v for k, v in job_output[1]["counts"].items()}
    with pytest.raises(FileNotFoundError, match="holds only multistream index files"):
        run_job(folder / PARTITION_INDEXES[0], tmp_path / "out_index")
