"""The README and the documentation site's pages (docs/**/*.md), for the tests that hold
their text to the code and the committed results."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def page(name: str) -> pathlib.Path:
    """A page of the site by its path under docs/, e.g. `guides/t5x.md`."""
    path = DOCS / name
    assert path.is_file(), f"no page docs/{name}"
    return path


def pages() -> list[pathlib.Path]:
    """Every page of the site, the README first."""
    return [README] + sorted(DOCS.rglob("*.md"))


def all_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in pages())


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of `text` in `language` (```language ... ```)."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
