import os
import pathlib
import subprocess
import sys

from ntl_jax._core.number_losses import registry
from tests.grid import long_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_sharded_on_batch_and_vocab_equals_unsharded(request):
    long = request.config.getoption("--long")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **long_env(long))
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "sharded_check.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every variant over batch + vocabulary, reweighed or not in turn; over the batch
    # alone and the vocabulary alone two variants (with --long: every one, each with and
    # without reweigh where it takes reweigh: DEL and DIST² do not).
    kinds = len(registry.NAMES)
    reweighable = sum(registry.LOSSES[name]().ceiling is not None for name in registry.NAMES)
    checked = 3 * (kinds + reweighable) if long else kinds + 2 * 2
    assert f"sharded == unsharded for {checked} layouts x variants" in result.stdout
