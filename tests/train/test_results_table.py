"""Markdown rendering of compare result files and the README blocks they fill."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ntl_jax.train import cli_compare, paired_stats, results_table

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
            ACC: {"baseline": "ce", "n": 1, "mean_diff": 0.05, "ci95": [0.05, 0.05], "p": 1.0,
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

| variant − baseline | metric | mean diff | 95 % CI | better/worse/ties | Wilcoxon p | sign p | verdict |
|---|---|---|---|---|---|---|---|
| ntl-was − ce | interpolate/number_accuracy ↑ | 0.050 | [0.050, 0.050] | 1/0/0 | 1.000 | 1.000 | not distinguishable from zero (one seed) |
| ntl-was − ce | interpolate/log_mae ↓ | -0.100 | [-0.100, -0.100] | 2/0/0 | 0.500 | 0.500 | distinguishable from zero (CI excludes 0) |

Paired by seed (same initialisation and data order); ↑ / ↓: higher / lower is better; \
better/worse/ties count seeds; 95 % CI: percentile bootstrap of the mean difference; \
p: exact two-sided tests.

Share of seeds above a threshold (for outcomes that land in one of two modes):

| loss | metric | threshold | share of seeds |
|---|---|---|---|
| ce | interpolate/number_accuracy | > 0.600 | 0.500 (1/2) |
| ntl-was | interpolate/number_accuracy | > 0.600 | 1.000 (1/1) |"""


def test_render_tiny_case():
    assert results_table.render(tiny_result()) == EXPECTED


def test_render_table_metrics_and_formatting():
    result = tiny_result() | {"table_metrics": ["x/other"]}
    result["summary"]["ce"]["x/other"] = {"mean": 12345.6, "std": 0.00012, "n": 2,
                                          "values": [1, 1], "seeds": [0, 1]}
    result["paired"]["ntl-was"]["x/other"] = {
        "baseline": "ce", "n": 2, "mean_diff": 0.0312, "ci95": [-0.0004, 0.07], "p": 0.0004,
        "p_sign": 0.03125, "better": 1, "worse": 1, "ties": 0, "higher_is_better": None}
    text = results_table.render(result)
    assert "| ce | 2 | 1.23e+04 ± 0.00012 |" in text
    assert "| ntl-was | 2 | n/a |" in text
    assert ("| ntl-was − ce | x/other | 0.031 | [-0.0004, 0.070] | 1/1/0 | <0.001 | 0.031 "
            "| not distinguishable from zero |") in text
    assert "interpolate" not in text
    assert "Share of seeds" not in text


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


@pytest.mark.parametrize("entry, expected", [
    ({"n": 5, "ci95": [0.01, 0.2]}, "distinguishable from zero (CI excludes 0)"),
    ({"n": 5, "ci95": [-0.2, -0.01]}, "distinguishable from zero (CI excludes 0)"),
    ({"n": 5, "ci95": [-0.2, 0.01]}, "not distinguishable from zero"),
    ({"n": 5, "ci95": [0.0, 0.01]}, "not distinguishable from zero"),
    ({"n": 1, "ci95": [0.3, 0.3]}, "not distinguishable from zero (one seed)"),
    ({"n": 0, "ci95": None}, "no paired seeds"),
])
def test_verdict_is_computed_from_the_interval(entry, expected):
    assert results_table.verdict(entry) == expected


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
    assert new == README.replace("old table\n", EXPECTED + "\n")
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
    assert readme.read_text() == README.replace("old table\n", EXPECTED + "\n")
    check = _script(*args, "--check")
    assert (check.returncode, check.stderr) == (0, "")

    readme.write_text(README + "<!-- results:gone -->\n<!-- /results:gone -->\n")
    missing = _script(*args)
    assert missing.returncode == 2
    assert "gone" in missing.stderr


def test_runs_from_before_the_fused_loss_say_how_to_repeat_them():
    result = tiny_result()
    del result["settings"]["fused_loss"]
    assert "add `--no-fused-loss` to the command" in results_table.render(result)
    assert "--no-fused-loss" not in results_table.render(tiny_result())
