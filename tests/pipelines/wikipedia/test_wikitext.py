"""Wikitext cleaning (pipelines/wikipedia/wikitext.py): exact outputs on small cases, then the real dump."""
from __future__ import annotations

import collections
import random
import re

import pytest

from pipelines.wikipedia.dump import Page, iter_pages, plan_splits
from pipelines.wikipedia.wikitext import (
    clean_wikitext,
    extract_passages,
    is_disambiguation,
    is_redirect,
    split_template_args,
)

DUMP = "wiki/enwiki-dbpedia-minidump-pages-articles.xml.bz2"


def passages_and_counts(wikitext: str) -> tuple[list[str], dict[str, int]]:
    counts: collections.Counter[str] = collections.Counter()
    passages = extract_passages(wikitext, lambda name, value=1: counts.update({name: value}))
    return passages, dict(counts)


# ---------------------------------------------------------------------------------------------
# One construct at a time

def test_bold_italic_and_links_keep_their_text():
    text = ("'''Berlin''' is the ''capital'' of [[Germany]]. It lies on the [[Spree (river)|Spree]]"
            " and has many [[bridge]]s; l''''arte''' and '''''both'''''.")
    assert extract_passages(text) == [
        ("Berlin is the capital of Germany. It lies on the Spree and has many bridges; l'arte and "
        "both.")]


def test_pipe_trick_section_links_and_visible_namespace_links():
    text = ("[[Paris, Texas|]] and [[Pipe (computing)|]], see [[#History|history]] and "
            "[[:Category:Cities]].")
    assert extract_passages(text) == [
        "Paris and Pipe, see history and Category:Cities."]


def test_files_categories_and_language_links_vanish_even_with_nested_caption_links():
    text = ("[[File:Brandenburger Tor.jpg|thumb|upright=1.2|The [[Brandenburg Gate]] at [[night]]]]"
            "Prose stays.[[Category:Capitals in Europe]][[de:Berlin]] [[Image:x.png|20px]]")
    assert extract_passages(text) == ["Prose stays."]


def test_templates_nested_and_multiline_are_removed_and_counted():
    text = ("{{Infobox country\n| name = {{lang|de|Deutschland}}\n| capital = [[Berlin]]\n}}\n"
            "Germany{{efn|A note with {{cite web|url=x}} inside}} is a country.{{citation needed}}")
    passages, counts = passages_and_counts(text)
    assert passages == ["Germany is a country."]
    assert counts == {"templates_removed": 3}


def test_inline_templates_render_their_visible_text():
    text = ("It is {{convert|5|km|mi}} long, {{convert|10|-|20|m}} deep, born {{circa|1900}}, "
            "named {{lang|de|Spree}} or {{lang-de|Spreefluss}}, {{nowrap|New York}}{{snd}}"
            "{{frac|1|2}} of it{{nbsp}}is {{ill|Foo|de|Bar}} in ''[[Anime Insider]]''{{'}}s list.")
    assert extract_passages(text) == [
        ("It is 5 km long, 10–20 m deep, born c. 1900, named Spree or Spreefluss, New York – "
        "1/2 of it is Foo in Anime Insider's list.")]


def test_as_of_and_nee_templates():
    text = ("{{As of|2021|3}}, x. Then {{as of|2015|lc=y}} y. {{As of|2019|12|5}} z. "
            "Merkel ({{née|Kasner}}; born 1954).")
    assert extract_passages(text) == [
        ("As of March 2021, x. Then as of 2015 y. As of 5 December 2019 z. "
        "Merkel (née Kasner; born 1954).")]


def test_template_parameters_and_brace_runs_pair_like_mediawiki():
    # }}}} closes two templates; {{{1}}} is a parameter; a lone brace is text.
    assert extract_passages("A{{outer|{{inner}}}}B {{{1|default}}} C {x} D") == ["AB C {x} D"]


def test_references_comments_and_dropped_elements():
    text = ('Fact one.<ref name="a">{{cite book|title=T}}</ref> Fact two.<ref name="a" /> '
            "<!-- hidden -->Fact three<ref>Note with }} and {{ braces</ref>. "
            "<math>E = mc^2</math>Energy.<gallery>\nA.jpg|cap\n</gallery>")
    assert extract_passages(text) == ["Fact one. Fact two. Fact three. Energy."]


def test_html_tags_are_stripped_block_tags_break_paragraphs():
    text = ("Line <small>small</small> and <span style='x'>span</span> text.<br />"
            "Next.<div>Block</div>")
    assert extract_passages(text) == ["Line small and span text.", "Next.", "Block"]


def test_entities_decoded_and_invisible_characters_removed():
    text = "AT&amp;T&nbsp;Inc. &ndash; 5&nbsp;km &lt;b&gt; caf\u00e9\u00ad&#233; &quot;q&quot;"
    # "<b>" decoded from &lt;b&gt; is literal text that looks like a tag: the passage is dropped.
    passages, counts = passages_and_counts(text)
    assert passages == []
    assert counts == {"passages_residue_dropped": 1}
    text = "AT&amp;T&nbsp;Inc. &ndash; 5&nbsp;km caf\u00e9\u00ad&#233; &quot;q&quot;"
    assert extract_passages(text) == ['AT&T Inc. – 5 km caféé "q"']


def test_lists_headings_pseudo_headings_rules_and_magic_words_are_not_passages():
    text = ("__NOTOC__\nIntro text.\n== History ==\nFirst.\nStill first.\n\n* item\n# numbered\n"
            "; term\n: definition\n----\n'''See also'''\n=== Sub ===\nLast one.")
    assert extract_passages(text) == ["Intro text.", "First. Still first.", "Last one."]


def test_tables_nested_and_indented_are_dropped():
    text = ("Before.\n{| class=wikitable\n|-\n| cell {{flag|X}}\n|\n{|\n| inner\n|}\n|}\n"
            ":{| \n| indented\n|}\nAfter.")
    assert extract_passages(text) == ["Before.", "After."]


def test_external_links_keep_their_label_only():
    text = "See [https://example.org the site] or [http://example.org] or [//x.org/a?b=c label]."
    assert extract_passages(text) == ["See the site or or label."]


def test_leftover_punctuation_from_removed_templates_is_tidied():
    text = "'''Angela Merkel''' ({{IPA-de|a}}; {{IPA-de|b}}; born 1954) is ({{lang|x|}}) here ."
    assert extract_passages(text) == ["Angela Merkel (born 1954) is here."]


# ---------------------------------------------------------------------------------------------
# Broken markup: no crash, no residue, the prose around it kept

def test_broken_markup_keeps_prose_and_leaves_no_residue():
    text = ("'''Broken''' page with [[Link|bold link]] text.\n\n"
            "Second paragraph with a [[link that never closes.\n\n"
            "{|\n| a cell\n|-\n! header\nThird paragraph after an unclosed table.\n\n"
            "Fourth <ref>an unclosed reference and ]] and |} strays.\n\n"
            "Fifth {{Infobox never closed\n| name = value\n<!-- an unclosed comment\nhidden")
    passages, counts = passages_and_counts(text)
    assert passages == [
        "Broken page with bold link text.",
        "Second paragraph with a link that never closes.",
        "Third paragraph after an unclosed table.",
        "Fourth an unclosed reference and and strays.",
        "Fifth",
    ]
    # No residue, but the unclosed "{{" is counted: its text may leak (see below). The "[["
    # pairs with the stray "]]" two paragraphs on, so no link is left open.
    assert counts == {"templates_unclosed": 1}


def test_unclosed_template_and_link_are_counted_where_their_text_leaks():
    # An unclosed {{Taxobox loses its first line only; an unclosed [[target|label keeps both.
    text = ("Lions are big.\n\n{{Taxobox\n| name = Lion\nstatus = VU\n}\n\n"
            "The lion is a cat, see [[Panthera leo|the lion\nand {{a|{{b}} c.")
    passages, counts = passages_and_counts(text)
    assert passages == ["Lions are big.", "status = VU }",
                        "The lion is a cat, see Panthera leo|the lion and"]
    assert counts == {"templates_unclosed": 2, "links_unclosed": 1}


def test_stray_closing_braces_and_a_template_spanning_paragraphs():
    # As in MediaWiki, "{{" pairs with the next "}}" even paragraphs later.
    text = "One {{open\n\nTwo }} three. Four }} five ]] six."
    assert extract_passages(text) == ["One three. Four five six."]


def test_random_markup_soup_never_crashes_or_leaks_markup():
    tokens = ["{{", "}}", "{{{", "}}}", "[[", "]]", "{|", "|}", "|", "<ref>", "</ref>", "<ref/>",
              "<!--", "-->", "'''", "''", "\n", "\n\n", "==", "*", "#", ":", "text ", "word. ",
              "&amp;", "&nbsp;", "<br/>", "<div>", "[http://x.org y]", "File:", "Category:",
              "=", "!", "(", ")", ";", ","]
    rng = random.Random(1234)
    structure = re.compile(r"^[*#;:|!=]")
    for _ in range(400):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 60)))
        for passage in extract_passages(text):
            assert not RESIDUE.search(passage), (text, passage)
            assert not structure.match(passage) and passage == passage.strip(), (text, passage)


@pytest.mark.timeout(60)
def test_pathological_unclosed_markup_stays_linear():
    # 30k unclosed openers of every kind: a quadratic scan would not finish.
    text = "x {{a " * 30_000 + "<ref>y " * 30_000 + "[[z " * 30_000 + "<!-- c"
    passages = extract_passages(text)
    assert len(passages) == 1 and passages[0].startswith("x")
    assert not re.search(r"\{\{|\[\[|<ref", passages[0])


# ---------------------------------------------------------------------------------------------
# Helpers and page classification

def test_split_template_args_respects_nesting():
    assert split_template_args("lang|de|[[a|b]]|{{x|y}}|k=v") == [
        "lang", "de", "[[a|b]]", "{{x|y}}", "k=v"]


def test_redirect_and_disambiguation_detection():
    assert is_redirect("#REDIRECT [[Berlin]]") and is_redirect("  #redirect[[x]]")
    assert not is_redirect("Text mentioning #REDIRECT later")
    assert is_disambiguation("Food (disambiguation)", "")
    for template in ("{{disambiguation}}", "{{Disambig|geo}}", "{{hndis|name=Smith, John}}",
                     "{{Human name disambiguation}}", "{{place_name disambiguation}}", "{{dab}}"):
        assert is_disambiguation("Mercury", f"Text.\n{template}"), template
    for template in ("{{disambiguation needed}}", "{{dablink|x}}", "{{about|x}}"):
        assert not is_disambiguation("Mercury", f"Text.\n{template}"), template


def test_clean_wikitext_keeps_line_structure():
    assert clean_wikitext("== H ==\n* [[a|b]]{{t}}\ntext") == "== H ==\n* b\ntext"


# ---------------------------------------------------------------------------------------------
# The real dump

@pytest.fixture(scope="module")
def articles(shared_data) -> dict[str, list[str]]:
    path = str(shared_data / DUMP)
    pages = [p for split in plan_splits(path, 1 << 30) for p in iter_pages(split)]
    assert all(isinstance(p, Page) for p in pages)
    return {p.title: extract_passages(p.text) for p in pages
            if p.namespace == 0 and not p.redirect and not is_disambiguation(p.title, p.text)}


RESIDUE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|'''|''|==|<!--|-->|</?[A-Za-z][^<>]*>"
                     r"|&(?:[a-z]+|#\d+);|\bthumb\||\|\s*\w+\s*=")


def test_real_dump_has_no_residue_lists_tables_or_headings(articles):
    assert len(articles) == 23
    all_passages = [p for passages in articles.values() for p in passages]
    assert len(all_passages) == 1185
    assert [p for p in all_passages if RESIDUE.search(p)] == []
    assert [p for p in all_passages if p[0] in "*#;:|!=" or p != p.strip() or "\n" in p] == []
    # Headings of the dump are not passages.
    assert not {"History", "Geography", "Early life", "See also", "References"} & set(all_passages)
    # Every article keeps prose.
    assert all(articles.values())


@pytest.mark.parametrize("title, sentence", [
    ("Angela Merkel", ("Angela Dorothea Merkel (née Kasner; born 17 July 1954) is a German "
                       "politician who served as the chancellor of Germany from 2005 to 2021.")),
    ("Angela Merkel", ("In November 1991, Merkel ran for the leadership of the neighboring CDU in "
                      "Brandenburg. She lost to Ulf Finke; this has been the only election to date "
                      "Merkel has lost.")),
    ("Berlin", "Berlin is the capital and largest city of Germany by both area and population."),
    ("IKEA", ("Founded in Sweden in 1943 by 17-year-old Ingvar Kamprad, IKEA has been the world's "
             "largest furniture retailer since 2008.")),
    ("Atlantic Ocean", ("The Atlantic Ocean is the second-largest of the world's five oceans, with "
                       "an area of about 106460000 km2.")),
    ("Arthur Schopenhauer", ("It amounts to this that the κύριος ['Lord'], who has created "
                             "the world, desires to be worshipped and adored;")),
    ("Ingoldiomyces", ("Ingoldiomyces is a genus of fungi in the Tilletiaceae family. This is a "
                      "monotypic genus, containing the single species Ingoldiomyces hyalosporus.")),
])
def test_real_dump_known_sentences_word_for_word(articles, title, sentence):
    assert any(sentence in passage for passage in articles[title]), (title, articles[title][:3])


def test_real_dump_short_articles_exactly(articles):
    assert articles["Dahlak SC"] == ["Dahlak is an Eritrean football club based in Asmara."]
    assert articles["Borysthenia goldfussiana"] == [
        ("†Borysthenia goldfussiana is an extinct species of small freshwater snail with a gill "
        "and an operculum, an aquatic gastropod mollusk in the family Valvatidae, the valve "
        "snails.")]
