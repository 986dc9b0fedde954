"""End to end on CPU: each of the paper's five systems trains, checkpoints, restores and
evaluates through `t5x.train` and `t5x.eval` with its gin file.

The tiny byte-level experiment with the system's file last: T5 with CE
(`losses/ce.gin`), CE + NTL-MSE (`losses/ntl_mse.gin`) and CE + NTL-WAS (the experiment
as shipped), the Regression Transformer with CE and with CE + NTL-MSE
(`systems/rt.gin`, `systems/rt_ntl.gin`: its own vocabulary and network) and xVal
(`systems/xval.gin`: its model, vocabulary and number head). Skipped without t5x.
"""

import json
import math

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.seqio.tasks")

from tests.t5x.test_t5x_train_e2e import _launch, _scalars  # noqa: E402

EXPERIMENT = "t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin"
BASE_TASK = "ntl_math_arithmetic__add_sub_multiple_byte"
STEPS, PERIOD, MORE = 4, 2, 6
# system -> (its gin files after the run file, the task it trains on, its NTL weight;
# None: xVal's (CE + MSE) / 2).
SYSTEMS = {
    "ce": (["t5x_configs/losses/ce.gin"], BASE_TASK, 0.0),
    "ntl_mse": (["t5x_configs/losses/ntl_mse.gin"], BASE_TASK, 0.3),
    "ntl_was": ([], BASE_TASK, 0.3),
    "rt": (["t5x_configs/systems/rt.gin"], f"{BASE_TASK}_rt", 0.0),
    "rt_ntl": (["t5x_configs/systems/rt_ntl.gin"], f"{BASE_TASK}_rt", 0.3),
    "xval": (["t5x_configs/systems/xval.gin"], f"{BASE_TASK}_xval", None),
}
MODELS = {"xval": ("XvalEncoderDecoderModel", "XvalTransformer"), "rt": ("NTLEncoderDecoderModel", "RtTransformer"),
          "rt_ntl": ("NTLEncoderDecoderModel", "RtTransformer")}


def _train(model_dir, steps, files):
    _launch("ntl_jax.t5x.train", model_dir, f"--gin_file={EXPERIMENT}", "--gin_file=t5x_configs/runs/local.gin",
            *(f"--gin_file={f}" for f in files), f'--gin.MODEL_DIR="{model_dir}"', f"--gin.TRAIN_STEPS={steps}",
            f"--gin.EVAL_PERIOD={PERIOD}")


@pytest.fixture(scope="module", params=list(SYSTEMS))
def run(request, tmp_path_factory):
    """`(system, model_dir, the train scalars after STEPS)`: trained to STEPS, then
    restored from MODEL_DIR's checkpoint and trained on to MORE."""
    system = request.param
    model_dir = tmp_path_factory.mktemp(f"t5x_{system}")
    files = SYSTEMS[system][0]
    _train(model_dir, STEPS, files)
    first = _scalars(model_dir / "train")
    _train(model_dir, MORE, files)
    return system, model_dir, first


def test_the_system_trains_its_model_and_loss(run):
    system, model_dir, _ = run
    _, task, weight = SYSTEMS[system]
    config = (model_dir / "config.gin").read_text()
    for name in MODELS.get(system, ("NTLEncoderDecoderModel", "network.Transformer")):
        assert name in config, name
    scalars = _scalars(model_dir / "training_eval" / task)
    for step in (PERIOD, STEPS, MORE):
        loss = scalars["loss"][step]
        if weight is None:
            total = (scalars["cross_ent_loss"][step] + scalars["number_mse"][step]) / 2
            assert scalars["number_mse"][step] > 0
        else:
            total = scalars["cross_ent_loss"][step] + scalars["z_loss"][step] + scalars["ntl_term"][step]
            assert scalars["ntl"][step] > 0  # number tokens among the targets, logged at any weight
            assert (scalars["ntl_term"][step] > 0) == (weight > 0)
        assert math.isfinite(loss) and math.isclose(loss, total, rel_tol=1e-4), (step, loss, total)


def test_the_restored_run_goes_on_from_its_checkpoint(run):
    _, model_dir, first = run
    assert (model_dir / f"checkpoint_{STEPS}").is_dir() and (model_dir / f"checkpoint_{MORE}").is_dir()
    assert max(first["loss"]) <= STEPS < max(_scalars(model_dir / "train")["loss"]) == MORE


def test_the_tasks_metrics_read_the_decoded_numbers(run):
    system, model_dir, _ = run
    task = SYSTEMS[system][1]
    records = [json.loads(x) for x in (model_dir / "inference_eval" / f"{task}-metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [PERIOD, STEPS, MORE]
    assert all("number_accuracy" in r and 0 <= r["fraction_unparseable"] <= 1 for r in records)
    (predictions,) = (model_dir / "inference_eval").glob(f"{task}-{MORE:06d}.jsonl")
    lines = [json.loads(x) for x in predictions.read_text().splitlines()]
    assert lines and all("[NUM]" not in line["prediction"] for line in lines)  # xVal writes each [NUM]'s value


def test_t5x_eval_evaluates_the_checkpoint(run, tmp_path):
    system, model_dir, _ = run
    files, task, _ = SYSTEMS[system]
    output = tmp_path / "eval"
    _launch(
        "ntl_jax.t5x.eval", tmp_path,
        "--gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin",
        "--gin_file=t5x_configs/runs/ntl_eval.gin",
        *(f"--gin_file={f}" for f in files),
        f"--gin.MIXTURE_OR_TASK_NAME='{BASE_TASK}'",
        f'--gin.CHECKPOINT_PATH="{model_dir / f"checkpoint_{MORE}"}"',
        f'--gin.EVAL_OUTPUT_DIR="{output}"',
        "--gin.EVALUATOR_NUM_EXAMPLES=16",
        "--gin.BATCH_SIZE=8",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'targets': 32}",
    )
    (record,) = [json.loads(x) for x in (output / "inference_eval" / f"{task}-metrics.jsonl").read_text()
                 .splitlines()]
    assert record["step"] == MORE and record["num_examples"] == 16 and "number_accuracy" in record
