"""benchmarks/easydel_memory.py: the committed table (EasyDeL's chunked cross-entropy
against CE + NTL through the fused head, compiled for a TPU v5e) is whole, its buffers
are the programs' own, and the EasyDeL guide shows it row for row; its micro version runs
on the CPU (in EasyDeL's environment), where the buffers are exactly the arrays'."""

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "easydel_memory_v5e.json"
GUIDE = ROOT / "docs" / "guides" / "easydel.md"
HEADS = {"llama3-8b": (4096, 128_256), "qwen3-8b": (4096, 151_936)}
VARIANTS = ("easydel chunked (auto", "easydel chunked (given", "ntl_jax CE", "ntl_jax CE + NTL-WAS")


def argument_bytes(batch, length, d_model, vocab):
    """hidden [B, L, D] and kernel [D, V] in bf16, labels and mask [B, L] in int32."""
    return 2 * batch * length * d_model + 2 * d_model * vocab + 2 * 4 * batch * length


def gradient_bytes(batch, length, d_model, vocab):
    """The gradients with respect to hidden and kernel, bf16."""
    return 2 * batch * length * d_model + 2 * d_model * vocab


def guide_table(result: dict) -> list[str]:
    lines = []
    for row in result["rows"]:
        lines.append(f"| {row['head']} | {row['variant']} | {row['peak'] / 2**30:.2f} GiB | "
                     f"{row['temp'] / 2**30:.2f} GiB | {row['bytes'] / 2**30:.1f} GiB |")
    return lines


def test_the_committed_table_is_whole_and_its_buffers_are_the_programs():
    result = json.loads(RESULT.read_text())
    assert result["target"].startswith("TPU v5e") and result["dtype"] == "bfloat16"
    assert result["easydel"] == "0.3.0" and result["jax"] == "0.9.2" and result["libtpu"] == "0.0.37"
    batch, length = result["batch"], result["length"]
    assert (batch, length) == (2, 4096)
    rows = result["rows"]
    assert [(r["head"], r["variant"].split(":")[0]) for r in rows] == [
        (head, variant) for head in HEADS for variant in VARIANTS]
    for row in rows:
        d_model, vocab = HEADS[row["head"]]
        assert (row["d_model"], row["vocab"]) == (d_model, vocab)
        assert row["peak"] == row["argument"] + row["output"] + row["temp"] - row["alias"], row
        assert row["argument"] == argument_bytes(batch, length, d_model, vocab), row
        grads = gradient_bytes(batch, length, d_model, vocab)
        assert row["output"] == grads + 1024, row  # the value, a scalar, in one 1 KiB tile
        assert row["bytes"] >= row["bytes_counted_once"] > 0
        # Every program reads the kernel and writes its gradient at least once.
        assert row["bytes"] > 2 * 2 * d_model * vocab


def test_the_guide_shows_the_committed_table():
    result = json.loads(RESULT.read_text())
    page = GUIDE.read_text()
    table = page.split("<!-- easydel-memory -->")[1].split("<!-- /easydel-memory -->")[0]
    assert table.strip().splitlines()[2:] == guide_table(result)
    assert result["command"] in " ".join(page.replace("`", "").split())


def test_the_micro_version_runs_on_the_cpu_with_the_arrays_own_buffers():
    pytest.importorskip("easydel")
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import easydel_memory

    result = easydel_memory.main(["--micro", "--platform", "cpu"])
    (d_model, vocab), = easydel_memory.MICRO_HEADS.values()
    batch, length = result["batch"], result["length"]
    assert [r["variant"] for r in result["rows"]] == [
        f"easydel chunked (auto: {length - 1} tokens)", "easydel chunked (given: 16 tokens)", "ntl_jax CE",
        "ntl_jax CE + NTL-WAS"]
    grads = gradient_bytes(batch, length, d_model, vocab)
    for row in result["rows"]:
        assert row["argument"] == argument_bytes(batch, length, d_model, vocab), row
        # The gradients, the value (EasyDeL's in bf16, ours in float32) and the CPU's
        # table of the three outputs' addresses (8 bytes each).
        value = 2 if row["variant"].startswith("easydel") else 4
        assert row["output"] == grads + value + 3 * 8, row
        assert row["peak"] == row["argument"] + row["output"] + row["temp"] - row["alias"]
