"""The committed Keras pod table (`benchmarks/results/keras_pod_cost.json`, made by
`benchmarks/keras_pod_cost.py`): a KerasHub Gemma train step compiled for TPU v5e:2x4,
where `NumberTokenLoss` holds at most 2% more per device than Keras's own cross-entropy.
Reads the JSON only; nothing is compiled."""

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "keras_pod_cost.json"
LIMIT = 1.02


@pytest.fixture(scope="module")
def table():
    return json.loads(RESULTS.read_text())


def test_the_table_says_how_it_was_made(table):
    assert table["command"].startswith("python benchmarks/keras_pod_cost.py")
    assert set(table["versions"]) == {"jax", "libtpu", "keras", "keras-hub", "ntl_jax"}
    assert table["topology"] == "v5e:2x4"
    assert table["mesh"] == {"batch": 2, "model": 4}
    model = table["model"]
    assert model["vocabulary_size"] == 256_000 and model["hidden_dim"] == 2048 and model["dtype"] == "bfloat16"
    assert model["num_layers"] >= 1 and model["lora_rank"] == 4
    assert table["batch"] == {"sequences": 8, "length": 1024, "tokens_per_device": 4096}
    assert table["layout"]["sharded"]["token_embedding/embeddings"] == "('model', 'batch')"


def test_every_row_is_there(table):
    rows = {(row["tuning"], row["loss"]) for row in table["rows"]}
    assert {("lora", "keras_scce"), ("lora", "ntl")} <= rows
    assert {("full", "keras_scce"), ("full", "ntl")} <= rows
    for row in table["rows"]:
        assert row["per_device_bytes"] > row["temp_bytes"] > 0
        assert row["bytes_accessed"] > 0


@pytest.mark.parametrize("loss", ["ntl", "fused"])
def test_ntl_holds_at_most_two_percent_more_than_keras_cross_entropy(table, loss):
    rows = [row for row in table["rows"] if row["loss"] == loss]
    if loss == "ntl":
        assert rows
    for row in rows:
        reference = next(r for r in table["rows"] if r["tuning"] == row["tuning"] and r["loss"] == "keras_scce")
        ratio = row["per_device_bytes"] / reference["per_device_bytes"]
        assert ratio <= LIMIT, (row["tuning"], loss, ratio)
        assert row["per_device_vs_keras_scce"] == pytest.approx(ratio, abs=1e-4)
