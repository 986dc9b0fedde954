"""The Tunix guide's memory table is the committed benchmark file, row for row."""

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLATFORMS = {"cpu": "CPU", "tpu": "TPU v5e"}


def expected_table(result: dict) -> list[str]:
    rows = {(r["platform"], r["layout"], r["path"]): r["peak_bytes"] for r in result["rows"]}
    lines = []
    for platform, layout in dict.fromkeys((p, lay) for p, lay, _ in rows):
        logits, fused = rows[platform, layout, "logits"], rows[platform, layout, "fused"]
        lines.append(f"| {PLATFORMS[platform]} | {layout} | {logits / 2**30:.2f} GiB | {fused / 2**30:.2f} GiB | "
                     f"{fused / logits:.2f} |")
    return lines


@pytest.mark.parametrize("name", ["tunix_memory_qwen", "tunix_memory_qwen_short"])
def test_the_guide_shows_the_committed_memory_figures(name):
    result = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    page = (ROOT / "docs" / "guides" / "tunix.md").read_text()
    table = page.split(f"<!-- tunix-memory:{name} -->")[1].split(f"<!-- /tunix-memory:{name} -->")[0]
    assert table.strip().splitlines()[2:] == expected_table(result)
    assert result["command"] in " ".join(page.replace("`", "").split())
    assert result["model"]["vocab"] == 151_936 and len(result["rows"]) == 8
