"""Smoke test of benchmarks/loss_overhead.py: its --quick mode prints both full tables
(the cross_entropy_and_ntl objective and optax CE + the standalone losses) and writes them
as JSON.

Times are not checked (no timing asserts); the peak-memory ratio of the reference rows is.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("optax")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "loss_overhead.py"
NTL_VARIANTS = [kind + suffix for kind in ("was", "mse", "mae", "huber", "number_level") for suffix in ("", "+rw")]
VARIANTS = ["ce", "optax_ce"] + NTL_VARIANTS
STANDALONE_VARIANTS = ["optax_ce"] + NTL_VARIANTS
OBJECTIVE_TITLE = "### logits [2, 8, 64] f32 (2 rounds)"
STANDALONE_TITLE = "### optax CE + standalone loss: logits [2, 8, 64] f32 (2 rounds)"


def _tables(text: str) -> dict[str, dict[str, list[str]]]:
    """Table title ("### ...") -> {variant: the row's other cells}; header rows left out."""
    tables: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("### "):
            rows = tables.setdefault(line, {})
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] != "variant":
            rows[cells[0]] = cells[1:]
    return tables


def _has_ntloss() -> bool:
    try:
        import ntloss  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_quick_run_prints_a_row_per_variant(tmp_path):
    # With ntloss installed the torch comparison runs too (tiny shapes, still quick).
    with_ntloss = _has_ntloss()
    out = tmp_path / "overhead.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--dtypes", "f32", "--repeats", "2", "--out", str(out)]
        + ([] if with_ntloss else ["--no-ntloss"]),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    tables = _tables(result.stdout)
    assert list(tables) == [OBJECTIVE_TITLE, STANDALONE_TITLE]

    rows = tables[OBJECTIVE_TITLE]
    assert list(rows) == VARIANTS
    assert rows["ce"][0] == "1.000"  # time / CE of CE itself
    assert rows["ce"][2] == "1.000"  # peak memory / CE of CE itself
    for name, cells in rows.items():
        assert len(cells) == (6 if with_ntloss else 4), (name, cells)
        assert float(cells[0]) > 0 and float(cells[1]) > 0 and float(cells[2]) > 0
        if with_ntloss and name != "optax_ce":  # optax has no torch counterpart
            assert float(cells[4]) > 0 and float(cells[5]) > 0, (name, cells)

    assert "| variant | time / optax CE | median ms | peak mem / optax CE | peak MiB |" in result.stdout
    rows = tables[STANDALONE_TITLE]
    assert list(rows) == STANDALONE_VARIANTS
    assert rows["optax_ce"][0] == "1.000" and rows["optax_ce"][2] == "1.000"
    for name, cells in rows.items():
        assert len(cells) == 4, (name, cells)  # no torch columns
        assert float(cells[0]) > 0 and float(cells[1]) > 0 and float(cells[2]) > 0

    written = json.loads(out.read_text())
    assert [(r["usage"], r["variant"]) for r in written["rows"]] == (
        [("objective", v) for v in VARIANTS] + [("standalone", v) for v in STANDALONE_VARIANTS])
    for row in written["rows"]:
        assert row["shape"] == "2x8x64" and row["dtype"] == "f32" and row["rounds"] == 2
        assert row["time_ratio"] > 0 and row["median_ms"] > 0 and row["peak_ratio"] > 0
        assert row["date"] and row["jax"] and row["machine"]


def test_bad_shape_is_rejected():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--shapes", "8x64"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "expected shapes like 8x64x32128" in result.stderr


def test_fused_loss_benchmark_runs_and_reports_less_memory(tmp_path):
    """benchmarks/fused_loss.py at small shapes: every variant timed, and the fused
    function's compiled temporaries at a chunk of a quarter of the vocabulary are under half
    the unfused path's."""
    import json

    out = tmp_path / "fused.json"
    script = SCRIPT.parent / "fused_loss.py"
    result = subprocess.run(
        [sys.executable, str(script), "--shapes", "2x512x4096", "--d-model", "32", "--rounds", "1",
         "--chunk-sizes", "1000", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    variants = {r["variant"] for r in rows}
    assert variants == {"optax CE", "unfused", "fused", "fused c=1000", "token chunks 512"}
    assert all(r["median_seconds"] > 0 for r in rows)
    by_variant = {(r["dtype"], r["variant"]): r for r in rows}
    for dtype in ("float32", "bfloat16"):
        # One chunk would be the whole vocabulary here; 1000 columns are a quarter of it.
        assert by_variant[(dtype, "fused c=1000")]["temp_bytes"] < by_variant[(dtype, "unfused")]["temp_bytes"] / 2


def test_fused_loss_benchmark_sharded_reports_gathers_and_memory(tmp_path):
    """`benchmarks/fused_loss.py --sharded` at a small shape: a row per layout and vocabulary
    shard count, and the vocabulary-parallel rows gather nothing (that XLA's own
    partitioning gathers the kernel at scale is tests/test_vocab_parallel.py's)."""
    import json

    out = tmp_path / "sharded.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "fused_loss.py"), "--sharded", "--shapes", "8x64x4096",
         "--d-model", "32", "--dtypes", "float32", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    layouts = [(r["layout"], r["vocab_shards"]) for r in rows]
    assert layouts == [("one device", 1)] + [(layout, n) for n in (1, 2, 4, 8)
                                             for layout in ("XLA partitioner", "vocab-parallel")]
    for row in rows:
        assert row["temp_bytes"] > 0, row
        if row["layout"] == "vocab-parallel":
            assert row["gathered_elements"] == 0, row
