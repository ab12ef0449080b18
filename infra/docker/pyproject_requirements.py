"""Print the requirements that pyproject.toml declares, one per line, for `pip install -r`.

    python pyproject_requirements.py [--pyproject pyproject.toml] [--extra dev ...] [--no-main]

The Dockerfile installs the dependencies in a layer of their own, built from pyproject.toml
alone, so that a code change does not reinstall them; this keeps pyproject.toml the one list.
"""
from __future__ import annotations

import argparse
import sys

import tomllib


def requirements(pyproject: dict, extras: list[str], main: bool = True) -> list[str]:
    project = pyproject["project"]
    lines = list(project.get("dependencies", [])) if main else []
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r} (has: {sorted(optional)})")
        lines += optional[extra]
    return lines


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
