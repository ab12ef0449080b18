"""make_shards' manifest: what the shards hold, per shard, per split and in total, with the
options they were made with and the vocabulary they were tokenized with."""
from __future__ import annotations

from common import storage
from common.manifest import Manifest
from pipelines.shards import shard_files
from pipelines.shards.config import ShardsConfig


def output_options(options: dict, config: ShardsConfig) -> dict:
    """The options the output depends on: the manifest's `config_hash` covers these only.

    Work-unit and join group sizes move no instance, and neither does the pack bucket size
    when rows are not packed (rows are in shuffle-key order either way), so tuning them for
    speed keeps the hash of the same shards.
    """
    neutral = {"join_buckets", "read_part_kb"} | ({"instances_per_pack_bucket"} if not config.pack
                                                   else set())
    return {**options, "job": {k: v for k, v in options["job"].items() if k not in neutral}}


def build_manifest(infos: list[shard_files.ShardInfo], options: dict, vocab_path: str,
                   vocab_size: int, config: ShardsConfig,
                   counters: dict) -> Manifest:
    from common.tokenization import is_vocab_folder, merges_sha256

    infos = sorted(infos, key=lambda i: (shard_files.SPLITS.index(i.split), i.index))
    totals = shard_files.ShardStats()
    splits = {}
    for split in shard_files.SPLITS:
        mine = [i for i in infos if i.split == split]
        if not mine:
            continue
        s = shard_files.ShardStats()
        for i in mine:
            s.add(i.stats)
        totals.add(s)
        per = [i.stats.num_rows for i in mine]
        splits[split] = {"num_shards": len(mine), "num_rows": s.num_rows,
                         "num_instances": s.num_instances, "num_tokens": s.num_tokens,
                         "min_rows_per_shard": min(per), "max_rows_per_shard": max(per)}
    L = config.max_seq_length
    edges = [round(b * (L + 1) / shard_files.HISTOGRAM_BINS) for b in range(shard_files.HISTOGRAM_BINS + 1)]
    vocab_file = (storage.join(vocab_path.rstrip("/"), "vocab.txt") if is_vocab_folder(vocab_path)
                  else vocab_path)
    merges = merges_sha256(vocab_path)  # a BPE vocabulary's other half (absent for WordPiece)
    return Manifest(stage="make_shards", config_hash=storage.config_hash(
        output_options(options, config)), shards=tuple(i.record() for i in infos), sections={
        "options": options,
        "vocab": {"path": vocab_file, "sha256": storage.sha256_file(vocab_file),
                  "vocab_size": vocab_size, **({"merges_sha256": merges} if merges else {})},
        "vocab_size": vocab_size,
        "max_seq_length": L,
        "max_predictions_per_seq": config.max_predictions_per_seq,
        "packed": config.pack,
        "nsp": config.next_sentence,
        "format": config.format,
        "mode": config.mode,
        "next_sentence_label": "1 = B is a random segment, 0 = B is the actual next, -1 = no NSP",
        "splits": splits,
        "totals": {
            "num_rows": totals.num_rows, "num_instances": totals.num_instances,
            "num_tokens": totals.num_tokens, "num_masked": totals.num_masked,
            "num_random_next": totals.num_random_next,
            "random_next_share": totals.num_random_next / totals.num_nsp if totals.num_nsp else 0.0,
            "padding_share": shard_files.padded_share(totals, L),
            "padding_share_unpacked": (1.0 - totals.num_tokens / (totals.num_instances * L)
                                       if totals.num_instances else 0.0),
            "length_histogram": {"bin_edges": edges, "counts": totals.length_histogram},
        },
        "counters": counters,
    })
