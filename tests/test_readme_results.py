"""The evidence page's result tables are renderings of the committed docs/results/*.json
files, and the README's summary rows are rows of those tables."""

import json
import math
import pathlib
import re

import numpy as np
import pytest

from ntl_jax.train import results_table
from tests import docs_pages

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
EVIDENCE = docs_pages.page("evidence.md")


def test_evidence_blocks_match_the_result_files():
    text = EVIDENCE.read_text(encoding="utf-8")
    assert results_table.stale_blocks(text, str(RESULTS)) == []


def test_every_result_file_is_on_the_evidence_page_with_five_paired_seeds_or_more():
    """Five or more paired seeds, or three for a sweep scored on the validation split (it
    picks weights; the comparisons that follow it have ten)."""
    text = EVIDENCE.read_text(encoding="utf-8")
    names = set(re.findall(r"<!-- results:([\w.-]+) -->", text))
    files = sorted(RESULTS.glob("*.json"))
    assert len(files) >= 2
    for path in files:
        assert path.stem in names, f"{path.name} is not rendered in docs/evidence.md"
        result = json.loads(path.read_text())
        assert result["command"].startswith("ntl-jax compare ")
        for loss, per_metric in result["paired"].items():
            for metric, entry in per_metric.items():
                sweep = result["settings"].get("eval_split") == "validation"
                assert entry["n"] >= (3 if sweep else 5), (path.name, loss, metric)
                lo, hi = entry["ci95"]
                assert lo <= entry["mean_diff"] <= hi, (path.name, loss, metric)


def test_evidence_rows_show_student_t_intervals_and_the_few_seeds_verdict():
    stats = pytest.importorskip("scipy.stats")
    text = EVIDENCE.read_text(encoding="utf-8")
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


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading (lower case, punctuation dropped)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _result_of_each_section() -> dict:
    """{anchor of an evidence section: the result files rendered in it}."""
    found, anchor = {}, None
    for line in EVIDENCE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            anchor = _slug(line[3:])
        elif (m := re.match(r"<!-- results:([\w.-]+) -->", line)) and anchor:
            found.setdefault(anchor, []).append(m.group(1))
    return found


def _cells(line: str) -> list:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_readme_summary_rows_are_rows_of_the_evidence_tables():
    readme = docs_pages.README.read_text(encoding="utf-8")
    start = readme.index("<!-- evidence-summary -->")
    rows = [ln for ln in readme[start:readme.index("<!-- /evidence-summary -->")].splitlines()
            if ln.startswith("| [")]
    sections = _result_of_each_section()
    assert len(rows) >= 5
    assert len({re.search(r"#([\w-]+)\)", r).group(1) for r in rows}) == len(sections) == 6
    for row in rows:
        setting, *cells = _cells(row)
        anchor = re.fullmatch(r"\[[^]]+\]\(docs/evidence\.md#([\w-]+)\)", setting).group(1)
        assert anchor in sections, (anchor, sorted(sections))
        rendered = "\n".join(results_table.render(results_table.load(str(RESULTS / f"{name}.json")))
                             for name in sections[anchor])
        matches = [_cells(ln) for ln in rendered.splitlines()
                   if ln.startswith("|") and _cells(ln)[:2] == cells[:2]]
        # A section may hold several settings with the same comparison (section 6):
        # the row must be one of them, cell for cell.
        # loss − baseline, metric, mean, interval, better/worse/tied ... verdict
        assert any(m[:5] + m[-1:] == cells for m in matches), (row, matches)
