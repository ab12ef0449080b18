"""Quality filters: length bounds, language ID and the Gopher rules (pipelines/corpus/quality.py),
their per-source setting, and the Beam transform (pipelines/corpus/filter_quality.py)."""
from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to

from common import settings
from flows import config as flow_config
from pipelines import build_corpus
from pipelines.corpus import filter_quality, quality
from pipelines.corpus.filter_quality import FilterQuality
from pipelines.corpus.quality import Drop, QualityConfig, check
from pipelines.documents.source import SourceConfig

# Jane Austen, "Emma" (1815), volume I chapter I, its first two paragraphs (public domain; the
# same text as data/sample/books/austen-emma.txt, lines joined).
EMMA = [
    ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, "
    "seemed to unite some of the best blessings of existence; and had lived nearly twenty-one "
    "years in the world with very little to distress or vex her."),
    ("She was the youngest of the two daughters of a most affectionate, indulgent father; and "
    "had, in consequence of her sister's marriage, been mistress of his house from a very early "
    "period.  Her mother had died too long ago for her to have more than an indistinct "
    "remembrance of her caresses; and her place had been supplied by an excellent woman as "
    "governess, who had fallen little short of a mother in affection."),
]
# Goethe, "Die Leiden des jungen Werther" (1774), the first lines of the letter of 4 May 1771
# (public domain).
WERTHER = [("Wie froh bin ich, daß ich weg bin! Bester Freund, was ist das Herz des Menschen! "
           "Dich zu verlassen, den ich so liebe, von dem ich unzertrennlich war, und froh zu sein! "
           "Ich weiß, du verzeihst mir's.")]
# Voltaire, "Candide" (1759), chapter 1, its first sentence (public domain).
CANDIDE = [("Il y avait en Westphalie, dans le château de M. le baron de Thunder-ten-tronckh, un "
           "jeune garçon à qui la nature avait donné les mœurs les plus douces.")]
# Tolstoy, "Anna Karenina", Constance Garnett's translation (1901), its first words.
TOLSTOY = ["Happy families are all alike."]

OFF = {"min_words": 0, "max_words": 0, "min_mean_word_length": 0, "max_mean_word_length": 0,
       "max_symbol_ratio": 0, "max_bullet_lines": 0, "max_ellipsis_lines": 0,
       "min_alpha_words": 0, "min_stop_words": 0, "max_duplicate_lines": 0,
       "max_duplicate_line_chars": 0, "max_duplicate_paragraphs": 0,
       "max_duplicate_paragraph_chars": 0, "max_top_ngram_chars": (0, 0, 0),
       "max_duplicate_ngram_chars": (0, 0, 0, 0, 0, 0)}


def only(**thresholds) -> QualityConfig:
    """Every rule off but the ones given."""
    return QualityConfig(**{**OFF, **thresholds})


def unique_words(chars: int) -> str:
    """Distinct words (no n-gram repeats) holding exactly `chars` word characters."""
    whole, rest = divmod(chars, 5)
    return " ".join([f"u{i:04d}" for i in range(whole)] + (["v" * rest] if rest else []))


# ---------------------------------------------------------------- the defaults on real text

def test_a_real_english_paragraph_passes_the_defaults():
    assert check(EMMA, QualityConfig()) is None
    assert check(EMMA, QualityConfig(languages=("en",))) is None


def test_real_german_and_french_are_dropped_by_an_english_filter():
    config = QualityConfig(min_words=0, min_stop_words=0, languages=("en",))
    assert check(WERTHER, config) == Drop("language", "de (1.00) not in en")
    assert check(CANDIDE, config) == Drop("language", "fr (1.00) not in en")
    assert check(WERTHER, dataclasses.replace(config, languages=("de", "fr"))) is None


def test_the_language_score_bound():
    assert quality.identify_language(TOLSTOY[0])[0] == "en"
    assert check(TOLSTOY, only(languages=("en",), min_language_score=0.95)) == Drop(
        "language", "en score 0.9225 < 0.95")
    assert check(TOLSTOY, only(languages=("en",), min_language_score=0.92)) is None


def test_the_first_failing_rule_in_order_names_the_drop():
    # Werther fails the word count (37 < 50), the language and the stop words: the count is first.
    assert check(WERTHER, QualityConfig(languages=("en",))) == Drop("too_few_words",
                                                                    "words 37 < 50")
    assert check(WERTHER * 2, QualityConfig(languages=("en",))) == Drop(
        "language", "de (1.00) not in en")
    assert check(WERTHER * 2, QualityConfig()) == Drop("stop_words", "distinct stop words 0 < 2")


# ---------------------------------------------------------------- each rule at its threshold

def test_length_bounds():
    assert check(["one two three four"], only(min_words=5)) == Drop("too_few_words",
                                                                   "words 4 < 5")
    assert check(["one two three four five"], only(min_words=5)) is None
    assert check(["a b c", "d e f"], only(max_words=5)) == Drop("too_many_words", "words 6 > 5")
    assert check(["a b c", "d e"], only(max_words=5)) is None
    assert check([], QualityConfig()) == Drop("too_few_words", "words 0 < 50")


def lines(marked: int, plain: int, mark: str, end: bool = False) -> list[str]:
    """`marked` lines carrying `mark` (at the end or the start), then `plain` lines."""
    return ([f"item {i}{mark}" if end else f"{mark} item {i}" for i in range(marked)]
            + [f"plain line {i}" for i in range(plain)])


RULE_CASES = {
    # rule: (config, a document over the threshold, one on it, the detail)
    "mean_word_length (low)": (
        only(min_mean_word_length=3), ["ab, ab. abcd!"], ["ab, abcd."],
        Drop("mean_word_length", "mean word length 2.667 < 3")),
    "mean_word_length (high)": (
        only(max_mean_word_length=10), ["abcdefghijk"], ["“abcdefghij”"],
        Drop("mean_word_length", "mean word length 11 > 10")),
    "hash_ratio": (
        only(max_symbol_ratio=0.1), ["#one " + unique_words(40)], ["#one " + unique_words(45)],
        Drop("hash_ratio", "'#' per word 0.1111 > 0.1")),
    "ellipsis_ratio": (
        only(max_symbol_ratio=0.1), ["one… " + unique_words(40)],
        ["one... " + unique_words(45)], Drop("ellipsis_ratio", "ellipses per word 0.1111 > 0.1")),
    "bullet_lines": (
        only(max_bullet_lines=0.9), ["\n".join(lines(10, 1, "•"))], lines(9, 1, "-"),
        Drop("bullet_lines", "bulleted lines 0.9091 > 0.9")),
    "ellipsis_lines": (
        only(max_ellipsis_lines=0.3), lines(4, 9, "...", end=True), lines(3, 7, "…", end=True),
        Drop("ellipsis_lines", "lines ending with an ellipsis 0.3077 > 0.3")),
    "alpha_words": (
        only(min_alpha_words=0.8), ["a b c d e f g 1 2"], ["a b c d 1999"],
        Drop("alpha_words", "words with a letter 0.7778 < 0.8")),
    "stop_words": (
        only(min_stop_words=2), ["The cat saw the dog"], ["The cat and dog"],
        Drop("stop_words", "distinct stop words 1 < 2")),
    "duplicate_lines": (
        only(max_duplicate_lines=0.3), ["\n".join(["x"] * 5 + [f"line {i}" for i in range(8)])],
        ["x"] * 4 + [f"line {i}" for i in range(6)],
        Drop("duplicate_lines", "duplicate lines 0.3077 > 0.3")),
    "duplicate_line_chars": (
        only(max_duplicate_line_chars=0.2), ["abcd\nabcd\nefghijklmno"],
        ["abcd\nabcd\nefghijklmnop"], Drop("duplicate_line_chars",
                                            "characters in duplicate lines 0.2105 > 0.2")),
    "duplicate_paragraphs": (
        only(max_duplicate_paragraphs=0.3), ["x"] * 5 + [f"line {i}" for i in range(8)],
        ["x"] * 4 + [f"line {i}" for i in range(6)],
        Drop("duplicate_paragraphs", "duplicate paragraphs 0.3077 > 0.3")),
    "duplicate_paragraph_chars": (
        only(max_duplicate_paragraph_chars=0.2), ["abcd", " abcd ", "efghijklmno"],
        ["abcd", "abcd", "efghijklmnop"],
        Drop("duplicate_paragraph_chars", "characters in duplicate paragraphs 0.2105 > 0.2")),
    "top_2gram": (
        only(max_top_ngram_chars=(0.2, 0, 0)), ["ab cd ab cd " + unique_words(31)],
        ["ab cd ab cd " + unique_words(32)], Drop("top_2gram", "top 2-gram characters 0.2051 > 0.2")),
    "top_4gram": (
        only(max_top_ngram_chars=(0, 0, 0.16)), ["a b c d a b c d " + unique_words(41)],
        ["a b c d a b c d " + unique_words(42)],
        Drop("top_4gram", "top 4-gram characters 0.1633 > 0.16")),
    "duplicate_5gram": (
        only(max_duplicate_ngram_chars=(0.15, 0, 0, 0, 0, 0)),
        ["aaa bbb ccc ddd eee aaa bbb ccc ddd eee " + unique_words(169)],
        ["aaa bbb ccc ddd eee aaa bbb ccc ddd eee " + unique_words(170)],
        Drop("duplicate_5gram", "duplicate 5-gram characters 0.1508 > 0.15")),
    "duplicate_10gram": (
        only(max_duplicate_ngram_chars=(0, 0, 0, 0, 0, 0.1)),
        [" ".join(["ab"] * 20) + " " + unique_words(359)],
        [" ".join(["ab"] * 20) + " " + unique_words(360)],
        Drop("duplicate_10gram", "duplicate 10-gram characters 0.1003 > 0.1")),
}


@pytest.mark.parametrize("case", RULE_CASES)
def test_each_rule_fires_just_over_its_threshold_and_not_on_it(case):
    config, over, on, drop = RULE_CASES[case]
    assert check(over, config) == drop
    assert check(on, config) is None
    assert check(over, only()) is None  # the threshold 0: the rule is off


def test_duplicate_ngrams_count_each_word_once():
    words = ["ab", "ab", "ab", "ab", "ab", "ab", "xy"]  # five 5-grams "ab ab ab ab ab" overlap: 6 words
    assert quality.duplicate_ngram_chars(words, 5) == 12 / 14
    assert quality.top_ngram_chars(words, 2) == 5 * 4 / 14  # every occurrence counts


def test_rules_lists_every_name_check_can_give():
    assert quality.RULES == (
        "too_few_words", "too_many_words", "language", "mean_word_length", "hash_ratio",
        "ellipsis_ratio", "bullet_lines", "ellipsis_lines", "alpha_words", "stop_words",
        "duplicate_lines", "duplicate_line_chars", "duplicate_paragraphs",
        "duplicate_paragraph_chars", "top_2gram", "top_3gram", "top_4gram", "duplicate_5gram",
        "duplicate_6gram", "duplicate_7gram", "duplicate_8gram", "duplicate_9gram",
        "duplicate_10gram")
    assert {drop.rule for _, _, _, drop in RULE_CASES.values()} <= set(quality.RULES)


# ---------------------------------------------------------------- settings

def test_the_defaults_are_the_gopher_papers():
    config = QualityConfig()
    assert (config.min_words, config.max_words) == (50, 100_000)
    assert (config.min_mean_word_length, config.max_mean_word_length) == (3, 10)
    assert (config.max_symbol_ratio, config.max_bullet_lines, config.max_ellipsis_lines,
            config.min_alpha_words, config.min_stop_words) == (0.1, 0.9, 0.3, 0.8, 2)
    assert (config.max_duplicate_lines, config.max_duplicate_line_chars,
            config.max_duplicate_paragraphs, config.max_duplicate_paragraph_chars) == (
        0.3, 0.2, 0.3, 0.2)
    assert config.max_top_ngram_chars == (0.2, 0.18, 0.16)
    assert config.max_duplicate_ngram_chars == (0.15, 0.14, 0.13, 0.12, 0.11, 0.10)
    assert config.languages == ()


@pytest.mark.parametrize("kwargs, message", [
    ({"max_symbol_ratio": 1.5}, "--max_symbol_ratio must be in [0, 1] (0 = off), got 1.5"),
    ({"min_words": -1}, "--min_words must be >= 0 (0 = off), got -1"),
    ({"min_words": 60, "max_words": 50}, "--max_words 50 is below min_words 60"),
    ({"max_top_ngram_chars": (0.2, 0.18)},
     ("--max_top_ngram_chars takes 3 fractions in [0, 1] (for n = 2..4; 0 = off), "
     "got [0.2, 0.18]")),
    ({"languages": ("EN",)}, "--languages ['EN']: ISO 639 codes in lower case (en, de)"),
    ({"languages": ("en", "de")},
     ("--min_stop_words counts English stop words, which a text in ['de'] lacks: set it to 0 "
     "when languages holds other languages than en")),
])
def test_config_errors_name_the_setting(kwargs, message):
    with pytest.raises(settings.SettingError) as error:
        QualityConfig(**kwargs)
    assert str(error.value) == message


def news_source(**quality_values) -> dict:
    return {"name": "news", "kind": "jsonl", "path": "/data/news", "quality": quality_values}


def test_a_sources_json_list_sets_a_sources_quality():
    text = json.dumps([news_source(min_words=50, languages=["en"]),
                       {"name": "poems", "kind": "jsonl", "path": "/data/poems"}])
    built = settings.build_items(SourceConfig, text, "sources.")
    assert built[0].quality == QualityConfig(min_words=50, languages=("en",))
    assert built[1].quality is None
    config = settings.apply(build_corpus.BuildCorpusConfig(input="in", output="out"),
                            {"sources": text}, label="--")
    assert config.sources == built


def test_a_bad_quality_value_in_a_sources_list_names_it():
    with pytest.raises(settings.SettingError) as error:
        settings.build_items(SourceConfig, [news_source(max_words=-3)], "sources.")
    assert str(error.value) == ("setting sources.0.quality.max_words: must be >= 0 (0 = off), "
                                "got -3")
    with pytest.raises(settings.SettingError) as error:
        settings.build_items(SourceConfig, [news_source(min_word=3)], "sources.")
    assert str(error.value).startswith("setting sources.0.quality.min_word: unknown field")


def test_the_flows_set_turns_a_sources_quality_on_and_off():
    dag = flow_config.tiny()
    assert [s.quality for s in dag.data.all_sources()] == [None, None, None]
    on = settings.apply(dag, settings.parse_assignments([
        "data.sources.poems.quality.languages=en", "data.sources.poems.quality.min_words=10"]))
    poems = next(s for s in on.data.sources if s.name == "poems")
    assert poems.quality == QualityConfig(min_words=10, languages=("en",))
    more = settings.apply(on, settings.parse_assignments(
        ["data.sources.poems.quality.max_words=500"]))
    assert more.data.sources[0].quality == QualityConfig(min_words=10, max_words=500,
                                                         languages=("en",))
    off = settings.apply(on, {"data": {"sources": {"poems": {"quality": None}}}})
    assert off.data.sources[0].quality is None


# ---------------------------------------------------------------- the Beam transform

def row(doc_id: str, passages: list[str]) -> dict:
    return {"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": f"{doc_id}.txt",
            "title": "", "passages": passages}


def counters(result, namespace: str) -> dict[str, int]:
    found = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    return {c.key.metric.name: c.committed for c in found if c.committed}


def test_filter_quality_keeps_drops_and_counts():
    rows = [row("news/1", EMMA), row("news/2", WERTHER * 2), row("news/3", ["too short"]),
            row("books/1", ["too short"]), row("wiki/1", WERTHER)]
    configs = {"news": QualityConfig(languages=("en",))}
    pipeline = beam.Pipeline()
    out = pipeline | beam.Create(rows) | FilterQuality(configs)
    assert_that(out["kept"], equal_to([rows[0], rows[3], rows[4]]), label="kept")
    assert_that(out["dropped"], equal_to([
        json.dumps({"doc_id": "news/2", "source": "news", "source_file": "news/2.txt",
                    "filter": "language", "detail": "de (1.00) not in en"}, ensure_ascii=False),
        json.dumps({"doc_id": "news/3", "source": "news", "source_file": "news/3.txt",
                    "filter": "too_few_words", "detail": "words 2 < 50"})]), label="dropped")
    result = pipeline.run()
    result.wait_until_finish()
    assert counters(result, build_corpus.LEDGER_NAMESPACE) == {
        "news/dropped_language": 1, "news/dropped_too_few_words": 1}
    assert counters(result, build_corpus.NAMESPACE) == {"quality_dropped": 2}


def test_filter_quality_uses_build_corpus_counter_namespaces():
    assert filter_quality.NAMESPACE == build_corpus.NAMESPACE
    assert filter_quality.LEDGER_NAMESPACE == build_corpus.LEDGER_NAMESPACE


def test_an_unknown_language_is_refused_when_the_transform_is_built():
    with pytest.raises(settings.SettingError) as error:
        FilterQuality({"news": QualityConfig(languages=("en", "xx"), min_stop_words=0)})
    assert str(error.value).startswith("--sources.news.quality.languages ['xx']: not a "
                                       "language py3langid names (known: ace, af, am, an, ar, ")


def test_a_top_ngram_seen_once_is_no_repetition():
    # Every 2-gram of a short sentence occurs once: 100% of its characters, but no repeat.
    assert quality.top_ngram_chars(["no", "words", "repeat"], 2) == 0.0
    assert check(["no words repeat"], only(max_top_ngram_chars=(0.2, 0.18, 0.16))) is None
