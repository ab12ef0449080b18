"""Multiple choice (SWAG, Cosmos QA): four `[CLS] A [SEP] B_i [SEP]` sequences per example,
one score per choice from the pooled `[CLS]`, softmax over the choices (paper section 4.4)."""
from finetune.multiple_choice.family import FAMILY, TASKS

__all__ = ["FAMILY", "TASKS"]
