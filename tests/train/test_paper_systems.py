"""The paper's comparison as one `ntl-jax compare` command: every system, paired by seed.

The committed ablation (`docs/results/ablation_add_sub_multiple.json`) is this command at
a real budget; here it runs on the micro preset, on the real generator and vocabularies.
"""

import json
import os

import pytest

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("mathematics_dataset")
pytest.importorskip("sentencepiece")

from ntl_jax import cli  # noqa: E402
from ntl_jax.train import results_table, systems  # noqa: E402

SYSTEMS = ["ce", "ntl-mse", "ntl-was", "gce", "gce+ntl-was-cdf", "rt", "rt+ntl-mse", "xval", "regression-head"]


def test_every_system_is_one_compare_command_paired_with_ce(tmp_path):
    out = str(tmp_path / "ablation")
    argv = ["compare", "--module", "arithmetic__add_sub_multiple", "--losses"] + SYSTEMS + [
        "--seeds", "1", "--steps", "2", "--preset", "micro", "--train-examples", "16", "--eval-examples", "4",
        "--batch-size", "8", "--log-every", "1", "--checkpoint-every", "2", "--no-progress", "--no-tensorboard",
        "--out", out]
    assert cli.main(argv) == 0
    result = json.load(open(os.path.join(out, "compare.json")))
    runs = {r["loss"]: r for r in result["runs"]}
    assert list(runs) == SYSTEMS  # λ is not in a label: one NTL weight
    for name, run in runs.items():
        assert run["seed"] == 0 and run["steps"] == 2
        assert run["baseline"] == (None if name == "ce" else "ce")
        # Both test splits: add_sub_multiple interpolates, _longer extrapolates.
        assert run["metrics"]["test_interpolate/num_examples"] == 4
        assert run["metrics"]["test_extrapolate/num_examples"] == 4
        config = json.load(open(os.path.join(out, run["run_dir"], "config.json")))
        assert config["loss"] == name
        assert config["ntl_weight"] == (0.3 if systems.trains_ntl(name) else 0.0) and config["seed"] == 0
    # Each system's table row is its CE-paired difference.
    for name in SYSTEMS[1:]:
        paired = result["paired"][name]["test_interpolate/log_mae"]
        assert paired["baseline"] == "ce" and paired["n"] == 1
        assert paired["mean_diff"] == pytest.approx(runs[name]["metrics"]["test_interpolate/log_mae"]
                                                    - runs["ce"]["metrics"]["test_interpolate/log_mae"])
    table = results_table.render(result)
    for name in SYSTEMS[1:]:
        assert f"| {name} − ce | interpolate/log_mae ↓ |" in table
    # The RT runs decode their own tokens back to numbers like everyone else's.
    predictions = json.load(open(os.path.join(out, runs["rt"]["run_dir"], "predictions.json")))
    assert {p["question"] for p in predictions["test_interpolate"]} == {
        p["question"] for p in json.load(open(os.path.join(out, runs["ce"]["run_dir"], "predictions.json")))[
            "test_interpolate"]}
    assert not any("_" in p["prediction"] for p in predictions["test_interpolate"])
    assert systems.vocabulary_name("rt+ntl-mse") == "rt" and systems.vocabulary_name("xval") == "default"
