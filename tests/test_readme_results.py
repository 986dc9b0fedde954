"""The README's result tables are renderings of the committed docs/results/*.json files."""

import json
import math
import pathlib
import re

import numpy as np
import pytest

from ntl_jax.train import results_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def test_readme_blocks_match_the_result_files():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert results_table.stale_blocks(text, str(RESULTS)) == []


def test_every_result_file_is_in_the_readme_with_five_paired_seeds_or_more():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    names = set(re.findall(r"<!-- results:([\w.-]+) -->", text))
    files = sorted(RESULTS.glob("*.json"))
    assert len(files) >= 2
    for path in files:
        assert path.stem in names, f"{path.name} is not rendered in README.md"
        result = json.loads(path.read_text())
        assert result["command"].startswith("ntl-jax compare ")
        for loss, per_metric in result["paired"].items():
            for metric, entry in per_metric.items():
                assert entry["n"] >= 5, (path.name, loss, metric)
                lo, hi = entry["ci95"]
                assert lo <= entry["mean_diff"] <= hi, (path.name, loss, metric)


def test_readme_rows_show_student_t_intervals_and_the_few_seeds_verdict():
    stats = pytest.importorskip("scipy.stats")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    checked = 0
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        metric_of = {(r["loss"], r["seed"]): r["metrics"] for r in result["runs"]}
        for loss, per_metric in result["paired"].items():
            for metric in result["table_metrics"]:
                e = per_metric[metric]
                d = []
                for seed in sorted(s for label, s in metric_of if label == loss):
                    v = metric_of[loss, seed].get(metric)
                    b = metric_of.get((e["baseline"], seed), {}).get(metric)
                    if v is not None and b is not None and math.isfinite(v) and math.isfinite(b):
                        d.append(v - b)
                d = np.asarray(d)
                if np.ptp(d) == 0:
                    expected = (d[0], d[0])
                else:
                    expected = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
                assert e["ci95"] == pytest.approx(expected, rel=1e-9, abs=1e-15), (path.name, loss, metric)
                untied = int(np.sum(np.abs(d) > 1e-12))
                row = (f"| {loss} − {e['baseline']} | {results_table.metric_title(metric)}"
                       f"{results_table._direction(e['higher_is_better'])} | "
                       f"{results_table.fmt(e['mean_diff'])} | [{results_table.fmt(expected[0])}, "
                       f"{results_table.fmt(expected[1])}] |")
                line = next((ln for ln in text.splitlines() if ln.startswith(row)), None)
                assert line is not None, row
                assert line.endswith("| too few seeds to tell |") == (0 < untied < 6), line
                checked += 1
    assert checked >= 30
