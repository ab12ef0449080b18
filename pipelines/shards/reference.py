"""make_shards' reference mode (`--mode reference`): one process, one random stream, exactly
the instances of BERT's reference generator (`create_instances_reference`) over the whole input,
written by the scalable mode's writers.

It holds every document in memory, as the reference does: it is the exactness check of the
algorithm (tests compare it with the reference's output), not the way to make shards of a large
corpus (the scalable mode, in waves on the local runner).
"""
from __future__ import annotations

import logging
import sys

import numpy as np

from common import errors, storage
from pipelines.shards import packing, shard_files
from pipelines.shards.batches import RowGroup, split_num_shards, write_group
from pipelines.shards.config import ShardsConfig
from pipelines.shards.instances import Vocab, create_instances_reference
from pipelines.shards.reading import (
    corpus_parquet,
    is_parquet,
    open_ends,
    parse_reference_text,
    split_of,
    tokenize_documents,
)

logger = logging.getLogger("make_shards")


def read_all_documents(files: list[storage.InputFile], tokenizer, validation_fraction: float
                       ) -> tuple[dict[str, list[list[np.ndarray]]], list[errors.BadRecord], int]:
    """Every document of every file, in input order, split by doc_id hash; and bad records.

    Text files are read as the reference reads them: as one stream of lines, so a document
    that reaches the end of a file without a blank line goes on in the next one. A text
    document's id is `<path below the input folder>:<i>` (a top-level file: its bare name).
    """
    from common.logs import progress

    records: list[tuple[str, list[str]]] = []  # (doc_id, sentences), in input order
    bad: list[errors.BadRecord] = []
    continues = False  # the last text file ended inside a document
    for file in progress(files, desc="read", unit="file", file=sys.stderr):
        path = file.path
        try:
            with storage.open_read(path, "rb") as f:
                if is_parquet(path):
                    file_records = _parquet_records(corpus_parquet(f, path), path, bad)
                    continues = False
                else:
                    data = f.read()
                    file_docs, file_bad = parse_reference_text(data, path)
                    bad += file_bad
                    name = file.name
                    file_records = [(f"{name}:{i}", d) for i, d in enumerate(file_docs)]
                    ends = open_ends(data)
                    if ends and continues and ends[0]:  # its first document is the last one's end
                        records[-1] = (records[-1][0], records[-1][1] + file_records.pop(0)[1])
                    continues = ends[1] if ends else continues
        except Exception as e:  # noqa: BLE001 - any unreadable file is a dead letter
            bad.append(errors.BadRecord(path, "file", f"{type(e).__name__}: {e}"))
            continues = False
            continue
        records += file_records
    docs: dict[str, list] = {"train": [], "validation": []}
    empty = 0
    for start in range(0, len(records), 512):  # batched WordPiece, bounded memory
        chunk = records[start:start + 512]
        for (doc_id, _), (tokens, lengths) in zip(
                chunk, tokenize_documents(tokenizer, [s for _, s in chunk])):
            if len(lengths) == 0:
                empty += 1
                continue
            docs[split_of(doc_id, validation_fraction)].append(
                np.split(tokens, np.cumsum(lengths)[:-1]))
    return docs, bad, empty


def _parquet_records(parquet, path: str, bad: list[errors.BadRecord]) -> list[tuple[str, list[str]]]:
    """(doc_id, sentences) of every row of a corpus Parquet file; a null row goes to `bad`."""
    table = parquet.read(columns=["doc_id", "sentences"])
    records = []
    for row, (doc_id, sents) in enumerate(zip(table.column(0).to_pylist(),
                                              table.column(1).to_pylist())):
        if doc_id is None or sents is None:
            bad.append(errors.BadRecord(path, f"row {row}", "null doc_id or sentences"))
        else:
            records.append((doc_id, sents))
    return records


def run_reference(files: list[storage.InputFile], output: str, vocab_path: str,
                  config: ShardsConfig) -> tuple[list[shard_files.ShardInfo], dict]:
    """One process, one random stream: `create_instances_reference`, then the same writers."""
    from common.logs import progress
    from common.tokenization import load_tokenizer, read_vocab, vocab_kind

    vocab_tokens = read_vocab(vocab_path)
    vocab = Vocab.from_tokens(vocab_tokens, vocab_kind(vocab_path))
    tokenizer = load_tokenizer(vocab_path, config.do_lower_case, split_special_tokens=True)
    docs, bad, empty = read_all_documents(files, tokenizer, config.validation_fraction)
    _write_dead_letters(output, bad)
    infos = []
    counters = {"documents": sum(len(d) for d in docs.values()), "empty_documents": empty,
                "bad_records": len(bad), "instances": 0,
                **{f"documents_{split}": len(docs[split]) for split in shard_files.SPLITS}}
    for split in shard_files.SPLITS:
        if not docs[split]:
            continue
        logger.info("%s: creating instances from %d documents (one random stream)", split,
                    len(docs[split]))
        instances = create_instances_reference(docs[split], vocab, config)
        counters["instances"] += len(instances)
        n = len(instances)
        batch = packing.InstanceBatch.from_instances(
            instances, np.arange(n, dtype=np.uint64), np.zeros(n), np.zeros(n), np.arange(n))
        if config.pack:
            order, sizes = packing.rows_order(packing.pack_lengths(batch.lengths,
                                                                   config.max_seq_length))
            group = RowGroup(batch.take(order), sizes)
        else:
            group = RowGroup(batch, np.ones(n, np.int64))
        # The reference order is already shuffled (its final rng.shuffle); like the reference
        # writer, deal it round robin over the output files.
        num_shards = split_num_shards([group.stats()], config, len(vocab_tokens))
        shard, _ = shard_files.assign_round_robin(np.arange(len(group.row_sizes)), num_shards)
        for s in progress(range(num_shards), desc=f"write {split}", unit="shard", file=sys.stderr):
            infos.append(write_group(output, split, s, group.take_rows(np.flatnonzero(shard == s)),
                                     config, vocab_tokens))
    return infos, counters


def _write_dead_letters(output: str, bad: list[errors.BadRecord]) -> None:
    path = storage.join(output, *f"{shard_files.DEAD_LETTERS}.jsonl".split("/"))
    storage.atomic_write_text(path, "".join(b.to_json() + "\n" for b in bad))
