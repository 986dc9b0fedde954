"""Markdown rendering of compare result files and the README blocks they fill."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ntl_jax.cli import compare as cli_compare
from ntl_jax.train import paired_stats, results_table

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "render_results.py"
ACC = "test_interpolate/number_accuracy"
LMAE = "test_interpolate/log_mae"


def tiny_result() -> dict:
    runs = [{"loss": "ce", "seed": 0, "metrics": {ACC: 0.70, LMAE: 0.20, "x/other": 1.0}},
            {"loss": "ce", "seed": 1, "metrics": {ACC: 0.50, LMAE: 0.40, "x/other": 1.0}},
            {"loss": "ntl-was", "seed": 0, "metrics": {ACC: 0.75, LMAE: 0.10, "x/other": 1.0}},
            {"loss": "ntl-was", "seed": 1, "metrics": {ACC: None, LMAE: 0.30, "x/other": 1.0}}]
    return {
        "command": "ntl-jax compare --seeds 2",
        "title": "tiny",
        "machine": "2-core CPU",
        "seconds": 754.0,
        "settings": {"seeds": 2, "fused_loss": True},
        "versions": {"jax": "0.4.30"},
        "runs": runs,
        "summary": {
            "ce": {ACC: {"mean": 0.6, "std": 0.14142, "n": 2, "values": [0.7, 0.5],
                         "seeds": [0, 1], "threshold": 0.6, "share_above": 0.5},
                   LMAE: {"mean": 0.3, "std": 0.14142, "n": 2, "values": [0.2, 0.4],
                          "seeds": [0, 1]}},
            "ntl-was": {ACC: {"mean": 0.75, "std": None, "n": 1, "values": [0.75, None],
                              "seeds": [0, 1], "threshold": 0.6, "share_above": 1.0},
                        LMAE: {"mean": 0.2, "std": 0.14142, "n": 2, "values": [0.1, 0.3],
                               "seeds": [0, 1]}},
        },
        "paired": {"ntl-was": {
            ACC: {"baseline": "ce", "n": 1, "mean_diff": 0.05, "ci95": None, "p": 1.0,
                  "p_sign": 1.0, "better": 1, "worse": 0, "ties": 0, "higher_is_better": True},
            LMAE: {"baseline": "ce", "n": 2, "mean_diff": -0.1, "ci95": [-0.1, -0.1],
                   "p": 0.5, "p_sign": 0.5, "better": 2, "worse": 0, "ties": 0,
                   "higher_is_better": False},
        }},
    }


EXPECTED = """\
**tiny**

`ntl-jax compare --seeds 2` · 2-core CPU · wall time 12.6 min

| loss | seeds | interpolate/number_accuracy (mean ± std) | interpolate/log_mae (mean ± std) |
|---|---|---|---|
| ce | 2 | 0.600 ± 0.141 | 0.300 ± 0.141 |
| ntl-was | 2 | 0.750 (n=1) | 0.200 ± 0.141 |

| variant − baseline | metric | mean diff | 95 % CI | better/worse/ties | Wilcoxon p | Holm p | sign p | verdict |
|---|---|---|---|---|---|---|---|---|
| ntl-was − ce | interpolate/number_accuracy ↑ | 0.0500 | n/a | 1/0/0 | 1.000 | 1.000 | 1.000 | too few seeds to tell |
| ntl-was − ce | interpolate/log_mae ↓ | -0.100 | [-0.100, -0.100] | 2/0/0 | 0.500 | 1.000 | 0.500 | interval excludes 0; too few seeds to test |

Paired by seed (same initialisation and data order); ↑ / ↓: higher / lower is better; \
better/worse/ties count seeds; 95 % CI: Student t interval of the mean difference \
(n − 1 degrees of freedom), for each comparison alone; p: exact two-sided tests; Holm p: \
the Wilcoxon p adjusted by Holm's step-down method over the 2 comparisons of this table; \
verdict: better or worse where Holm p < 0.05; "interval excludes 0" where the interval alone \
would call it and the verdict does not, with why: Holm's adjustment over the family, a Wilcoxon \
p ≥ 0.05, or too few seeds; "too few seeds to tell" where fewer than 6 seeds differ (the exact \
tests cannot then reach p < 0.05: their smallest p is 2/2^n ≥ 0.0625).

Share of seeds above a threshold (on these tasks a run's accuracy tends to end either low or high, \
depending on its seed: this counts the seeds that ended high):

| loss | metric | threshold | share of seeds |
|---|---|---|---|
| ce | interpolate/number_accuracy | > 0.600 | 0.500 (1/2) |
| ntl-was | interpolate/number_accuracy | > 0.600 | 1.00 (1/1) |"""


def test_render_tiny_case():
    assert results_table.render(tiny_result()) == EXPECTED


def test_render_table_metrics_and_formatting():
    result = tiny_result() | {"table_metrics": ["x/other"]}
    del result["runs"]  # without runs, the file's "paired" is rendered
    result["summary"]["ce"]["x/other"] = {"mean": 12345.6, "std": 0.00012, "n": 2,
                                          "values": [1, 1], "seeds": [0, 1]}
    result["paired"]["ntl-was"]["x/other"] = {
        "baseline": "ce", "n": 2, "mean_diff": 0.0312, "ci95": [-0.0004, 0.07], "p": 0.0004,
        "p_sign": 0.03125, "better": 1, "worse": 1, "ties": 0, "higher_is_better": None}
    text = results_table.render(result)
    assert "| ce | 2 | 1.23e+04 ± 0.000120 |" in text
    assert "| ntl-was | 2 | n/a |" in text
    assert ("| ntl-was − ce | x/other | 0.0312 | [-0.000400, 0.0700] | 1/1/0 | <0.001 | <0.001 | 0.031 "
            "| too few seeds to tell |") in text
    assert "over the 1 comparison of this table" in text
    assert "interpolate" not in text
    assert "Share of seeds" not in text


def test_a_mean_difference_that_cancels_to_a_rounding_trace_reads_as_zero():
    # Accuracies on 500 problems: +0.002, -0.002 and 0 differences, whose float mean is not 0.
    d = np.array([0.018 - 0.016, 0.014 - 0.016, 0.016 - 0.016])
    assert d.mean() != 0 and abs(d.mean()) < 1e-17
    assert results_table.fmt(d.mean()) == "0"
    # One rule for every number: three significant figures, trailing zeros kept.
    assert [results_table.fmt(x) for x in (2e-9, -0.0004, 0.0312, 12345.6, 0.000244, 0.004, -8.455, 123.4)] == [
        "2.00e-09", "-0.000400", "0.0312", "1.23e+04", "0.000244", "0.00400", "-8.46", "123"]


def test_wall_time_counts_the_invocations_that_trained_the_reused_runs():
    result = tiny_result() | {"seconds": 4.0, "earlier_seconds": [600.0, 356.0],
                              "reused_runs": 3, "total_runs": 4, "run_seconds": 1662.0}
    assert ("· wall time 16.0 min over 3 invocations (3 of 4 runs finished by an earlier "
            "invocation), training time of all runs 27.7 min") in results_table.render(result)


def test_earlier_wall_times_come_from_the_previous_file_of_the_same_comparison(tmp_path):
    path = tmp_path / "compare.json"
    new = {"title": "t", "reused_runs": 2, "seconds": 3.0}
    assert cli_compare._earlier_seconds(str(path), new) == []  # no previous file
    path.write_text(json.dumps({"title": "t", "seconds": 900.0, "earlier_seconds": [60.0]}))
    assert cli_compare._earlier_seconds(str(path), new) == [60.0, 900.0]
    assert cli_compare._earlier_seconds(str(path), new | {"reused_runs": 0}) == []
    assert cli_compare._earlier_seconds(str(path), new | {"title": "other"}) == []


def _entry(n, p, mean_diff, higher=True, ties=0):
    return {"n": n, "ties": ties, "p": p, "mean_diff": mean_diff, "higher_is_better": higher}


@pytest.mark.parametrize("entry, p_holm, expected", [
    (_entry(10, 0.002, 0.02), None, "better (p < 0.05)"),
    (_entry(10, 0.002, 0.02), 0.012, "better (Holm p < 0.05)"),
    (_entry(10, 0.002, -0.02), 0.012, "worse (Holm p < 0.05)"),
    (_entry(10, 0.002, -0.02, higher=False), 0.012, "better (Holm p < 0.05)"),
    (_entry(10, 0.002, 0.02, higher=False), 0.012, "worse (Holm p < 0.05)"),
    (_entry(10, 0.002, 0.02, higher=None), 0.012, "higher (Holm p < 0.05)"),
    (_entry(10, 0.002, -0.02, higher=None), 0.012, "lower (Holm p < 0.05)"),
    (_entry(10, 0.01, 0.02), 0.06, "not distinguishable from zero"),  # significant alone only
    # The verdict and the comparison's own interval tell one story.
    (_entry(10, 0.01, 0.02) | {"ci95": [0.004, 0.036]}, 0.06, "interval excludes 0; not called after Holm"),
    (_entry(10, 0.08, 0.02) | {"ci95": [0.004, 0.036]}, 0.4, "interval excludes 0; not called (Wilcoxon p ≥ 0.05)"),
    (_entry(10, 0.08, 0.02) | {"ci95": [0.004, 0.036]}, None, "interval excludes 0; not called (Wilcoxon p ≥ 0.05)"),
    (_entry(10, 0.01, 0.02) | {"ci95": [-0.004, 0.036]}, 0.06, "not distinguishable from zero"),
    (_entry(10, 0.002, 0.02) | {"ci95": [-0.004, 0.036]}, 0.012, "better (Holm p < 0.05); interval includes 0"),
    (_entry(10, 0.002, 0.02) | {"ci95": [0.004, 0.036]}, 0.012, "better (Holm p < 0.05)"),
    (_entry(5, 0.0625, -0.02) | {"ci95": [-0.036, -0.004]}, None, "interval excludes 0; too few seeds to test"),
    (_entry(10, 0.05, 0.02), None, "not distinguishable from zero"),
    (_entry(6, 0.03125, 0.02), None, "better (p < 0.05)"),            # 6 pairs can reach 1/32
    (_entry(5, 0.0625, 0.02), None, "too few seeds to tell"),         # 5 cannot: 1/16 at best
    (_entry(5, 0.0625, 0.02), 0.0, "too few seeds to tell"),          # whatever p says
    (_entry(8, 0.03125, 0.02, ties=3), None, "too few seeds to tell"),  # 5 untied pairs
    (_entry(1, 1.0, 0.3), None, "too few seeds to tell"),
    (_entry(10, 1.0, 0.0, ties=10), None, "identical in every seed"),
    ({"n": 0, "ci95": None}, None, "no paired seeds"),
])
def test_verdict_from_the_exact_test_and_the_number_of_pairs(entry, p_holm, expected):
    assert results_table.verdict(entry, p_holm) == expected


def test_a_verdict_not_called_after_holm_names_the_family():
    entry = _entry(10, 0.01, 0.02) | {"ci95": [0.004, 0.036]}
    assert results_table.verdict(entry, 0.06, 28) == "interval excludes 0; not called after Holm over 28"


def _holm_by_hand(p):
    """Holm from its definition: sort, multiply the i-th smallest (0-based) by m - i, cap
    at 1, then carry the running maximum up the sorted order."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    adjusted, running = [0.0] * len(p), 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[k]))
        adjusted[k] = running
    return adjusted


def test_render_known_fixture_t_intervals_and_holm():
    stats = pytest.importorskip("scipy.stats")
    shifts = {  # per variant and metric, the difference to CE in seeds 0..7
        ("ntl-was", ACC): [0.011, 0.023, 0.017, 0.031, 0.008, 0.026, 0.014, 0.020],   # 8 of 8 up
        ("ntl-was", LMAE): [-0.05, 0.02, -0.03, -0.07, 0.01, -0.04, -0.06, -0.08],
        ("ntl-mse", ACC): [0.010, -0.020, 0.015, -0.005, 0.030, -0.012, 0.004, -0.025],
        ("ntl-mse", LMAE): [0.03, 0.05, 0.02, 0.04, 0.06, 0.01, 0.07, 0.045],          # 8 of 8 up
    }
    ce = {ACC: [0.50, 0.42, 0.61, 0.55, 0.47, 0.58, 0.44, 0.52],
          LMAE: [0.30, 0.35, 0.22, 0.28, 0.33, 0.25, 0.31, 0.27]}
    runs = [{"loss": "ce", "seed": s, "metrics": {m: ce[m][s] for m in ce}} for s in range(8)]
    for variant in ("ntl-was", "ntl-mse"):
        runs += [{"loss": variant, "seed": s,
                  "metrics": {m: ce[m][s] + shifts[variant, m][s] for m in ce}} for s in range(8)]
    result = {"command": "ntl-jax compare", "runs": runs, "table_metrics": [ACC, LMAE],
              "summary": paired_stats.describe(runs), "settings": {"fused_loss": True}}
    text = results_table.render(result)

    keys = list(shifts)
    diffs = {k: np.array([r["metrics"][k[1]] for r in runs if r["loss"] == k[0]])
             - np.array(ce[k[1]]) for k in keys}
    p = {k: stats.wilcoxon(diffs[k], method="exact").pvalue for k in keys}
    holm = dict(zip(keys, _holm_by_hand([p[k] for k in keys])))
    # the two all-positive comparisons: p = 2/2^8 each; Holm multiplies the smaller by 4
    assert p["ntl-was", ACC] == p["ntl-mse", LMAE] == pytest.approx(2 / 256)
    assert holm["ntl-was", ACC] == holm["ntl-mse", LMAE] == pytest.approx(4 * 2 / 256)
    verdicts = {("ntl-was", ACC): "better (Holm p < 0.05)",
                ("ntl-was", LMAE): "interval excludes 0; not called after Holm over 4",  # p 0.039 alone
                ("ntl-mse", ACC): "not distinguishable from zero",
                ("ntl-mse", LMAE): "worse (Holm p < 0.05)"}
    for variant, metric in keys:
        d = diffs[variant, metric]
        lo, hi = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
        up, down = int(np.sum(d > 0)), int(np.sum(d < 0))
        better, worse = (up, down) if metric == ACC else (down, up)
        arrow = " ↑" if metric == ACC else " ↓"
        row = (f"| {variant} − ce | {results_table.metric_title(metric)}{arrow} | "
               f"{results_table.fmt(d.mean())} | [{results_table.fmt(lo)}, {results_table.fmt(hi)}] "
               f"| {better}/{worse}/0 | {results_table.fmt_p(p[variant, metric])} "
               f"| {results_table.fmt_p(holm[variant, metric])} "
               f"| {results_table.fmt_p(stats.binomtest(up, up + down).pvalue)} "
               f"| {verdicts[variant, metric]} |")
        assert row in text, row
    # by hand: mean 0.01875, sd 0.0077782, sem 0.00275, t(0.975, 7) = 2.3646: 0.01875 -/+ 0.0065
    assert "| ntl-was − ce | interpolate/number_accuracy ↑ | 0.0188 | [0.0122, 0.0253] |" in text
    assert "over the 4 comparisons of this table" in text


def test_render_recomputes_the_paired_statistics_from_the_runs():
    result = tiny_result()
    result["paired"]["ntl-was"][LMAE]["ci95"] = [-0.5, 0.5]  # an interval of an older method
    text = results_table.render(result)
    assert "[-0.100, -0.100]" in text and "[-0.500, 0.500]" not in text
    del result["runs"]
    assert "[-0.500, 0.500]" in results_table.render(result)


def test_seed_lines_join_each_seeds_runs_across_the_losses():
    lines = cli_compare.seed_lines(tiny_result(), ACC, ["ce", "ntl-was"])
    assert lines[0] == ([-0.15, 0.85], [0.7, 0.75])
    assert lines[1][0] == [0.15, 1.15]
    assert lines[1][1][0] == 0.5 and np.isnan(lines[1][1][1])   # missing: the line breaks
    only = tiny_result()
    only["summary"]["ce"][ACC] |= {"seeds": [3], "values": [0.7]}
    assert cli_compare.seed_lines(only, ACC, ["ce"]) == {3: ([0.0], [0.7])}


def test_render_of_computed_statistics_is_strict_json_and_consistent():
    runs = tiny_result()["runs"]
    result = tiny_result() | {"paired": paired_stats.paired_comparison(runs),
                              "summary": paired_stats.describe(runs, thresholds={ACC: 0.6})}
    json.loads(json.dumps(result, allow_nan=False))
    text = results_table.render(result)
    assert "| ntl-was | 2 | 0.750 (n=1) | 0.200 ± 0.141 |" in text
    assert ("| ntl-was − ce | interpolate/log_mae ↓ | -0.100 | [-0.100, -0.100] | 2/0/0 |"
            in text)


def _write(tmp_path, readme_text, results=("tiny",)):
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    for name in results:
        (results_dir / f"{name}.json").write_text(json.dumps(tiny_result()))
    readme = tmp_path / "README.md"
    readme.write_text(readme_text)
    return readme, results_dir


# After each block, a link to its file, relative to the page beside the results directory.
LINK = "\n\nEvery run's numbers: [`tiny.json`](results/tiny.json).\n"

README = """\
# Title

Intro.

<!-- results:tiny -->
old table
<!-- /results:tiny -->

Outro.
"""


def test_update_readme_replaces_only_the_block(tmp_path):
    _, results_dir = _write(tmp_path, README)
    new = results_table.update_readme(README, str(results_dir))
    assert new == README.replace("old table\n", EXPECTED + LINK)
    assert results_table.update_readme(new, str(results_dir)) == new
    assert results_table.stale_blocks(README, str(results_dir)) == ["tiny"]
    assert results_table.stale_blocks(new, str(results_dir)) == []


def test_update_readme_errors_name_the_block(tmp_path):
    _, results_dir = _write(tmp_path, README)
    with pytest.raises(results_table.ResultsError, match="'missing'.*missing.json"):
        results_table.update_readme("<!-- results:missing -->\n<!-- /results:missing -->",
                                    str(results_dir))
    with pytest.raises(results_table.ResultsError, match="no closing"):
        results_table.update_readme("<!-- results:tiny -->\n", str(results_dir))


def _script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_script_check_and_rewrite(tmp_path):
    readme, results_dir = _write(tmp_path, README)
    args = ("--readme", readme, "--results", results_dir)
    check = _script(*args, "--check")
    assert check.returncode == 1
    assert "tiny" in check.stderr
    assert readme.read_text() == README                 # --check writes nothing

    assert _script(*args).returncode == 0
    assert readme.read_text() == README.replace("old table\n", EXPECTED + LINK)
    check = _script(*args, "--check")
    assert (check.returncode, check.stderr) == (0, "")

    readme.write_text(README + "<!-- results:gone -->\n<!-- /results:gone -->\n")
    missing = _script(*args)
    assert missing.returncode == 2
    assert "gone" in missing.stderr


def test_script_refresh_paired_recomputes_the_files_paired_section(tmp_path):
    readme, results_dir = _write(tmp_path, README)
    path = results_dir / "tiny.json"
    stale = tiny_result()
    stale["paired"]["ntl-was"][LMAE]["ci95"] = [-0.5, 0.5]
    path.write_text(json.dumps(stale))
    args = ("--readme", readme, "--results", results_dir)
    assert _script(*args, "--check", "--refresh-paired").returncode == 2
    done = _script(*args, "--refresh-paired")
    assert done.returncode == 0 and "tiny.json: recomputed" in done.stdout
    refreshed = json.loads(path.read_text())
    runs = tiny_result()["runs"]
    assert refreshed["paired"] == json.loads(json.dumps(paired_stats.paired_comparison(
        runs, metrics=sorted({m for r in runs for m in r["metrics"]}))))
    assert refreshed["paired"]["ntl-was"][LMAE]["ci95"] == pytest.approx([-0.1, -0.1])
    assert {k: v for k, v in refreshed.items() if k != "paired"} == {
        k: v for k, v in stale.items() if k != "paired"}
    assert readme.read_text() == README.replace("old table\n", EXPECTED + LINK)
    again = _script(*args, "--refresh-paired")  # nothing left to change
    assert again.returncode == 0 and again.stdout == ""


def test_runs_from_before_the_fused_loss_say_which_version_repeats_them():
    result = tiny_result()
    del result["settings"]["fused_loss"]
    assert ("Trained by an earlier ntl-jax from the logits, before `--fused-loss` became the default: "
            "`--no-fused-loss` repeats these settings, but not these runs") in results_table.render(result)
    result["versions"] = {"ntl-jax": "0.1.0"}
    assert "Trained by ntl-jax 0.1.0 from the logits" in results_table.render(result)
    assert "repeating them takes ntl-jax 0.1.0." in results_table.render(result)
    assert "--no-fused-loss" not in results_table.render(tiny_result())


def test_against_pairs_every_loss_with_another_baseline_by_seed():
    stats = pytest.importorskip("scipy.stats")
    path = ROOT / "docs" / "results" / "diabetes.json"
    result = results_table.load(str(path))
    shown = results_table.against(result, "regression-head")
    metric = "test_interpolate/rmse"
    head = {r["seed"]: r["metrics"][metric] for r in result["runs"] if r["loss"] == "regression-head"}
    for loss in ("ce", "ntl-was", "ntl-mse"):
        d = np.array([r["metrics"][metric] - head[r["seed"]] for r in result["runs"] if r["loss"] == loss])
        entry = shown["paired"][loss][metric]
        assert entry["baseline"] == "regression-head" and entry["n"] == len(d) == 10
        assert entry["mean_diff"] == pytest.approx(d.mean(), rel=1e-12)
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        assert entry["ci95"] == pytest.approx([d.mean() - half, d.mean() + half], rel=1e-9)
    assert "regression-head" not in shown["paired"]
    assert result["paired"]["ntl-mse"][metric]["baseline"] == "ce"  # the file itself is unchanged
    with pytest.raises(results_table.ResultsError, match="expected a baseline among the runs' losses .*got 'head'"):
        results_table.against(result, "head")
    shown_by_script = _script("--show", path, "--against", "regression-head")
    assert shown_by_script.returncode == 0, shown_by_script.stderr
    assert "| ntl-mse − regression-head | interpolate/rmse ↓ |" in shown_by_script.stdout
    bad = _script("--show", path, "--against", "head")
    assert bad.returncode == 2 and "got 'head'" in bad.stderr


def test_also_against_pairs_every_other_loss_with_it_in_one_holm_family():
    stats = pytest.importorskip("scipy.stats")
    ce = [0.50, 0.42, 0.61, 0.55, 0.47, 0.58, 0.44, 0.52]
    shift = {"ntl-was": [0.011, 0.023, 0.017, 0.031, 0.008, 0.026, 0.014, 0.020],
             "del": [0.001, -0.002, 0.003, 0.0, 0.004, -0.001, 0.002, 0.005]}
    runs = [{"loss": "ce", "seed": s, "metrics": {ACC: ce[s]}} for s in range(8)]
    runs += [{"loss": loss, "seed": s, "baseline": "ce", "metrics": {ACC: ce[s] + d[s]}}
             for loss, d in shift.items() for s in range(8)]
    result = {"command": "c", "runs": runs, "table_metrics": [ACC], "summary": paired_stats.describe(runs),
              "settings": {"fused_loss": True, "also_against": ["ntl-was"]}}
    text = results_table.render(result)
    d = np.subtract(shift["del"], shift["ntl-was"])  # del − ntl-was, seed by seed
    p = [stats.wilcoxon(shift["ntl-was"], method="exact").pvalue,
         stats.wilcoxon(shift["del"]).pvalue, stats.wilcoxon(d, method="exact").pvalue]
    assert "| del − ntl-was | interpolate/number_accuracy ↑ | " + results_table.fmt(d.mean()) in text
    assert f"| 0/8/0 | {results_table.fmt_p(p[2])} | {results_table.fmt_p(_holm_by_hand(p)[2])} |" in text
    assert "ce − ntl-was" not in text and "ntl-was − ntl-was" not in text
    assert "over the 3 comparisons of this table" in text
    result["settings"]["also_against"] = ["dist2"]
    with pytest.raises(results_table.ResultsError, match=r"losses \['ce', 'del', 'ntl-was'\], got \['dist2'\]"):
        results_table.render(result)


def test_a_declared_primary_metric_is_the_holm_family_and_the_others_are_not_called():
    stats = pytest.importorskip("scipy.stats")
    ce = [0.50, 0.42, 0.61, 0.55, 0.47, 0.58, 0.44, 0.52]
    shift = {"ntl-was": [0.011, 0.023, 0.017, 0.031, 0.008, 0.026, 0.014, 0.020],   # 8 of 8 up
             "del": [0.001, -0.0022, 0.003, 0.004, 0.005, -0.0015, 0.0025, 0.006]}
    lmae = [0.30, 0.35, 0.22, 0.28, 0.33, 0.25, 0.31, 0.27]
    runs = [{"loss": "ce", "seed": s, "metrics": {ACC: ce[s], LMAE: lmae[s]}} for s in range(8)]
    runs += [{"loss": loss, "seed": s, "metrics": {ACC: ce[s] + d[s], LMAE: lmae[s] - 0.01 * (s + 1)}}
             for loss, d in shift.items() for s in range(8)]
    result = {"command": "c", "runs": runs, "table_metrics": [ACC, LMAE], "primary_metric": ACC,
              "summary": paired_stats.describe(runs), "settings": {"fused_loss": True}}
    text = results_table.render(result)
    d = {loss: np.array([r["metrics"][ACC] for r in runs if r["loss"] == loss]) - ce for loss in shift}
    p = [stats.wilcoxon(d[loss], method="exact").pvalue for loss in ("ntl-was", "del")]
    holm = _holm_by_hand(p)  # the two accuracy comparisons alone
    assert holm[0] == pytest.approx(2 * 2 / 256)
    for loss, p_one, p_holm, verdict in zip(("ntl-was", "del"), p, holm,
                                            ("better (Holm p < 0.05)", "not distinguishable from zero")):
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {loss} − ce | {results_table.metric_title(ACC)} ↑ |"))
        assert row.endswith(f"| {results_table.fmt_p(p_one)} | {results_table.fmt_p(p_holm)} | "
                            f"{row.split(' | ')[-2]} | {verdict} |"), row
        # log-MAE lower in every seed (p = 2/256): shown, not adjusted, not called
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {loss} − ce | {results_table.metric_title(LMAE)} ↓ |"))
        assert f"| 8/0/0 | {results_table.fmt_p(2 / 256)} | — |" in row and row.endswith("| secondary: not called |")
    assert f"over the 2 comparisons of {results_table.metric_title(ACC)}, the metric declared primary" in text
