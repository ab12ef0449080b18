"""make_shards' pure functions, in the order data flows through them: corpus files -> tokenized
documents (`reading`) -> pretraining instances (`instances`) -> columnar batches across the
shuffles (`batches`) -> rows, packed or not (`packing`) -> shard files (`shard_files`).
`pipelines/make_shards.py` wires them into Beam; `config` holds the job's one config."""
