"""Pre-training objectives: what a run trains, as one seam (torchtitan's train spec).

An `Objective` says everything `bert-pretrain` needs to know about what it trains:

- `build_model(config)`: the encoder with the objective's heads, from the run's `BertConfig`.
  Its `forward(**batch)` takes the loader's batch (model/heads.py's table) and returns an
  object with `loss` and one attribute per metric key (a missing or None one counts as 0).
- `metric_keys`: the output's values summed per micro-batch and logged; `heads`: the prefixes
  whose `<head>_loss` and `<head>_correct`/`<head>_count` make a head's loss and accuracy
  (the first head's are always logged, the others' when the window had labels).
- `causal`: the attention it asks of the encoder (`BertConfig.is_decoder`, model/attention.py).
- `next_sentence`: what it needs from the shards: True = their next-sentence labels (shards
  made with `--no_next_sentence` are refused, naming them).
- `check(config)`: the run's settings it cannot train with, one line naming the setting.

Registered (`--set objective.name=NAME`): `mlm_nsp` (masked LM + next-sentence prediction, the
paper's), `mlm` (masked LM alone, Table 5 "No NSP"), `ltr` (the left-to-right LM, Table 5
"LTR & No NSP", `model.heads.BertForNextToken`). `objective.name=mlm` with
`objective.next_sentence=true` (the default) on shards with NSP labels trains `mlm_nsp`
(`for_shards` is that rule, written once); `objective.next_sentence=false` makes any shards
MLM-only.

A new objective is one file and one line. In this package: a module defining an `Objective`
and its line in `OBJECTIVES`. Outside it, no line at all: name it by `module:attribute`,
which is imported in every rank (the module must be importable there, e.g. installed or on
PYTHONPATH), and is saved with the run's config like any other value:

    # my_objectives.py
    SEGMENT = Objective(name="segment", metric_keys=("loss", "segment_loss", ...),
                        heads=("segment",), model=build_segment_model)

    bert-pretrain --set objective.name=my_objectives:SEGMENT --set cadence.export_hf=false ...

(`cadence.export_hf` exports `BertForPreTraining` or `BertForNextToken`, model/hf.py; an
objective with a model of its own saves checkpoints only, and `check` asks for
cadence.export_hf=false before the run starts.) The example in
tests/training/test_objectives.py trains such an objective through `bert-pretrain`.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common import settings

if TYPE_CHECKING:
    from torch import nn

    from model.bert import BertConfig

COUNTER_KEYS = ("tokens", "samples", "micro_batches")
"""What every run counts besides its objective's metric keys (training/metrics.py)."""


def pretraining_model(config: BertConfig, next_sentence: bool) -> nn.Module:
    """`model.heads.BertForPreTraining`: the MLM head, and the NSP head where `next_sentence`."""
    from model.heads import BertForPreTraining
    return BertForPreTraining(config, next_sentence=next_sentence)


def next_token_model(config: BertConfig, next_sentence: bool = False) -> nn.Module:
    """`model.heads.BertForNextToken`: the left-to-right LM (`next_sentence` is always False:
    it has no NSP head)."""
    from model.heads import BertForNextToken
    return BertForNextToken(config)


EXPORTED_MODELS = (pretraining_model, next_token_model)
"""The models `cadence.export_hf` exports (model/hf.py: any of model/heads.py `HEADS`)."""


def has_causal_form(config: Any) -> bool:
    """Whether the encoder of `config` can attend left to right: its `is_decoder` is a field."""
    return any(f.name == "is_decoder" for f in dataclasses.fields(config))


@dataclass(frozen=True)
class Objective:
    """One pre-training objective (see the module docstring)."""

    name: str
    """Its name in logs and errors."""
    metric_keys: tuple[str, ...] = ("loss", "mlm_loss", "mlm_correct", "mlm_count")
    """Attributes of the model's output summed per micro-batch (`loss` first)."""
    heads: tuple[str, ...] = ("mlm",)
    """Prefixes of the per-head metrics; the first is logged at every step."""
    causal: bool = False
    """Causal attention: each token sees itself and the earlier tokens of its instance."""
    next_sentence: bool = False
    """Trains on the shards' next-sentence labels, which the shards must then have."""
    model: Callable[[BertConfig, bool], nn.Module] = pretraining_model
    """(BertConfig, next_sentence) -> the model whose forward takes the loader's batch."""
    refuses: tuple[tuple[str, Any, str], ...] = ()
    """(setting, value, why): settings it cannot train with, by their dotted names
    (`data.dynamic_masking`)."""

    def build_model(self, config: BertConfig) -> nn.Module:
        """The model on `config`, with the attention this objective asks for."""
        if config.is_decoder != self.causal:
            if refusal := self.encoder_refusal(config):
                raise ValueError(f"objective.name={refusal}")
            config = config.replace(is_decoder=self.causal)
        return self.model(config, self.next_sentence)

    def encoder_refusal(self, config: Any) -> str | None:
        """Why the encoder of `config` cannot train this objective, or None: a causal objective
        needs an encoder whose `is_decoder` is a setting (BERT's), not a constant (ModernBERT's,
        which attends both ways only)."""
        if self.causal and not has_causal_form(config):
            return (f"{self.name} trains left-to-right (causal) attention, which "
                    f"model.arch={type(config).arch} does not have; use objective.name=mlm or "
                    "model.arch=bert")
        return None

    def check(self, config: Any) -> None:
        """Raise a one-line ValueError naming the setting of `config` (a PretrainConfig)
        this objective cannot train with."""
        from common.settings import SettingError
        for setting, value, why in self.refuses:
            if settings.setting_at(config, setting) == value:
                raise SettingError("objective.name", f"{self.name} cannot be combined with "
                                   f"{setting}={str(value).lower()} ({why})",
                                   "--set {setting}: {message}")
        if config.cadence.export_hf and self.model not in EXPORTED_MODELS:
            raise SettingError("objective.name", f"{self.name} trains a model model/hf.py "
                               "cannot export to Hugging Face (it exports BertForPreTraining); "
                               "set cadence.export_hf=false", "--set {setting}: {message}")
        if self.next_sentence and not config.objective.next_sentence:
            raise SettingError("objective.name", f"{self.name} trains next-sentence prediction, "
                               "which objective.next_sentence=false turns off; use "
                               "objective.name=mlm", "--set {setting}: {message}")
        if config.model.preset:  # init_from's encoder is refused when the model is built
            from model.encoders import PRESETS
            if refusal := self.encoder_refusal(PRESETS[config.model.preset]()):
                raise SettingError("objective.name", refusal, "--set {setting}: {message}")

    def check_shards(self, manifest: dict, where: str) -> None:
        """Refuse shards without what this objective needs; `where` names them."""
        if self.next_sentence and not has_nsp_labels(manifest):
            raise ValueError(f"{where}: shards made without next-sentence labels "
                             f"(--no_next_sentence), but objective.name={self.name} trains NSP; "
                             "use objective.name=mlm or make the shards with NSP pairs")


MLM_NSP = Objective(name="mlm_nsp",
                    metric_keys=("loss", "mlm_loss", "mlm_correct", "mlm_count", "nsp_loss",
                                 "nsp_correct", "nsp_count"),
                    heads=("mlm", "nsp"), next_sentence=True)
MLM = Objective(name="mlm")
NO_MASKS = "the left-to-right LM predicts every next token; it has no masks"
LTR = Objective(name="ltr", causal=True, model=next_token_model,
                refuses=(("data.dynamic_masking", True, NO_MASKS),))

OBJECTIVES: dict[str, Objective] = {"mlm_nsp": MLM_NSP, "mlm": MLM, "ltr": LTR}
"""The registered objectives by the name `--set objective.name=` takes."""


def registered() -> str:
    """The registered names as an error lists them: "mlm_nsp, mlm or ltr"."""
    names = list(OBJECTIVES)
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def get(spec: str) -> Objective:
    """The objective a setting names: a registered name or `module:attribute`."""
    if spec in OBJECTIVES:
        return OBJECTIVES[spec]
    unknown = (f"must be one of {registered()}, or module:attribute naming an Objective, "
               f"got {spec!r}")
    module_name, colon, attribute = spec.partition(":")
    if not (colon and module_name and attribute):
        raise ValueError(unknown)
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except ImportError as e:
        raise ValueError(f"{unknown} (cannot import {module_name}: {e})") from None
    except AttributeError:
        raise ValueError(f"{unknown} ({module_name} has no {attribute})") from None
    if not isinstance(found, Objective):
        raise ValueError(f"{unknown} ({spec} is a {type(found).__name__})")  # noqa: TRY004 (a bad setting)
    return found


def has_nsp_labels(manifest: dict) -> bool:
    """Whether shards hold next-sentence labels (a manifest without `nsp` predates MLM-only
    shards: it has them)."""
    return bool(manifest.get("nsp", True))


def for_shards(spec: str, next_sentence: bool, manifest: dict) -> Objective:
    """The objective a run trains on shards of `manifest`: the NSP rule, once. `mlm` trains
    NSP too (`mlm_nsp`) where `next_sentence` is on and the shards have the labels."""
    if spec == "mlm" and next_sentence and has_nsp_labels(manifest):
        return MLM_NSP
    return get(spec)
