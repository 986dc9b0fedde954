"""The evidence page's result tables are renderings of the committed docs/results/*.json
files, and the summary rows (the README's, the evidence page's superseded settings) are
rows of those tables."""

import importlib.util
import json
import math
import pathlib
import re
import unicodedata

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
                verdict = _cells(line)[-1]
                # A secondary metric is never called, however many seeds differ.
                if verdict != "secondary: not called":
                    assert verdict.startswith(("too few seeds", "interval excludes 0; too few seeds")) == (
                        0 < untied < 6), line
                # The verdict and the interval tell one story: a verdict that calls nothing says
                # when the interval excludes 0, and one that calls says when it does not.
                excludes = expected[0] > 0 or expected[1] < 0
                if "secondary" not in verdict and "identical" not in verdict and untied:
                    called = verdict.startswith(("better", "worse", "higher", "lower"))
                    assert ("interval excludes 0" in verdict) == (excludes and not called), line
                    assert ("interval includes 0" in verdict) == (called and not excludes), line
                checked += 1
    assert checked >= 30


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading: ASCII, lower case,
    punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _result_of_each_section() -> dict:
    """{anchor of an evidence heading (## or ###): the result files rendered under it,
    a section's including its subsections'}."""
    found, section, subsection = {}, None, None
    for line in EVIDENCE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section, subsection = _slug(line[3:]), None
            found.setdefault(section, [])
        elif line.startswith("### "):
            subsection = _slug(line[4:])
            found.setdefault(subsection, [])
        elif m := re.match(r"<!-- results:([\w.-]+) -->", line):
            for anchor in {section, subsection} - {None}:
                found[anchor].append(m.group(1))
    return found


def _cells(line: str) -> list:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _render_results():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary_rows(page: pathlib.Path, name: str) -> list:
    text = page.read_text(encoding="utf-8")
    block = text[text.index(f"<!-- summary:{name} -->"):text.index(f"<!-- /summary:{name} -->")]
    return [ln for ln in block.splitlines() if ln.startswith("| [")]


def test_summaries_are_rendered_from_the_result_files():
    script = _render_results()
    for page in script.PAGES:
        text = page.read_text(encoding="utf-8")
        assert results_table.stale_summaries(text, script.SUMMARIES, str(RESULTS),
                                             evidence=script.evidence_link(page)) == [], page.name
    assert _summary_rows(docs_pages.README, "current") and _summary_rows(EVIDENCE, "superseded")


@pytest.mark.parametrize("page, name, link", [(docs_pages.README, "current", "docs/evidence.md"),
                                              (EVIDENCE, "superseded", "")], ids=["README", "evidence"])
def test_summary_rows_are_rows_of_the_evidence_tables(page, name, link):
    rows = _summary_rows(page, name)
    sections = _result_of_each_section()
    assert len(rows) >= 5
    for row in rows:
        setting, *cells = _cells(row)
        anchor = re.fullmatch(rf"\[[^]]+\]\({re.escape(link)}#([\w-]+)\)", setting).group(1)
        assert anchor in sections, (anchor, sorted(sections))
        rendered = "\n".join(results_table.render(results_table.load(str(RESULTS / f"{name}.json")))
                             for name in sections[anchor])
        matches = [_cells(ln) for ln in rendered.splitlines()
                   if ln.startswith("|") and _cells(ln)[:2] == cells[:2]]
        # A section may hold several settings with the same comparison (section 6):
        # the row must be one of them, cell for cell.
        # loss − baseline, metric, mean, interval, better/worse/tied ... verdict
        assert any(m[:5] + m[-1:] == cells[:6] for m in matches), (row, matches)


def test_the_readme_summarises_the_latest_settings_and_the_evidence_page_the_rest():
    """Every setting the README's summary dropped is on the evidence page's, with the run
    that superseded it."""
    script = _render_results()
    current, _ = script.SUMMARIES["current"]
    superseded, header = script.SUMMARIES["superseded"]
    assert header == "superseded by" and all(row.note for row in superseded)
    assert not {(r.name, r.comparison, r.metric) for r in current} & {
        (r.name, r.comparison, r.metric) for r in superseded}
    sections = _result_of_each_section()
    # Every section of the evidence page has a row in one of the two.
    numbered = {a for a in sections if re.match(r"\d-", a)}
    assert len(numbered) == 6
    covered = {a for a in numbered for r in current + superseded if r.name in sections[a]}
    assert covered == numbered
