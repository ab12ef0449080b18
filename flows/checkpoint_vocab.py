"""The vocabulary stage of a flow that continues pre-training (`pretrain.model.init_from`).

A checkpoint's word embeddings are indexed by its own vocabulary, so such a flow trains no
vocabulary: this stage copies the checkpoint's `vocab.txt` into a vocabulary folder like the one
`train_vocab` writes (vocab.txt, tokenizer.json, tokenizer_config.json), lower-casing as the
checkpoint's tokenizer does, and the shards and the pre-training run use it. Its content hash
covers the checkpoint's identity (sha256 of its config, weights and vocab.txt, and of a BPE
vocabulary's merges), so another checkpoint, even at the same path, gives other shards and
another pre-training stage.
"""
from __future__ import annotations

from common import storage
from flows.stages import StageResult, run_stage


def checkpoint_vocab_settings(init_from: str) -> dict:
    """The stage's config (what its folder's hash covers): the checkpoint's identity, its
    vocabulary's sha256 (a BPE one's merges too) and casing. Errors name the setting when the
    folder has no vocabulary."""
    from common.tokenization import merges_sha256
    from model.hf import find_starting_point
    from training.init_from import (
        checkpoint_do_lower_case,
        checkpoint_vocab_dir,
        initial_weights_digest,
    )

    start = find_starting_point(init_from)
    vocab_dir = checkpoint_vocab_dir(start)
    if vocab_dir is None:
        raise ValueError(f"pretrain.model.init_from={init_from}: no vocab.txt in {start.folder}; "
                         "the shards must be made with the checkpoint's vocabulary")
    merges = merges_sha256(vocab_dir)  # absent for WordPiece: its stages keep their keys
    return {"init_from": init_from, "vocab_dir": vocab_dir,
            "checkpoint_sha256": initial_weights_digest(start),
            "vocab_sha256": storage.sha256_file(storage.join(vocab_dir, "vocab.txt")),
            **({"merges_sha256": merges} if merges else {}),
            "do_lower_case": checkpoint_do_lower_case(start)}


def checkpoint_vocab(root: str, init_from: str) -> StageResult:
    """The `vocab-<hash>` stage holding `init_from`'s vocabulary (instead of train_vocab's)."""
    from common.tokenization import read_merges, read_vocab, save_tokenizer_folder

    settings = checkpoint_vocab_settings(init_from)
    # Where the checkpoint lies is not its content: only its hashes and casing name the stage.
    identity = {k: v for k, v in settings.items() if k not in ("init_from", "vocab_dir")}

    def build(out: str) -> None:
        tokens = read_vocab(settings["vocab_dir"])
        save_tokenizer_folder(tokens, out, do_lower_case=settings["do_lower_case"],
                              merges=read_merges(settings["vocab_dir"]))  # a BPE checkpoint's
        storage.write_manifest(out, {
            "stage": "checkpoint_vocab", "config": settings, "vocab_size": len(tokens),
            "vocab_sha256": storage.sha256_file(storage.join(out, "vocab.txt")),
            "do_lower_case": settings["do_lower_case"]})

    return run_stage(root, "vocab", {"from_checkpoint": identity}, build)
