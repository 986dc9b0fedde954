import os
import pathlib
import subprocess
import sys

import ntl_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_sharded_on_batch_and_vocab_equals_unsharded():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "sharded_check.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    # Three layouts for every variant, with and without reweigh.
    assert f"sharded == unsharded for {3 * 2 * len(ntl_jax._core.losses.KINDS)} layouts x variants" in result.stdout
