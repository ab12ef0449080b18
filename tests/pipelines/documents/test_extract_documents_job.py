"""A user's own corpus through the extract_documents job (real Beam, real files): each kind with
planted bad records, the field map, a source whose every record is bad, three kinds into one
documents folder, and the weights applied by build_corpus after deduplication."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import errors, settings
from pipelines import build_corpus, extract_documents
from pipelines.documents import source as mixture
from pipelines.documents.source import SourceConfig
from pipelines.extract_documents import ExtractDocumentsConfig

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample"


def _run(tmp_path: Path, *sources: SourceConfig, out: str = "out") -> tuple[dict, list, list]:
    manifest = extract_documents.run(ExtractDocumentsConfig(sources=sources,
                                                            output=str(tmp_path / out)))
    docs = [row for path in sorted((tmp_path / out).glob("documents-*.parquet"))
            for row in pq.read_table(path).to_pylist()]
    dead = (tmp_path / out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text()
    return manifest, docs, [json.loads(line) for line in dead.splitlines()]


def _ids(docs: list[dict]) -> list[str]:
    return sorted(d["doc_id"] for d in docs)


def test_jsonl_bad_records_are_dead_letters_with_their_line(tmp_path):
    path = tmp_path / "news.jsonl"
    path.write_bytes(b'{"id": 7, "text": "First story. It ends.", "headline": "One"}\n'
                     b'{"id": 8, "text": "broken\n'           # line 2: invalid JSON
                     b'{"id": 9, "text": 42}\n'              # line 3: not a string
                     b'{"id": 10}\n'                         # line 4: no text field
                     b'\n'                                    # line 5: blank, skipped
                     b'{"id": 11, "text": " \\n "}\n'        # line 6: empty text
                     b'["a list"]\n'                          # line 7: not an object
                     b'{"id": 12, "text": "caf\xe9"}\n'      # line 8: Latin-1 byte
                     b'{"id": 13, "text": "A.\\n\\nB said so."}\n')
    source = SourceConfig(name="news", kind="jsonl", path=str(path), id_field="id",
                          title_field="headline", licence="CC BY 4.0")
    manifest, docs, dead = _run(tmp_path, source)
    assert docs == [
        {"doc_id": "news/13", "source": "news", "source_file": str(path), "title": "",
         "passages": ["A.", "B said so."]},
        {"doc_id": "news/7", "source": "news", "source_file": str(path), "title": "One",
         "passages": ["First story. It ends."]}]
    assert [(d["file"], d["record"]) for d in dead] == [(str(path), f"line {n}")
                                                        for n in (2, 3, 4, 6, 7, 8)]
    assert dead[1]["reason"] == "field 'text' is int, not a string: '42'"
    assert dead[2]["reason"] == "no field 'text' (fields: id)"
    assert dead[5]["reason"].startswith("undecodable bytes (not UTF-8) at byte 23")
    assert manifest["sources"]["news"] == {
        "kind": "jsonl", "path": str(path), "licence": "CC BY 4.0", "input_files": 1,
        "input_bytes": path.stat().st_size, "records_read": 8, "bad_records": 6,
        "documents": 2, "bad": {"empty_text": 1, "invalid_json": 1, "missing_field": 1,
                                "not_a_string": 1, "not_an_object": 1, "undecodable": 1}}
    assert manifest["counts"] == {"records_read": 8, "bad_records": 6, "documents": 2}


def test_csv_and_tsv_rows_and_ids_by_row(tmp_path):
    (tmp_path / "in").mkdir()
    csv_path = tmp_path / "in" / "a.csv"
    csv_path.write_bytes(b'body,kind\n'
                         b'"A quoted, two-line\n\nreview.",x\n'  # row 1, lines 2-4
                         b'\xff bad,y\n'                          # row 2: undecodable
                         b',z\n'                                   # row 3: empty text
                         b'Last one.,w\n')                         # row 4
    tsv_path = tmp_path / "in" / "b.tsv"
    tsv_path.write_text("body\tkind\nTab separated text.\tq\n", encoding="utf-8")
    (tmp_path / "in" / "notes.md").write_text("not a csv file")
    csv_source = SourceConfig(name="reviews", kind="csv", path=str(tmp_path / "in"),
                              text_field="body")
    tsv_source = SourceConfig(name="tabs", kind="tsv", path=str(tsv_path), text_field="body")
    manifest, docs, dead = _run(tmp_path, csv_source, tsv_source)
    assert [(d["doc_id"], d["passages"]) for d in sorted(docs, key=lambda d: d["doc_id"])] == [
        ("reviews/a.csv:row1", ["A quoted, two-line", "review."]),
        ("reviews/a.csv:row4", ["Last one."]),
        ("tabs/b.tsv:row1", ["Tab separated text."])]
    assert [(d["record"], d["reason"]) for d in dead] == [
        ("row 2 (line 5)", "undecodable bytes (not UTF-8)"),
        ("row 3 (line 6)", "field 'body' holds no text")]
    assert manifest["skipped_inputs"] == [str(tmp_path / "in" / "b.tsv"),
                                          str(tmp_path / "in" / "notes.md")]


def test_parquet_and_hf_datasets_rows(tmp_path):
    table = pa.table({"content": ["Row one text.", None, "Row three text."],
                      "uid": ["u1", "u2", "u3"], "name": ["T1", "T2", None]})
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=2)
    saved = tmp_path / "saved"  # a `datasets` save_to_disk folder: Arrow IPC stream files
    saved.mkdir()
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text("{}")
    fields = {"text_field": "content", "id_field": "uid", "title_field": "name"}
    manifest, docs, dead = _run(
        tmp_path, SourceConfig(name="pq", kind="parquet", path=str(tmp_path / "part.parquet"),
                               **fields),
        SourceConfig(name="hf", kind="hf_datasets", path=str(saved), **fields))
    assert [(d["doc_id"], d["title"], d["passages"]) for d in docs] == [
        ("hf/u1", "T1", ["Row one text."]), ("hf/u3", "", ["Row three text."]),
        ("pq/u1", "T1", ["Row one text."]), ("pq/u3", "", ["Row three text."])]
    null = "field 'content' is null (fields: content, name, uid)"
    assert [(Path(d["file"]).name, d["record"], d["reason"]) for d in dead] == [
        ("part.parquet", "row 2", null), ("data-00000-of-00001.arrow", "row 2", null)]
    assert sorted(manifest["skipped_inputs"]) == [str(saved / "dataset_info.json"),
                                                  str(saved / "state.json")]


def test_text_folder_by_file_and_by_blank_line(tmp_path):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("One note.\nStill one.\n\n\n\nSecond block.\n")
    (folder / "sub" / "b.txt").write_bytes(b"Latin-1 \xe9 text.\n")
    (folder / "data.jsonl").write_text('{"text": "not for the text kind"}\n')
    manifest, docs, dead = _run(tmp_path, SourceConfig(name="notes", kind="text",
                                                       path=str(folder)))
    assert [(d["doc_id"], d["passages"]) for d in docs] == [
        ("notes/a.txt", ["One note. Still one.", "Second block."])]
    assert [(d["record"], d["reason"][:30]) for d in dead] == [
        ("file", "undecodable bytes (not UTF-8) ")]
    assert manifest["skipped_inputs"] == [str(folder / "data.jsonl")]
    _, blocks, _ = _run(tmp_path, SourceConfig(name="notes", kind="text", split="blank_line",
                                               path=str(folder / "a.txt")), out="blocks")
    assert [(d["doc_id"], d["passages"]) for d in blocks] == [
        ("notes/a.txt:line1", ["One note. Still one."]), ("notes/a.txt:line6", ["Second block."])]


def test_text_one_document_per_line_on_a_shared_book(tmp_path, shared_data):
    """`split: line`: each non-empty line of Blake's poems (1,094 of its lines) is a
    document `<file>:line<N>`; an undecodable line is set aside alone, a binary file is one
    dead letter, and \r\n ends a line as \n does."""
    folder = tmp_path / "lines"
    folder.mkdir()
    (folder / "blake-poems.txt").write_bytes((shared_data / "books" / "blake-poems.txt").read_bytes())
    (folder / "mixed.txt").write_bytes(b"First line.\r\n\r\n  \r\ncaf\xe9 au lait\r\nLast line.")
    (folder / "image.txt").write_bytes(bytes(range(256)) * 4)
    manifest, docs, dead = _run(tmp_path, SourceConfig(name="lines", kind="text", split="line",
                                                       path=str(folder)))
    blake = sorted((d for d in docs if "blake" in d["doc_id"]),
                   key=lambda d: int(d["doc_id"].rsplit(":line", 1)[1]))
    assert len(blake) == 1094
    assert [(d["doc_id"], d["passages"]) for d in blake[:2] + blake[-1:]] == [
        ("lines/blake-poems.txt:line1", ["[Poems by William Blake 1789]"]),
        ("lines/blake-poems.txt:line4", ["SONGS OF INNOCENCE AND OF EXPERIENCE"]),
        ("lines/blake-poems.txt:line1439",
         ["Fled back unhinderd till she came into the vales of Har"])]
    assert _ids(d for d in docs if "mixed" in d["doc_id"]) == ["lines/mixed.txt:line1",
                                                               "lines/mixed.txt:line5"]
    assert sorted((Path(d["file"]).name, d["record"], d["reason"][:30]) for d in dead) == [
        ("image.txt", "file", "binary, not text: 9.8% of byte"),
        ("mixed.txt", "line 4", "undecodable bytes (not UTF-8)")]
    assert manifest["sources"]["lines"]["records_read"] == 1094 + 3 + 1
    assert manifest["sources"]["lines"]["bad"] == {"binary": 1, "undecodable": 1}


def test_a_source_whose_every_record_is_bad_fails_in_one_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "Fine."}\n')
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"body": "wrong field"}\nnot json\n')
    with pytest.raises(errors.NoOutputError) as caught:
        _run(tmp_path, SourceConfig(name="good", kind="jsonl", path=str(good)),
             SourceConfig(name="broken", kind="jsonl", path=str(broken)))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"source 'broken' (jsonl, {broken}): 0 documents from 2 record(s), "
                              "2 bad, set aside in ")
    assert message.endswith(f"(first: {broken} line 1: no field 'text' (fields: body)); no "
                            "manifest written")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_command_line_one_source_and_its_errors(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text('{"key": "k1", "body": "Text one."}\n')
    manifest = extract_documents.main(["--input", str(path), "--kind", "jsonl", "--name", "mine",
                                       "--text_field", "body", "--id_field", "key",
                                       "--output", str(tmp_path / "out")])
    assert manifest["counts"]["documents"] == 1
    assert manifest["config"]["sources"][0]["name"] == "mine"
    assert pq.read_table(tmp_path / "out" / "documents-00000-of-00001.parquet").to_pylist()[0][
        "doc_id"] == "mine/k1"
    code = extract_documents.jobs.main(extract_documents.NAMESPACE, extract_documents.main, [
        "--input", str(path), "--kind", "wikipedia", "--output", str(tmp_path / "x")])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(
        "--kind source 'wikipedia': kind wikipedia has its own job "
        "(pipelines/extract_wikipedia.py)")


# ---------------------------------------------------------------- three kinds, one folder

def three_sources(root: Path) -> tuple[SourceConfig, ...]:
    """A JSONL file, a Parquet file and a text folder, 6 documents in all."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.jsonl").write_text("".join(json.dumps({"id": i, "text": f"Jsonl document {i}. "
                                                      "It has two sentences."}) + "\n"
                                          for i in range(3)))
    pq.write_table(pa.table({"text": ["Parquet row one. Done.", "Parquet row two. Done."]}),
                   root / "b.parquet")
    (root / "texts").mkdir(exist_ok=True)
    (root / "texts" / "c.txt").write_text("A plain text file. With two sentences.\n")
    return (SourceConfig(name="web", kind="jsonl", path=str(root / "a.jsonl"), id_field="id"),
            SourceConfig(name="tables", kind="parquet", path=str(root / "b.parquet")),
            SourceConfig(name="notes", kind="text", path=str(root / "texts")))


def test_three_kinds_give_one_documents_folder(tmp_path):
    manifest, docs, dead = _run(tmp_path, *three_sources(tmp_path / "in"))
    assert _ids(docs) == ["notes/c.txt", "tables/b.parquet:row1", "tables/b.parquet:row2",
                          "web/0", "web/1", "web/2"]
    assert dead == [] and manifest["counts"] == {"records_read": 6, "bad_records": 0,
                                                 "documents": 6}
    assert sorted(manifest["sources"]) == ["notes", "tables", "web"]


# ---------------------------------------------------------------- weights (build_corpus)

def test_weights_sample_and_repeat_after_deduplication(tmp_path):
    """Weight 0.5 keeps the documents whose hash draw is below 0.5 (6 of these 20); weight 3
    keeps each unique document three times: the exact duplicate (id 10) is removed first, so
    deduplication does not undo the repeats."""
    many, few = tmp_path / "many.jsonl", tmp_path / "few.jsonl"
    many.write_text("".join(json.dumps({"id": i, "text": f"Half document {i}. It is short."})
                            + "\n" for i in range(20)))
    texts = [f"Triple document {i}. It has two sentences." for i in range(10)] + [
        "Triple document 0. It has two sentences."]
    few.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    half = SourceConfig(name="half", kind="jsonl", path=str(many), id_field="id", weight=0.5)
    triple = SourceConfig(name="triple", kind="jsonl", path=str(few), id_field="id", weight=3,
                          licence="CC0")
    _run(tmp_path, half, triple)
    manifest = build_corpus.run(build_corpus.BuildCorpusConfig(
        input=str(tmp_path / "out"), output=str(tmp_path / "corpus"), sources=(half, triple)))
    ids = _ids(pq.read_table(tmp_path / "corpus" / "corpus-00000-of-00001.parquet").to_pylist())
    kept_half = [i for i in ids if i.startswith("half/")]
    assert kept_half == sorted(f"half/{i}" for i in range(20)
                               if mixture.unit_hash("half", f"half/{i}") < 0.5)
    assert len(kept_half) == HALF_KEPT
    triple_ids = [i for i in ids if i.startswith("triple/")]
    assert triple_ids == sorted(f"triple/{i}{r}" for i in range(10) for r in ("", "#r1", "#r2"))
    assert manifest["counts"]["duplicates_removed"] == 1
    assert manifest["counts"]["documents"] == HALF_KEPT + 30
    half_row, triple_row = manifest["ledger"]["half"], manifest["ledger"]["triple"]
    assert {k: half_row[k] for k in ("records_read", "documents_in", "duplicates_removed",
                                     "sampled_out", "repeats_added", "documents_out")} == {
        "records_read": 20, "documents_in": 20, "duplicates_removed": 0,
        "sampled_out": 20 - HALF_KEPT, "repeats_added": 0, "documents_out": HALF_KEPT}
    assert {k: triple_row[k] for k in ("records_read", "duplicates_removed", "repeats_added",
                                       "documents_out", "sentences_in", "sentences_out",
                                       "licence", "weight")} == {
        "records_read": 11, "duplicates_removed": 1, "repeats_added": 20, "documents_out": 30,
        "sentences_in": 20, "sentences_out": 60, "licence": "CC0", "weight": 3.0}
    share = round(HALF_KEPT / (HALF_KEPT + 30), 4)
    assert (half_row["share_documents"], triple_row["share_documents"]) == (share,
                                                                            round(1 - share, 4))


HALF_KEPT = 6


def test_weights_copies_are_exact_and_deterministic():
    assert mixture.copy_ids("s", "s/1", 3) == ["s/1", "s/1#r1", "s/1#r2"]
    assert mixture.original_id("s/1#r2") == "s/1" and mixture.original_id("s/1") == "s/1"
    draws = [mixture.copies("s", f"s/{i}", 1.5) for i in range(1000)]
    assert sum(draws) == 1000 + sum(mixture.unit_hash("s", f"s/{i}") < 0.5 for i in range(1000))
    assert draws == [mixture.copies("s", f"s/{i}", 1.5) for i in range(1000)]
    # make_shards holds out a copy with its original: no repeated text in both splits
    from pipelines.shards.reading import split_of

    splits = [split_of(f"s/{i}", 0.5) for i in range(200)]
    assert [split_of(f"s/{i}#r2", 0.5) for i in range(200)] == splits
    assert splits.count("validation") == 96


def test_sources_are_set_from_a_settings_list(tmp_path):
    cfg = settings.apply(build_corpus.BuildCorpusConfig(input="i", output="o"), {"sources": [
        {"name": "web", "kind": "jsonl", "path": "w.jsonl", "weight": "0.5"},
        {"name": "code", "kind": "parquet", "path": "c/", "licence": "MIT"}]})
    assert cfg.sources == (SourceConfig(name="web", kind="jsonl", path="w.jsonl", weight=0.5),
                           SourceConfig(name="code", kind="parquet", path="c/", licence="MIT"))
    with pytest.raises(settings.SettingError, match=r"^setting sources.1.weight: must be > 0"):
        settings.apply(cfg, {"sources": [{"name": "a", "kind": "text", "path": "p"},
                                         {"name": "b", "kind": "text", "path": "p", "weight": 0}]})
    with pytest.raises(settings.SettingError, match=r"^setting sources.0.path: is required"):
        settings.apply(cfg, {"sources": [{"name": "a", "kind": "text"}]})
    with pytest.raises(settings.SettingError, match=r"^setting sources.0.name: 'books' is the "):
        settings.apply(cfg, {"sources": '[{"name": "books", "kind": "text", "path": "p"}]'})


def test_a_csv_document_longer_than_csvs_default_field_limit_is_read_with_the_rest():
    """csv's default limit (131,072 characters) would end the file at a long document."""
    import io

    from pipelines.documents import readers
    from pipelines.documents.source import SourceConfig
    source = SourceConfig(name="long", kind="csv", path="x.csv")
    data = ("id,text\n1," + "word " * 40_000 + "\n2,a short one\n").encode()
    rows = list(readers.read_csv(io.BytesIO(data), "x.csv", source))
    assert [type(r).__name__ for r in rows] == ["Raw", "Raw"]
    assert [len(r.fields["text"]) for r in rows] == [200_000, 11]


def test_a_csv_row_with_an_unclosed_quote_is_a_dead_letter_and_the_next_row_is_read(tmp_path):
    """The quote opened in row 2 closes in row 3's first field: csv would read both as one
    row (row 3's text lost, nothing set aside). Row 2 is set aside; row 3 is read again."""
    poems = [json.loads(line) for line in (SAMPLE / "jsonl" / "blake-poems.jsonl")
             .read_text().splitlines()][:4]
    lines = ["title,text"] + [f'"{p["title"]}","{p["text"].splitlines()[0]}"' for p in poems]
    lines[2] = f'"{poems[1]["title"]}","{poems[1]["text"].splitlines()[0]}'  # unclosed
    path = tmp_path / "poems.csv"
    path.write_text("\n".join(lines) + "\n")
    manifest, docs, dead = _run(tmp_path, SourceConfig(name="poems", kind="csv",
                                                       path=str(path), title_field="title"))
    assert [(d["doc_id"], d["title"], d["passages"]) for d in docs] == [
        (f"poems/poems.csv:row{n}", poems[i]["title"], [poems[i]["text"].splitlines()[0]])
        for n, i in ((1, 0), (3, 2), (4, 3))]
    reason = ("malformed row: ',' expected after '\"' (a quote opened in it is not closed "
              "where a field ends); the lines after its first are read again")
    assert [(d["record"], d["reason"]) for d in dead] == [("row 2 (line 3)", reason)]
    assert manifest["sources"]["poems"]["bad"] == {"malformed_row": 1}
    assert manifest["counts"] == {"records_read": 4, "bad_records": 1, "documents": 3}


def test_binary_files_are_one_dead_letter_each(tmp_path):
    """A gzipped .jsonl and a text file of NUL bytes: each set aside whole, as extract_books
    and make_shards set aside a binary file."""
    import gzip
    (tmp_path / "poems").mkdir()
    data = (SAMPLE / "jsonl" / "blake-poems.jsonl").read_bytes()
    (tmp_path / "poems" / "a.jsonl").write_bytes(gzip.compress(data, mtime=0))
    (tmp_path / "poems" / "b.jsonl").write_bytes(data)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "nul.txt").write_bytes(b"\0" * 4096)
    (tmp_path / "notes" / "ok.txt").write_text("A note. It reads as text.\n")
    manifest, docs, dead = _run(
        tmp_path, SourceConfig(name="poems", kind="jsonl", path=str(tmp_path / "poems")),
        SourceConfig(name="notes", kind="text", path=str(tmp_path / "notes")))
    binary = "binary, not text: {} of bytes are control characters such as NUL (over 1%)"
    assert [(Path(d["file"]).name, d["record"], d["reason"]) for d in dead] == [
        ("nul.txt", "file", binary.format("100.0%")), ("a.jsonl", "file", binary.format("9.5%"))]
    assert manifest["sources"]["poems"]["bad"] == {"binary": 1}
    assert manifest["sources"]["notes"]["bad"] == {"binary": 1}
    assert sum(d["doc_id"].startswith("poems/") for d in docs) == len(data.splitlines())
    assert [d["passages"] for d in docs if d["source"] == "notes"] == [
        ["A note. It reads as text."]]


def test_a_quote_left_open_to_the_end_of_the_file_takes_no_row_with_it():
    import io

    from pipelines.documents import readers
    source = SourceConfig(name="q", kind="csv", path="q.csv")
    data = b'id,text\n1,"Left open.\n2,Good row.\n\n3,Last row.\n'
    rows = list(readers.read_csv(io.BytesIO(data), "q.csv", source))
    assert [(type(r).__name__, r.location) for r in rows] == [
        ("Bad", "row 1 (line 2)"), ("Raw", "row 2 (line 3)"), ("Raw", "row 4 (line 5)")]
    assert rows[0].reason.startswith("malformed row: unexpected end of data")
    assert [r.fields["text"] for r in rows[1:]] == ["Good row.", "Last row."]
