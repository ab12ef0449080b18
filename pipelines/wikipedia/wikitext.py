"""Wikitext -> clean text passages: pure functions, no I/O.

BERT (Devlin et al. 2019, section 3.1): "For Wikipedia we extract only the text passages and ignore
lists, tables, and headers." `extract_passages` does that with a few linear scans instead of a
full parse: a straightforward mwparserfromhell pass (parse, remove nodes, `strip_code`) is 10x or
more slower than WikiExtractor (see benchmarks/bench_wikipedia.py), and a dump is tens of GB.

The order follows MediaWiki's own: comments and extension tags (`<ref>`, `<math>`, ...) are taken
out first (their bodies may hold unbalanced braces), then templates (`{{...}}`, nested), then
tables (`{| ... |}`, line based), then links, then line structure (headings, lists) and last the
inline markup (bold/italic, entities). Every scan is linear in the text length, so a broken page
(an unclosed `{{`, `{|`, `<ref>` or `[[`) costs no more than a good one, and a last check drops
any passage that still holds markup, so residue never reaches the corpus.
"""
from __future__ import annotations

import html
import re
from collections.abc import Callable

Counter = Callable[[str, int], None]


def _no_count(name: str, value: int = 1) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Page classification

_REDIRECT = re.compile(r"\s*#\s*redirect\b", re.IGNORECASE)
# Templates that mark a disambiguation page (Wikipedia:Template index/Disambiguation).
_DISAMBIGUATION_TEMPLATES = frozenset({
    "disambiguation", "disambig", "disamb", "dab", "dmbox", "hndis", "geodis", "numberdis",
    "schooldis", "hospitaldis", "roaddis", "mathdab", "mil-unit-dis",
})  # and every "... disambiguation" template (human name, place name, genus, ...)
_DISAMBIGUATION_TEMPLATE = re.compile(
    r"\{\{\s*(?:" + "|".join(re.escape(name).replace(r"\ ", r"[\s_]+")
                            for name in sorted(_DISAMBIGUATION_TEMPLATES, key=len, reverse=True))
    + r"|[^{}|\n]*[\s_]disambiguation)\s*(?:\||\}\})", re.IGNORECASE)


def is_redirect(wikitext: str) -> bool:
    """True for `#REDIRECT [[Target]]` pages (the dump also flags them with `<redirect>`)."""
    return _REDIRECT.match(wikitext) is not None


def is_disambiguation(title: str, wikitext: str) -> bool:
    """True for disambiguation pages: a "(disambiguation)" title or a disambiguation template."""
    return title.endswith("(disambiguation)") or bool(_DISAMBIGUATION_TEMPLATE.search(wikitext))


def _normalise_name(name: str) -> str:
    return " ".join(name.replace("_", " ").split()).lower()


# ---------------------------------------------------------------------------------------------
# Step 1: comments and extension/HTML tags whose whole body is not prose

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_DROPPED_ELEMENTS = (
    "ref", "references", "gallery", "timeline", "imagemap", "math", "chem", "ce", "score",
    "graph", "mapframe", "maplink", "syntaxhighlight", "source", "pre", "templatedata",
    "templatestyles", "hiero", "inputbox", "categorytree", "poem", "noinclude", "includeonly",
    "indicator", "charinsert", "table", "ul", "ol", "dl",  # HTML tables and lists too
)
_DROPPED_TAG = re.compile(
    r"<(/?)(" + "|".join(sorted(set(_DROPPED_ELEMENTS), key=len, reverse=True)) +
    r")(?=[\s/>])[^<>]*?(/?)>", re.IGNORECASE)


def _strip_comments(text: str) -> str:
    # An unclosed `<!--` hides the rest of the page in MediaWiki too.
    return _COMMENT.sub("", text) if "<!--" in text else text


def _drop_elements(text: str) -> str:
    """Remove `<ref>...</ref>`, `<math>...</math>`, ... with their bodies; stray tags alone."""
    pieces: list[str] = []
    pos = 0
    unclosed: set[str] = set()  # names with no closing tag after some point: never search again
    search_from = 0
    while (match := _DROPPED_TAG.search(text, search_from)) is not None:
        closing, name, self_closing = match.group(1), match.group(2).lower(), match.group(3)
        pieces.append(text[pos:match.start()])
        pos = search_from = match.end()
        if closing or self_closing or name in unclosed:
            continue
        end = re.compile(rf"</{name}\s*>", re.IGNORECASE).search(text, match.end())
        if end is None:
            unclosed.add(name)  # MediaWiki shows an unclosed tag as text; we drop the tag only
            continue
        pos = search_from = end.end()
    pieces.append(text[pos:])
    return "".join(pieces)


# ---------------------------------------------------------------------------------------------
# Step 2: templates {{...}} (nested), with a few inline ones rendered as their visible text

_BRACE_RUN = re.compile(r"\{\{+|\}\}+")
_PIPES = re.compile(r"\[\[|\]\]|\{\{|\}\}|\|")


Span = tuple[int, int]


def _not_inside(spans: list[Span], outer: list[Span]) -> list[Span]:
    """The spans that do not start inside one of the (sorted, disjoint) `outer` spans."""
    kept, i = [], 0
    for start, end in spans:
        while i < len(outer) and outer[i][1] <= start:
            i += 1
        if i < len(outer) and outer[i][0] <= start < outer[i][1]:
            continue
        kept.append((start, end))
    return kept


def split_template_args(inner: str) -> list[str]:
    """Split a template body on the `|` that are not inside nested links or templates."""
    parts, depth, start = [], 0, 0
    for match in _PIPES.finditer(inner):
        token = match.group()
        if token in ("[[", "{{"):
            depth += 1
        elif token in ("]]", "}}"):
            depth = max(0, depth - 1)
        elif depth == 0:
            parts.append(inner[start:match.start()])
            start = match.end()
    parts.append(inner[start:])
    return parts


def _positional(args: list[str]) -> list[str]:
    return [a.strip() for a in args if "=" not in a.split("[[", 1)[0].split("{{", 1)[0]]


def _first(args: list[str]) -> str:
    pos = _positional(args)
    return pos[0] if pos else ""


def _last(args: list[str]) -> str:
    pos = _positional(args)
    return pos[-1] if pos else ""


def _convert(args: list[str]) -> str:
    pos = _positional(args)
    if len(pos) >= 4 and pos[1] in ("-", "–", "to", "and", "or", "by", "x", "×", "to(-)"):
        joiner = "–" if pos[1] in ("-", "–") else f" {pos[1]} "
        return f"{pos[0]}{joiner}{pos[2]} {pos[3]}"
    return " ".join(pos[:2])


def _frac(args: list[str]) -> str:
    pos = _positional(args)
    if len(pos) == 3:
        return f"{pos[0]} {pos[1]}/{pos[2]}"
    return "/".join(pos[:2]) if len(pos) == 2 else (f"1/{pos[0]}" if pos else "")


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")


def _as_of(args: list[str]) -> str:
    # {{As of|2021|3|lc=y}} -> "as of March 2021"; {{As of|2015}} -> "As of 2015".
    year, month, day = ([*_positional(args), "", "", ""])[:3]
    month = _MONTHS[int(month) - 1] if month.isdigit() and 1 <= int(month) <= 12 else month
    words = " ".join(w for w in ("As of", day, month, year) if w)
    lower = any(a.replace(" ", "").lower() in ("lc=y", "lc=yes") for a in args)
    return words[0].lower() + words[1:] if lower else words


def _quote(args: list[str]) -> str:
    named = {a.split("=", 1)[0].strip(): a.split("=", 1)[1] for a in args if "=" in a}
    text = named.get("text") or named.get("quote") or _first(args)
    return f"\n\n{text.strip()}\n\n"


_CONSTANT_TEMPLATES = {
    "ndash": "–", "mdash": "—", "snd": " – ", "spnd": " – ", "sndash": " – ",
    # {{'}} gives an entity, as in MediaWiki, so ''X''{{'}}s does not turn into a ''' run.
    "spaced ndash": " – ", "spaced en dash": " – ", "nbsp": " ", "'": "&#39;", "`": "&#39;",
    "dot": "·", "middot": "·", "·": " · ", "en dash": "–", "endash": "–", "em dash": "—",
    "emdash": "—", "sp": " ",
}
_RENDERED_TEMPLATES: dict[str, Callable[[list[str]], str]] = {
    **{name: _first for name in (
        "nowrap", "nobr", "nobreak", "small", "smaller", "big", "larger", "em", "strong",
        "nobold", "noitalic", "abbr", "ill", "interlanguage link", "interlanguage link multi",
        "visible anchor", "vanchor", "flag", "flagcountry", "nowiki", "keep together",
        "script", "lang-rtl", "nwr", "not a typo", "proper name", "linktext", "smallcaps",
        "sc", "gaps", "bold", "italic", "math", "mvar", "serif", "sans-serif", "nihongo",
        "nihongo2", "nihongo3", "nihongo4", "format price")},
    **{name: _last for name in ("lang", "transl", "transliteration", "sic", "resize", "font",
                                "coloured text", "color", "colored text", "tooltip")},
    "convert": _convert, "cvt": _convert, "frac": _frac, "fraction": _frac, "sfrac": _frac,
    "circa": lambda a: f"c. {_first(a)}", "c.": lambda a: f"c. {_first(a)}",
    "née": lambda a: f"née {_first(a)}", "nee": lambda a: f"née {_first(a)}",
    "as of": _as_of,
    "quote": _quote, "blockquote": _quote, "cquote": _quote, "quotation": _quote,
}


def _render_template(inner: str, counter: Counter) -> str:
    args = split_template_args(inner)
    name = _normalise_name(args[0])
    if name in _CONSTANT_TEMPLATES:
        return _CONSTANT_TEMPLATES[name]
    if name.startswith("lang-"):  # {{lang-de|Berlin}}: the foreign text itself
        return _remove_templates(_first(args[1:]), counter)
    render = _RENDERED_TEMPLATES.get(name)
    if render is None:
        counter("templates_removed", 1)
        return ""
    # The arguments may hold templates themselves ({{lang|de|{{nowrap|...}}}}).
    return _remove_templates(render(args[1:]), counter)


def _brace_spans(text: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]], int]:
    """Outermost `{{...}}` (width 2) and `{{{...}}}` (width 3) spans, unmatched braces, and the
    number of `{{` runs never closed.

    Runs of braces pair up as in MediaWiki's preprocessor: a closing run takes 3 braces from the
    innermost open run when both have at least 3 (a parameter), else 2 (a template), so
    `{{a|{{b}}}}` is two templates and `{{{{x}}}}` is a parameter inside literal braces.
    """
    stack: list[list[int]] = []  # [start, braces left] of open runs
    closed: list[tuple[int, int, int]] = []
    stray: list[tuple[int, int]] = []
    for match in _BRACE_RUN.finditer(text):
        start, end = match.span()
        if text[start] == "{":
            stack.append([start, end - start])
            continue
        pos, left = start, end - start
        while left >= 2 and stack:
            top = stack[-1]
            width = 3 if left >= 3 and top[1] >= 3 else 2
            top[1] -= width
            closed.append((top[0] + top[1], pos + width, width))
            pos, left = pos + width, left - width
            if top[1] < 2:
                stack.pop()
                if top[1]:
                    stray.append((top[0], top[0] + 1))
        if left:
            stray.append((pos, pos + left))
    # An unclosed "{{name" is never prose: drop it with the rest of its line. Its argument
    # lines may still leak into a passage: the caller counts it (templates_unclosed).
    stray.extend((start, _line_end(text, start)) for start, _ in stack)
    outer: list[tuple[int, int, int]] = []
    for span in sorted(closed):
        if not outer or span[0] >= outer[-1][1]:
            outer.append(span)
    unclosed = len(_not_inside([(start, start + 1) for start, _ in stack],
                               [(s, e) for s, e, _ in outer]))
    return outer, _not_inside(sorted(stray), [(s, e) for s, e, _ in outer]), unclosed


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _remove_templates(text: str, counter: Counter) -> str:
    if "{{" not in text and "}}" not in text:
        return text
    outer, stray, unclosed = _brace_spans(text)
    if unclosed:
        counter("templates_unclosed", unclosed)
    pieces, pos = [], 0
    for start, end, width in sorted(outer + [(s, e, 0) for s, e in stray]):
        if start < pos:
            continue
        pieces.append(text[pos:start])
        if width == 2:
            pieces.append(_render_template(text[start + 2:end - 2], counter))
        pos = end  # parameters ({{{1}}}) and stray braces render as nothing
    pieces.append(text[pos:])
    return "".join(pieces)


# ---------------------------------------------------------------------------------------------
# Step 3: remaining HTML tags; block elements and <br> line breaks end a paragraph

_BLOCK_TAGS = frozenset({"p", "br", "div", "blockquote", "center", "hr", "h1", "h2", "h3", "h4",
                         "h5", "h6", "li", "tr", "td", "th", "caption"})
_ANY_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)\b[^<>]*?/?>")


def _tag_replacement(match: re.Match) -> str:
    name = match.group(1).lower()
    return "\n\n" if name in _BLOCK_TAGS else ""


def _strip_tags(text: str) -> str:
    return _ANY_TAG.sub(_tag_replacement, text) if "<" in text else text


# ---------------------------------------------------------------------------------------------
# Step 4: tables {| ... |} (nested; the markers stand at the start of a line)

_TABLE_OPEN = re.compile(r"^[ \t:]*\{\|")
_TABLE_CLOSE = re.compile(r"^[ \t]*\|\}")
_TABLE_ROW = re.compile(r"^[ \t]*[|!]")


def _drop_tables(text: str) -> str:
    if "{|" not in text and "|}" not in text:
        return text
    kept: list[str] = []
    table: list[str] = []  # lines of the table(s) being dropped
    depth = 0
    for line in text.split("\n"):
        if _TABLE_OPEN.match(line):
            depth += 1
            table.append(line)
        elif depth and _TABLE_CLOSE.match(line):
            depth -= 1
            if depth == 0:
                table.clear()
                kept.append("")  # a table ends the paragraph before it
        elif depth:
            table.append(line)
        else:
            kept.append(line)
    if depth:
        # An unclosed table: MediaWiki closes it at the end of the page. Its rows go, but the
        # prose after it is kept, so one missing `|}` does not cost the rest of the article.
        kept.extend(line for line in table
                    if not (_TABLE_OPEN.match(line) or _TABLE_ROW.match(line)))
    text = "\n".join(kept)
    # Markers left inside a line are not table syntax; MediaWiki would show them as text.
    return text.replace("{|", "").replace("|}", "") if "{|" in text or "|}" in text else text


# ---------------------------------------------------------------------------------------------
# Step 5: links [[target|text]] (nested in file captions), external links [url text]

# [[...]] holding no other [[ or ]] (single brackets allowed: [[Kyrios|κύριος ['Lord']]]).
_INNERMOST_LINK = re.compile(r"\[\[([^\[\]]*(?:(?:\[(?!\[)|\](?!\]))[^\[\]]*)*)\]\]")
_HIDDEN_NAMESPACES = frozenset({"file", "image", "category"})
_LANGUAGE_LINK = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*:")
_EXTERNAL_LINK = re.compile(
    r"\[(?:https?:|ftp:|mailto:|news:|irc:)?//[^\s\]\[]*(?:\s+([^\]\[]*))?\]"
    r"|\[(?:mailto|news):[^\s\]\[]*(?:\s+([^\]\[]*))?\]")


def _render_link(inner: str) -> str:
    target, pipe, label = inner.partition("|")
    prefix = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    if prefix in _HIDDEN_NAMESPACES and not target.lstrip().startswith(":"):
        return ""  # files, images and categories show no prose
    if not pipe and _LANGUAGE_LINK.match(target.strip()):
        return ""  # interlanguage link: shown in the side bar, not in the text
    if pipe:
        if label.strip():
            return label
        # The pipe trick: [[Paris, Texas|]] -> "Paris", [[Pipe (computing)|]] -> "Pipe".
        return re.sub(r"\s*\(.*\)\s*$", "", target.split(",", 1)[0]).strip().lstrip(":")
    return target.strip().lstrip(":").split("#", 1)[0] or target.strip().lstrip(":#")


def _replace_links(text: str, counter: Counter = _no_count) -> str:
    # Innermost links first: a file caption's own links become text, then the whole file link
    # goes in the next round. Each round is one linear regex pass; rounds = nesting depth.
    while "[[" in text:
        replaced = _INNERMOST_LINK.sub(lambda m: _render_link(m.group(1)), text)
        if replaced == text:
            break
        text = replaced
    if "[[" in text or "]]" in text:  # unmatched: MediaWiki shows the brackets as text
        # An unclosed "[[target|label" leaks its target and pipe into the passage: counted.
        counter("links_unclosed", text.count("[["))
        text = text.replace("[[", "").replace("]]", "")
    if "[" in text:
        text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or m.group(2) or "", text)
    return text


# ---------------------------------------------------------------------------------------------
# Step 6: lines -> paragraphs; headings, lists, table rows and rules are not passages

_STRUCTURE_LINE = re.compile(r"[=*#;:|!]|\{\||-{4}")
# A line of bold text alone ('''Footnotes''') is a heading in all but markup.
_PSEUDO_HEADING = re.compile(r"'{3,5}[^'\n]+'{3,5}:?")


def _paragraphs(text: str) -> list[str]:
    paragraphs: list[str] = []
    current: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        structure = _STRUCTURE_LINE.match(stripped) or _PSEUDO_HEADING.fullmatch(stripped)
        if stripped and not structure:
            current.append(stripped)
            continue
        if current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


# ---------------------------------------------------------------------------------------------
# Step 7: inline markup, entities, spacing left by removed templates

_QUOTES = re.compile(r"'{2,}")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_INVISIBLE_CHARS = "\u00ad\u200b\u200e\u200f\ufeff"  # soft hyphen, zero-width, marks, BOM
_INVISIBLE = re.compile(f"[{_INVISIBLE_CHARS}]")
# The inline steps run once over all paragraphs joined by "\n" (one regex call per page, not per
# paragraph), so no pattern may cross a "\n"; spaces are single spaces by then.
_REPEATED_PUNCT = re.compile(r"([,;])(?: ?[,;])+")
_REPEATED_PAIRS = tuple(a + s + b for a in ",;" for s in ("", " ") for b in ",;")
_EMPTY_BRACKETS = re.compile(r"\( ?(?:[,;:.] ?)*\)|\[ ?\]")
_OPEN_PAREN_PUNCT = re.compile(r"\( ?[,;:] ?")
# Markup a clean passage never holds; a passage that starts like a list/table/heading line
# (possible only when removed markup exposed the character) counts as residue too.
_RESIDUE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|'''|==|<!--|-->|</?[A-Za-z][^<>\n]*>"
                      r"|(?m:^[*#;:|!=])")


def _quote_run(match: re.Match) -> str:
    # '' italic, ''' bold, ''''' both; '''' is an apostrophe followed by bold.
    n = len(match.group())
    return "'" if n == 4 else "'" * max(0, n - 5)


def _drop_space_before_punct(text: str) -> str:
    # str.replace is several times faster than a regex here (spaces are single by now).
    for mark in ",.;:!?)":
        text = text.replace(" " + mark, mark)
    return text


def _clean_inline(text: str) -> list[str]:
    """Paragraphs joined by "\n" -> cleaned paragraphs (bold/italic, entities, spacing)."""
    if "''" in text:
        text = _QUOTES.sub(_quote_run, text)
    if "__" in text:
        text = _MAGIC_WORD.sub("", text)
    if "&" in text:
        text = html.unescape(text)  # an entity for a line break (&#10;) splits its paragraph
    if "''" in text:  # left by over-long quote runs or decoded &#39;: never shown as markup
        text = _QUOTES.sub("'", text)
    if any(ch in text for ch in _INVISIBLE_CHARS):
        text = _INVISIBLE.sub("", text)
    text = _drop_space_before_punct("\n".join(" ".join(p.split()) for p in text.split("\n")))
    if any(pair in text for pair in _REPEATED_PAIRS):
        text = _REPEATED_PUNCT.sub(r"\1", text)
    if "(" in text or "[" in text:
        # Removed templates leave "(; born 1954)" and "()" behind.
        text = _EMPTY_BRACKETS.sub("", text)
        text = _OPEN_PAREN_PUNCT.sub("(", text)
        for mark in ",;:":
            text = text.replace(mark + ")", ")")
        text = _drop_space_before_punct(text.replace("  ", " "))
    return [p.strip() for p in text.split("\n")]


def _has_text(paragraph: str) -> bool:
    return any(ch.isalnum() for ch in paragraph)


# ---------------------------------------------------------------------------------------------

def clean_wikitext(wikitext: str, counter: Counter = _no_count) -> str:
    """Wikitext -> plain text with line structure kept (headings, lists still present as lines)."""
    text = _strip_comments(wikitext)
    text = _drop_elements(text)
    text = _remove_templates(text, counter)
    text = _strip_tags(text)
    text = _drop_tables(text)
    return _replace_links(text, counter)


def extract_passages(wikitext: str, counter: Counter = _no_count) -> list[str]:
    """The prose paragraphs of an article, one clean string each, in page order.

    Lists, tables, headings, templates, references, files, categories, comments and HTML tags are
    dropped; link text and bold/italic text stay; entities are decoded. `counter(name, n)` receives
    "templates_removed", "passages_residue_dropped" (a paragraph still holding markup after
    cleaning, e.g. from markup too broken to interpret: dropped rather than emitted), and
    "templates_unclosed" / "links_unclosed" (a `{{` or `[[` never closed: its line is dropped or
    its brackets removed, but text of it may remain in a passage).
    """
    paragraphs = _paragraphs(clean_wikitext(wikitext, counter))
    passages = [p for p in _clean_inline("\n".join(paragraphs)) if _has_text(p)]
    if _RESIDUE.search("\n".join(passages)):
        residue = [p for p in passages if _RESIDUE.search(p)]
        counter("passages_residue_dropped", len(residue))
        passages = [p for p in passages if not _RESIDUE.search(p)]
    return passages
