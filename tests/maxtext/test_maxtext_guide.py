"""The MaxText guide's CPU examples run as pasted from a checkout whose
`.venv-maxtext` is this environment, and print what the guide says they print."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("maxtext")

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "guides" / "maxtext.md").read_text()


def _block_after(heading: str) -> str:
    section = GUIDE.split(heading, 1)[1]
    return re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)


def _run_as_pasted(block: str, tmp_path) -> str:
    """Runs `block` in bash from a directory laid out as the checkout: `.venv-maxtext`
    is the environment these tests run in."""
    (tmp_path / ".venv-maxtext").symlink_to(pathlib.Path(sys.prefix))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


def test_the_pretraining_example_runs_as_pasted_and_logs_ntl(tmp_path):
    log = _run_as_pasted(_block_after("## Pretrain on the CPU"), tmp_path)
    metrics = [json.loads(line) for line in (tmp_path / "runs/maxtext/llama3_ntl.jsonl").read_text().splitlines()]
    train = [m for m in metrics if "learning/ntl" in m]
    assert len(train) == 20 and sum(m["learning/number_targets"] for m in train) > 0
    assert [m["step"] for m in metrics if "eval/avg_ntl" in m] == [0, 10]  # MaxText evaluates at step 0 too
    assert re.search(r"step 19: ntl: [0-9.]+ over \d+ number targets", log)
    assert re.search(r"eval step 10: ntl: [0-9.]+ over \d+ number targets", log)
    assert "completed step: 19" in log


def test_the_fine_tuning_example_runs_as_pasted_and_logs_ntl(tmp_path):
    log = _run_as_pasted(_block_after("## Fine-tune"), tmp_path)
    metrics = [json.loads(line) for line in (tmp_path / "runs/maxtext/qwen3_sft_ntl.jsonl").read_text().splitlines()]
    train = [m for m in metrics if "learning/loss" in m]
    assert [m["step"] for m in train] == list(range(1, 11))
    # The answers are digits: NTL counts most of each step's real targets.
    assert all(m["learning/number_targets"] > m["learning/total_weights"] / 4 and m["learning/ntl"] > 0
               for m in train)
    assert [m["step"] for m in metrics if "eval/avg_ntl" in m] == [0, 5, 10]  # Tunix evaluates first
    assert re.search(r"step 10: ntl: [0-9.]+ over \d+ number targets", log)
