"""Every job's Dataflow graph builds here: DataflowRunner with --dry_run=True --no_auth translates
and pickles the whole pipeline (no cloud account, nothing runs), and the job ends cleanly,
saying so, without touching its output folder. A change that breaks Dataflow translation fails
here, not in a user's cloud project. Needs the `gcp` extra (apache-beam[gcp])."""
from __future__ import annotations

from pathlib import Path

import pytest

from flows import audit_contamination as audit_cli
from pipelines import (
    build_corpus,
    decontaminate,
    extract_books,
    extract_documents,
    extract_wikipedia,
    make_shards,
    train_vocab,
)

pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient",
                    reason="needs the gcp extra: pip install 'apache-beam[gcp]==2.77.0'")

REPO = Path(__file__).resolve().parents[2]
DATAFLOW = ["--runner=DataflowRunner", "--dry_run=True", "--no_auth", "--project=test-project",
            "--region=us-central1", "--staging_location=gs://test-bucket/staging",
            "--temp_location=gs://test-bucket/tmp", "--sdk_location=container"]
BOOK = ("It was a dark and stormy night. The rain fell in torrents.\n\n"
        "Then it stopped, and the moon came out over the hills.\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A real documents folder and corpus folder (local runner) for the later jobs' inputs."""
    root = tmp_path_factory.mktemp("dataflow")
    (root / "books").mkdir()
    (root / "books" / "tale.txt").write_text(BOOK)
    extract_books.main(["--input", str(root / "books"), "--output", str(root / "docs")])
    build_corpus.main(["--input", str(root / "docs"), "--output", str(root / "corpus")])
    return {"root": root, "books": root / "books", "docs": root / "docs",
            "corpus": root / "corpus"}


def _check(summary: dict, stage: str, transforms: set[str], output: Path) -> None:
    assert summary["stage"] == stage and summary["dry_run"] is True
    assert summary["runner"] == "DataflowRunner"
    assert transforms <= set(summary["top_level_transforms"]), summary["top_level_transforms"]
    assert not output.exists()  # nothing ran: no folder, no manifest


def test_extract_wikipedia_graph_builds(tmp_path):
    dump = REPO / "data" / "sample" / "wiki" / "enwiki-sample-pages-articles.xml.bz2"
    summary = extract_wikipedia.main(["--input", str(dump), "--output", str(tmp_path / "out"),
                                     *DATAFLOW])
    _check(summary, "extract_wikipedia", {"Splits", "Extract", "Finalise"}, tmp_path / "out")


def test_extract_books_graph_builds(corpus, tmp_path):
    summary = extract_books.main(["--input", str(corpus["books"]),
                                 "--output", str(tmp_path / "out"), *DATAFLOW])
    _check(summary, "extract_books", {"Files", "Extract", "WriteDocuments", "WriteDeadLetters"},
           tmp_path / "out")


def test_extract_documents_graph_builds(tmp_path):
    notes = REPO / "data" / "sample" / "jsonl"
    summary = extract_documents.main(["--input", str(notes), "--kind", "jsonl", "--name", "poems",
                                      "--output", str(tmp_path / "out"), *DATAFLOW])
    _check(summary, "extract_documents", {"Files", "Read", "WriteDocuments", "WriteDeadLetters"},
           tmp_path / "out")


def test_build_corpus_graph_builds_and_leaves_an_earlier_output_alone(corpus):
    before = {p: p.read_bytes() for p in corpus["corpus"].rglob("*") if p.is_file()}
    summary = build_corpus.main(["--input", str(corpus["docs"]),
                                "--output", str(corpus["corpus"]), *DATAFLOW])
    assert summary["stage"] == "build_corpus" and summary["dry_run"] is True
    assert {"Read", "Build", "WriteCorpus", "WriteDuplicates"} <= set(
        summary["top_level_transforms"])
    after = {p: p.read_bytes() for p in corpus["corpus"].rglob("*") if p.is_file()}
    assert after == before and any(p.name == "manifest.json" for p in after)


def test_train_vocab_graph_builds(corpus, tmp_path):
    summary = train_vocab.main(["--input", str(corpus["corpus"]),
                               "--output", str(tmp_path / "out"), *DATAFLOW])
    _check(summary, "train_vocab", {"Read", "CountWords", "Train"}, tmp_path / "out")


def test_make_shards_graph_builds(corpus, minilm_dir, tmp_path):
    summary = make_shards.main(["--input", str(corpus["corpus"]), "--vocab", str(minilm_dir),
                               "--output", str(tmp_path / "out"), *DATAFLOW])
    _check(summary, "make_shards", {"CollectInfos", "SaveInfos"}, tmp_path / "out")
    with pytest.raises(ValueError, match="--dry_run .* needs --mode=scalable"):
        make_shards.main(["--input", str(corpus["corpus"]), "--vocab", str(minilm_dir),
                         "--output", str(tmp_path / "out"), "--mode=reference", *DATAFLOW])


def test_audit_contamination_and_decontaminate_graphs_build(corpus, tmp_path):
    audit = ["--eval_data", str(REPO / "data" / "sample"), "--tasks", "rte"]
    summary = audit_cli.main(["--input", str(corpus["corpus"]),
                              "--output", str(tmp_path / "out"), *audit, *DATAFLOW])
    _check(summary, "audit_contamination", {"Read", "Audit", "WriteOverlaps", "WritePassages"},
           tmp_path / "out")
    audit_cli.main(["--input", str(corpus["corpus"]),
                    "--output", str(tmp_path / "audit"), *audit])  # a real audit
    summary = decontaminate.main(["--input", str(corpus["corpus"]), "--audit",
                                  str(tmp_path / "audit"), "--output", str(tmp_path / "clean"),
                                  *DATAFLOW])
    _check(summary, "decontaminate", {"Read", "Remove", "WriteCorpus"}, tmp_path / "clean")
