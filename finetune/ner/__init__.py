"""Named-entity recognition (paper section 5.3): CoNLL-2003 and WNUT-17 as a fine-tuning family.

Modules: `data` (the CoNLL column reader), `tasks` (the task table), `encode` (first sub-token
labels, windows, packed batches), `metrics` (entity F1 as conlleval), `family` (the `Family`
the one fine-tuning loop runs).
"""
from finetune.ner.family import FAMILY
from finetune.ner.tasks import NER_TASKS

TASKS = tuple(NER_TASKS)  # ("conll2003", "wnut17")
DATA_FOLDERS = {name: spec.folder for name, spec in NER_TASKS.items()}  # D/conll2003, D/wnut17

__all__ = ["DATA_FOLDERS", "FAMILY", "TASKS"]
