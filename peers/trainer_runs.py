"""transformers' Trainer set up for step-for-step comparisons with our loop (the NER and SQuAD
parity tests) and for the paired changes of the SQuAD benchmark.

- `in_order(trainer_class)`: the Trainer taking its training rows in the order given (our
  loop's order, replayed), instead of its own shuffle.
- `step_arguments`: TrainingArguments of our recipe (AdamW epsilon and decay, linear warmup then
  decay, clipping) that log the loss of every step, on the CPU, saving nothing.
- `SquadWindows`: our SQuAD windows as the rows transformers' collator pads.
- `MaskedSpanLoss`: a Trainer whose span loss leaves out each batch's padding, as ours does
  (`model.heads.span_loss`); transformers' stock loss softmaxes over the padded positions too.
"""
from __future__ import annotations

import torch
import transformers

from finetune.options import FinetuneConfig
from model.heads import span_loss


def in_order(trainer_class: type[transformers.Trainer]) -> type[transformers.Trainer]:
    """`trainer_class` reading its training rows in the order they are given."""

    class InOrder(trainer_class):
        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)

    return InOrder


def step_arguments(cfg: FinetuneConfig, learning_rate: float, seed: int,
                   output_dir: str) -> transformers.TrainingArguments:
    """One epoch of `cfg`'s recipe at `learning_rate`, the loss logged at every step."""
    return transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=cfg.batch_size, num_train_epochs=1,
        learning_rate=learning_rate, weight_decay=cfg.weight_decay,
        adam_epsilon=cfg.adam_epsilon, warmup_steps=cfg.warmup_proportion,
        lr_scheduler_type="linear", max_grad_norm=cfg.max_grad_norm, seed=seed, use_cpu=True,
        save_strategy="no", eval_strategy="no", logging_strategy="steps", logging_steps=1,
        report_to=[], disable_tqdm=True, dataloader_num_workers=0)


def step_losses(trainer: transformers.Trainer) -> list[float]:
    """The loss of every training step the Trainer logged."""
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


class MaskedSpanLoss(transformers.Trainer):
    """The Trainer of a question-answering model with the span loss over each window's own
    tokens (padding left out of the softmax), as our loop computes it."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        outputs = model(input_ids=inputs["input_ids"], token_type_ids=inputs["token_type_ids"],
                        attention_mask=inputs["attention_mask"])
        loss = span_loss(outputs.start_logits, outputs.end_logits, inputs["start_positions"],
                         inputs["end_positions"], inputs["attention_mask"])
        return (loss, outputs) if return_outputs else loss


class SquadWindows(torch.utils.data.Dataset):
    """Our SQuAD windows (`finetune.squad.features.Windows`) as the rows
    `DataCollatorWithPadding` pads: the same token ids, segment B from the passage on, and with
    `with_labels` the answer's start and end positions."""

    def __init__(self, windows, with_labels: bool, order: list[int] | None = None):
        self.windows, self.with_labels = windows, with_labels
        self.order = list(range(len(windows))) if order is None else order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> dict:
        n = self.order[i]
        ids = self.windows.input_ids[n].tolist()
        first = int(self.windows.passage_start[n])
        row = {"input_ids": ids, "attention_mask": [1] * len(ids),
               "token_type_ids": [0] * first + [1] * (len(ids) - first)}
        if self.with_labels:
            row["start_positions"] = int(self.windows.start_positions[n])
            row["end_positions"] = int(self.windows.end_positions[n])
        return row
