"""The MaxText guide's cost table is `benchmarks/maxtext_pod_cost.py`'s rendering of the
committed `benchmarks/results/maxtext_pod_cost.json`, and in it CE + NTL costs at most
2 % more than MaxText's stock step per device, in memory and in HBM traffic, on both pods
with and without vocabulary tiling; NTL read from the logits is what cost more."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("maxtext_pod_cost", ROOT / "benchmarks" / "maxtext_pod_cost.py")
pod_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pod_cost)
RESULTS = json.loads(pod_cost.RESULTS.read_text())


def test_the_maxtext_guide_shows_the_committed_results():
    assert pod_cost.table(RESULTS) in (ROOT / "docs" / "guides" / "maxtext.md").read_text()


def _rows(model):
    return {(r["topology"], r["num_vocab_tiling"], r["variant"]): r for r in RESULTS["rows"] if r["model"] == model}


def test_ntl_costs_at_most_2_percent_more_than_maxtexts_step_on_both_pods_tiled_or_not():
    rows = _rows("pod")
    assert set(rows) == {(t, n, v) for t in ("v5e-16", "v4-8") for n in (1, 4) for v in ("stock", "ntl")}
    assert RESULTS["ntl"] == ["ntl_weight=0.3", "ntl_kind=was"]
    for (topology, tiling, variant), row in rows.items():
        if variant == "ntl":
            stock = rows[(topology, tiling, "stock")]
            assert row["per_device_bytes"] <= 1.02 * stock["per_device_bytes"], (topology, tiling)
            assert row["bytes_accessed"] <= 1.02 * stock["bytes_accessed"], (topology, tiling)


def test_reading_the_logits_writes_them_out_where_maxtext_never_does():
    rows = _rows("small")
    stock, ntl, from_logits = (rows[("v5e-16", 1, v)] for v in ("stock", "ntl", "from_logits"))
    assert ntl["per_device_bytes"] <= 1.02 * stock["per_device_bytes"]
    # A bfloat16 [256 tokens, 151,936] buffer per device more (77.8 MB), and then some.
    assert from_logits["temp_bytes"] - stock["temp_bytes"] >= 256 * 151936 * 2
