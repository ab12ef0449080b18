"""The library every package shares, with no Beam job in it: atomic storage and manifests
(`storage`), typed settings and their overrides (`settings`), user errors and dead letters
(`errors`), one logging set-up and progress bar for every command (`logs`), BERT's WordPiece
tokenizer (`tokenization`), and the data contract between make_shards and the training loader
(`shard_format`, `masking`). `model/`, `training/`, `finetune/` and `flows/` import it without
importing Beam."""
