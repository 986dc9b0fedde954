"""End to end on CPU: the paper's baselines train, checkpoint, restore and evaluate
through `t5x.train` and `t5x.eval` with their gin files (`t5x_configs/systems/`).

The tiny byte-level experiment with `systems/rt_ntl.gin` last: the Regression
Transformer on its own vocabulary, trained with CE + 0.3 * NTL-MSE. Skipped without t5x.
"""

import json
import math

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.seqio.tasks")

from tests.t5x.test_t5x_train_e2e import _launch, _scalars  # noqa: E402

EXPERIMENT = "t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin"
BASE_TASK = "ntl_math_arithmetic__add_sub_multiple_byte"
RT_TASK = f"{BASE_TASK}_rt"
STEPS, PERIOD, MORE = 4, 2, 6


def _train(model_dir, steps, system="t5x_configs/systems/rt_ntl.gin"):
    _launch(
        "ntl_jax.t5x.train", model_dir,
        f"--gin_file={EXPERIMENT}",
        "--gin_file=t5x_configs/runs/local.gin",
        f"--gin_file={system}",
        f'--gin.MODEL_DIR="{model_dir}"',
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.EVAL_PERIOD={PERIOD}",
    )


@pytest.fixture(scope="module")
def rt_run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("t5x_rt_ntl")
    _train(model_dir, STEPS)
    first = _scalars(model_dir / "train")
    _train(model_dir, MORE)  # restores checkpoint_4 from MODEL_DIR and goes on
    return model_dir, first


def test_the_rt_run_trains_the_rt_model_on_the_rt_task(rt_run):
    model_dir, _ = rt_run
    config = (model_dir / "config.gin").read_text()
    assert "RtTransformer" in config and "rt_vocabulary" in config
    scalars = _scalars(model_dir / "training_eval" / RT_TASK)
    for step in (PERIOD, STEPS):
        loss = scalars["loss"][step]
        total = scalars["cross_ent_loss"][step] + scalars["z_loss"][step] + 0.3 * scalars["ntl_loss"][step]
        assert math.isfinite(loss) and math.isclose(loss, total, rel_tol=1e-4)
        assert scalars["ntl_loss"][step] > 0  # RT number tokens among the targets
    records = [json.loads(x) for x in (model_dir / "inference_eval" / f"{RT_TASK}-metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [PERIOD, STEPS, MORE]
    assert all("number_accuracy" in r and 0 <= r["fraction_unparseable"] <= 1 for r in records)


def test_the_restored_run_goes_on_from_its_checkpoint(rt_run):
    model_dir, first = rt_run
    assert (model_dir / f"checkpoint_{STEPS}").is_dir() and (model_dir / f"checkpoint_{MORE}").is_dir()
    train = _scalars(model_dir / "train")
    assert max(first["loss"]) <= STEPS < max(train["loss"]) == MORE


def test_t5x_eval_evaluates_the_rt_checkpoint(rt_run, tmp_path):
    model_dir, _ = rt_run
    output = tmp_path / "eval"
    _launch(
        "ntl_jax.t5x.eval", tmp_path,
        "--gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin",
        "--gin_file=t5x_configs/runs/ntl_eval.gin",
        "--gin_file=t5x_configs/systems/rt.gin",
        f"--gin.MIXTURE_OR_TASK_NAME='{BASE_TASK}'",
        f'--gin.CHECKPOINT_PATH="{model_dir / f"checkpoint_{MORE}"}"',
        f'--gin.EVAL_OUTPUT_DIR="{output}"',
        "--gin.EVALUATOR_NUM_EXAMPLES=16",
        "--gin.BATCH_SIZE=8",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'targets': 32}",
    )
    (record,) = [json.loads(x) for x in (output / "inference_eval" / f"{RT_TASK}-metrics.jsonl").read_text()
                 .splitlines()]
    assert record["step"] == MORE and record["num_examples"] == 16 and "number_accuracy" in record


XVAL_TASK = f"{BASE_TASK}_xval"


@pytest.fixture(scope="module")
def xval_run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("t5x_xval")
    _train(model_dir, STEPS, "t5x_configs/systems/xval.gin")
    first = _scalars(model_dir / "train")
    _train(model_dir, MORE, "t5x_configs/systems/xval.gin")
    return model_dir, first


def test_the_xval_run_trains_xval_on_the_xval_task(xval_run):
    model_dir, first = xval_run
    config = (model_dir / "config.gin").read_text()
    assert "XvalEncoderDecoderModel" in config and "XvalTransformer" in config
    scalars = _scalars(model_dir / "training_eval" / XVAL_TASK)
    for step in (PERIOD, STEPS, MORE):
        loss, ce, mse = (scalars[k][step] for k in ("loss", "cross_ent_loss", "number_mse"))
        assert math.isfinite(loss) and math.isclose(loss, (ce + mse) / 2, rel_tol=1e-5) and mse > 0
    assert (model_dir / f"checkpoint_{STEPS}").is_dir() and (model_dir / f"checkpoint_{MORE}").is_dir()
    assert max(first["loss"]) <= STEPS < max(_scalars(model_dir / "train")["loss"]) == MORE
    records = [json.loads(x) for x in (model_dir / "inference_eval" / f"{XVAL_TASK}-metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [PERIOD, STEPS, MORE]
    assert all("number_accuracy" in r and 0 <= r["fraction_unparseable"] <= 1 for r in records)
    (predictions,) = (model_dir / "inference_eval").glob(f"{XVAL_TASK}-{MORE:06d}.jsonl")
    lines = [json.loads(x) for x in predictions.read_text().splitlines()]
    assert lines and all("[NUM]" not in line["prediction"] for line in lines)  # each [NUM] written as its value


def test_t5x_eval_evaluates_the_xval_checkpoint(xval_run, tmp_path):
    model_dir, _ = xval_run
    output = tmp_path / "eval"
    _launch(
        "ntl_jax.t5x.eval", tmp_path,
        "--gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin",
        "--gin_file=t5x_configs/runs/ntl_eval.gin",
        "--gin_file=t5x_configs/systems/xval.gin",
        f"--gin.MIXTURE_OR_TASK_NAME='{BASE_TASK}'",
        f'--gin.CHECKPOINT_PATH="{model_dir / f"checkpoint_{MORE}"}"',
        f'--gin.EVAL_OUTPUT_DIR="{output}"',
        "--gin.EVALUATOR_NUM_EXAMPLES=16",
        "--gin.BATCH_SIZE=8",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'targets': 32}",
    )
    (record,) = [json.loads(x) for x in (output / "inference_eval" / f"{XVAL_TASK}-metrics.jsonl").read_text()
                 .splitlines()]
    assert record["step"] == MORE and record["num_examples"] == 16 and "number_accuracy" in record
