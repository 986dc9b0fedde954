"""End to end on CPU: the offline byte-level tiny config trains with t5x.train.

Runs `python -m ntl_jax.t5x.train` (the launcher) on the shipped experiment file plus
runs/local.gin, with the mathematics generator producing the data on the fly.
Skipped without t5x.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.seqio.tasks")
tf = pytest.importorskip("tensorflow")

TASK = "ntl_math_arithmetic__add_sub_multiple_byte"
EXPERIMENT = "t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin"
STEPS, PERIOD = 8, 4


def _scalars(folder: pathlib.Path) -> dict:
    """{tag: {step: value}} from the TensorBoard event files T5X writes."""
    out: dict = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.HasField("tensor"):
                    number = tf.make_ndarray(value.tensor)
                    if number.ndim == 0 and number.dtype.kind == "f":
                        out.setdefault(value.tag, {})[event.step] = float(number)
                elif value.HasField("simple_value"):
                    out.setdefault(value.tag, {})[event.step] = float(value.simple_value)
    return out


def _launch(module, cwd, *flags):
    """Runs a launcher from `cwd` (not the checkout: gin files come via its search path)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("NTL_JAX_MATH_DIR", None)  # generate the data on the fly
    command = [sys.executable, "-m", module, *flags]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("t5x_run")
    _launch(
        "ntl_jax.t5x.train", model_dir,
        f"--gin_file={EXPERIMENT}",
        "--gin_file=t5x_configs/runs/local.gin",
        f'--gin.MODEL_DIR="{model_dir}"',
        f"--gin.TRAIN_STEPS={STEPS}",
        "--gin.NTL_FUSED_LOSS=False",  # the logits path here; the fine-tuning run below is fused
        f"--gin.EVAL_PERIOD={PERIOD}",
    )
    return model_dir


@pytest.fixture(scope="module")
def finetune_dir(run_dir, tmp_path_factory):
    """Fine-tunes that checkpoint as runs/ntl_finetune.gin does the public ones: a task
    copy on the model's vocabulary, packed batches, AVERAGE_PER_SEQUENCE; with the
    fused loss (the network without its logits projection)."""
    model_dir = tmp_path_factory.mktemp("t5x_finetune")
    _launch(
        "ntl_jax.t5x.train", model_dir,
        "--gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin",
        "--gin_file=t5x_configs/runs/ntl_finetune.gin",
        "--gin_file=t5x_configs/runs/local.gin",
        "--gin.MIXTURE_OR_TASK_NAME=@task_variants.with_vocabulary()",
        "--gin.task_variants.with_vocabulary.name='ntl_math_arithmetic_ablation_byte'",
        "--gin.LOSS_NORMALIZING_FACTOR='AVERAGE_PER_SEQUENCE'",
        "--gin.NTL_FUSED_LOSS=True",
        f'--gin.INITIAL_CHECKPOINT_PATH="{run_dir / f"checkpoint_{STEPS}"}"',
        f'--gin.MODEL_DIR="{model_dir}"',
        f"--gin.TRAIN_STEPS={STEPS + PERIOD}",
        f"--gin.EVAL_PERIOD={PERIOD}",
    )
    return model_dir


def test_training_writes_checkpoints(run_dir):
    assert (run_dir / f"checkpoint_{STEPS}").is_dir()
    assert (run_dir / f"checkpoint_{PERIOD}").is_dir()
    config = (run_dir / "config.gin").read_text()
    assert "NTLEncoderDecoderModel" in config


def test_loss_is_finite_and_falls_with_ntl_metrics_logged(run_dir):
    # The same validation batches at every evaluation, so the losses are comparable.
    scalars = _scalars(run_dir / "training_eval" / TASK)
    loss = scalars["loss"]
    assert sorted(loss) == [PERIOD, STEPS]
    assert all(math.isfinite(v) for v in loss.values())
    assert loss[STEPS] < loss[PERIOD]
    for tag in ("ntl", "ntl_term", "cross_ent_loss", "number_abs_error", "number_token_mass"):
        assert all(math.isfinite(v) for v in scalars[tag].values()), tag
    # Loss = CE + z-loss + the NTL term on every evaluation.
    for step in loss:
        total = scalars["cross_ent_loss"][step] + scalars["z_loss"][step] + scalars["ntl_term"][step]
        assert math.isclose(loss[step], total, rel_tol=1e-4)
        assert scalars["ntl"][step] > 0 and scalars["ntl_term"][step] > 0
    train = _scalars(run_dir / "train")
    assert all(math.isfinite(v) for v in train["loss"].values()) and train["ntl"] and train["ntl_term"]
    assert "ntl_loss" not in train and "ntl_loss_per_number_token" not in train


def test_inference_eval_metrics_from_the_task(run_dir):
    lines = (run_dir / "inference_eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [PERIOD, STEPS]
    for record in records:
        # The task's number metrics (ntl_jax.data.metrics) computed on decoded predictions.
        for key in ("number_accuracy", "mae", "exact_match", "fraction_unparseable"):
            assert key in record, sorted(record)
        assert 0.0 <= record["fraction_unparseable"] <= 1.0


def test_finetuning_restores_and_trains_on_the_task_copy(finetune_dir):
    assert (finetune_dir / f"checkpoint_{STEPS + PERIOD}").is_dir()
    task = "ntl_math_ablation__arithmetic__add_sub_multiple_byte_t5"
    scalars = _scalars(finetune_dir / "training_eval" / task)
    (loss,) = scalars["loss"].values()
    # AVERAGE_PER_SEQUENCE: mean over sequences of per-sequence means, so a per-token scale.
    assert math.isfinite(loss) and 0 < loss < 10
    lines = (finetune_dir / "inference_eval" / f"{task}-metrics.jsonl").read_text().splitlines()
    (record,) = [json.loads(x) for x in lines]
    assert record["step"] == STEPS + PERIOD and "number_accuracy" in record


def test_evaluation_on_a_test_split(run_dir, tmp_path):
    output = tmp_path / "eval"
    _launch(
        "ntl_jax.t5x.eval", tmp_path,
        "--gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin",
        "--gin_file=t5x_configs/runs/ntl_eval.gin",
        f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
        f'--gin.CHECKPOINT_PATH="{run_dir / f"checkpoint_{STEPS}"}"',
        f'--gin.EVAL_OUTPUT_DIR="{output}"',
        "--gin.EVALUATOR_NUM_EXAMPLES=16",
        "--gin.BATCH_SIZE=8",
    )
    (record,) = [json.loads(x) for x in (output / "inference_eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()]
    assert record["step"] == STEPS and record["num_examples"] == 16
