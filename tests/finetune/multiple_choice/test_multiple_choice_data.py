"""Multiple-choice readers and encoding on the real SWAG rows and Cosmos QA validation file."""
from __future__ import annotations

import csv
import io
import json
from collections import Counter

import pytest

from finetune.multiple_choice import data as mc_data

SWAG = mc_data.SPECS["swag"]
COSMOS = mc_data.SPECS["cosmosqa"]


@pytest.fixture(scope="module")
def swag_val(shared_data):
    return shared_data / "swag" / "val-first11.csv"


@pytest.fixture(scope="module")
def cosmos_valid(shared_data):
    return shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"


@pytest.fixture(scope="module")
def cosmos(cosmos_valid):
    return mc_data.read_choice_csv(str(cosmos_valid), COSMOS)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from finetune.checkpoint import load_tokenizer

    return load_tokenizer(str(minilm_dir))


def test_swag_official_csv(swag_val):
    split = mc_data.read_choice_csv(str(swag_val), SWAG)
    assert len(split) == 11 and split.bad_records == []
    assert [e.label for e in split.examples] == [2, 2, 2, 2, 2, 0, 0, 2, 1, 0, 2]
    # The unnamed first column (the row index) is the id; records start on lines 2..12.
    assert [e.example_id for e in split.examples] == [str(i) for i in range(11)]
    assert [e.line for e in split.examples] == list(range(2, 13))
    first = split.examples[0]
    assert first.first == "Students lower their eyes nervously."  # sent1
    assert first.choices == (  # sent2 + " " + ending_i
        "She pats her shoulder, then saunters toward someone.",
        "She turns with two students.",
        "She walks slowly towards someone.",
        "She wheels around as her dog thunders out.")


def test_swag_test_file_without_labels(swag_val, tmp_path):
    """The official test.csv has no label column: labels read as None (as HF's -1)."""
    rows = list(csv.reader(io.StringIO(swag_val.read_text(encoding="utf-8"), newline="")))
    test = tmp_path / "test.csv"
    with open(test, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(row[:-1] for row in rows)
    split = mc_data.read_choice_csv(str(test), SWAG, labelled=False)
    assert len(split) == 11 and {e.label for e in split.examples} == {None}
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"test\.csv:1: header lacks the swag columns \['label'\]"):
        mc_data.read_choice_csv(str(test), SWAG)


def jsonl_rows(cosmos_valid, count: int) -> list[dict]:
    """The first `count` rows of valid.csv as test.jsonl's objects: its keys, no label."""
    with open(cosmos_valid, encoding="utf-8", newline="") as f:
        rows = [row for _, row in zip(range(count), csv.DictReader(f))]
    return [{k: v for k, v in row.items() if k != "label"} for row in rows]


def test_cosmos_qa_test_jsonl_reads_as_the_csv_without_labels(cosmos, cosmos_valid, tmp_path):
    """Cosmos QA's test.jsonl: one object per line with valid.csv's keys but the label; a
    blank line is no record."""
    path = tmp_path / "test.jsonl"
    lines = [json.dumps(row) for row in jsonl_rows(cosmos_valid, 5)]
    path.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n", encoding="utf-8")
    split = mc_data.read_choice_file(str(path), COSMOS, labelled=False)
    assert [e.line for e in split.examples] == [1, 2, 3, 5, 6]
    assert [(e.example_id, e.first, e.choices) for e in split.examples] == \
        [(e.example_id, e.first, e.choices) for e in cosmos.examples[:5]]
    assert {e.label for e in split.examples} == {None}
    # A line separator inside a JSON string (valid JSON, seen in web text) ends no line.
    separated = tmp_path / "separated.jsonl"
    separated.write_text(cosmos_line("q1", context="one\u2028two") + "\r\n"
                         + cosmos_line("q2") + "\r\n", encoding="utf-8")
    assert "\u2028" in separated.read_text(encoding="utf-8")  # raw, not escaped
    split = mc_data.read_choice_file(str(separated), COSMOS, labelled=False)
    assert [(e.example_id, e.line) for e in split.examples] == [("q1", 1), ("q2", 2)]
    assert split.examples[0].first == "one\u2028two q"
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"test\.jsonl:1 \(id 3BFF0DJK8XA7YNK4QYIGCOG1A95STE##.*\): "
                             r"label is empty"):
        mc_data.read_choice_file(str(path), COSMOS)  # as a labelled file


def cosmos_line(example_id: str, **changes) -> str:
    """One test.jsonl line; `changes` replace keys (None drops one)."""
    record = {"id": example_id, "context": "c", "question": "q", "answer0": "a",
              "answer1": "b", "answer2": "c", "answer3": "d", **changes}
    return json.dumps({k: v for k, v in record.items() if v is not None}, ensure_ascii=False)


@pytest.mark.parametrize("line, message", [
    ("{not json", r"bad\.jsonl:2: not JSON \(Expecting property name"),
    ('["q2"]', r"bad\.jsonl:2: a JSON list, expected an object"),
    (cosmos_line("q2", answer3=None),
     r"bad\.jsonl:2 \(id q2\): lacks the cosmosqa keys \['answer3'\]"),
    (cosmos_line("q2", label=7), r"bad\.jsonl:2 \(id q2\): label '7' is not a choice index 0\.\.3"),
    (cosmos_line("q1"), r"bad\.jsonl:2 \(id q1\): id 'q1' repeats line 1"),
])
def test_a_malformed_json_line_is_named_by_file_line_and_id(tmp_path, line, message):
    path = write(tmp_path, "\n".join([cosmos_line("q1"), line, cosmos_line("q3")]) + "\n",
                 "bad.jsonl")
    with pytest.raises(mc_data.MultipleChoiceFormatError, match=message):
        mc_data.read_choice_file(path, COSMOS, labelled=False)
    split = mc_data.read_choice_file(path, COSMOS, labelled=False, skip_bad_records=True)
    assert [e.example_id for e in split.examples] == ["q1", "q3"]
    assert [(b.file, b.record[:6]) for b in split.bad_records] == [(path, "line 2")]


def test_cosmos_qa_validation_file(cosmos, cosmos_valid):
    assert len(cosmos) == 2985 and cosmos.bad_records == []
    assert Counter(e.label for e in cosmos.examples) == {0: 744, 1: 729, 2: 761, 3: 751}
    assert len({e.example_id for e in cosmos.examples}) == 2985
    # CRLF line ends and no final newline: the last record is on line 2986.
    assert cosmos.examples[-1].line == 2986
    first = cosmos.examples[0]
    assert first.example_id.startswith("3BFF0DJK8XA7YNK4QYIGCOG1A95STE##")
    assert first.first.startswith("Do i need to go for a legal divorce ?")
    assert first.first.endswith("any complication ? Why is this person asking about divorce ?")
    assert first.choices[1] == "He wants to get married to a different person ."
    assert first.label == 1


def test_split_by_passage_is_fixed_and_disjoint(cosmos, cosmos_valid, tmp_path):
    train_path, dev_path = tmp_path / "train.csv", tmp_path / "valid.csv"
    counts = mc_data.split_by_group(str(cosmos_valid), "context", 5, str(train_path),
                                    str(dev_path))
    assert counts == (2379, 606)
    train = mc_data.read_choice_csv(str(train_path), COSMOS)
    dev = mc_data.read_choice_csv(str(dev_path), COSMOS)
    assert (len(train), len(dev)) == counts
    # Every example once, unchanged; no passage on both sides (489 of the 2,445 go to dev).
    assert sorted(e.example_id for e in train.examples + dev.examples) == \
        sorted(e.example_id for e in cosmos.examples)
    by_id = {e.example_id: e for e in cosmos.examples}
    assert all((e.first, e.choices, e.label) == (by_id[e.example_id].first,
               by_id[e.example_id].choices, by_id[e.example_id].label)
               for e in train.examples + dev.examples)
    rows = list(csv.DictReader(io.StringIO(cosmos_valid.read_text(encoding="utf-8"),
                                           newline="")))
    context = {r["id"]: r["context"] for r in rows}
    dev_passages = {context[e.example_id] for e in dev.examples}
    assert len(dev_passages) == 489 and len({r["context"] for r in rows}) == 2445
    assert not dev_passages & {context[e.example_id] for e in train.examples}


def write(tmp_path, text: str, name: str = "bad.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


COSMOS_HEADER = "id,context,question,answer0,answer1,answer2,answer3,label\r\n"


@pytest.mark.parametrize("row, message", [
    ("q2,ctx,why?,a,b,c,d,4", r"bad\.csv:3 \(id q2\): label '4' is not a choice index 0\.\.3"),
    ("q2,ctx,why?,a,b,c,d,x", r"bad\.csv:3 \(id q2\): label 'x' is not a choice index"),
    ("q2,ctx,why?,a,b,c,d,-1", r"bad\.csv:3 \(id q2\): label '-1' is not a choice index"),
    ("q2,ctx,why?,a,b,c,d,", r"bad\.csv:3 \(id q2\): label is empty"),
    ("q2,ctx,why?,a,b,c,1", r"bad\.csv:3 \(id q2\): expected 8 comma-separated fields, found 7"),
    ("q1,ctx,why?,a,b,c,d,1", r"bad\.csv:3 \(id q1\): id 'q1' repeats line 2"),
])
def test_a_malformed_row_is_named_by_file_line_and_id(tmp_path, row, message):
    path = write(tmp_path, COSMOS_HEADER + "q1,ctx,why?,a,b,c,d,0\r\n" + row + "\r\n"
                 + "q3,ctx,why?,a,b,c,d,3\r\n")
    with pytest.raises(mc_data.MultipleChoiceFormatError, match=message):
        mc_data.read_choice_csv(path, COSMOS)
    # Set aside instead: counted with its place and reason; the other rows are read.
    split = mc_data.read_choice_csv(path, COSMOS, skip_bad_records=True)
    assert [e.example_id for e in split.examples] == ["q1", "q3"]
    assert len(split.bad_records) == 1
    bad = split.bad_records[0]
    assert bad.file == path and bad.record.startswith("line 3 (id q")


def test_file_level_problems_are_errors_even_when_skipping(tmp_path):
    multiline = COSMOS_HEADER + 'q1,"two\r\nlines",why?,a,b,c,d,0\r\nq2,c,"bad"quote,a,b,c,d,1\r\n'
    with pytest.raises(mc_data.MultipleChoiceFormatError, match=r"bad\.csv:4: ',' expected after '\"'"):
        mc_data.read_choice_csv(write(tmp_path, multiline), COSMOS, skip_bad_records=True)
    latin1 = (COSMOS_HEADER + "q1,ctx,why?,a,b,c,d,0\r\nq2,caf\xe9,why?,a,b,c,d,1\r\n")
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"bad\.csv:3: not UTF-8 text \(invalid continuation byte, byte 0xe9\)"):
        mc_data.read_choice_csv(write(tmp_path, latin1.encode("latin-1")), COSMOS,
                                skip_bad_records=True)
    no_question = "id,context,answer0,answer1,answer2,answer3,label\r\n"
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"bad\.csv:1: header lacks the cosmosqa columns \['question'\]"):
        mc_data.read_choice_csv(write(tmp_path, no_question), COSMOS, skip_bad_records=True)
    with pytest.raises(mc_data.MultipleChoiceFormatError, match=r"bad\.csv: empty file"):
        mc_data.read_choice_csv(write(tmp_path, ""), COSMOS)


def test_a_file_of_only_bad_rows_is_an_error(tmp_path):
    write(tmp_path, COSMOS_HEADER + "q1,ctx,why?,a,b,c,d,7\r\n", "train.csv")
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"train\.csv: no cosmosqa examples \(1 malformed rows set aside\)"):
        mc_data.read_split(str(tmp_path), COSMOS, "train", skip_bad_records=True)


def test_check_files_names_the_missing_file_and_a_bad_header(tmp_path, swag_val):
    swag = tmp_path / "swag"
    swag.mkdir()
    with pytest.raises(FileNotFoundError, match=r"swag/train\.csv: no swag train file \(the "
                                                r"folder needs train\.csv and val\.csv\)"):
        mc_data.check_files(str(swag), SWAG)
    (swag / "train.csv").write_bytes(swag_val.read_bytes())
    with pytest.raises(FileNotFoundError, match=r"swag/val\.csv: no swag dev file"):
        mc_data.check_files(str(swag), SWAG)
    (swag / "val.csv").write_text("video-id,sent1,sent2,label\n1,a,b,0\n")
    with pytest.raises(mc_data.MultipleChoiceFormatError,
                       match=r"val\.csv:1: header lacks the swag columns \['ending0', 'ending1'"):
        mc_data.check_files(str(swag), SWAG)


def test_subset_is_fixed_and_in_file_order(cosmos):
    a, b = mc_data.subset(cosmos, 100), mc_data.subset(cosmos, 100)
    assert [e.example_id for e in a.examples] == [e.example_id for e in b.examples]
    lines = [e.line for e in a.examples]
    assert len(lines) == 100 and lines == sorted(lines)
    assert mc_data.subset(cosmos, None) is cosmos


def test_encoding_equals_transformers_tokenizer(cosmos, tokenizer, minilm_dir):
    """Four (A, B_i) pairs per example, truncated longest-first to 128 as the HF tokenizer does
    with truncation=True: the same ids and token types, on real rows, truncated ones included."""
    import transformers

    examples = cosmos.examples[:200]
    encoded = mc_data.encode_split(tokenizer, examples, 128)
    hf = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    expected = hf([e.first for e in examples for _ in e.choices],
                  [c for e in examples for c in e.choices], truncation=True, max_length=128)
    ids = [list(s) for x in encoded.input_ids for s in x]
    types = [list(s) for x in encoded.token_type_ids for s in x]
    assert ids == expected["input_ids"] and types == expected["token_type_ids"]
    assert sum(len(s) == 128 for s in ids) == 127  # truncated pairs among the 800
    assert encoded.num_choices == 4 and len(encoded) == 200
    assert encoded.labels.tolist() == [e.label for e in examples]
    assert encoded.lengths[0] == sum(len(s) for s in ids[:4])
    # Truncation happens in a copy: the caller's tokenizer keeps its own setting (none).
    short = mc_data.encode_split(tokenizer, examples[:5], 64)
    assert max(len(s) for x in short.input_ids for s in x) == 64
    assert tokenizer.truncation is None


def test_swag_encoding_is_sent1_then_sent2_and_ending(swag_val, tokenizer):
    split = mc_data.read_choice_csv(str(swag_val), SWAG)
    encoded = mc_data.encode_split(tokenizer, split, 128)
    first = tokenizer.decode(encoded.input_ids[0][0].tolist(), skip_special_tokens=False)
    assert first == ("[CLS] students lower their eyes nervously. [SEP] she pats her shoulder, "
                     "then saunters toward someone. [SEP]")
    assert encoded.token_type_ids[0][0].tolist() == [0] * 8 + [1] * 14
    assert encoded.example_ids == [str(i) for i in range(11)]


def test_header_line_is_read_with_its_bom(tmp_path):
    path = write(tmp_path, "\ufeff" + COSMOS_HEADER + "q1,ctx,why?,a,b,c,d,2\r\n")
    assert [e.label for e in mc_data.read_choice_csv(path, COSMOS).examples] == [2]
    assert list(mc_data.csv_records(path, io.StringIO("a\r\n\r\nb\r\n").getvalue())) == \
        [(1, ["a"]), (3, ["b"])]
