"""Wikipedia and books are data sources like the others: listed in `data.sources` (kind
wikipedia or books) with their weight, licence and quality, or set by the shorthands
`data.wikipedia` / `data.books`. Both say the same run: the same extraction folders, the same
corpus mixture; a base run listing them needs no shorthand."""
from __future__ import annotations

import dataclasses

import pytest

from flows import steps
from flows.config import SAMPLE, resolve
from flows.stages import looking_up

WIKI, BOOKS = str(SAMPLE / "wiki"), str(SAMPLE / "books")


def _base(data: dict):
    return resolve("base", {"data": data, "finetune": {"data": ""}})


def test_a_listed_source_and_its_shorthand_are_one_run(tmp_path):
    listed = _base({"sources": [{"name": "wikipedia", "kind": "wikipedia", "path": WIKI},
                                {"name": "books", "kind": "books", "path": BOOKS,
                                 "licence": "public domain"}]})
    shorthand = _base({"wikipedia": WIKI, "books": BOOKS})
    assert listed.data.path_of("wikipedia") == shorthand.data.path_of("wikipedia") == WIKI
    assert [(s.name, s.weight) for s in listed.data.all_sources()] == [
        (s.name, s.weight) for s in shorthand.data.all_sources()] == [
        ("wikipedia", 1.0), ("books", 1.0)]
    assert listed.data.all_sources()[1].licence == "public domain"
    listed, shorthand = (dataclasses.replace(c, output=str(tmp_path)) for c in (listed, shorthand))
    with looking_up():
        for stage in (steps.extract_wikipedia, steps.extract_books):
            assert stage(listed).path == stage(shorthand).path


def test_a_listed_source_takes_a_weight_and_sets_its_shorthand():
    cfg = _base({"books": "", "sources": [{"name": "wikipedia", "kind": "wikipedia",
                                           "path": WIKI, "weight": 2}]})
    assert cfg.data.wikipedia is None
    assert [(s.name, s.kind, s.weight) for s in cfg.data.all_sources()] == [
        ("wikipedia", "wikipedia", 2.0)]


def test_an_unset_input_still_fails_naming_its_shorthand():
    with pytest.raises(ValueError, match=r"preset 'base' needs data.books: set each"):
        _base({"sources": [{"name": "wikipedia", "kind": "wikipedia", "path": WIKI}]})
    with pytest.raises(ValueError, match="source names repeat"):
        _base({"wikipedia": WIKI, "books": "",
               "sources": [{"name": "wikipedia", "kind": "wikipedia", "path": WIKI}]})
