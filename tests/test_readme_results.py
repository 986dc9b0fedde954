"""The README's result tables are renderings of the committed docs/results/*.json files."""

import json
import pathlib
import re

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
