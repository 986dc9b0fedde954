"""MaxText's own programs, launched through `ntl_jax.maxtext` as a user launches them:
a tiny pretraining run on synthetic data with CE and with CE + NTL logs NTL beside the
cross-entropy in the metrics file and in TensorBoard, in training and in evaluation; a
loss of one's own trains launched from Python; the ahead-of-time compile for a v5e
topology; a bad or old setting stops the launch with its name."""

import glob
import json
import math
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("maxtext")

from tests.maxtext import tiny  # noqa: E402

# Enough targets that MaxText's synthetic batch (uniform random tokens) holds a few of
# Llama-3's 1,110 number tokens.
RUN = [*[a for a in tiny.TINY
         if not a.startswith(("per_device_batch_size", "max_target_length", "dtype", "enable_checkpointing"))],
       "per_device_batch_size=4", "max_target_length=128", "steps=4", "eval_interval=2", "eval_steps=2",
       "ntl_digit_level=false"]


# The same batch as RUN's in two micro-batches of two sequences.
ACCUMULATED = ["per_device_batch_size=2", "gradient_accumulation_steps=2", "enable_checkpointing=true",
               "checkpoint_period=2", "async_checkpointing=false"]

# The same again with vocabulary tiling, NTL computed inside MaxText's tiles.
TILED = ["per_device_batch_size=2", "gradient_accumulation_steps=2", "num_vocab_tiling=2",
         "enable_checkpointing=false"]


def _launch(module, args, tmp_path, **env):
    done = subprocess.run([sys.executable, "-m", module, tiny.BASE, *args], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu", **env), timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


def _metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tensorboard_tags(directory):
    """The scalar tags in the TensorBoard event files under `directory`, read with
    tensorboardX's own protobuf (TFRecord framing: length, its CRC, the event, its CRC)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in glob.glob(os.path.join(directory, "**", "events.out.tfevents.*"), recursive=True):
        data = open(path, "rb").read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            tags.update(value.tag for value in event.summary.value)
            at += 12 + length + 4
    return tags


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run trained on CE (ntl_weight=0), on CE + 0.3 x NTL, and on CE + 0.3 x
    NTL with MaxText's gradient accumulation over two micro-batches, checkpointing, and
    with vocabulary tiling too."""
    out = {}
    for name, weight, extra in (("ce", 0.0, ["enable_checkpointing=false"]),
                                ("ntl", 0.3, ["enable_checkpointing=false"]),
                                ("accumulated", 0.3, ACCUMULATED),
                                ("tiled", 0.3, TILED)):
        tmp = tmp_path_factory.mktemp(name)
        args = [*(RUN if name in ("ce", "ntl") else [a for a in RUN if not a.startswith("per_device_batch_size")])]
        log = _launch("ntl_jax.maxtext.train", [*args, *extra, f"run_name={name}", f"base_output_directory={tmp}",
                                                f"metrics_file={tmp / 'metrics.jsonl'}", f"ntl_weight={weight}"], tmp)
        out[name] = (tmp, log, _metrics(tmp / "metrics.jsonl"))
    return out


def test_training_logs_ntl_beside_the_cross_entropy(runs):
    for name, weight in (("ce", 0.0), ("ntl", 0.3)):
        tmp, log, metrics = runs[name]
        train = [m for m in metrics if "learning/loss" in m]
        assert [m["step"] for m in train] == [0, 1, 2, 3]
        for m in train:
            assert m["learning/number_targets"] > 0 and m["learning/ntl"] > 0
            # MaxText's lm_loss and perplexity stay the cross-entropy; its loss is what trains.
            assert m["learning/loss"] == pytest.approx(m["learning/lm_loss"] + m["learning/ntl_term"], rel=1e-6)
            # ntl: NTL-WAS's mean over the number targets it counts; ntl_term: weight x that
            # mean, beside lm_loss (the cross-entropy's mean) as in the paper.
            assert m["learning/ntl_term"] == pytest.approx(weight * m["learning/ntl"], rel=1e-5)
        assert "ntl: " in log and "number targets" in log and "ntl_term: " in log
        tags = _tensorboard_tags(tmp / name / "tensorboard")
        assert {"learning/ntl", "learning/ntl_term", "learning/lm_loss", "eval/avg_ntl", "eval/avg_loss"} <= tags


def test_evaluation_logs_ntl_over_the_evaluations_targets(runs):
    for name in ("ce", "ntl"):
        _, log, metrics = runs[name]
        evals = [m for m in metrics if "eval/avg_ntl" in m]  # each evaluation's summary line
        assert [m["step"] for m in evals] == [0, 2]
        for m in evals:
            assert m["eval/number_targets"] > 0
            # NTL-WAS counts the number targets: its mean over them.
            assert m["eval/ntl_weight_sum"] == m["eval/number_targets"]
            assert m["eval/avg_ntl"] == pytest.approx(m["eval/ntl_sum"] / m["eval/ntl_weight_sum"], rel=1e-6)
        assert "eval step" in log


def test_the_same_step_trains_differently_only_with_a_weight(runs):
    ce, ntl = runs["ce"][2], runs["ntl"][2]
    # Step 0 starts from the same parameters: the same CE and NTL, whatever the weight.
    assert ntl[0]["learning/lm_loss"] == pytest.approx(ce[0]["learning/lm_loss"], rel=1e-6)
    assert ntl[0]["learning/ntl"] == pytest.approx(ce[0]["learning/ntl"], rel=1e-6)
    last_ce = [m for m in ce if "learning/loss" in m][-1]
    last_ntl = [m for m in ntl if "learning/loss" in m][-1]
    assert last_ntl["learning/ntl"] < last_ce["learning/ntl"]  # NTL's gradient moved the number tokens


def test_gradient_accumulation_trains_the_step_the_whole_batch_trains(runs):
    whole = [m for m in runs["ntl"][2] if "learning/loss" in m]
    accumulated = [m for m in runs["accumulated"][2] if "learning/loss" in m]
    assert accumulated[0]["learning/total_weights"] == whole[0]["learning/total_weights"]
    for key in ("learning/lm_loss", "learning/ntl", "learning/number_targets"):
        assert accumulated[0][key] == pytest.approx(whole[0][key], rel=1e-5), key
    # Each micro-batch's term stands to its own cross-entropy as in the paper, and MaxText
    # sums them as it sums the cross-entropies: the token-weighted mean of the two
    # micro-batches' NTL means, against the whole batch's one mean over its number targets.
    # MaxText rebuilds its loss from the cross-entropy under accumulation; the launcher adds NTL back.
    assert accumulated[0]["learning/loss"] == pytest.approx(
        accumulated[0]["learning/lm_loss"] + accumulated[0]["learning/ntl_term"], rel=1e-6)
    assert accumulated[0]["learning/ntl_term"] == pytest.approx(whole[0]["learning/ntl_term"], rel=0.1)
    # Each micro-batch's gradient computed in bfloat16 (the runs' dtype), summed in float32,
    # its NTL part each micro-batch's own mean (measured: 2.6 % off the whole batch's norm).
    assert accumulated[0]["learning/raw_grad_norm"] == pytest.approx(whole[0]["learning/raw_grad_norm"], rel=0.05)
    # After three updates from those gradients, which weigh each micro-batch's NTL mean by
    # its tokens where the whole batch takes one mean: NTL fell in both, alike.
    assert accumulated[-1]["learning/ntl"] < accumulated[0]["learning/ntl"]
    assert accumulated[-1]["learning/ntl"] == pytest.approx(whole[-1]["learning/ntl"], rel=0.05)


# The cross-entropy's log-normaliser is a float32 sum over the vocabulary, which the tiles
# split into other partial sums: rounding errors that grow as the square root of its length.
VOCAB_SUM_RTOL = math.sqrt(128_256) * float(np.finfo(np.float32).eps)  # 4.3e-5


def test_in_vocabulary_tiles_the_step_is_the_untiled_step(runs):
    untiled, tiled = ([m for m in runs[name][2] if "learning/loss" in m] for name in ("accumulated", "tiled"))
    for key in ("learning/lm_loss", "learning/number_targets"):
        assert tiled[0][key] == pytest.approx(untiled[0][key], rel=VOCAB_SUM_RTOL), key
    # The loss is the two: the cross-entropy to the bound above, NTL's term to the rounding below.
    bound = VOCAB_SUM_RTOL * untiled[0]["learning/lm_loss"] + 1e-3 * untiled[0]["learning/ntl_term"]
    assert tiled[0]["learning/loss"] == pytest.approx(untiled[0]["learning/loss"], abs=bound)
    # The number tokens' logits in bfloat16 (the runs' dtype), read from a tile's logits or
    # computed as their columns alone: a matmul of another shape, a rounding apart.
    assert tiled[0]["learning/ntl"] == pytest.approx(untiled[0]["learning/ntl"], rel=1e-3)
    assert tiled[0]["learning/ntl_term"] == pytest.approx(untiled[0]["learning/ntl_term"], rel=1e-3)
    # NTL's gradient from bfloat16 logits (2^-8 apart), now its authors' share of the step's
    # (T/D times ntl_jax 0.4's): measured 0.17 % apart.
    assert tiled[0]["learning/raw_grad_norm"] == pytest.approx(untiled[0]["learning/raw_grad_norm"], rel=5e-3)
    assert tiled[-1]["learning/ntl"] == pytest.approx(untiled[-1]["learning/ntl"], rel=5e-3)
    evals = [[m for m in runs[name][2] if "eval/avg_ntl" in m] for name in ("accumulated", "tiled")]
    assert [m["step"] for m in evals[1]] == [0, 2]
    # The first evaluation follows the first update, made from gradients a rounding apart.
    assert evals[1][0]["eval/number_targets"] == evals[0][0]["eval/number_targets"] > 0
    for key in ("eval/avg_loss", "eval/avg_ntl"):
        assert evals[1][0][key] == pytest.approx(evals[0][0][key], rel=1e-3), key


def test_a_run_resumes_from_its_checkpoint(runs, tmp_path_factory):
    tmp = runs["accumulated"][0]
    log = _launch("ntl_jax.maxtext.train",
                  [*[a for a in RUN if not a.startswith(("steps=", "per_device_batch_size"))], "steps=6",
                   *ACCUMULATED, "run_name=accumulated", f"base_output_directory={tmp}",
                   f"metrics_file={tmp / 'resumed.jsonl'}", "ntl_weight=0.3"], tmp)
    resumed = [m for m in _metrics(tmp / "resumed.jsonl") if "learning/loss" in m]
    assert [m["step"] for m in resumed] == [4, 5]  # from the checkpoint of step 4's start
    assert all(m["learning/ntl"] > 0 for m in resumed)
    assert "restor" in log.lower()


def test_the_ahead_of_time_compile_for_a_v5e_pod_takes_the_number_loss(tmp_path):
    log = _launch("ntl_jax.maxtext.train_compile",
                  [*RUN, "run_name=aot", f"base_output_directory={tmp_path}", "compile_topology=v5e-4",
                   "compile_topology_num_slices=1", "ntl_weight=0.3", "ntl_number_loss=del"],
                  tmp_path, ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_ACCELERATOR_TYPE="v5litepod-4")
    assert "Finished train_compile.py successfully!" in log
    assert "Memory analysis:" in log


def test_a_bad_setting_stops_the_launch_with_its_name(tmp_path):
    for setting, said in (("ntl_number_loss=wass", ("ntl_number_loss='wass': expected a number loss in", "got 'wass'")),
                          ("ntl_number_loss=was(squash=2)", ("number loss 'was' has no parameter 'squash'",)),
                          ("ntl_kind=was", ("ntl_kind is no longer a key", "'ntl_number_loss=was'"))):
        done = subprocess.run([sys.executable, "-m", "ntl_jax.maxtext.train", tiny.BASE, *RUN, setting],
                              capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert done.returncode != 0
        for words in said:
            assert words in done.stderr, setting


# A loss of one's own, launched from Python: `main` takes it where the command line takes a spec.
OWN_LOSS_LAUNCH = """
import sys
from absl import app
from ntl_jax.maxtext import train
from tests.maxtext.tiny import SQUARED_DISTANCE
app.run(lambda argv: train.main(argv, number_loss=SQUARED_DISTANCE), argv=sys.argv)
"""


def test_a_loss_of_ones_own_trains_through_the_launcher_from_python(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = [a for a in RUN if not a.startswith(("steps=", "eval_interval", "eval_steps"))]
    done = subprocess.run([sys.executable, "-c", OWN_LOSS_LAUNCH, tiny.BASE, *args, "steps=3", "eval_interval=-1",
                           "run_name=own", f"base_output_directory={tmp_path}", "enable_checkpointing=false",
                           f"metrics_file={tmp_path / 'metrics.jsonl'}", "ntl_weight=0.3"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    train = [m for m in _metrics(tmp_path / "metrics.jsonl") if "learning/loss" in m]
    assert [m["step"] for m in train] == [0, 1, 2]
    for m in train:
        assert m["learning/ntl"] > 0 and m["learning/number_targets"] > 0
        assert m["learning/loss"] == pytest.approx(m["learning/lm_loss"] + m["learning/ntl_term"], rel=1e-6)
    assert "ntl: " in done.stdout + done.stderr


OWN_PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "own_loss_package"


OWN_MODULE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "own_loss_module"


@pytest.mark.parametrize("spec, path", [
    # A loss a package names by an entry point (tests/fixtures/own_loss_package).
    ("squared_gap", OWN_PACKAGE),
    # A loss no package names: read through the module its spec names (tests/fixtures/own_loss_module).
    ("my_number_losses:scaled_gap(scale=2)", OWN_MODULE),
], ids=["entry_point", "module_spec"])
def test_a_loss_of_your_own_trains_from_its_key(tmp_path, spec, path):
    """`ntl_number_loss=<spec>` of a loss of one's own, found by the launcher's own process."""
    args = [a for a in RUN if not a.startswith(("steps=", "eval_interval", "eval_steps"))]
    _launch("ntl_jax.maxtext.train",
            [*args, "steps=2", "eval_interval=-1", "run_name=own_loss", f"base_output_directory={tmp_path}",
             "enable_checkpointing=false", f"metrics_file={tmp_path / 'metrics.jsonl'}", "ntl_weight=0.3",
             f"ntl_number_loss={spec}"],
            tmp_path, PYTHONPATH=os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]))
    train = [m for m in _metrics(tmp_path / "metrics.jsonl") if "learning/loss" in m]
    assert [m["step"] for m in train] == [0, 1]
    for m in train:
        assert m["learning/ntl"] > 0
        assert m["learning/loss"] == pytest.approx(m["learning/lm_loss"] + m["learning/ntl_term"], rel=1e-6)
