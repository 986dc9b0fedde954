"""SeqIO tasks: every registered task and split iterates, from files and on the fly."""

import numpy as np
import pytest

seqio = pytest.importorskip("seqio")
pytest.importorskip("mathematics_dataset")

from ntl_jax import NumberTokens  # noqa: E402
from ntl_jax.data import (
    catalogue,  # noqa: E402
    generate,  # noqa: E402
)
from ntl_jax.seqio import tasks, vocabularies  # noqa: E402  (tasks registers the tasks)
from tests.grid import LONG  # noqa: E402

LENGTHS = {"inputs": 96, "targets": 16}


def _first(name, split, n=1):
    ds = seqio.get_mixture_or_task(name).get_dataset(
        sequence_length=LENGTHS, split=split, shuffle=False, num_epochs=1)
    return list(ds.take(n).as_numpy_iterator())


def test_names_and_splits():
    names = set(tasks.REGISTERED)
    # 56 modules + 14 extrapolation-only sets + the ablation task, on four vocabularies;
    # 2 mixtures each.
    assert len(names) == 4 * (56 + 14 + 1) + 8
    for module in catalogue.TRAIN_MODULES:
        assert {f"ntl_math_{module}{suffix}" for suffix in ("", "_byte", "_rt", "_xval")} <= names
    add = seqio.get_mixture_or_task("ntl_math_arithmetic__add_sub_multiple")
    assert list(add.splits) == ["train", "validation", "test_interpolate", "test_extrapolate"]
    assert list(seqio.get_mixture_or_task("ntl_math_algebra__linear_1d").splits) == [
        "train", "validation", "test_interpolate"]
    assert list(seqio.get_mixture_or_task("ntl_math_arithmetic__mixed_longer").splits) == ["test_extrapolate"]
    paper13 = seqio.get_mixture_or_task("ntl_math_paper13")
    extrap = [t for t in paper13.tasks if "test_extrapolate" in t.splits]
    assert len(extrap) == 7 and len([t for t in paper13.tasks if "train" in t.splits]) == 13
    assert add.output_features["targets"].vocabulary == vocabularies.sentencepiece_vocabulary()
    assert [t.name for t in seqio.get_mixture_or_task("ntl_math_arithmetic_ablation_byte").tasks] == [
        "ntl_math_ablation__arithmetic__add_sub_multiple_byte"]


def _every_task():
    """Each registered task; of the byte-, RT- and xVal-vocabulary twins (the same
    generators read through another vocabulary) one of each runs by default, every one
    with --long."""
    names = sorted(tasks.REGISTERED)
    twins = [name for suffix in ("_byte", "_rt", "_xval") for name in [n for n in names if n.endswith(suffix)][1:]]
    return [pytest.param(name, marks=LONG if name in twins else ()) for name in names]


# The task whose every split is read by default. A task's train, validation and
# test_interpolate splits run one generator at other difficulties, and its test_extrapolate
# split the generator of an extrapolation module, which has a task of its own: so by default
# each other task reads its first split alone, and every split with --long.
EVERY_SPLIT = "ntl_math_arithmetic__add_sub_multiple"


@pytest.mark.parametrize("name", _every_task())
def test_every_task_iterates_on_the_fly(name, request):
    provider = seqio.get_mixture_or_task(name)
    splits = provider.splits if hasattr(provider, "splits") else catalogue.SPLITS
    if isinstance(provider, seqio.Mixture):
        splits = sorted({s for t in provider.tasks for s in t.splits})
    if name != EVERY_SPLIT and not request.config.getoption("--long"):
        splits = list(splits)[:1]
    for split in splits:
        (ex,) = _first(name, split)
        assert ex["targets"][-1] == 1 and ex["inputs"][-1] == 1  # EOS
        assert len(ex["targets"]) >= 2


def test_generated_examples_match_the_task_and_digits_are_tokens():
    (ex,) = _first("ntl_math_arithmetic__add_sub_multiple", "test_extrapolate")
    q, a = generate.examples("arithmetic__add_sub_multiple", "test_extrapolate", 1)[0]
    assert ex["inputs_pretokenized"].decode() == q and ex["targets_pretokenized"].decode() == a
    v = vocabularies.sentencepiece_vocabulary()
    assert v.decode(ex["targets"].tolist()) == a
    nt = NumberTokens.from_vocabulary(v)
    digits = [c for c in a if c.isdigit()]
    values = np.asarray(nt.values)[ex["targets"]]
    assert values[~np.isnan(values)].tolist() == [float(c) for c in digits]
    (bex,) = _first("ntl_math_arithmetic__add_sub_multiple_byte", "test_extrapolate")
    assert bex["targets"].tolist() == [b + 3 for b in a.encode()] + [1]  # bytes + 3, EOS


def test_rt_tasks_write_each_digit_with_its_place():
    (ex,) = _first("ntl_math_arithmetic__add_sub_multiple_rt", "test_extrapolate")
    q, a = generate.examples("arithmetic__add_sub_multiple", "test_extrapolate", 1)[0]
    v = vocabularies.rt_vocabulary()
    assert seqio.get_mixture_or_task("ntl_math_arithmetic__add_sub_multiple_rt").output_features[
        "targets"].vocabulary == v
    assert ex["targets"].tolist() == v.rt.encode(a) + [1] and ex["inputs"].tolist() == v.rt.encode(q) + [1]
    assert v.decode(ex["targets"].tolist()) == a
    values = np.asarray(v.number_tokens().values)[ex["targets"]]
    assert values[~np.isnan(values)].tolist() == [float(c) for c in a if c.isdigit()]
    assert [t.name for t in seqio.get_mixture_or_task("ntl_math_arithmetic_ablation_rt").tasks] == [
        "ntl_math_ablation__arithmetic__add_sub_multiple_rt"]


def test_xval_tasks_write_each_number_as_num_with_its_scale():
    from ntl_jax.data.number_scaling import scale_values
    from ntl_jax.data.xval_vocabulary import extract_numbers
    from ntl_jax.seqio import xval

    (ex,) = _first("ntl_math_arithmetic__add_sub_multiple_xval", "test_extrapolate")
    q, a = generate.examples("arithmetic__add_sub_multiple", "test_extrapolate", 1)[0]
    v = xval.xval_vocabulary()
    for name, text in (("inputs", q), ("targets", a)):
        ids, values = v.codec.encode(text)
        assert ex[name].tolist() == ids + [1]
        is_num = ex[name] == v.num_id
        assert is_num.sum() == len(extract_numbers(text)[1]) >= 1
        np.testing.assert_allclose(ex[f"{name}_scale"][is_num], scale_values(values[~np.isnan(values)]), rtol=1e-6)
        assert (ex[f"{name}_scale"][~is_num] == 1).all()
    assert [t.name for t in seqio.get_mixture_or_task("ntl_math_arithmetic_ablation_xval").tasks] == [
        "ntl_math_ablation__arithmetic__add_sub_multiple_xval"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny release files for the paper's 13 modules and the ablation, with the same
    seed as on-the-fly generation: 2 pairs per difficulty, 1 per test file."""
    root = str(tmp_path_factory.mktemp("math"))
    train, extra = catalogue.select_modules("paper13")
    generate.write_release(root, train, extra, per_train_module=6, per_test_module=1,
                           workers=1, progress=False)
    names = tasks.register_tasks(root, prefix="files_math", validation_per_difficulty=1,
                                 ablation_train_per_difficulty=1,
                                 ablation_validation_per_difficulty=1)
    return root, names


@pytest.mark.parametrize("mixture", ["files_math_paper13", "files_math_arithmetic_ablation",
                                     # the same files through the byte vocabulary
                                     pytest.param("files_math_paper13_byte", marks=LONG)])
def test_file_tasks_iterate_every_split(files, mixture):
    for task in seqio.get_mixture_or_task(mixture).tasks:
        for split in task.splits:
            assert _first(task.name, split), (task.name, split)


def test_file_splits_equal_on_the_fly_splits(files):
    # validation = the head of each difficulty file; train = the rest, in turn.
    m = "arithmetic__add_or_sub"
    got = {s: [(e["inputs_pretokenized"].decode(), e["targets_pretokenized"].decode())
               for e in _first(f"files_math_{m}", s, n=10)]
           for s in ("train", "validation", "test_interpolate", "test_extrapolate")}
    sizes = dict(validation_per_difficulty=1, train_per_difficulty=2, test_size=1)
    for split, pairs in got.items():
        assert pairs == generate.examples(m, split, 10, **sizes), split
    # ablation with 1 training pair per difficulty: validation is pair 1 of each file
    abl = [(e["inputs_pretokenized"].decode(), e["targets_pretokenized"].decode())
           for e in _first("files_math_ablation__arithmetic__add_sub_multiple", "validation", 5)]
    assert abl == [generate.sample(catalogue.ABLATION_MODULE, r, 1) for r in catalogue.TRAIN_REGIMES]


def test_missing_files_name_layout_and_command(files, tmp_path):
    tasks.register_tasks(str(tmp_path / "absent"), prefix="absent_math")
    with pytest.raises(FileNotFoundError, match="ntl-jax generate --output-dir .*absent --modules arithmetic__mul"):
        _first("absent_math_arithmetic__mul", "train")
    with pytest.raises(FileNotFoundError, match="train-easy/<module>.txt"):
        _first("absent_math_arithmetic__mul_byte", "test_extrapolate")


def test_malformed_file_names_file_and_line(tmp_path):
    tf = pytest.importorskip("tensorflow")
    root = tmp_path / "bad"
    for regime in catalogue.TRAIN_REGIMES:
        (root / regime).mkdir(parents=True)
        (root / regime / "numbers__gcd.txt").write_text("q1\na1\nq2\n")
    tasks.register_tasks(str(root), prefix="bad_math", validation_per_difficulty=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"numbers__gcd.txt:3: question without an answer"):
        _first("bad_math_numbers__gcd", "train", n=10)


def test_metric_fns_are_seqio_predict_metrics():
    task = seqio.get_mixture_or_task("ntl_math_arithmetic__mul")
    fns = task.predict_metric_fns
    assert len(fns) == 2
    merged = {}
    for fn in fns:
        merged.update(fn(["12", "-3"], ["12", "-4"]))
    assert merged["exact_match"] == 0.5 and merged["number_accuracy"] == 0.5
    assert merged["mae"] == pytest.approx(0.5)
    assert task.postprocess_fn(" 12 \n") == "12"


def test_environment_variable_selects_files(tmp_path):
    import os
    import subprocess
    import sys

    # Read when the tasks register, on import: set, in a process of its own; unset, here.
    code = ("import ntl_jax.seqio.tasks, seqio; "
            "print(type(seqio.get_mixture_or_task('ntl_math_numbers__gcd').source).__name__)")
    env = dict(os.environ, NTL_JAX_MATH_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "MathFileDataSource"
    assert tasks.DATA_DIR_ENV not in os.environ, "the tests read the on-the-fly tasks: unset NTL_JAX_MATH_DIR"
    assert type(seqio.get_mixture_or_task("ntl_math_numbers__gcd").source).__name__ == "FunctionDataSource"
