"""The linter configuration in pyproject.toml (line length, import order, pyflakes) holds, and public
docstrings stay short."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    pytest.importorskip("ruff", reason="ruff is in the test extra")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks", "scripts", "setup.py"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


MAX_DOCSTRING_LINES = 25


def _public_docstring_lengths(body, prefix=""):
    """`(qualified name, docstring lines)` of the public functions and classes in `body`, methods of
    public classes included."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield prefix + node.name, len(docstring.splitlines())
            if isinstance(node, ast.ClassDef):
                yield from _public_docstring_lengths(node.body, f"{prefix}{node.name}.")


def test_public_docstrings_are_short():
    """A longer explanation belongs on the matching docs page, named in the docstring."""
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}: {name} ({lines} lines)"
        for path in sorted((ROOT / "src" / "ntl_jax").rglob("*.py"))
        for name, lines in _public_docstring_lengths(ast.parse(path.read_text(encoding="utf-8")).body)
        if lines > MAX_DOCSTRING_LINES
    ]
    assert not offenders, f"docstrings over {MAX_DOCSTRING_LINES} lines:\n" + "\n".join(offenders)
