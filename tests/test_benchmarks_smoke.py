"""Smoke test of benchmarks/loss_overhead.py: its --quick mode prints both full tables
(the cross_entropy_and_ntl objective and optax CE + the standalone losses) and writes them
as JSON, on T5's digits and on the LLaMA-3-like table (`--vocab llama3`); the same for
benchmarks/fused_loss.py and benchmarks/train_step_gpt.py, and the LLaMA-3-like table
itself against its definition.

Times are not checked (no timing asserts); the peak-memory ratio of the reference rows is.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests import xla_flags

pytest.importorskip("optax")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "loss_overhead.py"
NTL_VARIANTS = [kind + suffix for kind in ("was", "mse", "mae", "huber", "number_level") for suffix in ("", "+rw")]
VARIANTS = ["ce", "ce (again)", "optax_ce"] + NTL_VARIANTS
STANDALONE_VARIANTS = ["optax_ce", "optax_ce (again)"] + NTL_VARIANTS
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
    assert rows["ce"][1] == "—"  # two rounds are too few for a 95% interval
    assert rows["ce"][3] == "1.000"  # peak memory / CE of CE itself
    assert rows["ce (again)"][3] == "1.000"  # the same program, compiled again
    for name, cells in rows.items():
        assert len(cells) == (7 if with_ntloss else 5), (name, cells)
        # The median ms is rounded to 0.1 ms: at these tiny shapes it can read 0.0.
        assert float(cells[0]) > 0 and float(cells[2]) >= 0 and float(cells[3]) > 0
        if with_ntloss and name not in ("optax_ce", "ce (again)"):  # no torch counterpart
            assert float(cells[5]) >= 0 and float(cells[6]) > 0, (name, cells)

    assert ("| variant | time / optax CE | 95% interval | median ms | peak mem / optax CE | peak MiB |"
            in result.stdout)
    rows = tables[STANDALONE_TITLE]
    assert list(rows) == STANDALONE_VARIANTS
    assert rows["optax_ce"][0] == "1.000" and rows["optax_ce"][3] == "1.000"
    assert rows["optax_ce (again)"][3] == "1.000"
    for name, cells in rows.items():
        assert len(cells) == 5, (name, cells)  # no torch columns
        # The median ms is rounded to 0.1 ms: at these tiny shapes it can read 0.0.
        assert float(cells[0]) > 0 and float(cells[2]) >= 0 and float(cells[3]) > 0

    written = json.loads(out.read_text())
    assert [(r["usage"], r["variant"]) for r in written["rows"]] == (
        [("objective", v) for v in VARIANTS] + [("standalone", v) for v in STANDALONE_VARIANTS])
    for row in written["rows"]:
        assert row["shape"] == "2x8x64" and row["dtype"] == "f32" and row["rounds"] == 2
        assert row["time_ratio"] > 0 and row["median_ms"] > 0 and row["peak_ratio"] > 0
        assert row["time_ratio_ci95"] is None  # two rounds
        assert row["date"] and row["jax"] and row["machine"]


def _load(name):
    import importlib.util

    sys.path.insert(0, str(SCRIPT.parent))  # loss_overhead imports its sibling vocabularies
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


@pytest.mark.parametrize("n", [6, 7, 10, 13, 29, 30, 60])
def test_median_interval_is_scipys_distribution_free_interval(n):
    stats = pytest.importorskip("scipy.stats")
    import numpy as np

    ratios = np.random.default_rng(n).lognormal(0.0, 0.1, n).tolist()
    expected = stats.quantile_test(ratios, q=float(np.median(ratios)), p=0.5).confidence_interval(0.95)
    assert _load("loss_overhead").median_interval(ratios) == [expected.low, expected.high]


def test_median_interval_needs_six_rounds_at_95_percent():
    median_interval = _load("loss_overhead").median_interval
    assert median_interval([1.0, 1.1, 0.9, 1.2, 0.8]) is None
    assert median_interval([1.0, 1.1, 0.9, 1.2, 0.8, 1.05]) == [0.8, 1.2]  # 2 x 2^-6 < 0.05


def test_floor_variants_are_the_bounds_they_claim():
    # The value-only floor has NTL-WAS's value and optax CE's gradient; the one-select
    # floor's gradient is optax CE's plus 0.3 / positions at each target's column.
    import jax
    import jax.numpy as jnp
    import numpy as np

    bench = _load("loss_overhead")
    _, number_tokens = bench.vocabulary("t5", 64)
    logits_np, targets_np = bench.make_inputs((2, 8, 64))
    logits, targets = jnp.asarray(logits_np), jnp.asarray(targets_np, jnp.int32)
    weights = jnp.asarray(bench.make_weights((2, 8, 64)))
    variants = bench.standalone_variants(number_tokens, ("was",), floors=True)
    assert list(variants)[-2:] == ["floor: was, value only", "floor: one select"]
    step = {name: jax.value_and_grad(fn) for name, fn in variants.items()}
    ce, d_ce = step["optax_ce"](logits, targets, weights)
    was, _ = step["was"](logits, targets, weights)
    floor, d_floor = step["floor: was, value only"](logits, targets, weights)
    assert float(was) > float(ce)
    np.testing.assert_allclose(float(floor), float(was), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(d_floor), np.asarray(d_ce))
    _, d_select = step["floor: one select"](logits, targets, weights)
    expected = np.asarray(d_ce).copy()
    b, t = np.indices(targets_np.shape)
    expected[b, t, targets_np] += bench.NTL_WEIGHT / targets_np.size
    np.testing.assert_allclose(np.asarray(d_select), expected, rtol=1e-6, atol=1e-9)


def test_bad_shape_is_rejected():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--shapes", "8x64"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "expected shapes like 8x64x32128" in result.stderr


def test_llama3_vocabulary_too_small_or_unknown_kind_is_rejected():
    for extra, message in ((["--vocab", "llama3", "--shapes", "2x8x2000"], "expected a vocabulary of at least 4096"),
                           (["--kinds", "was,wass"], "expected kinds from was, mse")):
        result = subprocess.run([sys.executable, str(SCRIPT), *extra], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr


def test_llama3_table_holds_every_piece_of_one_to_three_digits():
    """1,110 number tokens: 0-999 once, 0-9 three times ("7", "07", "007") and 10-99 twice
    ("42", "042"); digits at LLaMA-3's ids 15-24, "." at 13, the rest scattered."""
    vocabularies = _load("vocabularies")
    pieces = vocabularies.llama3_pieces()
    nt = vocabularies.llama3_number_tokens()
    assert len(pieces) == nt.vocab_size == 128_256
    expected = {p: float(p) for p in [str(n) for n in range(1000)] + [f"{n:02d}" for n in range(10)]
                + [f"{n:03d}" for n in range(100)]}
    found = {pieces[i]: float(v) for i, v in zip(nt.ids.tolist(), nt.number_values.tolist())}
    assert found == expected and len(nt.ids) == 1110
    counts = {}
    for value in found.values():
        counts[value] = counts.get(value, 0) + 1
    assert counts == {float(v): 3 if v < 10 else 2 if v < 100 else 1 for v in range(1000)}
    assert [pieces[i] for i in range(15, 25)] == [str(d) for d in range(10)] and nt.dot_id == 13
    gaps = [b - a for a, b in zip(nt.ids.tolist(), nt.ids.tolist()[1:])]
    assert max(gaps) > 100 and gaps.count(1) < 20  # spread out, not a block
    assert all(p.startswith("<|") for p in pieces[-256:])
    assert vocabularies.llama3_pieces() == pieces  # seeded: the same table every run


def test_quick_run_with_the_llama3_table(tmp_path):
    out = tmp_path / "overhead.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--vocab", "llama3", "--kinds", "was,mse", "--dtypes", "f32",
         "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "1,110 number tokens (0-999, 00-09, 000-099; digit_level=False) at scattered ids among 128,256" \
        in result.stdout
    assert "torch + ntloss comparison: skipped (--vocab llama3)" in result.stdout
    tables = _tables(result.stdout)
    objective, standalone = "### logits [2, 8, 128256] f32 (2 rounds)", \
        "### optax CE + standalone loss: logits [2, 8, 128256] f32 (2 rounds)"
    assert list(tables) == [objective, standalone]
    assert list(tables[objective]) == ["ce", "ce (again)", "optax_ce", "was", "was+rw", "mse", "mse+rw"]
    assert list(tables[standalone]) == ["optax_ce", "optax_ce (again)", "was", "was+rw", "mse", "mse+rw"]
    written = json.loads(out.read_text())
    assert written["vocab"] == "llama3" and "--vocab llama3" in written["command"]
    for row in written["rows"]:
        assert row["shape"] == "2x8x128256" and row["vocab"] == "llama3" and row["time_ratio"] > 0
        q1, q3 = row["time_ratio_quartiles"]
        assert q1 <= q3
        # The N columns' gradient and [B, L, N] temporaries: a few percent over the
        # reference's logits and their gradient, never a second [B, L, V] buffer.
        assert 0.999 < row["peak_ratio"] < 1.1, row


def test_every_formulation_beside_the_hbm_floor(tmp_path):
    """`--formulations all --hbm-floor --calls 2`: each NTL variant once per formulation of
    the number statistics, named by it, and every row's time over the floor pass."""
    from ntl_jax._core.number_stats import FORMULATIONS

    out = tmp_path / "formulations.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--kinds", "was", "--dtypes", "bf16", "--repeats", "2",
         "--formulations", "all", "--hbm-floor", "--calls", "2", "--no-ntloss", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "each timed sample: 2 steps queued, then a wait for the last" in result.stdout
    ntl = [f"{variant} [{formulation}]" for variant in ("was", "was+rw") for formulation in FORMULATIONS]
    tables = _tables(result.stdout)
    objective = tables["### logits [2, 8, 64] bf16 (2 rounds)"]
    assert list(objective) == ["ce", "ce (again)", "optax_ce"] + ntl
    assert list(tables["### optax CE + standalone loss: logits [2, 8, 64] bf16 (2 rounds)"]) == (
        ["optax_ce", "optax_ce (again)"] + ntl)
    assert "| peak MiB | time / HBM floor |" in result.stdout
    written = json.loads(out.read_text())
    assert written["calls"] == 2 and written["formulations"] == "all"
    assert [row["variant"] for row in written["rows"]] == list(objective) + ["optax_ce", "optax_ce (again)"] + ntl
    for row in written["rows"]:
        assert row["hbm_floor_ratio"] > 0 and row["hbm_floor_ms"] > 0 and row["rounds"] == 2


def test_each_variant_is_traced_in_its_own_formulation():
    """A variant built for a formulation traces in it: one program per formulation, none
    of them the backend's choice (`platform_dependent`), which the default variant keeps."""
    import jax
    import jax.numpy as jnp

    from ntl_jax._core.number_stats import FORMULATIONS

    bench = _load("loss_overhead")
    _, number_tokens = bench.vocabulary("t5", 64)
    logits_np, targets_np = bench.make_inputs((2, 8, 64))
    logits, targets = jnp.asarray(logits_np), jnp.asarray(targets_np, jnp.int32)
    weights = jnp.asarray(bench.make_weights((2, 8, 64)))

    def traced(variants, name, args):
        return str(jax.make_jaxpr(jax.value_and_grad(variants[name]))(*args))

    for usage, args in (("objective", (logits, targets)), ("standalone", (logits, targets, weights))):
        def made(formulation, usage=usage):
            if usage == "objective":
                return bench.jax_variants(number_tokens, ("was",), formulation)
            return bench.standalone_variants(number_tokens, ("was",), formulation=formulation)

        programs = {formulation: traced(made(formulation), "was+rw", args) for formulation in FORMULATIONS}
        assert len(set(programs.values())) == len(FORMULATIONS), usage
        assert not any("platform_index" in program for program in programs.values()), usage
        assert "platform_index" in traced(made("auto"), "was+rw", args), usage


def test_bad_formulations_or_calls_are_rejected():
    for extra, message in ((["--formulations", "columns,colums"], "expected --formulations backend, all or names"),
                           (["--calls", "0"], "expected --calls >= 1, got 0")):
        result = subprocess.run([sys.executable, str(SCRIPT), *extra], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr


def test_train_step_benchmark_times_each_loss(tmp_path):
    """benchmarks/train_step_gpt.py at one layer and 64 tokens: a row per loss (and the
    reference again), written to JSON; a bad size is refused."""
    out = tmp_path / "step.json"
    script = SCRIPT.parent / "train_step_gpt.py"
    result = subprocess.run(
        [sys.executable, str(script), "--layers", "1", "--batch", "1", "--length", "64", "--rounds", "2",
         "--steps", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    variants = ["optax CE", "optax CE (again)", "optax CE + 0.3 ntl_was", "cross_entropy_and_ntl"]
    assert "| loss | ms / step | time / optax CE | 95% interval |" in result.stdout
    written = json.loads(out.read_text())
    assert [row["variant"] for row in written["rows"]] == variants
    assert written["layers"] == 1 and written["length"] == 64 and written["rounds"] == 2
    assert written["rows"][0]["time_ratio"] == 1.0
    assert all(row["median_ms"] > 0 and row["time_ratio"] > 0 for row in written["rows"])
    refused = subprocess.run([sys.executable, str(script), "--length", "0"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "expected --length >= 1, got 0" in refused.stderr


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
    assert variants == {"optax CE", "unfused", "fused", "fused CE", "fused c=1000", "token chunks 512"}
    assert all(r["median_seconds"] > 0 for r in rows)
    for row in rows:  # the logits appear in the unfused HLO; in the fused one, never at chunks below V
        if row["variant"] in ("optax CE", "unfused", "fused c=1000"):
            assert (row["logits_shaped_arrays"] > 0) == (row["variant"] != "fused c=1000"), row
    by_variant = {(r["dtype"], r["variant"]): r for r in rows}
    for dtype in ("float32", "bfloat16"):
        # One chunk would be the whole vocabulary here; 1000 columns are a quarter of it.
        assert by_variant[(dtype, "fused c=1000")]["temp_bytes"] < by_variant[(dtype, "unfused")]["temp_bytes"] / 2


def test_fused_loss_benchmark_with_the_llama3_table(tmp_path):
    """`fused_loss.py --vocab llama3` at a small shape (two default chunks): the fused head,
    with and without NTL, forms no `[B, L, V]` array, and at 2,048 columns a chunk it needs
    a fraction of the unfused temporaries."""
    out = tmp_path / "fused.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "fused_loss.py"), "--vocab", "llama3", "--shapes", "1x128x128256",
         "--d-model", "32", "--rounds", "1", "--dtypes", "float32", "--chunk-sizes", "2048", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    assert written["vocab"] == "llama3" and "--vocab llama3" in written["command"]
    rows = {r["variant"]: r for r in written["rows"]}
    assert set(rows) == {"optax CE", "unfused", "fused", "fused CE", "fused c=2048"}
    logits_bytes = 128 * 128_256 * 4
    for name, row in rows.items():
        assert row["median_seconds"] > 0 and row["time_vs_fused_ce"] > 0
        if name.startswith("fused"):
            assert row["logits_shaped_arrays"] == 0, row
        else:
            assert row["logits_shaped_arrays"] > 0 and row["temp_bytes"] >= logits_bytes, row
    assert rows["fused c=2048"]["temp_bytes"] < logits_bytes / 4, rows["fused c=2048"]


def test_fused_loss_benchmark_sharded_reports_gathers_and_memory(tmp_path):
    """`benchmarks/fused_loss.py --sharded` at a small shape: a row per layout and vocabulary
    shard count, and the vocabulary-parallel rows gather nothing (that XLA's own
    partitioning gathers the kernel at scale is tests/test_vocab_parallel.py's)."""
    import json

    out = tmp_path / "sharded.json"
    env = dict(os.environ, XLA_FLAGS=xla_flags.with_fast_compile())
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


def test_train_step_benchmark_times_a_noise_row_and_intervals():
    script = SCRIPT.parent / "train_step.py"
    result = subprocess.run(
        [sys.executable, str(script), "--preset", "micro", "--losses", "ce", "ntl-was",
         "--rounds", "6", "--steps", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = {line[:24].strip(): line for line in result.stdout.splitlines() if "ms/step" in line}
    assert list(rows) == ["ce", "ce (again)", "ntl-was"]
    assert "ratio to ce: 1.000x  95% interval 1.000-1.000" in rows["ce"]
    for line in rows.values():  # six rounds are enough for a 95% interval
        low, high = (float(x) for x in line.split("95% interval ")[1].split("-"))
        assert 0 < low <= high
