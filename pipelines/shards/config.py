"""make_shards' config, `ShardsConfig`: the instances' options (`InstanceConfig`, with the
masking options of `common.masking.MaskingConfig`) and how they become files
(`ShardJobConfig`), and its presets per phase. The job's flags and the flow's
`shards.phase1.*` / `shards.phase2.*` settings are its fields; `MakeShardsConfig` adds the
paths of one run (what `make_shards.run` takes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.settings import check, check_choices
from pipelines.shards.instances import InstanceConfig

LOCAL_WAVE_MB = 4.0
"""Input MB per wave on Beam's local runner when `wave_mb` is unset (corpus Parquet,
uncompressed: about 2 MB of text, held as passages and as sentences): at the paper's
dupe_factor 10 the local runner holds ~250 bytes per such byte, so a wave's process peaks near
1 GB with one worker (benchmarks/bench_local_memory.py); each wave costs ~2 s to start."""


@dataclass(frozen=True)
class ShardJobConfig:
    """How instances become files (the instance options live in `InstanceConfig`)."""
    mode: Literal["scalable", "reference"] = "scalable"
    """`scalable` (Beam, any number of workers) or `reference` (one stream, exact)."""
    pack: bool = False
    """Pack several short instances into one max_seq_length row."""
    target_shard_mb: float = 64.0
    """Approximate shard size; sets the shard count."""
    num_shards: int = 0
    """Shards per split; 0 = from the target size."""
    rows_per_block: int = 128
    """Rows per `.rows.npz` tar member."""
    format: Literal["shards", "jsonl"] = "shards"
    """`shards` (WebDataset .tar) or `jsonl` (one instance per line, for inspection)."""
    validation_fraction: float = 0.0
    """Share of documents held out as the validation split, by a hash of doc_id."""
    do_lower_case: bool | None = None
    """Lower-case and strip accents before WordPiece; unset (None): as the vocabulary folder
    records (true for a bare vocab.txt). make_shards refuses a value that contradicts the folder
    (`make_shards.resolve_do_lower_case`)."""
    join_buckets: int = 0
    """Groups of the random-next join; 0 = one per ~`batches.INSTANCES_PER_JOIN_BUCKET` estimated
    instances, at least `batches.MIN_BUCKETS`; more = less memory per group."""
    read_part_kb: int = 256
    """Input KiB per read work unit: large files are read and tokenized in parts, so that
    workers share them."""
    instances_per_pack_bucket: int = 16_384
    """Instances sorted and packed together in one group (at least `batches.MIN_BUCKETS` groups)."""
    wave_mb: float | None = None
    """Input MB per wave: the input is run in consecutive waves of about this size, each a
    pipeline of its own, so a local run's memory follows the wave, not the corpus; random nexts
    are drawn within a wave, as the reference draws within one run's input files (0 = one
    wave). Unset: `LOCAL_WAVE_MB` on Beam's local runner, 0 on a distributed runner
    (Dataflow, Flink, Spark), whose shuffles spill to disk."""

    def __post_init__(self):
        check_choices(self)
        check(not (self.format == "jsonl" and self.pack), "pack",
              "cannot be combined with format=jsonl, which writes one instance per line")
        check(self.target_shard_mb > 0, "target_shard_mb",
              f"must be > 0, got {self.target_shard_mb}")
        check(self.num_shards >= 0, "num_shards", f"must be >= 0, got {self.num_shards}")
        check(1 <= self.rows_per_block <= 65535, "rows_per_block",
              f"must be in [1, 65535], got {self.rows_per_block}")
        check(0.0 <= self.validation_fraction < 1.0, "validation_fraction",
              f"must be in [0, 1), got {self.validation_fraction}")
        check(self.join_buckets >= 0, "join_buckets",
              f"must be >= 0 (0 = auto), got {self.join_buckets}")
        check(self.read_part_kb >= 1, "read_part_kb", f"must be >= 1, got {self.read_part_kb}")
        check(self.instances_per_pack_bucket >= 1, "instances_per_pack_bucket",
              f"must be >= 1, got {self.instances_per_pack_bucket}")
        check(self.wave_mb is None or self.wave_mb >= 0, "wave_mb",
              f"must be >= 0 (0 = one wave), got {self.wave_mb}")


@dataclass(frozen=True)
class ShardsConfig(ShardJobConfig, InstanceConfig):
    """make_shards' whole config: the instances' options (`InstanceConfig`, the reference
    generator's) and how they become files (`ShardJobConfig`), one flat set of fields as the
    job's flags and the flow's `shards.phase1.*` / `shards.phase2.*` settings are. The Beam code
    takes it where it needs either part."""

    def __post_init__(self):
        InstanceConfig.__post_init__(self)
        ShardJobConfig.__post_init__(self)


@dataclass(frozen=True, kw_only=True)
class MakeShardsConfig(ShardsConfig):
    """One make_shards run: the settings (`ShardsConfig`, the flow's `shards.phaseN`) and where
    it reads and writes. The manifest records the settings by part and the input files."""
    input: str
    """The corpus: Parquet or reference-format text; a file, glob or folder (local or gs://...),
    several separated by commas."""
    vocab: str
    """The vocabulary folder or vocab.txt."""
    output: str
    """The shard folder."""


def tiny(phase: int) -> ShardsConfig:
    """The demo's shards of the bundled sample: 2 passes, 128 then 256 tokens, 1 MB shards,
    a fifth of the documents held out (the sample is small)."""
    length, predictions = {1: (128, 20), 2: (256, 40)}[phase]
    return ShardsConfig(max_seq_length=length, max_predictions_per_seq=predictions,
                        dupe_factor=2, target_shard_mb=1.0, validation_fraction=0.2)


def base(phase: int) -> ShardsConfig:
    """BERT's: 10 passes, 128 tokens (20 predictions) then 512 (80); rows packed (attention
    runs per instance, so packing only removes padding); 1% of the documents held out."""
    length, predictions = {1: (128, 20), 2: (512, 80)}[phase]
    return ShardsConfig(max_seq_length=length, max_predictions_per_seq=predictions,
                        dupe_factor=10, pack=True, validation_fraction=0.01)


large = base
