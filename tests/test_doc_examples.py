"""Every Python example of the README and of the documentation site runs: the README's as
the file a reader pastes it into, the site's (written as interpreter sessions) as doctests
and pasted line by line into an interactive interpreter."""

import code
import contextlib
import doctest
import io

import pytest

from tests import docs_pages

SESSION_PAGES = [p for p in docs_pages.pages()[1:] if docs_pages.code_blocks(p.read_text(), "python")]


def test_every_python_block_of_the_site_is_an_interpreter_session():
    assert SESSION_PAGES
    for page in SESSION_PAGES:
        for block in docs_pages.code_blocks(page.read_text(), "python"):
            assert block.startswith(">>> "), f"{page.name}: a Python block that no test runs:\n{block[:200]}"


def test_the_readme_example_runs_as_a_file_and_trains():
    pytest.importorskip("optax")
    blocks = docs_pages.code_blocks(docs_pages.README.read_text(), "python")
    assert len(blocks) == 1
    namespace = {"__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), namespace)
    parts = namespace["parts"]
    assert float(parts["ntl"]) < 0.05 and float(parts["cross_entropy"]) < 0.1
    assert out.getvalue().startswith("{")


@pytest.mark.parametrize("page", SESSION_PAGES, ids=lambda p: p.relative_to(docs_pages.DOCS).as_posix())
def test_site_examples_are_correct_doctests(page):
    pytest.importorskip("optax")
    result = doctest.testfile(str(page), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= len(docs_pages.code_blocks(page.read_text(), "python"))
    assert result.failed == 0


def pasted_lines(block: str) -> list[str]:
    """What a reader pastes: the code without its `>>> `/`... ` prompts, blank lines kept,
    the expected output left out."""
    lines = []
    for line in block.splitlines():
        if line.startswith((">>>", "...")):
            lines.append(line[4:])
        elif not line.strip():
            lines.append("")
    return lines


class Console(code.InteractiveConsole):
    def __init__(self):
        super().__init__()
        self.errors = []

    def write(self, data):
        self.errors.append(data)


@pytest.mark.parametrize("page", SESSION_PAGES, ids=lambda p: p.relative_to(docs_pages.DOCS).as_posix())
def test_site_examples_paste_into_the_interpreter(page):
    pytest.importorskip("optax")
    console = Console()
    for block in docs_pages.code_blocks(page.read_text(), "python"):
        more = False
        for n, line in enumerate(pasted_lines(block)):
            more = console.push(line)
            assert not console.errors, f"line {n + 1} of a block of {page.name}, {line!r}:\n" + "".join(console.errors)
        # every block ends on a complete statement: nothing left waiting for more input
        assert not more, f"a block of {page.name} ends inside a statement: {block.splitlines()[-3:]}"
    if page.name == "getting-started.md":
        assert float(console.locals["parts"]["ntl"]) < 0.05
