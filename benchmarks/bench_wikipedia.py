"""Wikipedia extraction: our extractor vs WikiExtractor (and naive mwparserfromhell), one process.

    .venv/bin/python benchmarks/bench_wikipedia.py [--dump PATH] [--repeat 4] [--rounds 2]

All contestants read the same uncompressed pages-articles XML file (the shared enwiki excerpt,
its pages repeated `--repeat` times) in this one process, one after the other, `--rounds` times
(best round counts, since the machine is shared). Throughput is MB of dump XML and pages per
second per core. "Residue" counts markup left in each output: what the BERT paper's "only the text
passages" excludes (lists, tables, headers) and what should never reach a tokenizer.
"""
from __future__ import annotations

import argparse
import bz2
import io
import re
import sys
import tempfile
import time
from pathlib import Path

from common.errors import BadRecord
from pipelines.extract_wikipedia import page_document
from pipelines.wikipedia.dump import iter_pages, plan_splits

DEFAULT_DUMP = (Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki" /
                "enwiki-dbpedia-minidump-pages-articles.xml.bz2")

RESIDUE = {
    "[[ or ]]": re.compile(r"\[\[|\]\]"),
    "{{ or }}": re.compile(r"\{\{|\}\}"),
    "table {| |}": re.compile(r"\{\||\|\}"),
    "''' or ''": re.compile(r"''"),
    "== heading": re.compile(r"=="),
    "HTML tag": re.compile(r"</?[A-Za-z][A-Za-z0-9]*\b[^<>]*>"),
    "HTML entity": re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);"),
    "list line": re.compile(r"(?m)^[*#;:]"),
    "thumb|/px": re.compile(r"\bthumb\||\|\d+px\b|\bupright\b"),
}
_HEADING = re.compile(r"(?m)^(={2,6})\s*(.+?)\s*\1\s*$")


def build_dump(source: Path, repeat: int, folder: Path) -> tuple[Path, int, list[str]]:
    """The dump's XML with its pages repeated `repeat` times; returns path, pages, headings."""
    xml = bz2.decompress(source.read_bytes()) if source.suffix == ".bz2" else source.read_bytes()
    first, last = xml.index(b"<page>"), xml.rindex(b"</page>") + len(b"</page>")
    body = xml[first:last]
    path = folder / "bench.xml"
    path.write_bytes(xml[:first] + b"\n".join([body] * repeat) + xml[last:])
    text = xml.decode("utf-8")
    headings = sorted({m.group(2) for m in _HEADING.finditer(text)})
    return path, body.count(b"<page>") * repeat, headings


def run_ours(path: Path) -> list[str]:
    texts = []
    for split in plan_splits(str(path), 1 << 40):
        for item in iter_pages(split):
            if isinstance(item, BadRecord):
                raise SystemExit(f"bad record in {item.file}, {item.record}: {item.reason}")
            document = page_document(item, str(path), lambda name, value=1: None)
            if document is not None:
                texts.append("\n".join(document.passages))
    return texts


def run_wikiextractor(path: Path) -> list[str]:
    from wikiextractor import WikiExtractor
    from wikiextractor.extract import Extractor

    texts = []
    with open(path, encoding="utf-8") as lines:
        known_namespaces, template_prefix = _wikiextractor_siteinfo(lines, WikiExtractor)
        for page_id, revid, title, page in WikiExtractor.collect_pages(lines):
            out = io.StringIO()
            # The command line's defaults: sections kept, --html-safe, templates expanded with
            # no template definitions loaded (what a single pass over a dump has).
            Extractor(page_id, revid, "", title, page, templatePrefix=template_prefix,
                      knownNamespaces=known_namespaces, to_text=True).extract(out, html_safe=True)
            texts.append(out.getvalue())
    return texts


def _wikiextractor_siteinfo(lines, module) -> tuple[set[str], str]:
    """Read <siteinfo> as WikiExtractor's process_dump does, including the module-level
    `templateNamespace` its collect_pages filters on (its CLI sets it the same way)."""
    known, prefix = {"Template"}, ""
    for line in lines:
        match = module.tagRE.search(line)
        if not match:
            continue
        if match.group(2) == "namespace":
            known.add(match.group(3))
            if 'key="10"' in line:
                module.templateNamespace = match.group(3)
                prefix = match.group(3) + ":"
        elif match.group(2) == "/siteinfo":
            break
    return known, prefix


def run_mwparserfromhell(path: Path, max_pages: int) -> tuple[list[str], int, int]:
    """The straightforward pass: parse, remove templates/refs/files/tables, strip_code."""
    import mwparserfromhell

    texts, pages, nbytes = [], 0, 0
    for split in plan_splits(str(path), 1 << 40):
        for item in iter_pages(split):
            if pages >= max_pages:
                return texts, pages, nbytes
            pages += 1
            nbytes += item.source_bytes
            if item.namespace != 0 or item.redirect:
                continue
            code = mwparserfromhell.parse(item.text)
            for node in code.filter_templates(recursive=False) + code.filter_tags(
                    matches=lambda n: n.tag in ("ref", "table"), recursive=False):
                try:
                    code.remove(node)
                except ValueError:
                    pass
            texts.append(code.strip_code())
    return texts, pages, nbytes


def residue(texts: list[str], headings: list[str]) -> dict[str, int]:
    joined = "\n".join(texts)
    counts = {name: len(pattern.findall(joined)) for name, pattern in RESIDUE.items()}
    lines = {line.strip() for text in texts for line in text.split("\n")}
    counts["section title lines"] = sum(1 for h in headings if h in lines or f"{h}." in lines)
    return counts


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", type=Path, default=DEFAULT_DUMP)
    parser.add_argument("--repeat", type=int, default=4, help="copies of the dump's pages")
    parser.add_argument("--rounds", type=int, default=2, help="best of this many rounds")
    parser.add_argument("--mwp_pages", type=int, default=27,
                        help="pages for the (slow) mwparserfromhell pass")
    args = parser.parse_args(argv)
    if not args.dump.exists():
        print(f"dump not found: {args.dump}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path, num_pages, headings = build_dump(args.dump, args.repeat, Path(tmp))
        megabytes = path.stat().st_size / 1e6
        print(f"input: {args.dump.name} x{args.repeat}: {megabytes:.1f} MB XML, {num_pages} pages")
        best = {"ours": float("inf"), "wikiextractor": float("inf")}
        outputs = {}
        for round_ in range(args.rounds):
            for name, fn in (("ours", run_ours), ("wikiextractor", run_wikiextractor)):
                outputs[name], seconds = timed(fn, path)
                best[name] = min(best[name], seconds)
                print(f"  round {round_ + 1} {name:14s} {seconds:6.2f} s")
        (mwp_texts, mwp_pages, mwp_bytes), mwp_seconds = timed(run_mwparserfromhell, path,
                                                               args.mwp_pages)
        # The job reads .bz2 dumps: the same pages, decompression included (ours only).
        compressed = path.with_suffix(".xml.bz2")
        compressed.write_bytes(bz2.compress(path.read_bytes()))
        bz2_texts, bz2_seconds = timed(run_ours, compressed)
        assert bz2_texts == outputs["ours"]

    print(f"\n{'extractor':16s} {'MB/s':>7s} {'pages/s':>8s} {'articles':>9s}")
    for name, seconds in best.items():
        print(f"{name:16s} {megabytes / seconds:7.2f} {num_pages / seconds:8.1f} "
              f"{len(outputs[name]):9d}")
    print(f"{'mwparserfromhell':16s} {mwp_bytes / 1e6 / mwp_seconds:7.2f} "
          f"{mwp_pages / mwp_seconds:8.1f} {len(mwp_texts):9d}  (naive remove + strip_code, "
          f"{mwp_pages} pages)")
    print(f"{'ours from .bz2':16s} {megabytes / bz2_seconds:7.2f} {num_pages / bz2_seconds:8.1f} "
          f"{len(bz2_texts):9d}  (bz2 decompression included, one round)")
    print(f"\nspeed ratio ours / WikiExtractor: {best['wikiextractor'] / best['ours']:.2f}x")
    print(f"speed ratio ours / mwparserfromhell: "
          f"{(megabytes / best['ours']) / (mwp_bytes / 1e6 / mwp_seconds):.2f}x")

    ours = residue(outputs["ours"], headings)
    theirs = residue(outputs["wikiextractor"], headings)
    mwp = residue(mwp_texts, headings)
    print(f"\nresidue over the whole output (x{args.repeat} copies; mwparserfromhell: "
          f"{args.mwp_pages} pages)")
    print(f"{'markup':22s} {'ours':>8s} {'WikiExtractor':>14s} {'mwparserfromhell':>17s}")
    for name in ours:
        print(f"{name:22s} {ours[name]:8d} {theirs[name]:14d} {mwp[name]:17d}")
    print(f"{'total':22s} {sum(ours.values()):8d} {sum(theirs.values()):14d} "
          f"{sum(mwp.values()):17d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
