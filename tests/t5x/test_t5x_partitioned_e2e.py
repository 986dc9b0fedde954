"""End to end, partitioned: one training step of the NTL model through `t5x.train` on
8 host CPU devices (a 2 x 4 data x model mesh) gives the single-device step's metrics.

A tiny byte-level T5 whose sharded dimensions (heads, joined kv, mlp, vocab) divide by
the model axis, packed batches and `AVERAGE_PER_SEQUENCE`, so the loss's sums over
sequences and over the vocabulary cross device boundaries. Skipped without t5x.
"""

import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.tasks")
pytest.importorskip("tensorflow")

from tests.t5x.test_t5x_train_e2e import _scalars  # noqa: E402

TASK = "ntl_math_arithmetic__add_sub_multiple_byte"
CONFIG = """
from __gin__ import dynamic_registration
import __main__ as train_script
from t5x import partitioning
from t5x.examples.t5 import network

include 't5x_configs/experiments/scratch/tiny_byte_arithmetic.gin'
include 't5x_configs/runs/local.gin'

TRAIN_STEPS = 1
EVAL_PERIOD = 1
LOSS_NORMALIZING_FACTOR = 'AVERAGE_PER_SEQUENCE'
train_script.train.infer_eval_dataset_cfg = None  # no decoding: only the loss is compared
network.T5Config:
  num_heads = 8
  head_dim = 4
  emb_dim = 32
  mlp_dim = 32
partitioning.PjitPartitioner.num_partitions = {partitions}
"""
COMPARED = ["loss", "cross_ent_loss", "z_loss", "ntl_loss", "ntl_loss_per_number_token", "number_abs_error",
            "number_token_mass", "accuracy", "loss_per_nonpadding_target_token"]


def _train_one_step(tmp_path, name, devices, partitions):
    folder = tmp_path / name
    folder.mkdir()
    gin_file = folder / "run.gin"
    gin_file.write_text(CONFIG.format(partitions=partitions))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("NTL_JAX_MATH_DIR", None)  # generate the data on the fly
    env.pop("XLA_FLAGS", None)
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    command = [sys.executable, "-m", "ntl_jax.t5x.train", f"--gin_file={gin_file}",
               f'--gin.MODEL_DIR="{folder / "run"}"']
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    return folder / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("t5x_partitioned")
    return _train_one_step(tmp_path, "single", 1, 1), _train_one_step(tmp_path, "sharded", 8, 4)


def test_the_model_is_partitioned(runs):
    _, sharded = runs
    info = (sharded / "model-info.txt").read_text()
    for variable in ("decoder/logits_dense/kernel", "encoder/layers_0/mlp/wi_0/kernel",
                     "encoder/layers_0/attention/query/kernel"):
        (line,) = [x for x in info.splitlines() if f"Variable {variable} " in x]
        assert "'model'" in line, line


def test_step_one_metrics_equal_the_single_device_run(runs):
    single, sharded = (_scalars(run / "train") for run in runs)
    assert single["loss"].keys() == sharded["loss"].keys() == {1}
    assert single["ntl_loss"][1] > 0
    for tag in COMPARED:
        a, b = single[tag][1], sharded[tag][1]
        assert math.isfinite(a), tag
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), (tag, a, b)
    # Loss = CE + z-loss + 0.3 * NTL on both.
    total = sharded["cross_ent_loss"][1] + sharded["z_loss"][1] + 0.3 * sharded["ntl_loss"][1]
    assert math.isclose(sharded["loss"][1], total, rel_tol=1e-5)


def test_evaluation_after_the_step_equals_the_single_device_run(runs):
    # The parameters after one (sharded) Adafactor update give the same evaluation loss.
    single, sharded = (_scalars(run / "training_eval" / TASK) for run in runs)
    for tag in ("loss", "ntl_loss", "cross_ent_loss"):
        assert math.isclose(single[tag][1], sharded[tag][1], rel_tol=1e-5), (tag, single[tag], sharded[tag])
