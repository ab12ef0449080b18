"""SQuAD v1.1 and v2.0 fine-tuning: reader, windows, span post-processing, official metrics.

Modules: `data` (the official JSON), `features` (sliding windows through the tokenizer's
offsets), `postprocess` (best span per question, v2.0 null answer), `metrics` (official EM/F1),
`family` (the `Family` the fine-tuning loop runs: `FAMILY`, tasks `TASKS`).
"""
from finetune.squad.family import FAMILY, TASKS

__all__ = ["FAMILY", "TASKS"]
