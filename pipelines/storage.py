"""Atomic writes, content hashes and manifests for every stage's output.

Every output of this project is written to a temporary name and renamed when complete, so a
crash never leaves a half-written file. Paths may be local or any filesystem Beam supports
(`gs://`, `s3://`, ...); local paths take the fast `os.replace` route.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
# mkstemp creates 0600 files; outputs get the mode a plain open() would give (0666 & ~umask).
# Read once at import, when no other thread can race the set-and-restore.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


def is_remote(path: str) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return os.path.join(base, *parts)


def makedirs(path: str) -> None:
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def exists(path: str) -> bool:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems
        return FileSystems.exists(path)
    return os.path.exists(path)


def file_size(path: str) -> int:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems
        return FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    return os.path.getsize(path)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator[Any]:
    """Open `path` for writing through a temporary sibling that is renamed on success.

    On an exception the temporary file is removed and `path` is left untouched.
    """
    path = str(path)
    if is_remote(path):
        # Object stores: a new object only becomes visible when its upload completes,
        # and a rename is a copy, so writing through a temporary object buys nothing.
        from apache_beam.io.filesystems import FileSystems
        writer = FileSystems.create(path)
        if "b" not in mode:
            import io
            stream = io.TextIOWrapper(writer, encoding="utf-8")
            yield stream
            stream.close()
        else:
            yield writer
            writer.close()
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str) -> Any:
    with open_read(path) as f:
        return json.loads(f.read())


def open_read(path: str, mode: str = "r"):
    if is_remote(path):
        import io

        from apache_beam.io.filesystems import FileSystems
        raw = FileSystems.open(path)
        return raw if "b" in mode else io.TextIOWrapper(raw, encoding="utf-8")
    return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def config_hash(config: Any) -> str:
    """A short, stable hash of a config (dataclass or JSON-able mapping) for content addressing."""
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    blob = json.dumps(config, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sha256_file(path: str, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open_read(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(output_dir: str, manifest: dict) -> str:
    """Write `manifest.json` last: its presence marks the stage output as complete."""
    path = join(output_dir, MANIFEST_NAME)
    atomic_write_json(path, manifest)
    return path


def withdraw_manifest(output_dir: str) -> None:
    """Before a re-run: remove `manifest.json`, so a crash cannot leave it over new files."""
    path = join(output_dir, MANIFEST_NAME)
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems
        if FileSystems.exists(path):
            FileSystems.delete([path])
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def read_manifest(output_dir: str) -> dict | None:
    path = join(output_dir, MANIFEST_NAME)
    return read_json(path) if exists(path) else None


def expand_inputs(pattern: str | list[str]) -> list[str]:
    """Resolve `--input` (a file, a glob, a folder, or a comma-separated list of them) to files.

    Folders expand to the files directly inside them (hidden files and manifests skipped).
    Raises FileNotFoundError naming the pattern when nothing matches.
    """
    from apache_beam.io.filesystems import FileSystems

    patterns = pattern if isinstance(pattern, list) else [p for p in str(pattern).split(",") if p]
    files: list[str] = []
    for p in patterns:
        if not is_remote(p) and os.path.isdir(p):
            p = os.path.join(p, "*")
        elif is_remote(p) and p.endswith("/"):
            p = p + "*"
        matches = FileSystems.match([p])[0].metadata_list
        found = sorted(
            m.path for m in matches
            if not os.path.basename(m.path).startswith(".")
            and os.path.basename(m.path) != MANIFEST_NAME
            and (is_remote(m.path) or os.path.isfile(m.path))
        )
        if not found:
            raise FileNotFoundError(f"--input {p!r} matches no files")
        files.extend(found)
    return files
