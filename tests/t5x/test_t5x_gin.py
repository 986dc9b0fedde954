"""Every shipped gin file parses, finalizes and builds %MODEL (skipped without t5x).

Every experiment file is built with each loss (its default, each loss overlay, the
`--gin.` bindings), and so is every earlier one-file-per-loss experiment through the
command the T5X guide maps it to. `tests/test_gin_files.py` checks the files as text.
"""

import importlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")

import gin  # noqa: E402
import numpy as np  # noqa: E402
import seqio  # noqa: E402
import t5x  # noqa: E402

from ntl_jax import losses  # noqa: E402
from ntl_jax.seqio import vocabularies  # noqa: E402
from ntl_jax.t5x import configs  # noqa: E402
from ntl_jax.t5x import models as ntl_models  # noqa: E402
from ntl_jax.t5x import train as ntl_train  # noqa: E402
from tests.objective_options import registered_loss  # noqa: E402
from tests.test_gin_files import EARLIER_LOSSES, earlier_experiments  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = configs.configs_dir()
T5X_SEARCH_PATH = str(pathlib.Path(t5x.__file__).resolve().parents[1])  # as t5x.train adds it
ALL_FILES = [p.relative_to(CONFIGS).as_posix() for p in configs.gin_files()]
EXPERIMENTS = [f for f in ALL_FILES if f.startswith("experiments/")]
LOSS_FILES = [f for f in ALL_FILES if f.startswith("losses/")]
MODEL_FILES = [f for f in ALL_FILES if re.fullmatch(r"models/(t5_1_[01]_\w+|decoder_only_\w+)_ntl\.gin", f)]
PAPER_RUNS = [f for f in ALL_FILES if f.startswith("paper/")]
SYSTEM_FILES = [f for f in ALL_FILES if f.startswith("systems/")]
OVERLAYS = sorted(set(ALL_FILES) - set(EXPERIMENTS) - set(LOSS_FILES) - set(MODEL_FILES) - set(PAPER_RUNS)
                  - set(SYSTEM_FILES))
SIZES = {"tiny", "small", "base", "large", "xl"}
# Each way to pick a loss: (extra gin files, bindings) -> (ntl_weight, the number loss's spec).
LOSS_CHOICES = {
    "default": ((), (), (0.3, "was")),
    "losses/ce.gin": (("losses/ce.gin",), (), (0.0, "was")),
    "losses/ntl_mse.gin": (("losses/ntl_mse.gin",), (), (0.3, "mse")),
    "losses/ntl_was.gin": (("losses/ntl_was.gin",), (), (0.3, "was")),
    "losses/del.gin": (("losses/del.gin",), (), (0.001, "del")),  # DEL's own λ
    "losses/dist2.gin": (("losses/dist2.gin",), (), (0.1, "dist2")),
    "losses/smmd.gin": (("losses/smmd.gin",), (), (1.0, "smmd")),
    "NTL_WEIGHT=0.0": ((), ("NTL_WEIGHT = 0.0",), (0.0, "was")),
    "NTL_LOSS='mse'": ((), ("NTL_LOSS = 'mse'",), (0.3, "mse")),
    "NTL_LOSS='mae'": ((), ("NTL_LOSS = 'mae'",), (0.3, "mae")),
    "NTL_LOSS='dist2'": ((), ("NTL_LOSS = 'dist2'",), (0.1, "dist2")),  # the model file leaves λ to the loss
    # A loss's own parameter, bound on its constructor.
    "losses.was.squash_factor=2.0": ((), ("losses.was.squash_factor = 2.0",), (0.3, "was(squash_factor=2.0)")),
    "losses/smmd.gin + losses.smmd.mode='mmd'": (("losses/smmd.gin",), ("losses.smmd.mode = 'mmd'",),
                                                 (1.0, "smmd(mode=mmd)")),
}
# What the earlier experiment files set, by (protocol, task); fine-tuning also restored
# gs://t5-data/pretrained_models/t5x/t5_1_1_<size>/checkpoint_1000000.
EARLIER_SETTINGS = {
    ("scratch", "arithmetic"): ("ntl_math_arithmetic_ablation", 100_000),
    ("scratch", "math13"): ("ntl_math_paper13", 1_050_000),
    ("scratch", "tiny_byte_arithmetic"): ("ntl_math_arithmetic__add_sub_multiple_byte", 100_000),
    ("finetune", "arithmetic"): ("ntl_math_arithmetic_ablation", 1_100_000),
    ("finetune", "math13"): ("ntl_math_paper13", 1_100_000),
}


def _has_tasks():
    try:
        importlib.import_module("ntl_jax.seqio.tasks")
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def local_sentencepiece(tmp_path_factory):
    """A tiny local SentencePiece model standing in for T5's gs:// one (unreachable here)."""
    spm = pytest.importorskip("sentencepiece")
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    lines = [f"What is {a} + {b}? {a + b}. Solve {a}*x = {b} for x." for a in range(60) for b in range(0, 60, 7)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=64, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, split_digits=True, hard_vocab_limit=False,
    )
    return f"{prefix}.model"


@pytest.fixture
def gin_env(monkeypatch):
    """Fresh gin state with the launcher's search paths and t5x.train as `__main__`."""
    gin.clear_config(clear_constants=True)
    monkeypatch.setattr(gin.config, "_LOCATION_PREFIXES", [""])  # no search paths from earlier tests
    monkeypatch.setitem(sys.modules, "__main__", importlib.import_module("t5x.train"))
    for path in (configs.gin_search_path(), T5X_SEARCH_PATH):
        gin.add_config_file_search_path(path)
    yield
    gin.clear_config(clear_constants=True)


def _parse_and_build(files, bindings=()):
    gin.parse_config_files_and_bindings(
        [f"t5x_configs/{f}" for f in files], list(bindings), finalize_config=True
    )
    assert gin.config_is_locked()
    return _macro("MODEL")


def _macro(name):
    value = gin.query_parameter(f"{name}/macro.value")
    # A reference (e.g. @task_variants.with_vocabulary()) is evaluated as T5X would.
    return value.scoped_configurable_fn() if hasattr(value, "scoped_configurable_fn") else value


def _offline_bindings(sp_model, dropout=True):
    """Point the stock gs:// SentencePiece file at a local one; a run file sets DROPOUT_RATE."""
    bindings = [f"seqio.SentencePieceVocabulary.sentencepiece_model_file = '{sp_model}'", "MODEL_DIR = '/tmp/unused'"]
    return bindings + (["DROPOUT_RATE = 0.0"] if dropout else [])


def test_the_shipped_set_is_complete():
    expected = {f"models/t5_1_1_{s}_ntl.gin" for s in SIZES} | {"models/t5_1_1_tiny_byte_ntl.gin"}
    expected |= {"models/t5_1_0_small_ntl.gin", "models/t5_1_0_3b_ntl.gin"}
    assert expected <= set(MODEL_FILES)
    for mode, sizes in (("scratch", ("small", "base")), ("finetune", ("small", "base", "large", "xl"))):
        for size in sizes:
            for task in ("arithmetic", "math13"):
                assert f"experiments/{mode}/{size}_{task}.gin" in EXPERIMENTS
    assert "experiments/scratch/tiny_byte_arithmetic.gin" in EXPERIMENTS
    assert len(EXPERIMENTS) == 13
    assert LOSS_FILES == ["losses/ce.gin", "losses/del.gin", "losses/dist2.gin", "losses/ntl_mse.gin",
                          "losses/ntl_was.gin", "losses/smmd.gin"]


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_file_builds_ntl_model(gin_env, local_sentencepiece, name):
    text = (CONFIGS / name).read_text()
    assert text.startswith("# Provides MODEL\n"), "model files are headed '# Provides MODEL' (T5X style)"
    model = _parse_and_build([name], _offline_bindings(local_sentencepiece))
    assert isinstance(model, (ntl_models.NTLEncoderDecoderModel, ntl_models.NTLDecoderOnlyModel))
    assert model.ntl_options == {"ntl_weight": 0.3, "number_loss": "was"}
    assert model.number_loss is losses.was()
    assert model.number_tokens.num_numbers == 10
    if "byte" in name:
        assert isinstance(model.output_vocabulary, seqio.ByteVocabulary)
        assert model.module.config.vocab_size == 384  # 259 ids rounded up by padded_vocab_size


@pytest.mark.parametrize("binding, new_form", [
    ("ntl_models.NTLEncoderDecoderModel.ntl_kind = 'mse'", "number_loss= a name"),
    ("ntl_models.NTLEncoderDecoderModel.squash_factor = 2.0", r"number_loss=ntl_jax.losses.was\(squash_factor=...\)"),
])
def test_a_loss_parameter_bound_on_the_model_names_the_new_form(gin_env, local_sentencepiece, binding, new_form):
    with pytest.raises(TypeError, match=rf"NTLEncoderDecoderModel\(\) no longer takes \w+= \(ntl_jax 0.3.0\); "
                                        rf"pass {new_form}"):
        _parse_and_build(["models/t5_1_1_tiny_ntl.gin"], [*_offline_bindings(local_sentencepiece), binding])


def test_the_loss_macro_takes_a_spec_string_or_none(gin_env, local_sentencepiece):
    """On the command line (`--gin.NTL_LOSS=\\"smmd(mode=mmd)\\"`) the loss is a spec
    string, parsed by `ntl_jax.losses.parse`; `"none"` trains with cross-entropy alone."""
    bindings = _offline_bindings(local_sentencepiece)
    model = _parse_and_build(["models/t5_1_1_tiny_ntl.gin"], [*bindings, "NTL_LOSS = 'smmd(mode=mmd)'"])
    assert model.number_loss is losses.smmd(mode="mmd")
    gin.clear_config(clear_constants=True)
    model = _parse_and_build(["models/t5_1_1_tiny_ntl.gin"], [*bindings, "NTL_LOSS = 'none'"])
    assert model.number_loss is None and model.ntl_options == {"ntl_weight": 0.3, "number_loss": "none"}


def squared_distance():
    """A configurable of the user's own that makes a `NumberLoss` (the guide's example)."""
    from tests.t5x.test_t5x_models import SQUARED_DISTANCE

    return SQUARED_DISTANCE


def test_a_loss_of_ones_own_through_gin(gin_env, local_sentencepiece, tmp_path):
    own = tmp_path / "own_loss.gin"
    own.write_text("from __gin__ import dynamic_registration\n"
                   "from tests.t5x import test_t5x_gin as user\n"
                   "NTL_LOSS = @user.squared_distance()\n")
    gin.parse_config_files_and_bindings(["t5x_configs/models/t5_1_1_tiny_ntl.gin", str(own)],
                                        _offline_bindings(local_sentencepiece), finalize_config=True)
    model = _macro("MODEL")
    assert model.number_loss is squared_distance()
    with pytest.raises(ValueError, match=r"no spec that parse reads back .*losses.register"):
        model.ntl_options


@pytest.mark.parametrize("spec", ["ntil", "ntil(combine=add)", "squared_gap"])
def test_ntil_and_a_registered_loss_by_a_gin_string(gin_env, local_sentencepiece, spec):
    registered_loss()
    model = _parse_and_build(["models/t5_1_1_tiny_ntl.gin"], [*_offline_bindings(local_sentencepiece),
                                                               f"NTL_LOSS = '{spec}'"])
    assert model.number_loss is losses.parse(spec)
    assert model.ntl_options == {"ntl_weight": 0.3, "number_loss": spec}


def test_decoder_only_file_has_t5x_s_settings(gin_env, local_sentencepiece):
    """models/decoder_only_base_ntl.gin has T5X's decoder_only/models/base.gin settings.

    It restates them because gin cannot include that file by its relative path (see
    the file's header); an absolute path, as here, works.
    """
    stock = pathlib.Path(T5X_SEARCH_PATH) / "t5x/examples/decoder_only/models/base.gin"
    bindings = _offline_bindings(local_sentencepiece)

    def build(path):
        gin.clear_config(clear_constants=True)
        gin.parse_config_files_and_bindings([path], bindings, finalize_config=True)
        model = _macro("MODEL")
        decoding = {k: gin.query_parameter(f"decoding.temperature_sample.{k}") for k in ("temperature", "topk")}
        optimizer = {k: gin.query_parameter(f"adafactor.Adafactor.{k}") for k in ("decay_rate", "step_offset")}
        return model, (model.module.config, model.output_vocabulary, model._z_loss, model._label_smoothing,
                       model._loss_normalizing_factor, decoding, optimizer, type(model.optimizer_def))

    ours, ours_settings = build(str(CONFIGS / "models/decoder_only_base_ntl.gin"))
    theirs, theirs_settings = build(str(stock))
    assert type(theirs) is t5x.models.DecoderOnlyModel and isinstance(ours, ntl_models.NTLDecoderOnlyModel)
    assert ours_settings == theirs_settings


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_file_parses_after_a_model(gin_env, local_sentencepiece, monkeypatch, name):
    if "ntl_jax.seqio.tasks" in (CONFIGS / name).read_text() and not _has_tasks():
        pytest.skip("ntl_jax.seqio.tasks is not available")
    base = "models/t5_1_1_tiny_ntl.gin" if name == "models/digit_vocab.gin" else "models/t5_1_1_tiny_byte_ntl.gin"
    if name == "models/ntl_decoder_only.gin":
        base = "models/decoder_only_base_ntl.gin"
    if name == "models/digit_vocab.gin":
        pytest.importorskip("ntl_jax.seqio.vocabularies")
    bindings = _offline_bindings(local_sentencepiece) + ["MIXTURE_OR_TASK_NAME = 'any'", "TRAIN_STEPS = 1"]
    if "finetune" in name:
        bindings.append("INITIAL_CHECKPOINT_PATH = '/tmp/unused'")
    if name == "runs/ntl_eval.gin":
        monkeypatch.setitem(sys.modules, "__main__", importlib.import_module("t5x.eval"))
        bindings += ["CHECKPOINT_PATH = '/tmp/unused'", "EVAL_OUTPUT_DIR = '/tmp/unused'"]
    model = _parse_and_build([base, name], bindings)
    expected_class = ntl_models.NTLDecoderOnlyModel if "decoder_only" in name else ntl_models.NTLEncoderDecoderModel
    assert isinstance(model, expected_class)


@pytest.mark.parametrize("loss", LOSS_CHOICES)
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_builds_its_model(gin_env, local_sentencepiece, name, loss):
    if not _has_tasks():
        pytest.skip("ntl_jax.seqio.tasks is not available")
    mode, stem = name.split("/")[1], pathlib.Path(name).stem
    files, bindings, expected = LOSS_CHOICES[loss]
    model = _parse_and_build([name, *files], [*_offline_bindings(local_sentencepiece, dropout=False), *bindings])
    assert isinstance(model, ntl_models.NTLEncoderDecoderModel)
    assert (model.ntl_options["ntl_weight"], model.ntl_options["number_loss"]) == expected
    assert model.number_loss is losses.parse(expected[1])  # the one value the constructor gives
    # The task exists and uses the model's vocabulary (what t5x.train checks first).
    task = seqio.get_mixture_or_task(_macro("MIXTURE_OR_TASK_NAME"))
    assert task.output_features["targets"].vocabulary == model.output_vocabulary
    size = stem.split("_")[0]
    assert size in SIZES
    if mode == "finetune":
        path = _macro("INITIAL_CHECKPOINT_PATH")
        assert path == f"gs://t5-data/pretrained_models/t5x/t5_1_1_{size}/checkpoint_1000000"
        assert _macro("TRAIN_STEPS") > 1_000_000  # absolute: includes pretraining
    else:
        assert gin.query_parameter("utils.RestoreCheckpointConfig.path") == []


# What each of the paper's runs sets: (task, checkpoint or None, TRAIN_STEPS, evaluated split).
PAPER_SETTINGS = {
    "paper/gsm8k_t5_3b.gin": ("ntl_gsm8k_t5", "gs://t5-data/pretrained_models/t5x/t5_3B/checkpoint_1000000",
                              1_010_000, "test"),
    "paper/rjokes_t5_small.gin": ("ntl_rjokes_t5", None, 100_000, "validation"),
}


@pytest.mark.parametrize("loss", ["default", "losses/ce.gin", "losses/ntl_mse.gin", "NTL_WEIGHT=0.0"])
@pytest.mark.parametrize("name", PAPER_RUNS)
def test_paper_run_builds_its_model_and_task(gin_env, local_sentencepiece, name, loss):
    assert sorted(PAPER_SETTINGS) == PAPER_RUNS
    files, bindings, expected = LOSS_CHOICES[loss]
    model = _parse_and_build([name, *files], [*_offline_bindings(local_sentencepiece, dropout=False), *bindings])
    assert isinstance(model, ntl_models.NTLEncoderDecoderModel)
    assert (model.ntl_options["ntl_weight"], model.ntl_options["number_loss"]) == expected
    # T5.1.0's network: 3B has 24 + 24 layers of 1024, Small 6 + 6 of 512.
    config = model.module.config
    size = (24, 1024) if "3b" in name else (6, 512)
    assert (config.num_encoder_layers, config.emb_dim) == size and config.num_decoder_layers == size[0]
    assert isinstance(model.output_vocabulary, vocabularies.DigitSplitVocabulary)
    task_name, checkpoint, steps, split = PAPER_SETTINGS[name]
    task = seqio.get_mixture_or_task(_macro("MIXTURE_OR_TASK_NAME"))
    assert task.name == task_name
    assert task.output_features["targets"].vocabulary == model.output_vocabulary
    assert _macro("TRAIN_STEPS") == steps
    assert gin.query_parameter("infer_eval/utils.DatasetConfig.split") == split
    assert split in task.splits and "train" in task.splits
    if checkpoint:
        assert _macro("INITIAL_CHECKPOINT_PATH") == checkpoint
        assert gin.query_parameter("train_eval/utils.DatasetConfig.split") == split
    else:
        assert gin.query_parameter("utils.RestoreCheckpointConfig.path") == []


@pytest.mark.parametrize(
    "old, files, bindings",
    [(old, files, bindings) for old, commands in earlier_experiments().items() for files, bindings in commands],
)
def test_earlier_experiment_is_reachable(gin_env, local_sentencepiece, old, files, bindings):
    """The T5X guide's command for a removed experiment file trains what that file did."""
    if not _has_tasks():
        pytest.skip("ntl_jax.seqio.tasks is not available")
    model = _parse_and_build(files, [*_offline_bindings(local_sentencepiece, dropout=False), *bindings])
    spec, weight = EARLIER_LOSSES[re.search(r"_(ce|ntl_mse|ntl_was)\.gin$", old).group(1)]
    assert (model.ntl_options["ntl_weight"], model.ntl_options["number_loss"]) == (weight, spec)
    protocol, stem = old.split("/")[1], pathlib.Path(old).stem.rsplit("_ntl", 1)[0].removesuffix("_ce")
    size, task = ("tiny", stem) if stem.startswith("tiny_byte") else stem.split("_", 1)
    task_name, steps = EARLIER_SETTINGS[(protocol, task)]
    assert _macro("TRAIN_STEPS") == steps
    if protocol == "finetune":
        assert gin.query_parameter("task_variants.with_vocabulary.name") == task_name
        assert _macro("INITIAL_CHECKPOINT_PATH") == f"gs://t5-data/pretrained_models/t5x/t5_1_1_{size}/checkpoint_1000000"
    else:
        assert _macro("MIXTURE_OR_TASK_NAME") == task_name


def test_gin_search_path_is_the_checkout():
    assert configs.gin_search_path() == str(REPO)
    assert (CONFIGS / "models" / "t5_1_1_base_ntl.gin").is_file()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["prog", "--gin_file=a.gin"], ["prog", "--gin_search_paths=.,/cfg", "--gin_file=a.gin"]),
        (["prog", "--gin_search_paths=/x,/y", "--gin_file=a.gin"],
         ["prog", "--gin_search_paths=/x,/y,/cfg", "--gin_file=a.gin"]),
        (["prog", "--gin_search_paths", "/x", "--gin_search_paths=/z"], ["prog", "--gin_search_paths=/z,/cfg"]),
        (["prog", "--gin_search_paths=/cfg"], ["prog", "--gin_search_paths=/cfg"]),
    ],
)
def test_launcher_adds_the_search_path(argv, expected):
    assert ntl_train.with_search_path(argv, "/cfg") == expected


def test_launcher_rejects_a_dangling_flag():
    with pytest.raises(ValueError, match="expected a value"):
        ntl_train.with_search_path(["prog", "--gin_search_paths"], "/cfg")


def test_wheel_ships_the_gin_files_and_finds_them(tmp_path):
    """Build the wheel, unpack it, and resolve the configs from the unpacked package.

    Built from a copy of the source tree without `build/`: pip builds in the tree, and
    setuptools keeps what an earlier build left in `build/lib` (gin files removed since).
    """
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(REPO, source, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("ntl_jax-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    shipped = {n[len("ntl_jax/"):] for n in names if n.startswith("ntl_jax/t5x_configs/")}
    assert shipped == {f"t5x_configs/{f}" for f in ALL_FILES}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    code = "from ntl_jax.t5x import configs; print(configs.gin_search_path())"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, capture_output=True,
                         text=True)
    assert out.stdout.strip() == str(tmp_path / "site" / "ntl_jax")
    np.testing.assert_equal(len(shipped), len(ALL_FILES))


# The paper's baselines as overlays: RT with (ntl_weight, the number loss's spec), and xVal.
SYSTEMS = {"systems/rt.gin": ("_rt", (0.0, "mse")), "systems/rt_ntl.gin": ("_rt", (0.3, "mse")),
           "systems/xval.gin": ("_xval", None)}
ENCODER_DECODER_SIZES = [f for f in MODEL_FILES if "decoder_only" not in f and "byte" not in f]


def test_the_system_files_are_the_papers_baselines():
    assert SYSTEM_FILES == sorted(SYSTEMS)


@pytest.mark.parametrize("system", sorted(SYSTEMS))
@pytest.mark.parametrize("files", [[e] for e in EXPERIMENTS if "/scratch/" in e]
                         + [[m, "runs/ntl_pretrain.gin"] for m in ENCODER_DECODER_SIZES])
def test_a_system_file_turns_a_run_into_the_papers_baseline(gin_env, local_sentencepiece, files, system):
    """The RT and xVal files, after any from-scratch experiment or any T5 size with the run file."""
    if not _has_tasks():
        pytest.skip("ntl_jax.seqio.tasks is not available")
    from ntl_jax.seqio import xval as seqio_xval
    from ntl_jax.t5x import networks as ntl_networks
    from ntl_jax.t5x import xval as ntl_xval

    bindings = [*_offline_bindings(local_sentencepiece, dropout=False), "DROPOUT_RATE = 0.0"]
    if len(files) > 1:
        bindings += ["MIXTURE_OR_TASK_NAME = 'ntl_math_arithmetic_ablation'", "TRAIN_STEPS = 1"]
    model = _parse_and_build([*files, system], bindings)
    suffix, ntl = SYSTEMS[system]
    if suffix == "_rt":
        assert isinstance(model, ntl_models.NTLEncoderDecoderModel)
        assert isinstance(model.module, ntl_networks.RtTransformer)
        assert (model.ntl_options["ntl_weight"], model.ntl_options["number_loss"]) == ntl
        assert model.output_vocabulary == vocabularies.rt_vocabulary() == model.input_vocabulary
        assert model.module.config.vocab_size == 1664  # 1,550 ids rounded up to 128s
        assert model.number_tokens.num_numbers == 550  # the RT pieces, each valued at its digit
    else:
        assert isinstance(model, ntl_xval.XvalEncoderDecoderModel)
        assert isinstance(model.module, ntl_networks.XvalTransformer)
        assert model.output_vocabulary == seqio_xval.xval_vocabulary() == model.input_vocabulary
        assert model.module.config.vocab_size == 1024 and model.num_id == 1000  # 1,000 ids and [NUM]
        for scope in ("train", "train_eval"):
            assert gin.query_parameter(f"{scope}/utils.DatasetConfig.pack") is False
    base = _macro("MIXTURE_OR_TASK_NAME")
    for scope in ("train", "train_eval", "infer_eval"):
        name = _macro_value(gin.query_parameter(f"{scope}/utils.DatasetConfig.mixture_or_task_name"))
        assert name == f"{base}{suffix}"
        task = seqio.get_mixture_or_task(name)
        assert all(f.vocabulary == model.output_vocabulary for f in task.output_features.values())


def _macro_value(value):
    return value.scoped_configurable_fn() if hasattr(value, "scoped_configurable_fn") else value


FRESH_GIN = """
import importlib, json, sys
import gin
import t5x
from ntl_jax.t5x import configs
sys.modules["__main__"] = importlib.import_module("t5x.train")  # as T5X's launcher imports its configurables
for path in (configs.gin_search_path(), sys.argv[1]):
    gin.add_config_file_search_path(path)
gin.parse_config_files_and_bindings(["t5x_configs/models/t5_1_1_tiny_ntl.gin"], json.loads(sys.argv[2]),
                                    finalize_config=True)
model = gin.query_parameter("MODEL/macro.value").scoped_configurable_fn()
print(json.dumps({"options": model.ntl_options, "imported": "my_number_losses" in sys.modules}))
"""


def test_a_gin_string_names_a_loss_of_your_own_in_a_fresh_process(local_sentencepiece, tmp_path):
    """`NTL_LOSS = 'my_number_losses:scaled_gap(scale=2)'` in a process that never ran the
    loss's code: the spec names its module (tests/fixtures/own_loss_module, no entry point)."""
    own = REPO / "tests" / "fixtures" / "own_loss_module"
    bindings = [*_offline_bindings(local_sentencepiece), "NTL_LOSS = 'my_number_losses:scaled_gap(scale=2)'"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(own), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", FRESH_GIN, T5X_SEARCH_PATH, json.dumps(bindings)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.splitlines()[-1])
    assert printed == {"options": {"ntl_weight": 0.3, "number_loss": "my_number_losses:scaled_gap(scale=2.0)"},
                       "imported": True}
