"""The extraction jobs in waves (pipelines/waves.py): documents scattered by shard, each shard
written whole after the pipeline: the same bytes as one pipeline with as many shards."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import extract_books, extract_documents, waves

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"


def _outputs(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def test_books_in_waves_are_the_bytes_of_one_pipeline(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    for path in sorted((SAMPLE / "books").iterdir()):
        (books / path.name).write_bytes(path.read_bytes())
    (books / "broken.txt").write_bytes(bytes(range(256)) * 64)  # binary: a dead letter
    one = extract_books.main(["--input", str(books), "--output", str(tmp_path / "one"),
                              "--num_shards", "3", "--wave_mb", "0"])
    many = extract_books.main(["--input", str(books), "--output", str(tmp_path / "many"),
                               "--num_shards", "3", "--wave_mb", "0.5"])
    assert _outputs(tmp_path / "many") == _outputs(tmp_path / "one")
    assert many["counts"] == one["counts"] and one["counts"]["bad_records"] == 1
    assert many["config"]["wave_mb"] == 0.5 and one["config"]["wave_mb"] == 0
    assert not (tmp_path / "many" / waves.SCRATCH).exists()
    auto = extract_books.main(["--input", str(books), "--output", str(tmp_path / "auto"),
                               "--wave_mb", "0.5"])
    assert auto["num_shards"] == waves.wave_count(sum(
        p.stat().st_size for p in books.iterdir()), 0.5) > 1


def test_documents_in_waves_are_the_bytes_of_one_pipeline(tmp_path):
    lines = [json.dumps({"id": i, "text": f"Document {i}. " + "Some words here. " * (i % 50)})
             for i in range(3000)]
    lines[7] = "{not json"
    source = tmp_path / "news.jsonl"
    source.write_text("\n".join(lines) + "\n")
    common = ["--input", str(source), "--kind", "jsonl", "--name", "news", "--id_field", "id",
              "--num_shards", "4"]
    one = extract_documents.main([*common, "--output", str(tmp_path / "one"), "--wave_mb", "0"])
    many = extract_documents.main([*common, "--output", str(tmp_path / "many"),
                                   "--wave_mb", "0.4"])
    assert _outputs(tmp_path / "many") == _outputs(tmp_path / "one")
    assert many["counts"] == one["counts"]
    assert many["sources"]["news"]["documents"] == 2999


def test_fewer_shards_than_waves_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--num_shards 1 is fewer than the \d+ waves of "
                                         r"--wave_mb 0.5"):
        extract_books.main(["--input", str(SAMPLE / "books"), "--output", str(tmp_path / "x"),
                            "--num_shards", "1", "--wave_mb", "0.5"])
