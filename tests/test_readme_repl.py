"""The README's Python examples paste into an interactive interpreter line by line."""

import code
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```python\n(.*?)```", text, re.S)]


def pasted_lines(block: list[str]) -> list[str]:
    """What a reader pastes: the code without its `>>> `/`... ` prompts, blank lines kept,
    the expected output left out."""
    lines = []
    for line in block:
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


def test_readme_python_blocks_paste_into_the_repl():
    pytest.importorskip("optax")
    blocks = python_blocks(README.read_text())
    assert blocks
    console = Console()
    for block in blocks:
        for n, line in enumerate(pasted_lines(block)):
            more = console.push(line)
            assert not console.errors, f"line {n + 1} of a README block, {line!r}:\n" + "".join(console.errors)
        # every block ends on a complete statement: nothing left waiting for more input
        assert not more, f"README block ends inside a statement: {block[-3:]}"
    assert float(console.locals["parts"]["ntl"]) < 0.05
