"""Print the requirements that pyproject.toml declares, one per line, for `pip install -r`.

    python pyproject_requirements.py [--pyproject pyproject.toml] [--extra dev ...] [--no-main]

The Dockerfile installs the dependencies in a layer of their own, built from pyproject.toml
alone, so that a code change does not reinstall them; this keeps pyproject.toml the one list.
An extra that names the project itself (`flow = ["bert-dag[data,train]", ...]`) stands for
those extras' lines; a line listed twice is printed once.
"""
from __future__ import annotations

import argparse
import re
import sys

import tomllib


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: dict, extras: list[str], main: bool = True) -> list[str]:
    project = pyproject["project"]
    lines = list(project.get("dependencies", [])) if main else []
    optional = project.get("optional-dependencies", {})
    itself = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*\[([^\]]*)\]\s*")
    added: set[str] = set()

    def add(extra: str) -> None:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r} (has: {sorted(optional)})")
        if extra in added:
            return
        added.add(extra)
        for line in optional[extra]:
            match = itself.fullmatch(line)
            if match and normalized(match[1]) == normalized(project["name"]):
                for included in match[2].split(","):
                    add(included.strip())
            else:
                lines.append(line)

    for extra in extras:
        add(extra)
    return list(dict.fromkeys(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", default="pyproject.toml")
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group")
    parser.add_argument("--no-main", dest="main", action="store_false",
                        help="only the extras, not [project].dependencies")
    args = parser.parse_args(argv)
    with open(args.pyproject, "rb") as f:
        print("\n".join(requirements(tomllib.load(f), args.extra, args.main)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
