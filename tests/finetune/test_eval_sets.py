"""Each family gives its evaluation sets (`Family.eval_texts`): a family written in its own
file and registered with one line reaches the contamination audit with no other edit, and the
built-in families read the bundled sample's splits."""
from __future__ import annotations

import textwrap
from pathlib import Path

from finetune import tasks
from finetune.eval_sets import read_eval_texts
from pipelines import audit_contamination
from pipelines.contamination import index as eval_index
from pipelines.contamination.eval_sets import keyed_examples

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"

HAIKU_FAMILY = '''
"""A family of its own: one poem per line of <data>/haiku/{dev,test}.txt."""
import os

from finetune.family import EvalTexts

TASKS = ("haiku",)


class HaikuFamily:
    name = "haiku"

    def eval_texts(self, task, data_dir, skip_bad_records=False):
        texts = []
        for split in ("dev", "test"):
            path = os.path.join(data_dir, f"{split}.txt")
            with open(path, encoding="utf-8") as f:
                poems = [line.strip() for line in f if line.strip()]
            texts.append(EvalTexts.of(task, split, [path],
                                      ((f"poem {i}", (poem,)) for i, poem in enumerate(poems))))
        return texts


FAMILY = HaikuFamily()
'''

POEMS = {
    "dev": ["an old silent pond a frog jumps into the pond splash silence again and again",
            "autumn moonlight a worm digs silently into the chestnut under the bright moon"],
    "test": ["over the wintry forest winds howl in rage with no leaves to blow at all tonight"],
}


def test_a_family_registered_with_one_line_reaches_the_audit(tmp_path, monkeypatch):
    (tmp_path / "haiku_family.py").write_text(textwrap.dedent(HAIKU_FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(tasks.FAMILIES, "haiku", "haiku_family")  # the one registry line
    data = tmp_path / "data"
    (data / "haiku").mkdir(parents=True)
    for split, poems in POEMS.items():
        (data / "haiku" / f"{split}.txt").write_text("".join(p + "\n" for p in poems))

    splits = read_eval_texts(str(data), tasks.parse_tasks("haiku"))
    assert [(s.task, s.split, s.files, len(s.examples)) for s in splits] == [
        ("haiku", "dev", (str(data / "haiku" / "dev.txt"),), 2),
        ("haiku", "test", (str(data / "haiku" / "test.txt"),), 1)]
    index = eval_index.build(keyed_examples(splits), 13)
    planted = f"As the poet wrote: {POEMS['dev'][1].upper()}! Then the essay goes on."
    records, shared = audit_contamination.passage_overlaps(index, "essays/7", 2, planted)
    assert [(r["task"], r["split"], r["example_id"], r["doc_id"], r["passage"])
            for r in records] == [("haiku", "dev", "poem 1", "essays/7", 2)]
    assert records[0]["ngram"] == "autumn moonlight a worm digs silently into the chestnut " \
                                  "under the bright moon"
    assert len(shared) == 1  # the poem is 13 words: one 13-gram
    assert audit_contamination.passage_overlaps(index, "essays/8", 0, POEMS["dev"][0][:60])[
        0] == []  # fewer than 13 of its words


def test_the_built_in_families_read_the_bundled_sample():
    entries = tasks.parse_tasks("rte,mrpc,squad1,squad2")
    texts = read_eval_texts(str(SAMPLE), entries)
    assert [(t.task, t.split, len(t.examples)) for t in texts] == [
        ("rte", "dev", 100), ("rte", "test", 100), ("mrpc", "dev", 100), ("mrpc", "test", 100),
        ("squad1", "dev", 37), ("squad2", "dev", 115)]
    rte_dev = texts[0]
    assert rte_dev.files == (str(SAMPLE / "glue" / "RTE" / "dev.tsv"),)
    first = (SAMPLE / "glue" / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1]
    guid, sentence1, sentence2, _ = first.split("\t")
    assert rte_dev.examples[0] == (guid, (sentence1, sentence2))


def test_multiple_choice_and_ner_read_their_dev_files(shared_data, tmp_path):
    (tmp_path / "swag").mkdir()
    (tmp_path / "swag" / "val.csv").symlink_to(shared_data / "swag" / "val-first11.csv")
    (tmp_path / "conll2003").symlink_to(shared_data / "conll2003")
    texts = read_eval_texts(str(tmp_path), tasks.parse_tasks("swag,conll2003"))
    assert [(t.task, t.split, len(t.examples)) for t in texts] == [
        ("swag", "dev", 11), ("conll2003", "dev", 3250), ("conll2003", "test", 3453)]
    assert texts[0].examples[0] == ("0", (
        "Students lower their eyes nervously.",
        "She pats her shoulder, then saunters toward someone.",
        "She turns with two students.", "She walks slowly towards someone.",
        "She wheels around as her dog thunders out."))
