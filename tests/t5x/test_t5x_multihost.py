"""A pod on one machine: T5X with the NTL model on 2 hosts of 4 CPU devices each
(`python -m ntl_jax.t5x.local_pod`, data 2 x model 4, each host a data row) against one
process of 8 devices.

Unpacked and unshuffled, the one-process run's batch is the task's first 32 examples;
each host of the pod reads its own shard of the task (host i the examples i, i + 2, ...),
so the pod's global batch holds the same 32 only if the hosts read different shards (the
same shard on both would repeat 16 examples, and the loss would differ). Step 1's loss
and NTL metrics equal the one-process run's, unfused and fused (vocabulary-parallel
across the model axis); the checkpoint both hosts wrote restores into a second pod run
that trains step 2 as the one-process run does from its own checkpoint; and the pod
evaluates that checkpoint with `runs/ntl_eval.gin` as one process does. Skipped without
t5x; the runs take a few minutes.
"""

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.seqio.tasks")
pytest.importorskip("tensorflow")

from tests.t5x.test_t5x_partitioned_e2e import COMPARED  # noqa: E402
from tests.t5x.test_t5x_train_e2e import _scalars  # noqa: E402

TASK = "ntl_math_arithmetic__add_sub_multiple_byte"
# The network and its layout: the same for training and for evaluating its checkpoint.
NETWORK = """network.T5Config:
  num_heads = 8
  head_dim = 4
  emb_dim = 32
  mlp_dim = 32
partitioning.PjitPartitioner.num_partitions = 4
"""
CONFIG = """
from __gin__ import dynamic_registration
import __main__ as train_script
from t5x import partitioning
from t5x import utils
from t5x.examples.t5 import network
from ntl_jax.t5x import models as ntl_models

include 't5x_configs/experiments/scratch/tiny_byte_arithmetic.gin'
include 't5x_configs/runs/local.gin'

EVAL_PERIOD = 1
LOSS_NORMALIZING_FACTOR = 'AVERAGE_PER_SEQUENCE'
NTL_FUSED_LOSS = {fused}
ntl_models.NTLEncoderDecoderModel.fused_chunk_size = 64
train_script.train.infer_eval_dataset_cfg = None  # no decoding: only the loss is compared
train/utils.DatasetConfig.pack = False
train/utils.DatasetConfig.shuffle = False
""" + NETWORK


def _env(devices=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("NTL_JAX_MATH_DIR", None)  # generate the data on the fly
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _run(folder, program, flags, *, pod):
    """`program` (train or eval) as one process of 8 devices, or as a pod of 2 x 4."""
    if pod:
        command = [sys.executable, "-m", "ntl_jax.t5x.local_pod", "--processes=2", "--devices_per_process=4",
                   f"--log_dir={folder / 'logs'}", "--timeout=800", "--", program, *flags]
        env = _env()
    else:
        command = [sys.executable, "-m", f"ntl_jax.t5x.{program}", *flags]
        env = _env(8)
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    return result


def _train(folder, steps, *, pod, fused=False):
    folder.mkdir(exist_ok=True)
    gin_file = folder / "run.gin"
    gin_file.write_text(CONFIG.format(fused=fused))
    _run(folder, "train", [f"--gin_file={gin_file}", f'--gin.MODEL_DIR="{folder / "run"}"',
                           f"--gin.TRAIN_STEPS={steps}"], pod=pod)
    return folder / "run"


EVAL_CONFIG = """
from __gin__ import dynamic_registration
from t5x import partitioning
from t5x.examples.t5 import network

include 't5x_configs/models/t5_1_1_tiny_byte_ntl.gin'
include 't5x_configs/runs/ntl_eval.gin'

MIXTURE_OR_TASK_NAME = '{task}'
CHECKPOINT_PATH = '{checkpoint}'
EVAL_OUTPUT_DIR = '{out}'
BATCH_SIZE = 8
EVALUATOR_NUM_EXAMPLES = 16
""" + NETWORK


def _evaluate(folder, checkpoint, *, pod):
    """The task's metrics on 16 `test_interpolate` examples, decoded with `checkpoint`."""
    out = folder / "eval"
    gin_file = folder / "eval.gin"
    gin_file.write_text(EVAL_CONFIG.format(task=TASK, checkpoint=checkpoint, out=out))
    _run(folder, "eval", [f"--gin_file={gin_file}"], pod=pod)
    (record,) = [json.loads(x) for x in (out / "inference_eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()]
    return record


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5x_multihost")
    out = {}
    for name, pod in (("one_process", False), ("pod", True)):
        run = _train(root / name, 1, pod=pod)
        out[name, "step_1"] = _scalars(run / "train")
        _train(root / name, 2, pod=pod)  # restores checkpoint_1 from the same MODEL_DIR
        out[name, "steps"] = sorted(p.name for p in run.glob("checkpoint_*"))
        out[name, "train"] = _scalars(run / "train")
        out[name, "eval"] = _evaluate(root / name, run / "checkpoint_2", pod=pod)
    return out


def _assert_close(a, b, step, tags=COMPARED):
    for tag in tags:
        x, y = a[tag][step], b[tag][step]
        assert math.isfinite(x), tag
        assert math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-7), (tag, step, x, y)


def test_step_one_on_the_pod_equals_one_process(runs):
    one, pod = runs["one_process", "step_1"], runs["pod", "step_1"]
    assert one["loss"].keys() == pod["loss"].keys() == {1}
    assert pod["ntl"][1] > 0
    _assert_close(one, pod, 1)


def test_the_pods_checkpoint_restores_and_training_goes_on(runs):
    # The second run restored checkpoint_1 (the latest in MODEL_DIR) and wrote checkpoint_2.
    assert runs["pod", "steps"] == runs["one_process", "steps"] and runs["pod", "steps"][-2:] == [
        "checkpoint_1", "checkpoint_2"]
    one, pod = runs["one_process", "train"], runs["pod", "train"]
    assert pod["loss"].keys() == {1, 2}
    assert pod["loss"][2] != pod["loss"][1]
    _assert_close(one, pod, 2)


def test_the_pod_evaluates_the_checkpoint_as_one_process_does(runs):
    one, pod = runs["one_process", "eval"], runs["pod", "eval"]
    assert one["step"] == pod["step"] == 2 and one["num_examples"] == pod["num_examples"] == 16
    for key in ("number_accuracy", "mae", "exact_match", "fraction_unparseable"):
        assert key in one, sorted(one)
    assert one.keys() == pod.keys()
    for key, value in one.items():
        if isinstance(value, float) and math.isfinite(value):
            assert math.isclose(value, pod[key], rel_tol=1e-5, abs_tol=1e-7), (key, value, pod[key])


def test_fused_vocabulary_parallel_step_one_on_the_pod_equals_one_process(tmp_path):
    one = _scalars(_train(tmp_path / "one_process", 1, pod=False, fused=True) / "train")
    pod = _scalars(_train(tmp_path / "pod", 1, pod=True, fused=True) / "train")
    assert pod["ntl"][1] > 0
    _assert_close(one, pod, 1)


def test_a_failing_host_stops_the_pod_and_its_log_is_shown(tmp_path):
    command = [sys.executable, "-m", "ntl_jax.t5x.local_pod", "--processes=2", "--devices_per_process=1",
               f"--log_dir={tmp_path / 'logs'}", "--timeout=300", "--", "train", "--gin_file=does_not_exist.gin"]
    result = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    assert result.returncode not in (0, 124), result.stderr[-3000:]
    assert "local pod stopped with exit status" in result.stderr
    assert "the end of host 1's log" in result.stderr and "does_not_exist.gin" in result.stderr


def test_the_launcher_asks_for_the_program_after_the_separator():
    result = subprocess.run([sys.executable, "-m", "ntl_jax.t5x.local_pod", "--processes=2", "train"],
                            env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "expected `-- train|eval <T5X flags>`" in result.stderr
