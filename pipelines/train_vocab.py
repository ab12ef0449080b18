"""Beam job: train BERT's WordPiece vocabulary from the corpus.

    beam run pipelines/train_vocab.py --input out/corpus --output out/vocab --vocab_size 8000

`--kind bpe` trains a byte-level BPE instead (`pipelines/vocab/bpe.py`; the folder then holds
`merges.txt` too, and `transformers.AutoTokenizer` loads it).

Input: corpus Parquet (`sentences` column), documents Parquet (`passages` when `sentences` is
absent) or plain text files (one sentence or paragraph per line; `.gz`/`.bz2` are decompressed).
The word counting is a Beam combine over the whole corpus; only the trainer step, fed the exact
counts, runs on one worker. Output (a folder `transformers.BertTokenizerFast` loads):
`vocab.txt`, `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`,
`word_counts.tsv` (word TAB count, by count then word), the bad records in
`dead_letter/dead_letter-00000-of-00001.jsonl`, and `manifest.json`, written last.
See `pipelines/vocab/wordpiece.py` for the layout and the determinism. The trainer's worker holds every
unique word in memory (BERT's 3.3B-word corpus: tens of millions, a few GB).
"""
from __future__ import annotations

import argparse
import logging
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.metrics import Metrics

from common import errors, storage
from common.manifest import Manifest
from common.tokenization import MERGES_NAME, merges_sha256, save_tokenizer_folder
from pipelines import jobs, parquet_io
from pipelines.disk_full import disk_full_reported
from pipelines.vocab import kinds
from pipelines.vocab.wordpiece import VocabConfig, count_words

logger = logging.getLogger(__name__)

DEAD = "dead"
TEXT_COLUMNS = ("sentences", "passages")  # first present wins
PARQUET_BATCH_ROWS = 256
WORD_COUNTS_NAME = "word_counts.tsv"
WRITTEN = (r"vocab\.txt|merges\.txt|tokenizer(_config)?\.json|special_tokens_map\.json"
           r"|word_counts\.tsv|manifest\.json|dead_letter/dead_letter-00000-of-00001\.jsonl")
"""The files this job writes, as paths below its output (`jobs.remove_stale_temporaries`)."""


@dataclass(frozen=True, kw_only=True)
class TrainVocabConfig(VocabConfig):
    """One train_vocab run: the settings (`VocabConfig`, the flow's `vocab` section) and where
    it reads and writes. The manifest records the settings alone."""
    input: str
    """The texts: corpus or documents Parquet, or text files; a file, glob or folder (local or
    gs://...), several separated by commas."""
    output: str
    """The vocabulary folder."""
    progress: bool = True
    """Progress bars from the trainer (the flow turns them off)."""


def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `VocabConfig` field, help from its docstring."""
    parser = jobs.config_parser(__doc__.strip().splitlines()[0], VocabConfig, aliases=[
        ("--cased", "do_lower_case", "false",
         "keep case and accents (default: lower-case and strip accents)")])
    parser.add_argument("--no_progress", action="store_true",
                        help="no progress bars from the trainer")
    return parser


# --- reading texts -------------------------------------------------------------------------

def parquet_texts(path: str) -> Iterator[str | errors.BadRecord]:
    """The texts of a corpus or documents Parquet file, row group by row group."""
    import pyarrow.parquet as pq

    with storage.open_read(path, "rb") as f:
        parquet = pq.ParquetFile(f)
        names = parquet.schema_arrow.names
        column = next((c for c in TEXT_COLUMNS if c in names), None)
        if column is None:
            yield errors.BadRecord(path, "file", f"no column {' or '.join(TEXT_COLUMNS)} "
                                               f"(columns: {names})")
            return
        row = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column]):
            for texts in batch.column(0).to_pylist():
                if texts is None:
                    yield errors.BadRecord(path, f"row {row}", f"null {column}")
                for i, text in enumerate(texts or ()):
                    if text is None:
                        yield errors.BadRecord(path, f"row {row} {column}[{i}]", "null text")
                    else:
                        yield text
                row += 1


def open_text_file(path: str):
    """A binary stream of the file, decompressed by its extension (`.bz2`, `.gz`).

    Python's own decompressors raise on a truncated file; Beam's `CompressedFile` returns an
    early end of file instead, which would lose the rest silently.
    """
    import bz2
    import gzip

    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.endswith(".bz2"):
        return bz2.open(raw)
    if path.endswith(".gz"):
        return gzip.open(raw)
    return raw


def text_file_texts(path: str) -> Iterator[str | errors.BadRecord]:
    """The lines of a text file (compression from the extension); bad UTF-8 lines set aside."""
    with open_text_file(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield errors.BadRecord(path, f"line {number}", f"invalid UTF-8: {e}")


def drop_text_renderings(files: list[str]) -> list[str]:
    """Leave out `X.txt` when `X.parquet` is an input too: build_corpus's `--text_output` writes
    each shard again as text beside it, and counting both would count every word twice."""
    parquet_stems = {f[:-len(".parquet")] for f in files if f.endswith(".parquet")}
    return [f for f in files if not (f.endswith(".txt") and f[:-len(".txt")] in parquet_stems)]


def file_texts(path: str) -> Iterator[str | errors.BadRecord]:
    """The texts and bad records of one input file, Parquet or text by its extension."""
    reader = parquet_texts if path.endswith(".parquet") else text_file_texts
    num_items = 0
    try:
        for item in reader(path):
            num_items += 1
            yield item
    except (OSError, EOFError, ValueError, zlib.error) as e:
        # A corrupt file (truncated bz2, bad Parquet footer): what came before the break is
        # kept, the rest of the file is set aside, and the other files go on.
        yield errors.BadRecord(path, f"rest of file after {num_items} records",
                             f"unreadable: {type(e).__name__}: {e}")


class ReadTexts(beam.DoFn):
    """File path -> its texts; bad records to the `DEAD` output."""

    def __init__(self) -> None:
        self.texts = Metrics.counter("train_vocab", "texts")
        self.bad_records = Metrics.counter("train_vocab", "bad_records")

    def process(self, path: str):
        for item in file_texts(path):
            if isinstance(item, errors.BadRecord):
                self.bad_records.inc()
                logger.warning("bad record: %s %s: %s", item.file, item.record, item.reason)
                yield beam.pvalue.TaggedOutput(DEAD, item.to_json())
            else:
                self.texts.inc()
                yield item


class CountWordsInBatch(beam.DoFn):
    """A batch of texts -> (word, count) pairs for it: counting in the mapper cuts the shuffle."""

    def __init__(self, do_lower_case: bool, kind: str = "wordpiece") -> None:
        self.do_lower_case = do_lower_case
        self.kind = kind
        self.words = Metrics.counter("train_vocab", "words")

    def setup(self) -> None:
        self.split = kinds()[self.kind].word_splitter(self.do_lower_case)

    def process(self, texts: list[str]):
        counts = count_words(texts, self.split)
        self.words.inc(sum(counts.values()))
        yield from counts.items()


class CountWords(beam.PTransform):
    """Texts -> exact (word, count) over the whole collection (the kind's normaliser and
    pre-tokenizer: BERT's, or the byte-level BPE's)."""

    def __init__(self, do_lower_case: bool, kind: str = "wordpiece") -> None:
        super().__init__()
        self.do_lower_case = do_lower_case
        self.kind = kind

    def expand(self, texts):
        return (texts
                | "Batch" >> beam.BatchElements(min_batch_size=64, max_batch_size=2048)
                | "CountBatch" >> beam.ParDo(CountWordsInBatch(self.do_lower_case, self.kind))
                | "Sum" >> beam.CombinePerKey(sum))


# --- the single-worker step ----------------------------------------------------------------

def write_outputs(word_count_pairs: list[tuple[str, int]], bad_records: list[str], *,
                  output: str, config: VocabConfig, inputs: list[str], input_arg: str,
                  num_texts: int, show_progress: bool) -> str:
    """Train on the exact counts and write the vocabulary folder; manifest.json last.

    No words at all: only the dead letters are written (run() then fails naming them); raising
    here would bury the message in the runner's traceback."""
    word_counts = dict(word_count_pairs)
    if not word_counts:
        logger.error("no words in %d file(s) (%d texts, %d bad records): %s", len(inputs),
                     num_texts, len(bad_records), ", ".join(inputs[:5]))
        storage.makedirs(output)
        parquet_io.write_dead_letters(output, bad_records)
        return ""
    logger.info("training %s (%d entries) on %d unique words, %d in all", config.kind,
                config.vocab_size, len(word_counts), sum(word_counts.values()))
    started = time.monotonic()
    result = kinds()[config.kind].train_vocab(word_counts, config, show_progress=show_progress)
    train_seconds = time.monotonic() - started
    storage.makedirs(output)
    parquet_io.write_dead_letters(output, bad_records)
    ranked = sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    storage.atomic_write_text(storage.join(output, WORD_COUNTS_NAME),
                              "".join(f"{w}\t{c}\n" for w, c in ranked))
    save_tokenizer_folder(result.tokens, output, do_lower_case=config.do_lower_case,
                          merges=getattr(result, "merges", None))
    vocab_sha256 = storage.sha256_file(storage.join(output, "vocab.txt"))
    merges = merges_sha256(output)  # a BPE vocabulary's other half (absent for WordPiece)
    manifest = Manifest(
        stage="train_vocab", config=config.resolved(),
        # What decides the content: the config and the inputs (not where the output goes).
        config_hash=storage.config_hash({**config.resolved(), "input": input_arg}),
        inputs=inputs, sections={
            "vocab_size": len(result.tokens),
            "vocab_sha256": vocab_sha256,
            **({"merges_sha256": merges} if merges else {}),
            "num_texts": num_texts,
            "num_bad_records": len(bad_records),
            "word_counts_sha256": storage.sha256_file(storage.join(output, WORD_COUNTS_NAME)),
            "train_seconds": round(train_seconds, 3),
            **result.stats})
    manifest.write(output)
    logger.info("vocabulary of %d tokens (%d learned) written to %s; sha256 %s",
                len(result.tokens), result.stats["num_learned_tokens"], output, vocab_sha256)
    return vocab_sha256


def withdraw_merges(output: str) -> None:
    """Before a re-run: remove a `merges.txt` an earlier BPE run left, which would make a
    WordPiece folder read as a BPE one (`common.tokenization.vocab_kind`)."""
    import contextlib
    import os

    path = storage.join(output, MERGES_NAME)
    if storage.is_remote(path):
        from apache_beam.io.filesystems import FileSystems
        if FileSystems.exists(path):
            FileSystems.delete([path])
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `TrainVocabConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    base = TrainVocabConfig(input=args.input, output=args.output, progress=not args.no_progress)
    return run(jobs.config_from_args(args, base), beam_args)


def run(config: TrainVocabConfig, beam_args: Sequence[str] = ()) -> dict:
    """Train the vocabulary of the texts at `config.input` (a file, glob or folder) into
    `config.output`; returns the manifest written to `<output>/manifest.json`."""
    jobs.configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    input, output, progress = config.input, config.output, config.progress
    config = jobs.settings_of(config, VocabConfig)  # what the manifest records and hashes
    inputs = drop_text_renderings(storage.expand_inputs(input))
    logger.info("train_vocab: %d input file(s) -> %s", len(inputs), output)
    logger.debug("train_vocab config: %s", config.resolved())
    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.withdraw_manifest(output)
        withdraw_merges(output)
        jobs.remove_stale_temporaries(output, WRITTEN)
    with (disk_full_reported(output),
          beam.Pipeline(runner=jobs.local_runner(options), options=options) as p):
        read = (p
                | "Files" >> beam.Create(inputs)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(ReadTexts()).with_outputs(DEAD, main="texts"))
        num_texts = read.texts | "CountTexts" >> beam.combiners.Count.Globally()
        word_counts = read.texts | "CountWords" >> CountWords(config.do_lower_case, config.kind)
        _ = (word_counts
             | "Gather" >> beam.combiners.ToList()
             | "Train" >> beam.Map(
                 write_outputs, beam.pvalue.AsList(read[DEAD]), output=output,
                 config=config, inputs=inputs, input_arg=input,
                 num_texts=beam.pvalue.AsSingleton(num_texts), show_progress=progress))
    if dry_run:
        return jobs.dry_run_summary("train_vocab", p)
    manifest = storage.read_manifest(output)
    dead_letters = parquet_io.dead_letter_path(output)
    if manifest is None:
        with storage.open_read(dead_letters) as f:
            num_bad = sum(1 for line in f if line.strip())
        raise jobs.nothing_produced(f"words ({len(inputs)} file(s): {', '.join(inputs[:5])})",
                                    input, num_bad, dead_letters)
    jobs.warn_dead_letters(logger, "train_vocab", manifest["num_bad_records"], dead_letters)
    return manifest


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main("train_vocab", main))
