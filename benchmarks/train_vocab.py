"""Vocabulary training: our job vs the stock `tokenizers` recipe, in one process, same input.

    .venv/bin/python benchmarks/train_vocab.py [--input DIR] [--vocab_size N] [--repeat R]

The peer is what `tokenizers`' `BertWordPieceTokenizer.train` does: a WordPiece trainer fed the
raw lines, with BERT's normaliser and pre-tokenizer, on one machine. Ours counts words first
(a Beam combine in the job; plain Python here for the in-process row) and trains on the exact
counts. Prints seconds, the ratio, the vocabulary quality on the corpus (word pieces per word),
and whether two runs give the same vocabulary.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from common.tokenization import PAD, read_vocab
from pipelines import train_vocab
from pipelines.vocab import wordpiece

DEFAULT_INPUT = Path(__file__).resolve().parents[2] / "shared" / "data" / "books"


def read_lines(folder: Path) -> list[str]:
    lines = []
    for path in sorted(folder.glob("*.txt")):
        lines += [t for t in train_vocab.text_file_texts(str(path)) if isinstance(t, str)]
    return lines


def peer_train(lines: list[str], config: wordpiece.VocabConfig) -> list[str]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from common.tokenization import SPECIAL_TOKENS, bert_normalizer

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = bert_normalizer(config.do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The same number of learned tokens as ours: ours also holds the [unused*] tokens.
    trainer = trainers.WordPieceTrainer(
        vocab_size=config.vocab_size - config.num_unused, min_frequency=config.min_frequency, show_progress=False,
        limit_alphabet=config.limit_alphabet, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(lines, trainer, length=len(lines))
    return [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]


def ours_in_process(lines: list[str], config: wordpiece.VocabConfig) -> list[str]:
    counts = wordpiece.count_words(lines, wordpiece.word_splitter(config.do_lower_case))
    return wordpiece.train_vocab(counts, config).tokens


def timed(fn, *args):
    """(result, wall seconds, CPU seconds of this process over all its threads)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - start, time.process_time() - cpu


def digest(tokens: list[str]) -> str:
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, for determinism")
    args = parser.parse_args(argv)
    config = wordpiece.VocabConfig(vocab_size=args.vocab_size)
    lines = read_lines(args.input)
    counts = wordpiece.count_words(lines, wordpiece.word_splitter(True))
    print(f"input: {args.input} ({len(lines)} lines, {sum(counts.values())} words, "
          f"{len(counts)} unique); vocab_size {args.vocab_size}")

    rows = {}
    for name, fn in [("peer: tokenizers trainer on raw lines", peer_train),
                     ("ours: count + train on counts (in process)", ours_in_process)]:
        runs = [timed(fn, lines, config) for _ in range(args.repeat)]
        rows[name] = runs
    with tempfile.TemporaryDirectory() as tmp:
        job_argv = ["--input", str(args.input), "--output", tmp, "--no_progress",
                    "--vocab_size", str(args.vocab_size)]
        job_runs = []
        for _ in range(args.repeat):
            _, seconds, cpu = timed(train_vocab.main, job_argv)
            job_runs.append((read_vocab(tmp), seconds, cpu))
        rows["ours: Beam job (DirectRunner), end to end"] = job_runs

    peer_runs = rows["peer: tokenizers trainer on raw lines"]
    peer_seconds, peer_cpu = min(r[1] for r in peer_runs), min(r[2] for r in peer_runs)
    print(f"\n{'variant':46s} {'wall s':>7s} {'vs peer':>8s} {'cpu s':>7s} {'vs peer':>8s} "
          f"{'pieces/word':>11s} {'same vocab each run':>20s}")
    for name, runs in rows.items():
        tokens = runs[0][0]
        best, cpu = min(r[1] for r in runs), min(r[2] for r in runs)
        stats = wordpiece.tokenization_stats(tokens, counts, True)
        same = len({digest(r[0]) for r in runs}) == 1
        print(f"{name:46s} {best:7.2f} {best / peer_seconds:7.2f}x {cpu:7.2f} "
              f"{cpu / peer_cpu:7.2f}x {stats['tokens_per_word']:11.4f} {same!s:>20s}")
    ours = rows["ours: count + train on counts (in process)"][0][0]
    assert ours[0] == PAD and len(ours) == args.vocab_size
    return 0


if __name__ == "__main__":
    sys.exit(main())
