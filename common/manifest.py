"""The manifest every data stage writes last into its output folder (`manifest.json`): one
typed `Manifest`, one `ShardRecord` per file it lists, and one hash helper for those files,
`common.storage.sha256_file`.

A manifest's presence marks the folder complete (`storage.write_manifest`, written last and
atomically), so the flow reuses a folder that has one (flows/stages.py). The JSON keeps the field
names the stages have always written, and `Manifest.from_json(d).to_json() == d` for any of
them: a folder built by earlier code reads the same, and so does the JSON the readers
(training/shard_trust.py, pipelines/verify_shards.py, the flow's plan) take.

    manifest = Manifest(stage="extract_books", config_hash=h, config=asdict(config),
                        counts=counts, outputs=(ShardRecord("documents-00000-of-00001.parquet",
                                                            storage.sha256_file(path)),))
    manifest.write(output)            # manifest.json, last
    Manifest.read(output).outputs     # (ShardRecord(...),)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from common import storage

_SHARD_COUNTS = ("num_rows", "num_instances", "num_tokens", "num_masked")


@dataclass(frozen=True)
class ShardRecord:
    """One file a stage wrote, as its manifest lists it.

    A record with a `split` is a training shard (make_shards' `shards` list, whose JSON names the
    file `file` and its size `bytes`, as the trainers read them); one without is an output file
    (the other stages' `outputs` list: `path`, `size_bytes`). Reading also takes a shard list's
    `name` (hand-written manifests of shards made elsewhere)."""
    path: str
    """The file, below the stage's output folder (`train-000003.tar`, `documents-00000-of-00004.parquet`)."""
    sha256: str | None = None
    """sha256 of the file's bytes (`storage.sha256_file`); None where the manifest records
    none."""
    num_bytes: int | None = None
    """The file's size; None where the manifest records none."""
    split: str | None = None
    """train or validation: a training shard's split."""
    index: int | None = None
    """A training shard's index within its split."""
    num_rows: int | None = None
    """Rows in a training shard (packed rows count once)."""
    num_instances: int | None = None
    num_tokens: int | None = None
    num_masked: int | None = None
    num_documents: int | None = None
    """Documents in an output file, where its stage counts them (extract_wikipedia)."""

    @property
    def name(self) -> str:
        """The file's base name."""
        return os.path.basename(self.path)

    def to_json(self) -> dict[str, Any]:
        if self.split is not None:
            return {"file": self.path, "split": self.split, "index": self.index,
                    **{k: getattr(self, k) for k in _SHARD_COUNTS}, "sha256": self.sha256,
                    "bytes": self.num_bytes}
        entry: dict[str, Any] = {"path": self.path}
        optional = (("sha256", self.sha256), ("size_bytes", self.num_bytes),
                    ("num_documents", self.num_documents))
        return entry | {key: value for key, value in optional if value is not None}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> ShardRecord:
        """The record of a manifest entry; raises ValueError naming what it lacks."""
        path = entry.get("file") or entry.get("path") or entry.get("name")
        if not path:
            raise ValueError(f"manifest entry without 'file', 'path' or 'name': {entry}")
        size = entry.get("bytes", entry.get("size_bytes"))

        def number(key: str) -> int | None:
            return None if entry.get(key) is None else int(entry[key])

        return cls(str(path), entry.get("sha256") or None, None if size is None else int(size),
                   entry.get("split"), number("index"),
                   *(number(k) for k in _SHARD_COUNTS), number("num_documents"))


_TYPED = ("stage", "output_version", "config", "config_hash", "counts", "inputs", "outputs",
          "shards")


@dataclass(frozen=True)
class Manifest:
    """A stage output's `manifest.json`: what made it (stage, config and its hash), what it
    counted, read and wrote. A field left None is not written."""
    stage: str
    """The job that wrote the folder (`make_shards`, `build_corpus`, ...)."""
    config_hash: str | None
    """Hash of what decides the content (the config without the output folder, the inputs'
    hashes): what a later stage compares. Every data stage writes one (None: a manifest of
    another kind, e.g. the flow's own stages)."""
    config: dict[str, Any] | None = None
    """The resolved config (make_shards records its `options` among the `sections`)."""
    output_version: int | None = None
    """The job's output version, where it has one (bumped when the same input gives other records)."""
    counts: dict[str, Any] | None = None
    """The job's counters."""
    inputs: list | None = None
    """The files read (each a path, or a mapping with its path and size)."""
    outputs: tuple[ShardRecord, ...] | None = None
    """The files written, with their sha256 (Parquet shards, dead letters, reports)."""
    shards: tuple[ShardRecord, ...] | None = None
    """make_shards' training shards."""
    sections: dict[str, Any] = field(default_factory=dict)
    """The stage's own sections, at the JSON's top level (make_shards' `totals`, build_corpus'
    `ledger`, train_vocab's `vocab_size`, ...)."""

    def __post_init__(self):
        clash = sorted(set(self.sections) & set(_TYPED))
        if clash:
            raise ValueError(f"manifest sections {clash} are fields of Manifest")

    def to_json(self) -> dict[str, Any]:
        """The JSON object written (keys as every stage has written them)."""
        out: dict[str, Any] = {}
        for name in _TYPED:
            value = getattr(self, name)
            if value is None:
                continue
            if name in ("outputs", "shards"):
                value = [record.to_json() for record in value]
            out[name] = value
        return out | self.sections

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """The manifest of a JSON object any stage wrote; raises ValueError without a stage."""
        if not isinstance(data, dict) or "stage" not in data:
            raise ValueError("not a stage manifest (no 'stage')")
        typed = {k: data[k] for k in _TYPED if k in data}
        for name in ("outputs", "shards"):
            if isinstance(typed.get(name), list):
                typed[name] = tuple(ShardRecord.from_json(e) for e in typed[name])
        return cls(**{"config_hash": None, **typed},
                   sections={k: v for k, v in data.items() if k not in _TYPED})

    def write(self, output_dir: str) -> dict[str, Any]:
        """Write `<output_dir>/manifest.json` (atomically; last, as it marks the folder
        complete); returns the JSON as a later reader sees it (tuples as lists)."""
        storage.write_manifest(output_dir, self.to_json())
        return storage.read_manifest(output_dir)

    @classmethod
    def read(cls, output_dir: str) -> Manifest | None:
        """The folder's manifest, None when it has none (its stage did not finish)."""
        data = storage.read_manifest(output_dir)
        return None if data is None else cls.from_json(data)
