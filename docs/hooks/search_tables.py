"""A hook of the site (mkdocs.yml `hooks`): the evidence page's result tables are left out of
the search index, whose preview of the page would otherwise be their numbers."""

import re


def on_page_content(html, page, **kwargs):
    if page.file.src_uri == "evidence.md":
        html = re.sub(r"<table>", "<table data-search-exclude>", html)
    return html
