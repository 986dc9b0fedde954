"""`scripts/pick_weights.py`: each swept loss's weight (and GCE's σ) with the best mean validation metric."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "pick_weights.py"
spec = importlib.util.spec_from_file_location("pick_weights", SCRIPT)
pick_weights = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pick_weights)

ACC = "validation/number_accuracy"


def _run(loss, weight, seed, acc, sigma=None):
    return {"loss": f"{loss} λ={weight:g}", "loss_function": loss, "ntl_weight": weight, "seed": seed,
            "gce_sigma": sigma, "metrics": {ACC: acc}}


def test_the_best_mean_over_seeds_wins_and_ties_go_to_the_smaller_weight(tmp_path, capsys):
    runs = [{"loss": "ce", "loss_function": "ce", "ntl_weight": 0.0, "seed": s, "metrics": {ACC: 0.9}}
            for s in range(3)]
    runs += [_run("del", 0.001, s, a) for s, a in enumerate([0.10, 0.20, 0.30])]   # mean 0.20
    runs += [_run("del", 0.01, s, a) for s, a in enumerate([0.35, 0.05, 0.23])]    # mean 0.21
    runs += [_run("del", 0.1, s, a) for s, a in enumerate([0.00, 0.00, 0.60])]     # mean 0.20
    runs += [_run("dist2", w, s, 0.5) for w in (0.3, 0.03) for s in range(3)]      # a tie
    runs += [_run("dist2", 0.1, s, a) for s, a in enumerate([0.5, 0.5, None])]     # mean 0.5 of 2
    runs += [_run("ntl-was", w, s, a) for w, a in ((0.1, 0.3), (1.0, 0.4)) for s in range(3)]
    runs += [_run("gce", 0.0, s, a, sigma) for sigma, a in ((0.5, 0.6), (2.0, 0.2)) for s in range(3)]
    runs += [_run("gce+ntl-was", w, 0, a, sigma) for w, sigma, a in ((0.1, 2.0, 0.3), (1.0, 0.5, 0.1))]
    assert pick_weights.pick({"runs": runs}, ACC) == {
        "del": (("ntl_weight", 0.01),), "dist2": (("ntl_weight", 0.03),),
        "ntl-was": (("ntl_weight", 1.0),), "gce": (("gce_sigma", 0.5),),
        "gce+ntl-was": (("ntl_weight", 0.1), ("gce_sigma", 2.0))}
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"runs": runs}))
    assert pick_weights.main([str(path)]) == 0
    assert capsys.readouterr().out == ("--ntl-weight del=0.01 --ntl-weight dist2=0.03 --ntl-weight ntl-was=1 "
                                       "--gce-sigma 0.5 --ntl-weight gce+ntl-was=0.1 --gce-sigma 2\n")
    with pytest.raises(ValueError, match="expected swept runs with the metric 'validation/mape', found none"):
        pick_weights.pick({"runs": runs}, "validation/mape")


def test_an_error_metric_picks_the_lowest_mean_and_an_unknown_one_is_refused():
    runs = [dict(_run("ntl-was", w, s, None), metrics={"validation/log_mae": e, "validation/x": 1.0})
            for w, e in ((0.1, 0.30), (0.3, 0.10), (1.0, 0.20)) for s in range(2)]
    assert pick_weights.pick({"runs": runs}, "validation/log_mae") == {"ntl-was": (("ntl_weight", 0.3),)}
    with pytest.raises(ValueError, match="better direction is known .* got 'validation/x'"):
        pick_weights.pick({"runs": runs}, "validation/x")
