"""Beam job: book text files (one book per file, as BooksCorpus is distributed) -> documents.

    beam run pipelines/extract_books.py --input data/sample/books --output out/books_documents
    python pipelines/extract_books.py --input 'books/*.txt' --output out/books --num_shards 4 \\
        --direct_num_workers=2 --direct_running_mode=multi_processing

Each file becomes one document (`doc_id` "books/<path below the input folder, without its
extension>": "books/crlf" for a top-level crlf.txt, "books/austen/emma/text" for
austen/emma/text.txt; title from the book's first bracketed line): decoded (UTF-8 with or without BOM, else CP1252/Latin-1, counted), CRLF
normalised, control characters (DOS Ctrl-Z) removed, Project Gutenberg header/footer (1990s and
later forms), transcriber's notes, title pages, lists and chapter headings dropped, hard-wrapped
lines unwrapped into one passage per paragraph, long verse cut at sentence ends (see
`pipelines/books/cleaning.py`; each of these is a counter in the manifest).

Bad input is set aside in `<output>/dead_letter/` and counted, never dropped silently: an empty or
binary file, a file with no text left, an unreadable file (one record each), and a paragraph
longer than --max_passage_chars that cannot be cut into passages under it (a 50 MB file with
no line breaks, a run of characters without a space: set aside with its size and line; the
rest of that book is kept). A longer paragraph that can (Paradise Lost's verse paragraph of
50,128 characters) is cut at sentence ends, and counted (`long_paragraphs_split`). Files
whose name matches --exclude (default: README*, LICENSE*, ...) are not books: they are skipped
and listed. A folder --input reads its subfolders too. A run whose files give no document at all writes no manifest
and fails naming the input and its dead letters.

Output: `documents-{i:05d}-of-{n:05d}.parquet` (pipelines.corpus.documents.DOCUMENT_SCHEMA), dead letters,
and `manifest.json` written last (config + hash, counts, inputs, outputs with sha256).
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import apache_beam as beam
from apache_beam import pvalue

from common import errors, storage
from pipelines import jobs, parquet_io, waves
from pipelines.books import cleaning
from pipelines.corpus.documents import DOCUMENT_SCHEMA

NAMESPACE = "extract_books"
OUTPUT_VERSION = 3
"""Changes when the same input and options give other records (ids, fields, text rules): it is
in the manifest and in the flow's stage hash, so an output of other code is not reused."""
PREFIX = "documents"
DEFAULT_EXCLUDE = "README*,LICENSE*,LICENCE*,COPYING*,*.md,*.json,*.parquet"
# Counter names, in manifest order.
COUNTERS = ("files_read", "decoded_utf8", "decoded_fallback", "documents", "passages",
            "headings_dropped", "gutenberg_headers_stripped", "gutenberg_footers_stripped",
            "bad_records", "passages_set_aside", "control_chars_removed",
            "transcriber_notes_dropped", "front_matter_dropped", "list_blocks_dropped",
            "verse_paragraphs_split", "long_paragraphs_split")
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ExtractBooksConfig(cleaning.BookConfig, waves.ShardedOutput):
    """Resolved options of one extract_books run (saved in the manifest, hashed); the limits
    of bad input (`max_passage_chars`, `max_control_fraction`) are `cleaning.BookConfig`'s,
    `num_shards` and `wave_mb` are `waves.ShardedOutput`'s."""
    input: str
    """Book files, a glob or a folder (local or gs://...); several separated by commas."""
    output: str
    """The documents folder."""
    exclude: tuple[str, ...] = tuple(DEFAULT_EXCLUDE.split(","))
    """Comma-separated file-name patterns that are not books (skipped, listed in the
    manifest); default README*,LICENSE*,LICENCE*,COPYING*,*.md,*.json,*.parquet."""

    def __post_init__(self):
        cleaning.BookConfig.__post_init__(self)
        waves.ShardedOutput.__post_init__(self)


def is_excluded(path: str, patterns: Sequence[str]) -> bool:
    name = os.path.basename(path)
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def doc_id_for(file: storage.InputFile) -> str:
    """"books/" + the file's path below its input folder without the extension: a top-level
    file keeps its bare stem, and `a/book/text.txt` and `b/book/text.txt` stay two books."""
    return f"books/{os.path.splitext(file.name)[0]}"


def book_record(file: storage.InputFile, book: cleaning.Book) -> dict:
    """The DOCUMENT_SCHEMA row of one book."""
    stem = os.path.splitext(os.path.basename(file.path))[0]
    return {"doc_id": doc_id_for(file), "source": "books", "source_file": file.path,
            "title": book.title or stem, "passages": list(book.passages)}


class ExtractBookFn(beam.DoFn):
    """Wires `cleaning.extract_book`: InputFile -> document record, plus tagged dead letters."""

    def __init__(self, config: cleaning.BookConfig):
        self.config = config
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, file: storage.InputFile):
        yield from extract_path(file, self.config, self.counters)


def extract_path(file: storage.InputFile, config: cleaning.BookConfig, counters: dict):
    """Read and extract one file; yields a record or tagged dead letters and bumps counters."""
    path = file.path
    counters["files_read"].inc()
    try:
        with storage.open_read(path, "rb") as f:
            data = f.read()
        book = cleaning.extract_book(data, config)
    except cleaning.BadBookError as e:
        counters["bad_records"].inc()
        log.warning("dead letter: %s %s: %s", path, e.record, e.reason)
        yield pvalue.TaggedOutput("dead_letter", errors.BadRecord(path, e.record, e.reason).to_json())
        return
    except OSError as e:
        counters["bad_records"].inc()
        yield pvalue.TaggedOutput("dead_letter", errors.BadRecord(path, "file", f"unreadable: {e}").to_json())
        return
    counters["decoded_fallback" if book.fell_back else "decoded_utf8"].inc()
    counters["headings_dropped"].inc(book.headings_dropped)
    counters["gutenberg_headers_stripped"].inc(int(book.header_stripped))
    counters["gutenberg_footers_stripped"].inc(int(book.footer_stripped))
    for name in ("control_chars_removed", "transcriber_notes_dropped", "front_matter_dropped",
                 "list_blocks_dropped", "verse_paragraphs_split", "long_paragraphs_split"):
        counters[name].inc(getattr(book, name))
    for record, reason in book.bad_paragraphs:
        counters["bad_records"].inc()
        counters["passages_set_aside"].inc()
        log.warning("dead letter: %s %s: %s", path, record, reason)
        yield pvalue.TaggedOutput("dead_letter", errors.BadRecord(path, record, reason).to_json())
    if book.passages:
        counters["documents"].inc()
        counters["passages"].inc(len(book.passages))
        log.debug("book %s: %d passages (%s)", os.path.basename(path), len(book.passages), book.encoding)
        yield book_record(file, book)


def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `ExtractBooksConfig` field, help from its docstring."""
    return jobs.config_parser(__doc__.splitlines()[0], ExtractBooksConfig)


def select_inputs(config: ExtractBooksConfig) -> tuple[list[storage.InputFile], list[str]]:
    """(books sorted by path, excluded paths). Raises ValueError naming the files when two
    books would get the same doc_id (e.g. the same name below two comma-separated inputs)."""
    files = storage.expand_input_files(config.input)
    excluded = {f.path for f in files if is_excluded(f.path, config.exclude)}
    # A file two patterns both name is one book.
    selected = sorted({f.path: f for f in files if f.path not in excluded}.values(),
                      key=lambda f: f.path)
    by_id: dict[str, str] = {}
    for f in selected:
        if (other := by_id.setdefault(doc_id_for(f), f.path)) != f.path:
            raise ValueError(f"{other} and {f.path} would both be document {doc_id_for(f)!r}: "
                             "book paths below their input folders must be unique")
    if not selected:
        raise FileNotFoundError(f"--input {config.input!r}: no book files left after --exclude")
    return selected, sorted(excluded)


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `ExtractBooksConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    config = jobs.config_from_args(args, ExtractBooksConfig(input=args.input, output=args.output))
    return run(config, beam_args)


def run(config: ExtractBooksConfig, beam_args: Sequence[str] = ()) -> dict:
    """Extract the books of `config.input` into `config.output`; returns the manifest."""
    jobs.configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    config = waves.resolve_wave_mb(config, options, waves.LOCAL_SHARD_WAVE_MB)
    files, excluded = select_inputs(config)
    sizes = {f.path: f.size_bytes for f in files}  # from the listing: no lookup per file
    total = sum(sizes.values())
    num_waves, num_shards = waves.shard_plan(total, config.wave_mb, config.num_shards,
                                             parquet_io.auto_num_shards(total))
    log.info("extract_books: %d books (%d excluded), %d shard(s), %d wave(s)",
             len(files), len(excluded), num_shards, num_waves)
    log.debug("extract_books config: %s", dataclasses.asdict(config))
    jobs.warn_if_too_large_for_local_runner(log, NAMESPACE, total // num_waves, options)
    pipeline = waves.run_to_shards(options, files, ("Extract", ExtractBookFn(config)),
                                   config.output, (num_waves, num_shards), PREFIX,
                                   DOCUMENT_SCHEMA)
    if jobs.is_dry_run(options):
        return jobs.dry_run_summary(NAMESPACE, pipeline)
    counts = parquet_io.query_counters(pipeline.result, NAMESPACE, COUNTERS)
    return finish(config, [f.path for f in files], excluded, sizes, num_shards, counts)


def finish(config: ExtractBooksConfig, files: list[str], excluded: list[str],
           sizes: dict[str, int], num_shards: int, counts: dict[str, int]) -> dict:
    """After the pipeline: complete the shard set, check counts against rows, write manifest."""
    shards = parquet_io.finish_shards(config.output, PREFIX, num_shards, DOCUMENT_SCHEMA)
    dead_letters = parquet_io.finish_dead_letters(config.output, counts["bad_records"] > 0)
    parquet_io.check_rows_written(config.output, shards, counts["documents"])
    counts = {**counts, "files_excluded": len(excluded)}
    if counts["documents"] == 0:
        raise jobs.nothing_produced(f"documents ({len(files)} file(s) read)", config.input,
                                    counts["bad_records"], dead_letters)
    manifest = jobs.stage_manifest(
        NAMESPACE, config, parquet_io.content_hash(config), OUTPUT_VERSION, counts=counts,
        inputs=[{"path": f, "bytes": sizes[f]} for f in files],
        outputs=parquet_io.output_records(config.output, [*shards, dead_letters]),
        num_shards=num_shards, excluded_inputs=excluded)
    return jobs.publish_manifest(log, NAMESPACE, manifest, counts, dead_letters)


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
