"""The EasyDeL guide's example (docs/guides/easydel.md) runs as pasted, in a fresh process
of EasyDeL's environment, and prints what the page shows: the text as it is, each number
within 0.02 of the page's (its two decimals after 40 float32 training steps, whose sums
XLA may order otherwise on another CPU)."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("easydel")

from tests import docs_pages  # noqa: E402

PAGE = docs_pages.page("guides/easydel.md")
# A Python block and the ```text block right after it: what the block prints.
EXAMPLE = re.compile(r"^```python\n(.*?)^```\n\s*^```text\n(.*?)^```", re.S | re.M)
NUMBER = re.compile(r"\d+\.\d+")
SEPARATOR = "=== next block ==="


def _parts(text: str) -> tuple[str, list[float]]:
    return NUMBER.sub("#", text), [float(n) for n in NUMBER.findall(text)]


def test_the_guides_example_runs_as_pasted_and_prints_what_the_page_shows(tmp_path):
    text = PAGE.read_text()
    examples = EXAMPLE.findall(text)
    assert len(examples) == len(docs_pages.code_blocks(text, "python")) == 2
    script = f"\nprint({SEPARATOR!r})\n".join(code for code, _ in examples)
    # The reader's environment: no test settings (this session's XLA flags, its 8-device
    # count or fast compile) reach the example.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=dict(env, PYTHONPATH=str(docs_pages.ROOT)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = done.stdout.split(SEPARATOR + "\n")
    assert len(printed) == len(examples)
    for n, (out, (_, shown)) in enumerate(zip(printed, examples)):
        (got_text, got), (shown_text, expected) = _parts(out), _parts(shown)
        assert got_text == shown_text, f"block {n + 1} printed:\n{out}\nthe page shows:\n{shown}"
        assert got == pytest.approx(expected, abs=0.02), f"block {n + 1} printed:\n{out}\nthe page shows:\n{shown}"
    # NTL-WAS trains: CE and NTL on the held-out examples fall.
    before, after = (dict(zip(("cross_entropy", "ntl"), _parts(line)[1])) for line in printed[1].splitlines()[:2])
    assert after["cross_entropy"] < before["cross_entropy"] and after["ntl"] < before["ntl"]
