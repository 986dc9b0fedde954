"""docs/performance.md's tables of the fused heads are the committed results, as
`benchmarks/fused_anchors.py --docs-tables` renders them."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_fused_anchors_tables_are_the_committed_results():
    results = ROOT / "benchmarks" / "results" / "fused_anchors_v5e.json"
    rendered = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fused_anchors.py"), "--docs-tables",
                               str(results)], capture_output=True, text=True, check=True, timeout=120).stdout
    page = (ROOT / "docs" / "performance.md").read_text()
    lines = [line for line in rendered.splitlines() if line.startswith("|")]
    assert len(lines) == 3 * (2 + 11), len(lines)  # per shape: header, rule, 11 implementations
    assert [line for line in lines if line not in page] == []
