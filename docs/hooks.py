"""mkdocs hooks: the CLI reference page is written from sim's own argparse parser at build time."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MARKER = "<!-- cli-reference -->"
README_MARKER = "<!-- readme -->"
ROOT = Path(__file__).resolve().parent.parent


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share one parser
                    seen.add(id(sub))
                    out.append((name, sub))
    return out


def _walk(prefix: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{prefix}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser):
        lines += _walk(f"{prefix} {name}", sub, min(level + 1, 4))
    return lines


def cli_reference() -> str:
    sys.path.insert(0, str(ROOT))
    os.environ["COLUMNS"] = "80"  # one width that fits the page, whatever terminal builds the site
    from sim.cli.main import build_parser

    parser = build_parser()
    parser.prog = "python -m sim"
    return "\n".join(_walk("python -m sim", parser, 2))


def readme_for_the_site() -> str:
    """The README, its links made relative to docs/ (where the site's pages live)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.replace("](docs/", "](")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if README_MARKER in markdown:
        markdown = markdown.replace(README_MARKER, readme_for_the_site())
    return markdown
