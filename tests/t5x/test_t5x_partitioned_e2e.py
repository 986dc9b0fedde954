"""End to end, partitioned: one training step of the NTL model through `t5x.train` on
8 host CPU devices (a 2 x 4 data x model mesh) gives the single-device step's metrics.

A tiny byte-level T5 whose sharded dimensions (heads, joined kv, mlp, vocab) divide by
the model axis, packed batches and `AVERAGE_PER_SEQUENCE`, so the loss's sums over
sequences and over the vocabulary cross device boundaries. With `fused_loss=True` the
partitioned step is vocabulary-parallel (`fused_vocab_axis`, default `"model"`): the
same metrics, and its compiled train step (dumped by XLA) all-gathers no part of the
`logits_dense` kernel, which `fused_vocab_axis=None` (XLA partitioning the fused loss
itself) does. The paper's other systems, T5 with CE and with CE + NTL-MSE, the
Regression Transformer (`systems/rt_ntl.gin`) and xVal (`systems/xval.gin`), give the
single-device step's metrics too. Skipped without t5x.
"""

import math
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("ntl_jax.seqio.tasks")
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
{extra}
"""
UNFUSED = "NTL_FUSED_LOSS = False"  # the loss from the logits (the gin files' default is 'auto')
EMB_DIM, VOCAB, PARTITIONS = 32, 384, 4  # the logits_dense kernel: [32, 384], 96 columns per device
# The fused loss, in chunks smaller than a device's share of the vocabulary (96 columns):
# two chunks per device vocabulary-parallel, six when XLA partitions it.
FUSED = """
from ntl_jax.t5x import models as ntl_models
NTL_FUSED_LOSS = True
ntl_models.NTLEncoderDecoderModel.fused_chunk_size = 64
"""
COMPARED = ["loss", "cross_ent_loss", "z_loss", "ntl_term", "ntl", "number_abs_error", "number_token_mass",
            "accuracy", "loss_per_nonpadding_target_token"]


def _train_one_step(tmp_path, name, devices, partitions, extra="", dump_hlo=False):
    """Trains one step; with `dump_hlo`, XLA writes the train step's compiled HLO as
    text to `<name>/hlo` (see `_train_step_all_gathers`)."""
    folder = tmp_path / name
    folder.mkdir()
    gin_file = folder / "run.gin"
    gin_file.write_text(CONFIG.format(partitions=partitions, extra=extra))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("NTL_JAX_MATH_DIR", None)  # generate the data on the fly
    env.pop("XLA_FLAGS", None)
    flags = []
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    if dump_hlo:
        flags += [f"--xla_dump_to={folder / 'hlo'}", "--xla_dump_hlo_as_text", "--xla_dump_hlo_module_re=train_step"]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    command = [sys.executable, "-m", "ntl_jax.t5x.train", f"--gin_file={gin_file}",
               f'--gin.MODEL_DIR="{folder / "run"}"']
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    return folder / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("t5x_partitioned")
    return (_train_one_step(tmp_path, "single", 1, 1, UNFUSED),
            _train_one_step(tmp_path, "sharded", 8, PARTITIONS, UNFUSED))


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
    assert single["ntl"][1] > 0 and single["ntl_term"][1] > 0
    for tag in COMPARED:
        a, b = single[tag][1], sharded[tag][1]
        assert math.isfinite(a), tag
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), (tag, a, b)
    # Loss = CE + z-loss + the NTL term (0.3 * NTL's sum over the factor) on both.
    total = sharded["cross_ent_loss"][1] + sharded["z_loss"][1] + sharded["ntl_term"][1]
    assert math.isclose(sharded["loss"][1], total, rel_tol=1e-5)


def test_evaluation_after_the_step_equals_the_single_device_run(runs):
    # The parameters after one (sharded) Adafactor update give the same evaluation loss.
    single, sharded = (_scalars(run / "training_eval" / TASK) for run in runs)
    for tag in ("loss", "ntl", "cross_ent_loss"):
        assert math.isclose(single[tag][1], sharded[tag][1], rel_tol=1e-5), (tag, single[tag], sharded[tag])


# -- the fused loss, vocabulary-parallel -----------------------------------------------


@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory):
    """One device; 2 x 4 vocabulary-parallel (the default `fused_vocab_axis="model"`);
    2 x 4 with `fused_vocab_axis=None`. The partitioned runs dump their HLO."""
    tmp_path = tmp_path_factory.mktemp("t5x_partitioned_fused")
    return {
        "single": _train_one_step(tmp_path, "single", 1, 1, FUSED),
        "vocab_parallel": _train_one_step(tmp_path, "vocab_parallel", 8, PARTITIONS, FUSED, dump_hlo=True),
        "xla": _train_one_step(tmp_path, "xla", 8, PARTITIONS,
                               FUSED + "ntl_models.NTLEncoderDecoderModel.fused_vocab_axis = None\n", dump_hlo=True),
    }


def _train_step_all_gathers(run):
    """`[(dtype, shape)]` of every all-gather in the compiled train step (T5X's pjit of
    its `train_step`), from the HLO text XLA dumped after optimisation."""
    (path,) = (run.parent / "hlo").glob("*jit_train_step*after_optimizations.txt")
    return [(m.group(1), tuple(int(x) for x in m.group(2).split(",") if x))
            for m in re.finditer(r"= (\w+)\[([\d,]*)\][^=\n]*? all-gather(?:-start)?\(", path.read_text())]


def _kernel_gathers(gathers):
    """The all-gathers that hold `logits_dense` kernel columns: d_model rows and a
    multiple of a device's share of the vocabulary (96, 192, ..., 384 columns)."""
    share = VOCAB // PARTITIONS
    return [(dtype, shape) for dtype, shape in gathers
            if EMB_DIM in shape and any(d >= share and d % share == 0 for d in shape)]


def test_fused_step_one_metrics_equal_the_single_device_run(fused_runs):
    for name, run in fused_runs.items():
        config = (run / "config.gin").read_text()
        assert "NTL_FUSED_LOSS = True" in config, name
        assert ("fused_vocab_axis = None" in config) == (name == "xla"), name
    info = (fused_runs["vocab_parallel"] / "model-info.txt").read_text()
    (line,) = [x for x in info.splitlines() if "Variable decoder/logits_dense/kernel " in x]
    assert f"(embed={EMB_DIM}, vocab={VOCAB})" in line and "(None, 'model')" in line, line
    single = _scalars(fused_runs["single"] / "train")
    assert single["loss"].keys() == {1} and single["ntl"][1] > 0
    for name in ("vocab_parallel", "xla"):
        sharded = _scalars(fused_runs[name] / "train")
        for tag in COMPARED:
            a, b = single[tag][1], sharded[tag][1]
            assert math.isfinite(a), tag
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), (name, tag, a, b)
    # The parameters after one vocabulary-parallel update give the same evaluation loss.
    single, sharded = (_scalars(fused_runs[name] / "training_eval" / TASK) for name in ("single", "vocab_parallel"))
    for tag in ("loss", "ntl", "cross_ent_loss"):
        assert math.isclose(single[tag][1], sharded[tag][1], rel_tol=1e-5), (tag, single[tag], sharded[tag])


def test_the_vocab_parallel_train_step_gathers_no_kernel(fused_runs):
    vocab_parallel = _train_step_all_gathers(fused_runs["vocab_parallel"])
    xla = _train_step_all_gathers(fused_runs["xla"])
    # Left to XLA, the fused loss gathers the whole [32, 384] kernel (so the check can fail) ...
    assert (("f32", (EMB_DIM, VOCAB)) in _kernel_gathers(xla)), xla
    # ... vocabulary-parallel, no kernel column is gathered.
    assert _kernel_gathers(vocab_parallel) == [], vocab_parallel


def test_fused_data_parallel_step_one_equals_the_single_device_run(fused_runs, tmp_path):
    # 8 devices, one on the model axis: the fused loss runs under shard_map over the batch.
    run = _train_one_step(tmp_path, "data_parallel", 8, 1, FUSED, dump_hlo=True)
    single, data_parallel = _scalars(fused_runs["single"] / "train"), _scalars(run / "train")
    for tag in COMPARED:
        a, b = single[tag][1], data_parallel[tag][1]
        assert math.isfinite(a), tag
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), (tag, a, b)
    assert _kernel_gathers(_train_step_all_gathers(run)) == []


# -- the paper's other systems ----------------------------------------------------------

# system -> (what its run adds, the task, the metrics compared, its NTL weight; None: xVal).
NTL_TAGS = ["loss", "cross_ent_loss", "z_loss", "ntl_term", "ntl", "accuracy"]
SYSTEMS = {
    "ce": (UNFUSED + "\ninclude 't5x_configs/losses/ce.gin'\n", TASK, NTL_TAGS, 0.0),
    "ntl_mse": (UNFUSED + "\ninclude 't5x_configs/losses/ntl_mse.gin'\n", TASK, NTL_TAGS, 0.3),
    "rt_ntl": (UNFUSED + "\ninclude 't5x_configs/systems/rt_ntl.gin'\n", f"{TASK}_rt", NTL_TAGS, 0.3),
    "xval": ("\ninclude 't5x_configs/systems/xval.gin'\n", f"{TASK}_xval",
             ["loss", "cross_ent_loss", "number_mse", "accuracy"], None),
}


@pytest.fixture(scope="module", params=list(SYSTEMS))
def system_runs(request, tmp_path_factory):
    system = request.param
    tmp_path = tmp_path_factory.mktemp(f"t5x_partitioned_{system}")
    extra = SYSTEMS[system][0]
    return system, (_train_one_step(tmp_path, "single", 1, 1, extra),
                    _train_one_step(tmp_path, "sharded", 8, PARTITIONS, extra))


def test_each_systems_step_one_on_8_devices_equals_one_device(system_runs):
    system, runs = system_runs
    _, task, tags, weight = SYSTEMS[system]
    info = (runs[1] / "model-info.txt").read_text()
    (line,) = [x for x in info.splitlines() if "Variable decoder/logits_dense/kernel " in x]
    vocab = {"rt_ntl": 1664, "xval": 1024}.get(system, 384)  # the RT and xVal vocabularies, or bytes
    assert f"vocab={vocab}" in line and "'model'" in line, line
    if system == "xval":  # the number head is sharded too
        (line,) = [x for x in info.splitlines() if "Variable number_head/hidden/kernel " in x]
        assert "(embed=32, mlp=32)" in line and "'model'" in line, line
    single, sharded = (_scalars(run / "train") for run in runs)
    for tag in tags:
        a, b = single[tag][1], sharded[tag][1]
        assert math.isfinite(a), tag
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7), (tag, a, b)
    if weight is None:
        total = (sharded["cross_ent_loss"][1] + sharded["number_mse"][1]) / 2
    else:
        total = sharded["cross_ent_loss"][1] + sharded["z_loss"][1] + sharded["ntl_term"][1]
        assert (sharded["ntl_term"][1] > 0) == (weight > 0) and sharded["ntl"][1] > 0  # logged at any weight
    assert math.isclose(sharded["loss"][1], total, rel_tol=1e-5)
    single, sharded = (_scalars(run / "training_eval" / task) for run in runs)
    for tag in ("loss", "cross_ent_loss"):
        assert math.isclose(single[tag][1], sharded[tag][1], rel_tol=1e-5), (tag, single[tag], sharded[tag])
