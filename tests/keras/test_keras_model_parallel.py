"""`NumberTokenLoss` under `keras.distribution.ModelParallel`, the vocabulary sharded, on
8 host devices (a subprocess: the device count is fixed when JAX starts)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("keras_hub")

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_parallel_check.py")


def test_model_parallel_equals_one_device():
    env = dict(os.environ, JAX_PLATFORMS="cpu", KERAS_BACKEND="jax")
    result = subprocess.run([sys.executable, CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "model parallel equals one device" in result.stdout
