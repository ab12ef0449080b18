"""GLUE readers on the real shared files and the bundled sample, HF layout, tokenization."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from finetune.glue import data as glue_data
from finetune.glue.tasks import TASKS, get_task, parse_tasks
from tests.support.glue_fixtures import glue_slice

SAMPLE_GLUE = Path(__file__).resolve().parents[3] / "data" / "sample" / "glue"

# (task, split) -> data rows in ../shared/data/glue (SOURCES.md section 1; the numbers).
SHARED_ROWS = {
    ("CoLA", "train"): 8551, ("CoLA", "dev"): 1043, ("CoLA", "test"): 1063,
    ("SST-2", "train"): 67349, ("SST-2", "dev"): 872, ("SST-2", "test"): 1821,
    ("MRPC", "train"): 3668, ("MRPC", "dev"): 408, ("MRPC", "test"): 1725,
    ("STS-B", "train"): 5749, ("STS-B", "dev"): 1500, ("STS-B", "test"): 1379,
    ("RTE", "train"): 2490, ("RTE", "dev"): 277, ("RTE", "test"): 3000,
    ("WNLI", "train"): 635, ("WNLI", "dev"): 71, ("WNLI", "test"): 146,
    ("QNLI", "dev"): 5463, ("QNLI", "test"): 5463,
    ("MNLI", "test_ax"): 1104,
}
# Class counts of the labelled files (label id -> rows), counted once with `cut -f`.
SHARED_LABELS = {
    ("CoLA", "train"): {0: 2528, 1: 6023}, ("CoLA", "dev"): {0: 322, 1: 721},
    ("SST-2", "train"): {0: 29780, 1: 37569}, ("SST-2", "dev"): {0: 428, 1: 444},
    ("MRPC", "train"): {0: 1194, 1: 2474}, ("MRPC", "dev"): {0: 129, 1: 279},
    ("RTE", "train"): {0: 1249, 1: 1241}, ("RTE", "dev"): {0: 146, 1: 131},
    ("WNLI", "train"): {0: 323, 1: 312}, ("WNLI", "dev"): {0: 40, 1: 31},
    ("QNLI", "dev"): {0: 2702, 1: 2761},
}


def _split_spec(task_name: str, split_name: str):
    task = TASKS[task_name]
    return task, next(s for s in (task.train, *task.dev, *task.test) if s.name == split_name)


def _read(root: Path, task_name: str, split_name: str, **kw) -> glue_data.GlueSplit:
    task, spec = _split_spec(task_name, split_name)
    return glue_data.read_split(str(root), task, spec, **kw)


@pytest.mark.parametrize("key", sorted(SHARED_ROWS))
def test_shared_row_counts(shared_data, key):
    split = _read(shared_data / "glue", *key)
    assert len(split) == SHARED_ROWS[key]
    assert split.bad_rows == []
    if key in SHARED_LABELS:
        assert dict(Counter(e.label for e in split.examples)) == SHARED_LABELS[key]
    if key[1].startswith("test"):
        assert all(e.label is None for e in split.examples)


def test_shared_quirks(shared_data):
    glue = shared_data / "glue"
    # MRPC: the BOM is not part of the header; the label is the first column.
    mrpc = _read(glue, "MRPC", "train").examples[0]
    assert (mrpc.label, mrpc.text_a[:20], mrpc.text_b[:20]) == (
        1, "Amrozi accused his b", "Referring to him as ")
    # Unbalanced quotes stay inside their field (quoting off).
    assert _read(glue, "MRPC", "dev").examples[0].text_b.startswith('"The foodservice pie')
    # SST-2: the trailing space before the tab is kept; test has none.
    assert _read(glue, "SST-2", "dev").examples[0].text_a == (
        "it 's a charming and often affecting journey . ")
    # STS-B: "5.000", "3.800", "4.4" and "4" are all scores.
    stsb = _read(glue, "STS-B", "train").examples
    assert [stsb[i].label for i in (0, 1, 1000, 1003)] == [5.0, 3.8, 4.4, 4.0]
    assert sum(e.label for e in stsb) == pytest.approx(15528.0433968, abs=1e-6)
    # CoLA dev: no header, and the last row (no final newline) is read whole.
    cola = _read(glue, "CoLA", "dev").examples
    assert (cola[0].text_a, cola[-1].text_a, cola[-1].label) == (
        "The sailors rode the breeze clear of the rocks.", "John talked to Bill about himself.", 1)
    # Ids come from the index column where there is one.
    assert _read(glue, "RTE", "test").examples[-1].guid == "2999"
    assert _read(glue, "QNLI", "dev").examples[0].label == 0  # "entailment"


def test_sample_data_keeps_format():
    counts = {("CoLA", "train"): 400, ("CoLA", "dev"): 100, ("SST-2", "train"): 400,
              ("MRPC", "train"): 300, ("STS-B", "train"): 300, ("RTE", "train"): 250}
    for (task_name, split_name), n in counts.items():
        assert len(_read(SAMPLE_GLUE, task_name, split_name)) == n
    for task_name in ("CoLA", "SST-2", "MRPC", "STS-B", "RTE"):
        assert len(_read(SAMPLE_GLUE, task_name, "dev")) == 100
        assert len(_read(SAMPLE_GLUE, task_name, "test")) == 100
    assert (SAMPLE_GLUE / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    assert not (SAMPLE_GLUE / "CoLA" / "dev.tsv").read_bytes().endswith(b"\n")
    assert sum(p.stat().st_size for p in SAMPLE_GLUE.rglob("*")) < 500_000


def _broken_copy(src: Path, tmp_path: Path, line_number: int, fix) -> Path:
    lines = src.read_text(encoding="utf-8").split("\n")
    lines[line_number - 1] = fix(lines[line_number - 1])
    out = tmp_path / src.parent.name / src.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def test_malformed_row_names_file_and_line(shared_data, tmp_path):
    task, spec = _split_spec("RTE", "dev")
    path = _broken_copy(shared_data / "glue" / "RTE" / "dev.tsv", tmp_path, 5,
                        lambda line: line.rsplit("\t", 1)[0])  # drop the label field
    with pytest.raises(glue_data.GlueFormatError,
                       match=rf"{path}:5: expected 4 tab-separated fields, found 3"):
        glue_data.read_glue_tsv(str(path), task, spec)
    # With skip_bad_rows the row is set aside and counted; the others are kept.
    split = glue_data.read_glue_tsv(str(path), task, spec, skip_bad_rows=True)
    assert len(split) == 276
    assert [(b.record, b.reason) for b in split.bad_rows] == [
        ("line 5", "expected 4 tab-separated fields, found 3")]


def test_bad_label_and_score_name_file_and_line(shared_data, tmp_path):
    task, spec = _split_spec("RTE", "train")
    path = _broken_copy(shared_data / "glue" / "RTE" / "train.tsv", tmp_path, 3,
                        lambda line: line.rsplit("\t", 1)[0] + "\tcontradiction")
    with pytest.raises(glue_data.GlueFormatError, match=rf"{path}:3: label 'contradiction' is not"):
        glue_data.read_glue_tsv(str(path), task, spec)
    task, spec = _split_spec("STS-B", "dev")
    path = _broken_copy(shared_data / "glue" / "STS-B" / "dev.tsv", tmp_path, 10,
                        lambda line: line.rsplit("\t", 1)[0] + "\tfive")
    with pytest.raises(glue_data.GlueFormatError, match=rf"{path}:10: could not convert"):
        glue_data.read_glue_tsv(str(path), task, spec)


def test_missing_split_names_both_layouts(tmp_path):
    task = TASKS["RTE"]
    with pytest.raises(FileNotFoundError, match="RTE/train.tsv nor a Hugging Face rte/train"):
        glue_data.read_split(str(tmp_path), task, task.train)


def _to_hf_rows(task, examples, with_labels: bool) -> list[dict]:
    rows = []
    for i, e in enumerate(examples):
        texts = [e.text_a] + ([e.text_b] if e.text_b is not None else [])
        row = dict(zip(task.hf_text_fields, texts), idx=i)
        row["label"] = e.label if with_labels else -1
        rows.append(row)
    return rows


def test_hf_layouts_read_like_the_tsv(shared_data, tmp_path):
    """Parquet (Hub), Arrow stream (save_to_disk) and JSON lines give the TSV's examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    task = TASKS["RTE"]
    tsv = _read(shared_data / "glue", "RTE", "dev").examples
    table = pa.Table.from_pylist(_to_hf_rows(task, tsv, with_labels=True))
    layouts = {
        "hub": lambda d: pq.write_table(table, d / "rte" / "validation-00000-of-00001.parquet"),
        "jsonl": lambda d: (d / "rte" / "validation.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in table.to_pylist()), encoding="utf-8"),
        "save_to_disk": lambda d: _write_arrow_stream(table, d / "rte" / "validation"),
    }
    for name, write in layouts.items():
        root = tmp_path / name
        (root / "rte").mkdir(parents=True)
        write(root)
        got = glue_data.read_split(str(root), task, task.dev[0]).examples
        assert len(got) == 277, name
        assert [(e.text_a, e.text_b, e.label) for e in got] == [
            (e.text_a, e.text_b, e.label) for e in tsv], name
        assert got[5].guid == "5"


def _write_arrow_stream(table, folder: Path) -> None:
    import pyarrow as pa

    folder.mkdir()
    with (pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink,
          pa.ipc.new_stream(sink, table.schema) as writer):
        writer.write_table(table)


def test_hf_test_split_and_bad_record(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    task = TASKS["MNLI"]
    (tmp_path / "mnli").mkdir()
    rows = [{"premise": "A man sleeps.", "hypothesis": "A man rests.", "label": -1, "idx": 0},
            {"premise": "It rains.", "hypothesis": "It is dry.", "label": -1, "idx": 1}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mnli" / "test_matched-00000-of-00001.parquet")
    split = glue_data.read_split(str(tmp_path), task, task.test[0])
    assert [(e.guid, e.text_b, e.label) for e in split.examples] == [
        ("0", "A man rests.", None), ("1", "It is dry.", None)]
    rows[1]["label"] = 7
    path = tmp_path / "mnli" / "validation_matched-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(glue_data.GlueFormatError, match=rf"{path}: row 0: label -1 is not a class"):
        glue_data.read_split(str(tmp_path), task, task.dev[0])


def test_tokenization_matches_transformers(shared_data, minilm_dir):
    """Our batched encoding = BertTokenizerFast with truncation to 128, pairs longest-first."""
    from transformers import AutoTokenizer

    task = TASKS["RTE"]
    split = _read(shared_data / "glue", "RTE", "train")
    encoded = glue_data.encode_split(glue_data.load_glue_tokenizer(str(minilm_dir)), split, task)
    peer = AutoTokenizer.from_pretrained(str(minilm_dir))
    reference = peer([e.text_a for e in split.examples], [e.text_b for e in split.examples],
                     truncation=True, max_length=128)
    assert [x.tolist() for x in encoded.input_ids] == reference["input_ids"]
    assert [x.tolist() for x in encoded.token_type_ids] == reference["token_type_ids"]
    assert int(encoded.lengths.max()) == 128
    assert int((encoded.lengths == 128).sum()) == 314  # pairs truncated to the limit
    assert encoded.labels.tolist() == [e.label for e in split.examples]


def test_collate_pads_to_longest_in_batch(minilm_dir):
    task = TASKS["SST-2"]
    examples = [glue_data.Example(str(i), t, None, i % 2) for i, t in
                enumerate(["a fine film .", "bad", "an utterly charming and moving tale ."])]
    split = glue_data.GlueSplit("SST-2", "dev", "<memory>", examples=examples)
    encoded = glue_data.encode_split(glue_data.load_glue_tokenizer(str(minilm_dir)), split, task)
    batch = glue_data.collate(encoded, [0, 1])
    assert batch.input_ids.shape == (2, 6)  # [CLS] a fine film . [SEP]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert batch.labels.tolist() == [0, 1]
    assert glue_data.collate(encoded, [1]).input_ids.shape == (1, 3)


def test_task_table():
    assert len(TASKS) == 9
    assert get_task("sts-b").name == get_task("stsb").name == "STS-B"
    assert [t.name for t in parse_tasks("rte,MRPC")] == ["RTE", "MRPC"]
    assert [t.name for t in TASKS.values() if t.small] == ["CoLA", "MRPC", "STS-B", "RTE", "WNLI"]
    assert TASKS["STS-B"].num_labels == 1 and TASKS["MNLI"].num_labels == 3
    assert [s.submission_file for t in TASKS.values() for s in t.test] == [
        "CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv",
        "AX.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv"]
    with pytest.raises(ValueError, match="--tasks: unknown GLUE task 'squad'"):
        parse_tasks("rte,squad")
    with pytest.raises(ValueError, match="listed twice"):
        parse_tasks("rte,RTE")
    assert np.all([t.train.columns.label is not None for t in TASKS.values()])


# ---------------------------------------------------------------------------------------------
# Bad input found early and reported with its place (bert-glue)
# ---------------------------------------------------------------------------------------------


def test_set_aside_rows_keep_their_raw_text(shared_data, tmp_path):
    task, spec = _split_spec("RTE", "dev")
    original = (shared_data / "glue" / "RTE" / "dev.tsv").read_text(encoding="utf-8").split("\n")
    path = _broken_copy(shared_data / "glue" / "RTE" / "dev.tsv", tmp_path, 7,
                        lambda line: line.rsplit("\t", 1)[0] + "\tmaybe")
    split = glue_data.read_glue_tsv(str(path), task, spec, skip_bad_rows=True)
    (bad,) = split.bad_rows
    assert (bad.file, bad.record) == (str(path), "line 7")
    assert bad.text == original[6].rsplit("\t", 1)[0] + "\tmaybe"  # the line as written
    assert json.loads(bad.to_json()) == {
        "file": str(path), "record": "line 7", "text": bad.text,
        "reason": "label 'maybe' is not one of ['entailment', 'not_entailment']"}


def test_text_that_is_not_utf8_names_its_line(shared_data, tmp_path):
    """A Latin-1 byte on line 100 stops the read there, with or without skip_bad_rows (the
    reader decodes ahead of the rows, so the line is located, not guessed)."""
    task, spec = _split_spec("RTE", "train")
    data = (shared_data / "glue" / "RTE" / "train.tsv").read_bytes().split(b"\n")
    data[99] = data[99].replace(b"a", b"\xe9", 1)
    path = tmp_path / "train.tsv"
    path.write_bytes(b"\n".join(data))
    for skip in (False, True):
        with pytest.raises(glue_data.GlueFormatError,
                           match=rf"{path}:100: not UTF-8 text \(invalid continuation byte"):
            glue_data.read_glue_tsv(str(path), task, spec, skip_bad_rows=skip)


def test_duplicate_vocab_token_names_both_lines(minilm_dir, tmp_path):
    lines = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[1996] == "the"
    (tmp_path / "vocab.txt").write_text("\n".join(lines + ["the"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{tmp_path}/vocab.txt:30523: token 'the' repeats "
                                         "line 1997"):
        glue_data.load_glue_tokenizer(str(tmp_path))
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert glue_data.load_glue_tokenizer(str(tmp_path)).get_vocab_size() == 30522


def test_unreadable_tokenizer_json_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{tmp_path}/tokenizer.json: not a tokenizers file"):
        glue_data.load_glue_tokenizer(str(tmp_path))


def test_check_task_files_reports_every_problem_before_training(shared_data, tmp_path):
    rte, mrpc = TASKS["RTE"], TASKS["MRPC"]
    root = glue_slice(shared_data, tmp_path / "glue",
                       {"RTE/train.tsv": 4, "RTE/dev.tsv": 4, "RTE/test.tsv": 4})
    glue_data.check_task_files(str(root), [rte], predict_test=True)  # all present and right
    with pytest.raises(FileNotFoundError) as missing:
        glue_data.check_task_files(str(root), [rte, mrpc], predict_test=True)
    assert str(missing.value).splitlines() == [
        f"--data {root}: 2 problem(s) found before any fine-tuning:",
        (f"  MRPC train: neither {root}/MRPC/train.tsv nor a Hugging Face mrpc/train.* file "
         f"under {root}"),
        (f"  MRPC dev: neither {root}/MRPC/dev.tsv nor a Hugging Face mrpc/validation.* file "
         f"under {root}")]
    # A test file with a label column (a dev file copied over it): checked only when predicted.
    (root / "RTE" / "test.tsv").write_bytes((root / "RTE" / "dev.tsv").read_bytes())
    glue_data.check_task_files(str(root), [rte], predict_test=False)
    with pytest.raises(glue_data.GlueFormatError) as malformed:
        glue_data.check_task_files(str(root), [rte, mrpc], predict_test=True)
    assert str(malformed.value).splitlines()[1:] == [
        (f"  MRPC train: neither {root}/MRPC/train.tsv nor a Hugging Face mrpc/train.* file "
         f"under {root}"),
        (f"  MRPC dev: neither {root}/MRPC/dev.tsv nor a Hugging Face mrpc/validation.* file "
         f"under {root}"),
        f"  {root}/RTE/test.tsv:1: header has 4 fields, expected 3 for RTE test"]
    # An empty file and a CoLA file (no header) whose first row lacks a field.
    (root / "RTE" / "train.tsv").write_bytes(b"")
    cola = glue_slice(shared_data, tmp_path / "cola", {"CoLA/dev.tsv": 3, "CoLA/train.tsv": 3})
    (cola / "CoLA" / "train.tsv").write_text("gj04\t1\tThe sailors rode.\n", encoding="utf-8")
    with pytest.raises(glue_data.GlueFormatError, match=r"RTE/train.tsv: empty file"):
        glue_data.check_task_files(str(root), [rte], predict_test=False)
    with pytest.raises(glue_data.GlueFormatError,
                       match=r"CoLA/train.tsv:1: first row has 3 fields, expected 4 for CoLA"):
        glue_data.check_task_files(str(cola), [TASKS["CoLA"]], predict_test=False)


def test_check_task_files_reads_hf_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    task = TASKS["RTE"]
    (tmp_path / "rte").mkdir()
    rows = [{"sentence1": "A man sleeps.", "sentence2": "A man rests.", "label": 0, "idx": 0}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rte" / "train-00000-of-00001.parquet")
    (tmp_path / "rte" / "validation.jsonl").write_text(
        json.dumps({"sentence1": "It rains.", "label": 1, "idx": 0}) + "\n", encoding="utf-8")
    with pytest.raises(glue_data.GlueFormatError, match=r"rte/validation.jsonl: missing columns "
                                                        r"\['sentence2'\] for RTE dev"):
        glue_data.check_task_files(str(tmp_path), [task], predict_test=False)
    (tmp_path / "rte" / "validation.jsonl").write_bytes(b"PAR1 not parquet")
    (tmp_path / "rte" / "validation.jsonl").rename(tmp_path / "rte" / "validation.parquet")
    with pytest.raises(glue_data.GlueFormatError, match=r"validation.parquet: not a readable "
                                                        r"parquet file"):
        glue_data.check_task_files(str(tmp_path), [task], predict_test=False)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rte" / "validation.parquet")
    glue_data.check_task_files(str(tmp_path), [task], predict_test=True)  # no test: optional


def test_hf_score_that_is_not_finite_is_a_bad_row(tmp_path):
    """STS-B in JSON lines: a NaN score would train to a NaN loss; it is a bad row instead."""
    task = TASKS["STS-B"]
    (tmp_path / "stsb").mkdir()
    rows = [{"sentence1": "A dog runs.", "sentence2": "A dog is running.", "label": 4.8, "idx": 0},
            {"sentence1": "It rains.", "sentence2": "The sun shines.", "label": float("nan"),
             "idx": 1}]
    path = tmp_path / "stsb" / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(glue_data.GlueFormatError,
                       match=rf"{path}: line 2: score nan is not a finite number"):
        glue_data.read_split(str(tmp_path), task, task.dev[0])
    split = glue_data.read_split(str(tmp_path), task, task.dev[0], skip_bad_rows=True)
    assert [e.label for e in split.examples] == [4.8]
    assert [(b.record, b.text) for b in split.bad_rows] == [("line 2", json.dumps(rows[1]))]
