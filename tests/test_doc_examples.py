"""Every Python example of the README and of the documentation site runs as the file a
reader pastes it into, and prints what the page shows."""

import contextlib
import doctest
import io
import pathlib
import re
import sys
import warnings
from code import InteractiveConsole

import pytest

from tests import docs_pages

# Pages whose examples run in an environment of their own, tested there: EasyDeL pins a jax
# of its own (tests/easydel/test_easydel_guide.py, in .ci/easydel's environment).
OWN_ENVIRONMENT = {"guides/easydel.md"}
PYTHON_PAGES = [p for p in docs_pages.pages()[1:] if docs_pages.code_blocks(p.read_text(), "python")
                and p.relative_to(docs_pages.DOCS).as_posix() not in OWN_ENVIRONMENT]
# A Python block and the ```text block right after it, if any: what the block prints.
EXAMPLE = re.compile(r"^```python\n(.*?)^```\n(?:\s*^```text\n(.*?)^```)?", re.S | re.M)


def test_no_fenced_block_is_an_interpreter_session():
    """A reader copies a block whole: prompts and outputs in it would not run."""
    for page in docs_pages.pages():
        for block in re.findall(r"^```\w*\n(.*?)^```", page.read_text(), re.S | re.M):
            assert not block.lstrip().startswith((">>>", "...")), f"{page.name}: {block[:120]}"


def test_the_readme_example_runs_as_a_file_trains_and_prints_what_the_readme_shows():
    pytest.importorskip("optax")
    examples = EXAMPLE.findall(docs_pages.README.read_text())
    assert len(examples) == len(docs_pages.code_blocks(docs_pages.README.read_text(), "python")) == 1
    (code, shown), = examples
    namespace = {"__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), namespace)
    parts = namespace["parts"]
    assert float(parts["ntl"]) < 0.05 and float(parts["cross_entropy"]) < 0.1
    assert shown and doctest.OutputChecker().check_output(shown, out.getvalue(), doctest.ELLIPSIS), (
        f"README.md's example printed:\n{out.getvalue()}\nthe README shows:\n{shown}")


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: p.relative_to(docs_pages.DOCS).as_posix())
def test_site_examples_run_as_pasted_and_print_what_the_page_shows(page):
    """Each page's Python blocks, pasted in order into one file, run; each prints exactly
    the ```text block shown after it ("..." where a value depends on the machine, as in
    doctests)."""
    pytest.importorskip("optax")
    namespace = {"__name__": "__main__"}
    checker = doctest.OutputChecker()
    examples = EXAMPLE.findall(page.read_text())
    assert len(examples) == len(docs_pages.code_blocks(page.read_text(), "python"))
    for n, (code, shown) in enumerate(examples):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(code, f"{page.name}, block {n + 1}", "exec"), namespace)
        printed = out.getvalue()
        assert checker.check_output(shown, printed, doctest.ELLIPSIS), (
            f"{page.name}, block {n + 1} printed:\n{printed}\nthe page shows:\n{shown}")
        # A reader sees a Keras warning as something done wrong (fit's `shuffle=True` on the
        # dataset KerasHub makes of the arrays was one): the examples give Keras none.
        from_keras = [f"{w.category.__name__}: {w.message}" for w in caught
                      if {"keras", "keras_hub"} & set(pathlib.PurePath(w.filename).parts)]
        assert not from_keras, f"{page.name}, block {n + 1}: {from_keras}"
    if page.name == "getting-started.md":
        assert float(namespace["parts"]["ntl"]) < 0.05


def _repl_errors(code: str) -> list[str]:
    """The syntax errors Python's interactive interpreter reports for `code` typed (or
    pasted) into it line by line: a compound statement there ends at a blank line and must
    end with one. Compiled only, nothing runs."""
    errors = []

    class Console(InteractiveConsole):
        def runcode(self, code):  # compiling is the check
            pass

        def showsyntaxerror(self, filename=None, **kwargs):
            errors.append(str(sys.exc_info()[1]))

    console = Console()
    for line in code.splitlines():
        console.push(line)
    console.push("")
    return errors


def test_repl_check_finds_a_statement_after_a_loop_without_a_blank_line():
    assert _repl_errors("for i in range(2):\n    x = i\nprint(x)\n")
    assert _repl_errors("def f():\n    x = 1\n\n    return x\n")
    assert not _repl_errors("for i in range(2):\n    x = i\n\nprint(x)\n")


@pytest.mark.parametrize("page", docs_pages.pages(), ids=lambda p: p.relative_to(docs_pages.ROOT).as_posix())
def test_examples_paste_into_the_plain_repl(page):
    """Python 3.11's plain REPL reads a pasted block line by line: each block compiles
    there as it does in a file."""
    failing = {f"block {n + 1}": errors for n, code in enumerate(docs_pages.code_blocks(page.read_text(), "python"))
               if (errors := _repl_errors(code))}
    assert failing == {}, page.name
