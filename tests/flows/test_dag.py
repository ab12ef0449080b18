"""The DAG's data stages are one description (flows/dag.py `DATA_STAGES`): the flow submits
them as tasks and `bert-dag --plan` looks them up from it, so a stage added there is in both.
No Prefect server and nothing built: the flow's task factory is replaced by one that records
what the flow submits and calls the stage within `stages.looking_up()`."""
from __future__ import annotations

import dataclasses

import pytest

from flows import dag, pretrain_bert, steps
from flows.config import resolve
from flows.stages import StageResult, looking_up, run_stage, stage_dir


@dataclasses.dataclass
class Done:
    value: StageResult | None

    def result(self) -> StageResult | None:
        return self.value


def flow_stages(cfg, monkeypatch) -> tuple[list[str], list[StageResult]]:
    """The task names the flow submits for `cfg`'s data stages, and the stages it hands the
    report (looked up, not built)."""
    submitted = []

    class Recorded:  # stands in for the Prefect task of a stage
        def __init__(self, stage: dag.Stage):
            self.stage = stage

        def submit(self, *args) -> Done:
            submitted.append(self.stage.name)
            return Done(self.stage.run(*args))

    monkeypatch.setattr(pretrain_bert, "stage_task", Recorded)
    with looking_up():
        made = pretrain_bert.run_data_stages(cfg)
    return submitted, dag.stage_list(made)


def chain(cfg) -> list[StageResult]:
    """The tiny run's data stages (with the audit), called one by one: the keys the flow's
    stage functions compute."""
    with looking_up():
        sources = [steps.extract_wikipedia(cfg), steps.extract_books(cfg),
                   *(steps.extract_documents(cfg, s) for s in cfg.data.all_sources()
                     if s.generic)]
        corpus = steps.build_corpus(cfg, sources)
        audit = steps.audit_contamination(cfg, corpus)
        vocab = steps.train_vocab(cfg, corpus)
        return [*sources, corpus, audit, vocab,
                *(steps.make_shards(cfg, corpus, vocab, phase) for phase in (1, 2))]


def keys(results) -> list[tuple[str, str, str]]:
    return [(r.stage, r.path, r.config_hash) for r in results]


def test_the_flow_submits_and_the_plan_finds_the_stages_of_the_description(tmp_path,
                                                                          monkeypatch):
    cfg = resolve("tiny", {"output": str(tmp_path)})
    submitted, flow = flow_stages(cfg, monkeypatch)
    plan = dag.look_up_data_stages(cfg)
    assert submitted == ["extract-wikipedia", "extract-books", "extract-documents",
                         "build-corpus", "audit-contamination", "train-vocab", "make-shards",
                         "make-shards"]
    assert [s.stage for s in plan.found] == ["wikipedia", "books", "documents-poems", "corpus",
                                             "audit", "vocab", "shards128", "shards256"]
    assert keys(flow) == keys(plan.found) == keys(chain(cfg))
    assert (plan.corpus, plan.vocab, plan.shards) == (flow[3], flow[5], flow[6:])
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing built


def test_decontamination_replaces_the_corpus_the_vocabulary_reads(tmp_path, monkeypatch):
    cfg = resolve("tiny", {"output": str(tmp_path), "data": {"decontaminate": True}})
    submitted, flow = flow_stages(cfg, monkeypatch)
    plan = dag.look_up_data_stages(cfg)
    assert submitted[3:6] == ["build-corpus", "audit-contamination", "decontaminate"]
    # the report lists the corpus the vocabulary read, in the corpus's place
    assert [s.stage for s in plan.found][3:] == ["corpus-clean", "audit", "vocab", "shards128",
                                                 "shards256"]
    assert keys(flow) == keys(plan.found)
    with looking_up():
        assert plan.vocab.path == steps.train_vocab(cfg, plan.corpus).path


def test_continued_pretraining_takes_the_checkpoints_vocabulary_first(tmp_path, monkeypatch):
    """A remote checkpoint is not downloaded by a plan: its vocab stage is not found."""
    cfg = resolve("tiny", {"output": str(tmp_path), "finetune": {"data": ""},
                           "pretrain": {"model": {"init_from": "gs://bucket/bert"}}})
    submitted, flow = flow_stages(cfg, monkeypatch)
    assert submitted == ["checkpoint-vocab", "extract-wikipedia", "extract-books",
                         "extract-documents", "build-corpus", "make-shards", "make-shards"]
    plan = dag.look_up_data_stages(cfg)
    assert (plan.vocab.path, plan.vocab.cached) == (str(tmp_path / "vocab-?"), False)
    assert [s.stage for s in plan.found] == ["wikipedia", "books", "documents-poems", "corpus",
                                             "vocab", "shards128", "shards256"]
    assert keys(flow) == keys(plan.found)


def count_words(cfg, corpus: StageResult) -> StageResult:
    return run_stage(cfg.output, "words", {"min_count": 2}, lambda out: None, upstream=(corpus,))


def test_a_stage_added_to_the_description_is_in_the_flow_and_the_plan(tmp_path, monkeypatch):
    words = dag.Stage("count-words", "words", count_words, inputs=("corpus",))
    monkeypatch.setattr(dag, "DATA_STAGES", (*dag.DATA_STAGES, words))
    cfg = resolve("tiny", {"output": str(tmp_path), "finetune": {"data": ""}})
    submitted, flow = flow_stages(cfg, monkeypatch)
    plan = dag.look_up_data_stages(cfg)
    assert submitted[-3:] == ["make-shards", "make-shards", "count-words"]
    expected = stage_dir(str(tmp_path), "words", {"min_count": 2}, (plan.corpus,))[0]
    assert (plan.found[-1].stage, plan.found[-1].path, plan.found[-1].cached) == (
        "words", expected, False)
    assert keys(flow) == keys(plan.found)


# ---------------------------------------------------------------- the walk, on stand-in stages

def test_siblings_of_a_list_run_together_and_every_other_stage_waits(monkeypatch):
    """The order the flow starts and waits for runs in: the `first` stage before all, the
    stages of one list (and a fan-out's items) together, each other stage after those above
    it; a stage whose input was not made is left out, and a None result is dropped."""
    events = []

    class Run:
        def __init__(self, name, value):
            self.name, self.value = name, value

        def result(self):
            events.append(f"wait {self.name}")
            return self.value

    def submit(stage, args):
        name = stage.name + "".join(f" {a}" for a in args[1 + len(stage.inputs):])
        events.append(f"start {name}")
        value = None if name == "b" else StageResult(stage.output, name, name, False, 0.0)
        return Run(name, value)

    def stage(name, output, **fields):
        return dag.Stage(name, output, lambda *args: None, **fields)

    stages = (stage("a", "sources", many=True), stage("b", "sources", many=True),
              stage("c", "sources", each=lambda cfg: ("x", "y"), many=True),
              stage("corpus", "corpus", inputs=("sources",)),
              stage("audit", "audit", inputs=("corpus",), when=lambda cfg: False),
              stage("clean", "corpus", inputs=("corpus", "audit")),
              stage("vocab", "vocab", first=True),
              stage("shards", "shards", inputs=("corpus", "vocab"), each=lambda cfg: (1, 2),
                    many=True))
    made = dag.walk(None, stages, submit)
    assert events == ["start vocab", "wait vocab",
                      "start a", "start b", "start c x", "start c y",
                      "wait a", "wait b", "wait c x", "wait c y",
                      "start corpus", "wait corpus",
                      "start shards 1", "start shards 2", "wait shards 1", "wait shards 2"]
    assert [r.path for r in dag.stage_list(made)] == [
        "a", "c x", "c y", "corpus", "vocab", "shards 1", "shards 2"]
    assert made["audit"] is None


def test_a_fan_out_stage_makes_a_list():
    with pytest.raises(ValueError, match="fan-out"):
        dag.Stage("s", "out", lambda cfg, item: None, each=lambda cfg: (1,))
