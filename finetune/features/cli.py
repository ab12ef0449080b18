"""`bert-features`: per-token activations of chosen layers of a frozen BERT for a text file.

    bert-features --model <checkpoint folder> --input_file in.txt --output_file out.jsonl \\
        --layers=-1,-2,-3,-4

The output is what BERT's `extract_features.py` writes (`finetune.features.extract`): one JSON
line per input line. A bad option or input prints `bert-features: error: <message>`, exit 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from common import extras, logs, storage
from common.errors import debug_requested, is_user_error

with extras.needed_by("bert-features"):  # without the train extra: one line, not a traceback
    from finetune.features import extract

log = logging.getLogger("bert-features")


@dataclass(frozen=True)
class FeaturesConfig:
    """What `bert-features` extracts."""

    model: str
    """Checkpoint folder: ours, our export, or any Hugging Face BERT folder."""
    input_file: str
    """Text, one example per line; `A ||| B` for a pair."""
    output_file: str
    """JSON lines, written atomically (a temporary file, then renamed)."""
    layers: str = "-1,-2,-3,-4"
    """Comma-separated Transformer blocks (0 = first, -1 = last), as the reference's flag."""
    max_seq_length: int = 128
    """Word pieces per example, [CLS] and [SEP] included; longer examples are truncated."""
    batch_size: int = 32
    """Examples per forward pass (no effect on the values beyond float rounding)."""
    device: str = "cpu"
    """Torch device for the forward passes."""

    def __post_init__(self) -> None:
        if self.max_seq_length < 3:
            raise ValueError(f"--max_seq_length must be >= 3, got {self.max_seq_length}")
        if self.batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {self.batch_size}")
        if not os.path.isfile(self.input_file):
            raise FileNotFoundError(f"--input_file {self.input_file}: no such file")


def run(cfg: FeaturesConfig) -> int:
    """Write the features of every line of `cfg.input_file`; returns the number of lines."""
    import torch

    from finetune.checkpoint import load_encoder, load_tokenizer

    model = load_encoder(cfg.model).to(torch.device(cfg.device))
    layers = extract.parse_layers(cfg.layers, model.config.num_hidden_layers)
    if cfg.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {cfg.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {model.config.max_position_embeddings}")
    examples = extract.read_examples(cfg.input_file)
    encoded = extract.encode_examples(load_tokenizer(cfg.model), examples,
                                      cfg.max_seq_length)
    lines = (extract.feature_line(e.index, enc.tokens, states, layers)
             for e, enc, states in zip(examples, encoded,
                                       extract.layer_states(model, encoded, layers,
                                                            cfg.batch_size)))
    storage.atomic_write_text(cfg.output_file, "".join(lines))
    log.info("wrote features of %d lines, layers %s, to %s", len(examples), layers,
             cfg.output_file)
    return len(examples)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bert-features", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = FeaturesConfig.__dataclass_fields__
    p.add_argument("--model", required=True, help="checkpoint folder")
    p.add_argument("--input_file", required=True, help="text, one example per line")
    p.add_argument("--output_file", required=True, help="JSON lines output")
    p.add_argument("--layers", default=defaults["layers"].default,
                   help="Transformer blocks, e.g. --layers=-1,-2,-3,-4 (0 = first; write it with =)")
    p.add_argument("--max_seq_length", type=int, default=defaults["max_seq_length"].default)
    p.add_argument("--batch_size", type=int, default=defaults["batch_size"].default)
    p.add_argument("--device", default=defaults["device"].default)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    logs.add_verbose_flag(p)
    return p


@extras.reports_missing("bert-features")
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(args.verbose)
    options = {k: v for k, v in vars(args).items() if k not in ("debug", "verbose")}
    try:
        run(FeaturesConfig(**options))
    except Exception as e:  # a user error prints one line, others re-raise
        if args.debug or debug_requested() or not is_user_error(e):
            raise
        print(f"bert-features: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
