"""The vocabulary-parallel fused head (`vocab_axis`) on 8 host CPU devices equals the
one-device function, gathers no kernel, and needs less memory per device.

`tests/vocab_parallel_check.py` runs in a subprocess (the device count is fixed when
JAX initialises) and prints one JSON line per check.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests import xla_flags
from tests.grid import long_env
from tests.objective_options import OPTIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
# float32: the sharded path sums the vocabulary's exponentials per shard, then across
# shards, and the kernel's gradient per token shard, then across them: a few hundred
# ulps of the largest value, as tests/test_fused.py allows the fused path.
RTOL = 2e-5


# The script's checks and the rows each prints. NTL_JAX_VOCAB_PARALLEL_CHECKS (names
# separated by spaces) runs only those named, and the tests reading the others skip:
# .ci/lowest_versions runs the quick ones; unset, every check runs.
CHECKS = {"equal": ("variant", "factor", "chunk"), "sequence": ("sequence", "sequence bfloat16"),
          "bfloat16": ("bfloat16", "argmax"), "context": ("context",),
          "errors": ("error",), "scale": ("scale",)}


class _Rows(dict):
    """Rows by kind; a kind whose check was not asked for skips the test reading it."""

    def __init__(self, rows, checks):
        super().__init__(rows)
        self.checks = checks

    def __missing__(self, kind):
        if any(kind in CHECKS[check] for check in self.checks):
            raise KeyError(kind)
        pytest.skip(f"check not run: NTL_JAX_VOCAB_PARALLEL_CHECKS={' '.join(self.checks)!r}")


@pytest.fixture(scope="module")
def results(request):
    checks = os.environ.get("NTL_JAX_VOCAB_PARALLEL_CHECKS", "").split() or list(CHECKS)
    unknown = set(checks) - set(CHECKS)
    assert not unknown, f"NTL_JAX_VOCAB_PARALLEL_CHECKS names no check {sorted(unknown)}; the checks: {list(CHECKS)}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = xla_flags.with_fast_compile()
    env.update(long_env(request.config.getoption("--long")))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "vocab_parallel_check.py"), *checks], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-5000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    by_check = {}
    for row in rows:
        by_check.setdefault(row.pop("check"), []).append(row)
    return _Rows(by_check, checks)


def test_every_variant_over_2_4_and_8_vocabulary_shards(results, request):
    rows = results["variant"]
    assert {row["shards"] for row in rows} == {2, 4, 8}
    # every option set over 4 shards, three over 8, and over 2 three (every one with --long)
    over_2 = len(OPTIONS) if request.config.getoption("--long") else 3
    assert len(rows) == len(OPTIONS) + 3 + over_2
    # Over 4 shards every option set, a loss a user writes (`SQUARED_DISTANCE`) among them.
    assert sorted(row["name"] for row in rows if row["shards"] == 4) == sorted(OPTIONS)
    assert "squared_distance" in OPTIONS
    for row in rows:
        assert row["error"] <= RTOL, row


def test_every_loss_normalizing_factor_packed_or_not(results, request):
    rows = results["factor"]
    # each factor packed or not in turn (both with --long)
    assert len(rows) == (10 if request.config.getoption("--long") else 5)
    assert {row["name"].endswith(" packed") for row in rows} == {True, False}
    for row in rows:
        assert row["error"] <= RTOL, row


def test_default_and_wide_chunks(results):
    rows = results["chunk"]
    assert len(rows) == 6
    for row in rows:
        assert row["error"] <= RTOL, row


def test_the_sequence_split_over_the_vocabulary_axis_too(results):
    """`sequence_parallel=True`: hidden states `P("data", "model")` on 2 x 4 and 4 x 2."""
    rows = results["sequence"]
    assert {(row["shards"], row["name"]) for row in rows} == {
        (shards, name) for shards in (4, 2) for name in ("was-reweigh", "number_level", "smoothing-z", "was_cdf-gce")}
    for row in rows:
        assert row["error"] <= RTOL, row
        # The gradient comes back split as the hidden states came in ...
        assert row["d_hidden_spec"] == ["data", "model"], row
        # ... and what is gathered with a d_model axis is the hidden states, [batch / data, length, 16].
        assert row["gathered_with_d_model"] == [[row["shards"], 12, 16]], row  # batch 8 / data (8 / shards)
    (row,) = results["sequence bfloat16"]
    assert row["error"] <= RTOL, row
    assert row["grad_error"] <= 2**-7, row
    assert row["dtypes"] == ["bfloat16", "bfloat16"]


def test_bfloat16_and_the_argmax_across_shards(results):
    (row,) = results["bfloat16"]
    # bf16 inputs, float32 accumulation on both sides: the loss agrees to float32
    # rounding; the gradients come back in bf16 (a bf16 ulp is 2**-8 relative).
    assert row["error"] <= RTOL, row
    assert row["grad_error"] <= 2**-7, row
    assert row["dtypes"] == ["bfloat16", "bfloat16"]
    (row,) = results["argmax"]
    assert row["equal"], "the sharded argmax (ties across shards included) differs from jnp.argmax"


def test_the_mesh_in_context(results):
    rows = {row["name"]: row for row in results["context"]}
    assert set(rows) == {"with mesh", "jax.set_mesh"}
    for row in rows.values():
        assert row["error"] <= RTOL, row


def test_bad_layouts_are_named(results):
    rows = {row["name"]: row["message"] for row in results["error"]}
    assert "divisible by the 4 shards of mesh axis 'model', got 130" in rows["indivisible"]
    assert "pad the kernel's columns to a multiple of 4" in rows["indivisible"]
    assert "axis of the mesh ('data', 'model'), got 'vocab'" in rows["unknown axis"]
    assert "needs a device mesh" in rows["no mesh"]
    assert "expected vocab_axis" in rows["mesh without axis"]
    assert "batch divisible by the 2 shards of mesh axes ('data',)" in rows["indivisible batch"]
    assert "sequence length divisible by the 8 shards of mesh axis 'model'" in rows["indivisible sequence"]
    assert "got 12" in rows["indivisible sequence"]
    assert "with sequence_parallel=True, got None" in rows["sequence without axis"]
    assert "expected sequence_parallel True or False, got 'yes'" in rows["sequence not a bool"]


def test_no_kernel_is_gathered_and_per_device_memory_halves(results):
    """hidden [8, 1024, 512] bf16 on `data`, kernel [512, 128256] bf16 on `model`, 2 x 4."""
    (row,) = results["scale"]
    # Left to XLA, the sharded function gathers the whole kernel (so the count can fail) ...
    assert row["automatic"]["gathered_with_d_model"] >= 512 * 128256, row
    # ... vocabulary-parallel, nothing is gathered.
    assert row["vocab_parallel"]["gathered_elements"] == 0, row
    assert row["vocab_parallel"]["temp_bytes"] <= 0.5 * row["one_device"]["temp_bytes"], row
