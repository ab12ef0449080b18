"""Small real GLUE inputs for the GLUE tests: slices of the shared files."""
from __future__ import annotations

from pathlib import Path


def glue_slice(shared_data: Path, root: Path, files: dict[str, int]) -> Path:
    """The first `rows` data rows (after the header) of real GLUE files, e.g. {"RTE/dev.tsv": 8},
    written under `root` in the glue_data layout; returns `root`."""
    for name, rows in files.items():
        lines = (shared_data / "glue" / name).read_bytes().split(b"\n")
        out = root / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"\n".join(lines[:1 + rows]) + b"\n")
    return root
