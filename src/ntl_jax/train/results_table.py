"""Markdown tables of `ntl-jax compare` result files, and keeping the evidence page (docs/evidence.md) in sync.

A result file (``docs/results/<name>.json``) is a JSON object with ``"command"``,
``"title"``, ``"machine"``, ``"seconds"``, ``"settings"``, ``"versions"``, ``"runs"``
(``[{"loss", "seed", "metrics"}, ...]``), ``"paired"`` (as
`ntl_jax.train.paired_stats.paired_comparison` returns), ``"summary"`` (as
`ntl_jax.train.paired_stats.describe` returns) and optionally ``"table_metrics"``
(the metric names to show). `render` turns one into Markdown; `update_readme`
replaces the text between ``<!-- results:<name> -->`` and ``<!-- /results:<name> -->``
with the rendering of ``<name>.json``, so the evidence page's numbers always come from the
files. Every verdict in the tables is computed from the numbers, and the paired statistics
are recomputed from the per-seed numbers in ``"runs"`` (the file's ``"paired"`` is used only
without them), so a file written before a change of method renders with the current one.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import NamedTuple

from ntl_jax.train import paired_stats

DEFAULT_METRICS = ("test_interpolate/number_accuracy", "test_interpolate/log_mae",
                   "test_extrapolate/number_accuracy", "test_extrapolate/log_mae")
DEFAULT_BASELINE = "ce"


# Below this a table's number is float64 rounding of metrics well under 1e6, not a value.
ROUNDING_TRACE = 1e-9
# Every number of a table (not its p-values) has this many significant figures.
SIGNIFICANT = 3


class ResultsError(ValueError):
    """A results marker without its closing marker or without its result file."""


def fmt(x) -> str:
    """A table's number (a mean, a std, a difference, an interval's end) to `SIGNIFICANT`
    significant figures, trailing zeros kept: 0.676, -0.0120, 0.000244, -8.46, 12.0;
    exponent form below 1e-4 and from 1e3 on (2.00e-09, 1.23e+04); "0" for zero, or for a
    trace float rounding left of one (a mean of differences such as 0.002 and -0.002,
    which binary fractions do not cancel exactly)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) < ROUNDING_TRACE:
        return "0"
    # "#" keeps the trailing zeros, and a point after three integer digits ("123."), dropped.
    return f"{x:#.{SIGNIFICANT}g}".removesuffix(".")


def fmt_p(p) -> str:
    """A p-value to 3 decimals (0.031), "<0.001" below that."""
    if p is None or not math.isfinite(p):
        return "n/a"
    return "<0.001" if p < 1e-3 else f"{p:.3f}"


def fmt_seconds(s) -> str:
    if s is None or not math.isfinite(s):
        return "n/a"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def metric_title(metric: str) -> str:
    """"test_interpolate/number_accuracy" -> "interpolate/number_accuracy"."""
    return metric.removeprefix("test_")


def _cell(text) -> str:
    return str(text).replace("|", r"\|")


def _row(cells) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), "|" + "---|" * len(header)] + [_row(r) for r in rows]


ALPHA = 0.05


def excludes_zero(entry: dict) -> bool:
    """Whether the comparison's 95 % interval (`ci95`) lies wholly above or below 0."""
    ci = entry.get("ci95")
    return bool(ci) and (ci[0] > 0 or ci[1] < 0)


def verdict(entry: dict, p_adjusted: float | None = None, family: int | None = None) -> str:
    """The verdict of one paired comparison, from its Wilcoxon p-value (`p_adjusted`, the
    Holm-adjusted one, where the comparison is one of a `family` of several), saying
    where it and the comparison's own 95 % interval part ways.

    With fewer untied pairs than the exact tests need to reach p < `ALPHA` (6 at 0.05)
    the answer is "too few seeds to tell", whatever the numbers; otherwise the difference
    is "better" / "worse" (by the metric's direction and the sign of the mean difference;
    "higher" / "lower" for a metric of unknown direction) where p < `ALPHA`. An interval
    that excludes 0 where nothing is called is named, with why nothing is: too few
    seeds, Holm's adjustment over the family, or the Wilcoxon p itself.
    """
    n = entry.get("n") or 0
    if not n:
        return "no paired seeds"
    untied = n - (entry.get("ties") or 0)
    if untied == 0:
        return "identical in every seed"
    excludes = excludes_zero(entry)
    if paired_stats.min_attainable_p(untied) >= ALPHA:
        return "interval excludes 0; too few seeds to test" if excludes else "too few seeds to tell"
    p = entry.get("p") if p_adjusted is None else p_adjusted
    if p is not None and p < ALPHA:
        up = (entry.get("mean_diff") or 0.0) > 0
        higher = entry.get("higher_is_better")
        word = ("higher" if up else "lower") if higher is None else ("better" if up == higher else "worse")
        called = f"{word} ({'Holm p' if p_adjusted is not None else 'p'} < {ALPHA:g})"
        return called + ("; interval includes 0" if entry.get("ci95") and not excludes else "")
    if not excludes:
        return "not distinguishable from zero"
    raw = entry.get("p")
    if p_adjusted is not None and raw is not None and raw < ALPHA:
        return "interval excludes 0; not called after Holm" + (f" over {family}" if family else "")
    return f"interval excludes 0; not called (Wilcoxon p ≥ {ALPHA:g})"


def table_metrics(result: dict) -> list[str]:
    """``result["table_metrics"]``, else those of `DEFAULT_METRICS` present in the
    summary or the paired results, else every metric of the summary."""
    if result.get("table_metrics"):
        return list(result["table_metrics"])
    present: dict[str, None] = {}
    for section in ("summary", "paired"):
        for per_metric in (result.get(section) or {}).values():
            present.update(dict.fromkeys(per_metric))
    chosen = [m for m in DEFAULT_METRICS if m in present]
    return chosen or list(present)


def _seed_counts(result: dict) -> dict[str, int]:
    counts: dict[str, set] = {}
    for run in result.get("runs") or []:
        counts.setdefault(str(run["loss"]), set()).add(run["seed"])
    return {label: len(seeds) for label, seeds in counts.items()}


def _direction(higher) -> str:
    return {True: " ↑", False: " ↓"}.get(higher, "")


# Target tokens per digit token among a task's training answers (`python
# scripts/tokens_per_digit.py`): what ntl_jax 0.4's normalisation scaled the paper's term by.
TOKENS_PER_DIGIT = {"multiplication": 1.34, "arithmetic__add_or_sub": 1.34, "diabetes": 1.75}


def normalisation_note(result: dict) -> str | None:
    """What the number losses' terms were normalised by, and their λ in the paper's terms:
    runs recorded without `ntl_mean_over` (before ntl_jax 0.5.0) divided the term by all
    the target tokens. None where no run trained on a number loss."""
    trained = [r for r in result.get("runs", []) if r.get("ntl_weight") and r.get("ntl_mean_over", "targets")
               and ("ntl_mean_over" in r or _combine(r) is not None)]
    if not trained:
        return None
    if all(_combine(r) == "scale_to_ce" for r in trained):
        return ("The number loss's term is scaled to CE (λ · CE whatever its size), so its normalisation, ntl_jax "
                "0.4's or its authors', changes nothing here.")
    trained = [r for r in trained if _combine(r) != "scale_to_ce"]
    kinds = {r.get("ntl_mean_over", "targets") for r in trained}
    if kinds == {"counted"}:
        return ("Number losses at their authors' objective: each term its loss's mean over the positions it "
                "counts (`mean_over=counted`, ntl_jax 0.5), λ as given.")
    module = (result.get("settings") or {}).get("module")
    ratio = TOKENS_PER_DIGIT.get(module)
    weights = sorted({(r["loss"], r["ntl_weight"]) for r in trained if r.get("ntl_mean_over", "targets") == "targets"})
    if ratio is None:
        scale = "λ × D/T, D/T the share of digits among its target tokens (not measured for this task)"
    else:
        shown = ", ".join(f"{loss} {weight * (1 / ratio):.3g}" for loss, weight in weights)
        scale = f"λ × D/T = λ / {ratio:g} on this task's answers: {shown}"
    return ("Number losses at ntl_jax 0.4's objective: each term its sum over the positions it counts divided by "
            "all the target tokens (`mean_over=targets`; today's code repeats it with `--ntl-mean-over targets`), "
            "so the paper's objective at an effective " + scale + ".")


def _combine(record: dict) -> str | None:
    """How the number loss a run trained on joins CE (`NumberLoss.combine`); None where
    it trained on none."""
    from ntl_jax.train import loss_names, systems

    system = record.get("loss_function") or record["loss"]
    try:
        if not systems.trains_ntl(system):
            return None
        return loss_names.number_loss(systems.token_loss(system)).combine
    except ValueError:
        return None


def render(result: dict) -> str:
    """The Markdown block of one result file (no trailing newline)."""
    metrics = table_metrics(result)
    summary = result.get("summary") or {}
    seeds = _seed_counts(result)
    lines = []
    if result.get("title"):
        lines += [f"**{result['title']}**", ""]
    timing = f"wall time {fmt_seconds(result.get('seconds'))}"
    earlier = result.get("earlier_seconds") or []
    if earlier:  # the runs were trained by earlier invocations of the same comparison
        timing = (f"wall time {fmt_seconds(sum(earlier) + (result.get('seconds') or 0))} "
                  f"over {len(earlier) + 1} invocations")
    if result.get("reused_runs"):
        timing += (f" ({result['reused_runs']} of {result['total_runs']} runs finished by an "
                   f"earlier invocation)")
    if result.get("run_seconds"):
        timing += f", training time of all runs {fmt_seconds(result['run_seconds'])}"
    lines += [f"`{result.get('command', '')}` · {result.get('machine', 'n/a')} · {timing}", ""]
    note = normalisation_note(result)
    if note:
        lines += [note, ""]
    if "fused_loss" not in (result.get("settings") or {"fused_loss": None}):
        version = (result.get("versions") or {}).get("ntl-jax")
        version = f"ntl-jax {version}" if version else "an earlier ntl-jax"
        lines += [f"Trained by {version} from the logits, before `--fused-loss` became the default: "
                  "`--no-fused-loss` repeats these settings, but not these runs: today's code trains each "
                  "seed along another path (seed 0 of the multiplication comparison, rerun so, ends at "
                  f"another accuracy); repeating them takes {version}.", ""]

    rows = []
    for label, per_metric in summary.items():
        n_seeds = seeds.get(label)
        if n_seeds is None:
            n_seeds = max((len(e.get("seeds", [])) for e in per_metric.values()), default=0)
        row = [label, str(n_seeds)]
        for metric in metrics:
            e = per_metric.get(metric)
            if e is None or not e.get("n"):
                row.append("n/a")
                continue
            text = fmt(e["mean"])
            if e.get("std") is not None:
                text += f" ± {fmt(e['std'])}"
            if e["n"] < n_seeds:
                text += f" (n={e['n']})"
            row.append(text)
        rows.append(row)
    lines += _table(["loss", "seeds"] + [f"{metric_title(m)} (mean ± std)" for m in metrics], rows)

    rows, family, primary = comparison_rows(result, metrics)
    if rows:
        lines += ["", *_table(["variant − baseline", "metric", "mean diff", "95 % CI",
                               "better/worse/ties", "Wilcoxon p", "Holm p", "sign p", "verdict"],
                              rows),
                  "", "Paired by seed (same initialisation and data order); ↑ / ↓: higher / "
                  "lower is better; better/worse/ties count seeds; 95 % CI: Student t interval "
                  "of the mean difference (n − 1 degrees of freedom), for each comparison alone; "
                  "p: exact two-sided tests; Holm p: the Wilcoxon p adjusted by Holm's step-down "
                  + (f"method over the {family} comparison{'s' if family != 1 else ''} of "
                     f"{metric_title(primary)}, the metric declared primary (the others are "
                     "secondary: shown, not called)" if primary else
                     f"method over the {len(rows)} comparison{'s' if len(rows) != 1 else ''} of this "
                     "table")
                  + f"; verdict: better or worse where Holm p < {ALPHA:g}; \"interval excludes 0\" "
                  "where the interval alone would call it and the verdict does not, with why: "
                  "Holm's adjustment over the family, a Wilcoxon p ≥ 0.05, or too few seeds; "
                  "\"too few seeds to tell\" where fewer than 6 seeds differ (the exact tests cannot "
                  f"then reach p < {ALPHA:g}: their smallest p is 2/2^n ≥ 0.0625)."]

    rows = []
    for label, per_metric in summary.items():
        for metric in metrics:
            e = per_metric.get(metric)
            if e is None or "share_above" not in e:
                continue
            share = e["share_above"]
            text = "n/a" if share is None else f"{fmt(share)} ({round(share * e['n'])}/{e['n']})"
            rows.append([label, metric_title(metric),
                         f"> {fmt(e['threshold'])}" if e.get("threshold") is not None else "n/a",
                         text])
    if rows:
        lines += ["", "Share of seeds above a threshold (on these tasks a run's accuracy tends to "
                  "end either low or high, depending on its seed: this counts the seeds that "
                  "ended high):", "", *_table(["loss", "metric", "threshold", "share of seeds"], rows)]
    return "\n".join(lines)


def comparison_rows(result: dict, metrics: list | None = None):
    """`(rows, family, primary)`: the cells of each row of `render`'s table of paired
    comparisons (variant − baseline, metric, mean diff, 95 % CI, better/worse/ties,
    Wilcoxon p, Holm p, sign p, verdict), the size of the family Holm adjusts, and the
    metric declared primary (None: every comparison is in the family)."""
    metrics = table_metrics(result) if metrics is None else metrics
    if result.get("runs"):
        paired = paired_stats.paired_comparison(result["runs"], metrics=metrics)
    else:
        paired = result.get("paired") or {}
    compared = [(label, metric, per_metric[metric]) for label, per_metric in paired.items()
                for metric in metrics if per_metric.get(metric) is not None]
    for baseline in also_against(result):
        compared += [(label, metric, per_metric[metric]) for label, per_metric
                     in against(result, baseline)["paired"].items()
                     if label != DEFAULT_BASELINE  # CE − baseline is baseline − CE above
                     for metric in metrics if per_metric.get(metric) is not None]
    # One family, adjusted together (Holm): the comparisons of the primary metric where one
    # was declared, else every comparison of the table.
    primary = result.get("primary_metric")
    family = [i for i, (_, metric, _) in enumerate(compared) if primary in (None, metric)]
    adjusted = dict(zip(family, paired_stats.holm([compared[i][2].get("p") for i in family])))
    rows = []
    for i, (label, metric, e) in enumerate(compared):
        ci = e.get("ci95")
        ci_text = f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "n/a"
        called = i in adjusted
        rows.append([f"{label} − {e.get('baseline', DEFAULT_BASELINE)}",
                     metric_title(metric) + _direction(e.get("higher_is_better")),
                     fmt(e.get("mean_diff")), ci_text,
                     f"{e.get('better', 0)}/{e.get('worse', 0)}/{e.get('ties', 0)}",
                     fmt_p(e.get("p")), fmt_p(adjusted[i]) if called else "—", fmt_p(e.get("p_sign")),
                     verdict(e, adjusted[i], len(family)) if called else "secondary: not called"])
    return rows, len(family), primary


def also_against(result: dict) -> list[str]:
    """The losses every other loss is also paired with (`ntl-jax compare --also-against`),
    in the same Holm family as the comparisons with CE.

    Raises:
      ResultsError: one of them has no runs in `result`.
    """
    baselines = list((result.get("settings") or {}).get("also_against") or [])
    labels = {run["loss"] for run in result.get("runs") or []}
    missing = [b for b in baselines if b not in labels]
    if missing:
        raise ResultsError(f"expected the losses to also compare against among the runs' "
                           f"losses {sorted(labels)}, got {missing}")
    return baselines


def refresh_paired(result: dict) -> dict:
    """`result` with ``"paired"`` recomputed from its ``"runs"`` over every metric they
    report, as `ntl-jax compare` computes it (a file without runs is returned as is)."""
    if not result.get("runs"):
        return result
    metrics = sorted({k for run in result["runs"] for k in run.get("metrics", {})})
    return result | {"paired": paired_stats.paired_comparison(result["runs"], metrics=metrics)}


def against(result: dict, baseline: str) -> dict:
    """`result` with every other loss paired with `baseline`'s run of the same seed (e.g.
    NTL against the regression head instead of CE); `render` then shows those differences.

    Raises:
      ResultsError: no run of `result` has the label `baseline`.
    """
    labels = list(dict.fromkeys(run["loss"] for run in result.get("runs") or []))
    if baseline not in labels:
        raise ResultsError(f"expected a baseline among the runs' losses {labels}, got {baseline!r}")
    # The baseline's own runs name themselves: a label paired with itself is skipped.
    runs = [run | {"baseline": baseline} for run in result["runs"]]
    return refresh_paired(result | {"runs": runs})


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def blocks(text: str, kind: str = "results") -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of the text between each marker pair
    ``<!-- KIND:NAME -->`` ... ``<!-- /KIND:NAME -->`` (`kind` "results" or "summary")."""
    marker = re.compile(rf"<!-- {kind}:([A-Za-z0-9_.-]+) -->")
    found = []
    pos = 0
    while (m := marker.search(text, pos)) is not None:
        name = m.group(1)
        close = f"<!-- /{kind}:{name} -->"
        end = text.find(close, m.end())
        if end < 0:
            raise ResultsError(f"marker <!-- {kind}:{name} --> has no closing {close}")
        found.append((name, m.end(), end))
        pos = end + len(close)
    return found


def _rendered(name: str, results_dir: str) -> str:
    path = os.path.join(results_dir, f"{name}.json")
    if not os.path.isfile(path):
        raise ResultsError(f"results block {name!r}: no result file {path}")
    # The page sits beside the results directory (docs/evidence.md, docs/results/).
    link = f"{os.path.basename(os.path.normpath(results_dir))}/{name}.json"
    return "\n" + render(load(path)) + f"\n\nEvery run's numbers: [`{name}.json`]({link}).\n"


def update_readme(text: str, results_dir: str) -> str:
    """`text` with every results block replaced by the rendering of its file."""
    out, pos = [], 0
    for name, start, end in blocks(text):
        out += [text[pos:start], _rendered(name, results_dir)]
        pos = end
    return "".join(out) + text[pos:]


def stale_blocks(text: str, results_dir: str) -> list[str]:
    """Names of the blocks whose text differs from what `update_readme` would write."""
    return [name for name, start, end in blocks(text)
            if text[start:end] != _rendered(name, results_dir)]


# -- Summary tables: chosen rows of several files' tables, one line each ---------------


class SummaryRow(NamedTuple):
    """One row of a summary table: the comparison `comparison` ("ntl-was − ce") on
    `metric` ("test_interpolate/number_accuracy") of ``<name>.json``'s table, under the
    label `setting`, linked to the evidence page's heading `anchor`; `note`, Markdown,
    fills the table's last column where it has one."""

    setting: str
    anchor: str
    name: str
    comparison: str
    metric: str
    note: str | None = None


SUMMARY_HEADER = ("setting", "comparison", "metric", "mean", "95 % CI", "better/worse/tied", "verdict")


def summary_table(rows, results_dir: str, *, evidence: str = "", note_header: str | None = None) -> str:
    """The Markdown table of `rows` (`SummaryRow`), each the cells of its file's row of
    `comparison_rows` (mean, interval, seeds, verdict, as the evidence page renders them),
    its setting linked to ``{evidence}#{anchor}`` (`evidence`: the evidence page's path
    from the page the table is on; "" on that page itself).

    Raises:
      ResultsError: a file that is missing, or that has not exactly one such row.
    """
    tables: dict[str, list] = {}
    out = []
    for row in rows:
        if row.name not in tables:
            path = os.path.join(results_dir, f"{row.name}.json")
            if not os.path.isfile(path):
                raise ResultsError(f"summary row {row.comparison!r}: no result file {path}")
            tables[row.name] = comparison_rows(load(path))[0]
        title = metric_title(row.metric)
        found = [cells for cells in tables[row.name]
                 if cells[0] == row.comparison and cells[1].removesuffix(" ↑").removesuffix(" ↓") == title]
        if len(found) != 1:
            raise ResultsError(f"expected one row {row.comparison!r} on {title!r} in {row.name}.json's table, "
                               f"found {len(found)}")
        cells = found[0]
        line = [f"[{row.setting}]({evidence}#{row.anchor})", *cells[:5], cells[-1]]
        out.append(line + ([row.note or ""] if note_header else []))
    return "\n".join(_table(list(SUMMARY_HEADER) + ([note_header] if note_header else []), out))


def update_summaries(text: str, summaries: dict, results_dir: str, *, evidence: str = "") -> str:
    """`text` with every ``<!-- summary:NAME -->`` block replaced by the table of
    ``summaries[NAME]``, a `(rows, note_header)` pair (`summary_table`)."""
    out, pos = [], 0
    for name, start, end in blocks(text, "summary"):
        out += [text[pos:start], _summary(name, summaries, results_dir, evidence)]
        pos = end
    return "".join(out) + text[pos:]


def stale_summaries(text: str, summaries: dict, results_dir: str, *, evidence: str = "") -> list[str]:
    """Names of the summary blocks whose text differs from what `update_summaries` writes."""
    return [name for name, start, end in blocks(text, "summary")
            if text[start:end] != _summary(name, summaries, results_dir, evidence)]


def _summary(name: str, summaries: dict, results_dir: str, evidence: str) -> str:
    if name not in summaries:
        raise ResultsError(f"summary block {name!r}: expected one of {sorted(summaries)}")
    rows, note_header = summaries[name]
    return "\n" + summary_table(rows, results_dir, evidence=evidence, note_header=note_header) + "\n"
