"""A hook of the site (mkdocs.yml `hooks`): with the repository's address (`repo_url`), a
file of the repository named in inline code (`tests/test_parity.py`) links to that file
there. Only names of files that exist are linked; without `repo_url` nothing changes."""

import re
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
# A link, left as it is, or inline code that is a path alone.
_CODE = re.compile(r"(<a\b[^>]*>.*?</a>)|<code>([\w./-]+/[\w.-]+\.[a-z]+)</code>", re.S)


def on_page_content(html, page, config, **kwargs):
    if not config.repo_url:
        return html
    base = config.repo_url.rstrip("/") + "/blob/HEAD/"

    def link(match):
        path = match.group(2)
        if path is None or not (_ROOT / path).is_file():
            return match.group(0)
        return f'<a href="{base}{path}">{match.group(0)}</a>'

    return _CODE.sub(link, html)
