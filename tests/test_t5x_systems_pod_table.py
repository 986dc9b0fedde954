"""The T5X guide's table of the paper's five systems on a pod is
`benchmarks/t5x_systems_pod.py`'s rendering of the committed
`benchmarks/results/t5x_systems_pod.json`, and what the guide says of it holds: each
system fits T5.1.1 Base on v5e:4x4 and v4:2x2x4, NTL costs at most 0.2 % more than vanilla
T5, RT at most 1 % and xVal at most 2 % (memory and HBM traffic)."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("t5x_systems_pod", ROOT / "benchmarks" / "t5x_systems_pod.py")
pod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pod)
RESULTS = json.loads(pod.RESULTS.read_text())
LIMITS = {"T5 + NTL-MSE": 1.002, "T5 + NTL-WAS": 1.002, "RT": 1.01, "RT + NTL-MSE": 1.01, "xVal": 1.02}


def test_the_t5x_guide_shows_the_committed_results():
    assert pod.table(RESULTS) in (ROOT / "docs" / "guides" / "t5x.md").read_text()


def test_each_system_is_what_its_row_names():
    assert set(RESULTS) == {"base v5e:4x4", "base v4:2x2x4"}
    for key, rows in RESULTS.items():
        assert list(rows) == list(pod.ROWS), key
        assert rows["T5, CE"]["ntl"] == {} and rows["xVal"]["ntl"] == {}
        assert rows["T5 + NTL-MSE"]["ntl"] == {"ntl_weight": 0.3, "ntl_kind": "mse", "fused": "auto"}
        assert rows["T5 + NTL-WAS"]["ntl"] == {"ntl_weight": 0.3, "ntl_kind": "was", "fused": "auto"}
        assert rows["RT"]["ntl"] == {"ntl_weight": 0.0, "ntl_kind": "mse", "fused": "auto"}
        assert rows["RT + NTL-MSE"]["ntl"] == {"ntl_weight": 0.3, "ntl_kind": "mse", "fused": "auto"}
        assert all(r["batch_size"] == 32 and r["feature_lengths"] == {"inputs": 192, "targets": 32}
                   for r in rows.values())
        # RT's 1,664-row vocabulary and xVal's head: more parameters than T5's.
        params = {row: r["params_bytes"] for row, r in rows.items()}
        assert params["T5, CE"] == params["T5 + NTL-WAS"] < params["RT"] < params["xVal"]


def test_every_system_fits_and_costs_what_the_guide_says():
    for key, rows in RESULTS.items():
        base = rows[pod.BASELINE]
        for row, limit in LIMITS.items():
            r = rows[row]
            assert r["fits"], (key, row)
            assert r["total_bytes"] <= limit * base["total_bytes"], (key, row)
            assert r["bytes_accessed"] <= limit * base["bytes_accessed"], (key, row)
