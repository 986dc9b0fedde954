"""The linter configuration in pyproject.toml (line length, import order, pyflakes) holds."""

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("ruff", reason="ruff is in the test extra")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks", "scripts", "setup.py"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
