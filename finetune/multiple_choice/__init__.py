"""Multiple choice (SWAG, Cosmos QA): four `[CLS] A [SEP] B_i [SEP]` sequences per example,
one score per choice from the pooled `[CLS]`, softmax over the choices (paper section 4.4)."""
from finetune.multiple_choice.data import SPECS
from finetune.multiple_choice.family import FAMILY, TASKS

DATA_FOLDERS = {task: SPECS[task].folder for task in TASKS}
"""Each task has its own folder under --data: swag/, cosmosqa/."""

__all__ = ["DATA_FOLDERS", "FAMILY", "TASKS"]
