"""What the jobs remove on start (only their own temporaries) and how a full disk is read from
the text of a Beam worker's error."""
from __future__ import annotations

from pathlib import Path

from common import storage
from pipelines import disk_full, jobs, parquet_io, train_vocab


def plant(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")


def left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_parquet_jobs_remove_their_temporaries_only(tmp_path):
    plant(tmp_path, [
        ".documents-00000-of-00002.parquet.abcd_123.tmp",  # ours
        ".manifest.json.zz99yy88.tmp",  # ours
        "dead_letter/.dead_letter-00000-of-00001.jsonl.q1w2e3r4.tmp",  # ours
        ".documents-00000-of-00002.parquet.abc.tmp",  # not mkstemp's 8 characters
        ".corpus-00000-of-00002.parquet.abcd1234.tmp",  # another job's prefix
        "notes/.documents-00000-of-00002.parquet.abcd1234.tmp",  # another folder
        "documents.tmp", "keep.txt"])
    parquet_io.clear_previous_output(str(tmp_path), "documents")
    assert left(tmp_path) == [".corpus-00000-of-00002.parquet.abcd1234.tmp",
                              ".documents-00000-of-00002.parquet.abc.tmp", "documents.tmp",
                              "keep.txt", "notes/.documents-00000-of-00002.parquet.abcd1234.tmp"]


def test_train_vocab_names_and_beam_sink_folders(tmp_path):
    plant(tmp_path, [".vocab.txt.abcdefgh.tmp", ".tokenizer_config.json.12345678.tmp",
                     ".vocab.json.abcdefgh.tmp", "dead_letter/beam-temp-other-" + "a" * 32 + "/x",
                     "dead_letter/beam-temp-make_shards-" + "b" * 32 + "/x"])
    removed = jobs.remove_stale_temporaries(str(tmp_path), train_vocab.WRITTEN,
                                            beam_sinks=["dead_letter/make_shards"])
    assert sorted(removed) == [".tokenizer_config.json.12345678.tmp", ".vocab.txt.abcdefgh.tmp",
                               "dead_letter/beam-temp-make_shards-" + "b" * 32]
    assert left(tmp_path) == [".vocab.json.abcdefgh.tmp",
                              "dead_letter/beam-temp-other-" + "a" * 32 + "/x"]


def test_temporary_target_reads_atomic_open_names(tmp_path):
    target = tmp_path / "train-000001.tar"
    with storage.atomic_open(str(target)) as f:
        f.write(b"x")
        (temporary,) = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert storage.temporary_target(temporary) == "train-000001.tar"
    assert storage.temporary_target("train-000001.tar") is None


def test_disk_full_read_from_worker_error_text(tmp_path):
    ours = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            f"RuntimeError: common.errors.DiskFullError: no space left on the device writing "
            f"{tmp_path}/train-000003.tar: it needs 184.3 KB, 65.5 KB left there "
            "[while running 'WriteShards/Write']\n")
    found = disk_full.disk_full_in_text(ours)
    assert (found.path, str(found).split(": it needs ")[1].split(",")[0]) == (
        f"{tmp_path}/train-000003.tar", "184.3 KB")
    pyarrow = ("OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space "
               "left on device [while running 'WriteCorpus/Write']")
    assert disk_full.disk_full_in_text(pyarrow, str(tmp_path)).path == str(tmp_path)
    python = f"OSError: [Errno 28] No space left on device: '{tmp_path}/x.jsonl'"
    assert disk_full.disk_full_in_text(python).path == f"{tmp_path}/x.jsonl"
    assert disk_full.disk_full_in_text("OSError: [Errno 2] No such file or directory: 'a'") is None
    assert disk_full.disk_full_in_text("ValueError: row 28 [errno] unparsable") is None
