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
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.errors import disk_full

MANIFEST_NAME = "manifest.json"
STAGE_LOCK_NAME = ".build.lock"
"""The file in a flow stage's folder whose flock a building run holds (flows/stages.py). It
stays in the finished folder, naming the last builder; it is bookkeeping, never a stage's data
(hidden, so no input listing reads it, and a folder check expects it)."""
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
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        full = disk_full(e, path)
        if full is not None and full is not e:
            raise full from None
        raise


_TEMPORARY_NAME = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$")
"""`atomic_open`'s temporaries: mkstemp's `.<name>.<8 random characters>.tmp` beside <name>."""


def temporary_target(name: str) -> str | None:
    """The file name an `atomic_open` temporary called `name` was written for, else None. A
    process killed mid-write (kill -9, out of memory) leaves its temporary behind; a re-run
    of the same job removes the ones of the names it writes (`pipelines.jobs`)."""
    match = _TEMPORARY_NAME.match(name)
    return match.group("target") if match else None


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def json_text(obj: Any) -> str:
    """`obj` as every JSON file of this project is written: indented, keys sorted, dataclasses,
    paths and numpy values as plain JSON."""
    return json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json_text(obj))


def read_utf8(path: str, error: type[Exception] = ValueError) -> str:
    """A local file's text (a UTF-8 BOM dropped); bytes that are not UTF-8 raise `error` naming
    the file, the line and the byte: `<path>:<line>: not UTF-8 text (<reason>, byte 0x..)`."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise error(f"{path}:{line}: not UTF-8 text ({e.reason}, byte "
                    f"0x{raw[e.start]:02x})") from None


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


SIDE_OUTPUT_DIRS = frozenset({"dead_letter", "duplicates"})
"""Folders our jobs write next to their outputs (set-aside records, removed duplicates): never
inputs of a later stage, so a folder --input does not descend into them (errors.DEAD_LETTER_DIR,
build_corpus.DUPLICATES_FILE)."""
_SKIPPED_DIRS = SIDE_OUTPUT_DIRS | {"_temporary"}
"""...and the folder Hadoop/Spark output committers stage unfinished task output in."""
_SKIPPED_FILES = frozenset({MANIFEST_NAME, "_SUCCESS"})
"""Completion markers, ours and Hadoop/Spark's (an empty `_SUCCESS` is no input)."""
_TEMP_PREFIXES = (".", "beam-temp-")
"""Hidden entries and the temporary folders Beam's file sinks leave when a job dies."""
_GLOB_CHARS = frozenset("*?[")


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One file an `--input` resolved to, with what its listing said about it."""
    path: str
    """The file, local or remote, as the job opens it."""
    size_bytes: int
    """Its size, from the listing that found it (no second lookup per file)."""
    name: str
    """Its path below the folder it was found in ("fiction/caesar.txt"), "/"-separated; for a
    glob, below the glob's folder; for a file named directly, its base name."""


def expand_inputs(pattern: str | list[str]) -> list[str]:
    """The paths of `expand_input_files(pattern)`."""
    return [f.path for f in expand_input_files(pattern)]


def expand_input_files(pattern: str | list[str]) -> list[InputFile]:
    """Resolve `--input` (a file, a glob, a folder, or a comma-separated list of them) to files.

    A folder expands to every file under it, subfolders included (symlinked ones followed, each
    real folder once, the first in sorted order), in sorted path order (so a run is
    deterministic), skipping what is not input: hidden entries, Beam's `beam-temp-*` folders,
    manifests, our jobs' side outputs (`SIDE_OUTPUT_DIRS`), and Hadoop/Spark's `_SUCCESS`
    markers and `_temporary/` folders. A remote path is a folder when it ends with "/", or when
    no object has that exact name but objects sit under it (`gs://bucket/books`). A glob matches
    what it says (`*` stays inside one folder). Sizes come from the one listing of each pattern:
    a remote folder of 100k objects costs one listing, not a lookup per object. Raises
    FileNotFoundError naming the pattern when nothing matches.
    """
    patterns = pattern if isinstance(pattern, list) else [p for p in str(pattern).split(",") if p]
    files: list[InputFile] = []
    for p in patterns:
        found = _resolve(p)
        if not found:
            raise FileNotFoundError(f"--input {p!r} matches no files")
        files.extend(found)
    return files


def _resolve(pattern: str) -> list[InputFile]:
    """The input files of one pattern, sorted by path."""
    from apache_beam.io.filesystems import FileSystems

    if _GLOB_CHARS & set(pattern) and not (not is_remote(pattern) and os.path.exists(pattern)):
        matches = FileSystems.match([pattern])[0].metadata_list
        glob_folder = pattern[:min(pattern.index(c) for c in _GLOB_CHARS & set(pattern))]
        return _below(glob_folder.rpartition("/")[0], [
            (m.path, m.size_in_bytes) for m in matches
            if _is_input_name(os.path.basename(m.path))
            and (is_remote(m.path) or os.path.isfile(m.path))])
    if not is_remote(pattern):
        if os.path.isdir(pattern):
            return folder_input_files(pattern)
        if not os.path.isfile(pattern):
            return []
        return [InputFile(pattern, os.path.getsize(pattern), os.path.basename(pattern))]
    # An object store has no folders: `gs://b/books` is one when no object has that very name
    # (one lookup; `gs://b/books/` needs none).
    exact = [] if pattern.endswith("/") else FileSystems.match([pattern])[0].metadata_list
    if exact:
        return [InputFile(m.path, m.size_in_bytes, m.path.rpartition("/")[2]) for m in exact]
    return folder_input_files(pattern)


def _below(folder: str, listed: list[tuple[str, int]]) -> list[InputFile]:
    """InputFiles of (path, size) pairs listed under `folder`, named relative to it."""
    prefix = folder.rstrip("/") + "/" if folder else ""
    return sorted((InputFile(path, size, path[len(prefix):] if path.startswith(prefix)
                             else os.path.basename(path)) for path, size in listed),
                  key=lambda f: f.path)


def folder_input_files(folder: str) -> list[InputFile]:
    """Every input file under `folder`, recursively, sorted; see `expand_input_files`."""
    base = str(folder).rstrip("/") or "/"
    if is_remote(base):
        from apache_beam.io.filesystems import FileSystems
        # Object stores list by prefix; `**` crosses "/" in Beam's patterns. The listing
        # carries each object's size.
        listed = [(m.path, m.size_in_bytes)
                  for m in FileSystems.match([f"{base}/**"])[0].metadata_list]
    else:
        listed = list(_walk_local(base))
    kept = []
    for path, size in listed:
        parts = path[len(base):].lstrip("/").split("/")
        if all(_is_input_name(part) for part in parts) and not _SKIPPED_DIRS & set(parts[:-1]):
            kept.append((path, size))
    return _below(base, kept)


def _walk_local(base: str) -> Iterator[tuple[str, int]]:
    """(path, size) of the files under a local folder. Symlinked subfolders are followed (a
    linked book folder must not vanish), each real folder once (a link to an ancestor is no
    endless loop); subfolders are walked in sorted order, so which of two routes to one folder
    is kept does not depend on the order the filesystem lists them in."""
    seen: set[str] = set()
    for root, dirs, files in os.walk(base, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if _is_input_name(d) and d not in _SKIPPED_DIRS)
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path):  # not a dangling symlink, a socket, ...
                yield path, os.path.getsize(path)


def _is_input_name(name: str) -> bool:
    return bool(name) and not name.startswith(_TEMP_PREFIXES) and name not in _SKIPPED_FILES
