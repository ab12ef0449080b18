"""Verify a shard folder against its manifest and print its statistics.

    python -m pipelines.verify_shards <folder>

Checks every shard the manifest lists: present, byte size, sha256, decodable to the end, and
its row, instance, token and masked-token counts; any other file in the folder (besides the
manifest, `dead_letter/make_shards.jsonl` and the flow's stage lock) is reported too, e.g. a
shard of another run or a temporary a killed run left. Problems are named one per line; the exit code is 1 if any.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from common import storage
from common.manifest import Manifest, ShardRecord
from pipelines.shards import shard_files


def verify_folder(folder: str, progress: bool = True) -> tuple[list[str], shard_files.ShardStats]:
    """(problems, recounted totals) for a shard folder. Raises FileNotFoundError without manifest."""
    manifest = Manifest.read(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder}: no {storage.MANIFEST_NAME} (incomplete or not a "
                                "shard folder)")
    max_seq_length = manifest.sections["max_seq_length"]
    problems: list[str] = []
    records = manifest.shards or ()
    iterator = records
    if progress:
        from common.logs import progress
        iterator = progress(records, desc="verify", unit="shard", file=sys.stderr)
    for record in iterator:
        problems += shard_files.verify_shard(folder, record, max_seq_length)
    if not storage.is_remote(folder):
        problems += unexpected_files(folder, {r.path for r in records})
    totals = manifest_totals(records)
    for name in ("num_rows", "num_instances", "num_tokens", "num_masked"):
        want = manifest.sections["totals"].get(name)
        if want is not None and getattr(totals, name) != want:
            problems.append(f"{storage.MANIFEST_NAME}: totals.{name} {want} != sum over shards "
                            f"{getattr(totals, name)}")
    return problems, totals


def unexpected_files(folder: str, listed: set[str]) -> list[str]:
    """A problem per file under a local shard folder that is neither a listed shard, the
    manifest, the dead letters nor the flow's stage lock: a later stage reading the folder must
    find only those."""
    expected = listed | {storage.MANIFEST_NAME, f"{shard_files.DEAD_LETTERS}.jsonl",
                         storage.STAGE_LOCK_NAME}
    problems = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if path in expected:
                continue
            what = ("a temporary left by a killed run" if storage.temporary_target(name)
                    else "not in the manifest (left from another run?)")
            problems.append(f"{path}: {what}")
    return sorted(problems)


def manifest_totals(records: Sequence[ShardRecord]) -> shard_files.ShardStats:
    totals = shard_files.ShardStats()
    for r in records:
        totals.add(shard_files.ShardStats(r.num_rows, r.num_instances, r.num_tokens,
                                          r.num_masked))
    return totals


def describe(manifest: Manifest) -> str:
    m = manifest.sections
    t = m["totals"]
    header = (f"shards: {len(manifest.shards or ())}  format: {m.get('format', 'shards')}  "
              f"max_seq_length: {m['max_seq_length']}  packed: {m['packed']}  "
              f"nsp: {m['nsp']}  vocab_size: {m['vocab_size']}")
    lines = [header]
    for split, s in m.get("splits", {}).items():
        lines.append(f"  {split}: {s['num_shards']} shards, {s['num_rows']} rows, "
                     f"{s['num_instances']} instances, rows per shard {s['min_rows_per_shard']}"
                     f"-{s['max_rows_per_shard']}")
    lines.append(f"instances: {t['num_instances']}  rows: {t['num_rows']}  tokens: "
                 f"{t['num_tokens']}  masked: {t['num_masked']}")
    lines.append(f"random-next share: {t['random_next_share']:.4f}  padding share: "
                 f"{t['padding_share']:.4f}  (unpacked: {t['padding_share_unpacked']:.4f})")
    edges = t["length_histogram"]["bin_edges"]
    counts = t["length_histogram"]["counts"]
    lines.append("instance lengths: " + "  ".join(
        f"[{edges[i]},{edges[i + 1]}):{c}" for i, c in enumerate(counts) if c))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command's flags; its help shows this module's docstring and example as written."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.verify_shards",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a make_shards output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        problems, _ = verify_folder(args.folder, progress=not args.quiet)
    except FileNotFoundError as e:
        print(f"FAILED: {e}")
        return 1
    print(describe(Manifest.read(args.folder)))
    if problems:
        print(f"FAILED: {len(problems)} problem(s)")
        for p in problems:
            print(f"  {p}")
        return 1
    print("OK: every shard matches the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
