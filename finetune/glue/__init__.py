"""GLUE as a fine-tuning task family: task table, readers, metrics, packed classification.

    from finetune import loop
    from finetune.glue import FAMILY
    result = loop.finetune_task(FAMILY, encoder, FAMILY.prepare("rte", ...), config)

Modules: `tasks` (TaskSpec table of the nine tasks), `data` (TSV and Hugging Face readers,
tokenization, batching), `metrics`, `family` (the `Family` the loop trains: packing, the
classifier head, scoring, test-set predictions), `cli` (`bert-glue`, `bert-finetune` fixed to
GLUE). The loop itself is finetune/loop.py.
"""
from finetune.glue.family import FAMILY
from finetune.glue.tasks import TASKS as _SPECS

TASKS = tuple(spec.name.lower() for spec in _SPECS.values())
"""("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli")."""

__all__ = ["FAMILY", "TASKS"]
