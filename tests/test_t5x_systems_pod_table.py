"""The T5X guide's table of the paper's five systems on a pod is
`benchmarks/t5x_systems_pod.py`'s rendering of the committed
`benchmarks/results/t5x_systems_pod.json`, and what the guide says of it holds: each
system fits T5.1.1 Base on v5e:4x4 and v4:2x2x4; against vanilla T5, NTL costs at most
0.08 % more memory and 0.11 % more HBM traffic, RT 0.42 % and 0.71 %, xVal 1.28 % and
1.79 %."""

import importlib.util
import json
import pathlib

from tests.compile_check_reports import loss_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("t5x_systems_pod", ROOT / "benchmarks" / "t5x_systems_pod.py")
pod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pod)
RESULTS = json.loads(pod.RESULTS.read_text())
# (memory, traffic) the guide states, to its rounding.
LIMITS = {"T5 + NTL-MSE": (1.0008, 1.0011), "T5 + NTL-WAS": (1.0008, 1.0011), "RT": (1.0042, 1.0071),
          "RT + NTL-MSE": (1.0042, 1.0071), "xVal": (1.0128, 1.0179)}


def test_the_t5x_guide_shows_the_committed_results():
    assert pod.table(RESULTS) in (ROOT / "docs" / "guides" / "t5x.md").read_text()


def test_each_system_is_what_its_row_names():
    assert set(RESULTS) == {"base v5e:4x4", "base v4:2x2x4"}
    for key, rows in RESULTS.items():
        assert list(rows) == list(pod.ROWS), key
        assert rows["T5, CE"]["ntl"] == {} and rows["xVal"]["ntl"] == {}
        assert loss_of(rows["T5 + NTL-MSE"]) == {"ntl_weight": 0.3, "number_loss": "mse", "fused": "auto"}
        assert loss_of(rows["T5 + NTL-WAS"]) == {"ntl_weight": 0.3, "number_loss": "was", "fused": "auto"}
        assert loss_of(rows["RT"]) == {"ntl_weight": 0.0, "number_loss": "mse", "fused": "auto"}
        assert loss_of(rows["RT + NTL-MSE"]) == {"ntl_weight": 0.3, "number_loss": "mse", "fused": "auto"}
        assert all(r["batch_size"] == 32 and r["feature_lengths"] == {"inputs": 192, "targets": 32}
                   for r in rows.values())
        # RT's 1,664-row vocabulary and xVal's head: more parameters than T5's.
        params = {row: r["params_bytes"] for row, r in rows.items()}
        assert params["T5, CE"] == params["T5 + NTL-WAS"] < params["RT"] < params["xVal"]


def test_every_system_fits_and_costs_what_the_guide_says():
    for key, rows in RESULTS.items():
        base = rows[pod.BASELINE]
        for row, (memory, traffic) in LIMITS.items():
            r = rows[row]
            assert r["fits"], (key, row)
            assert round(r["total_bytes"] / base["total_bytes"], 4) <= memory, (key, row)
            assert round(r["bytes_accessed"] / base["bytes_accessed"], 4) <= traffic, (key, row)
