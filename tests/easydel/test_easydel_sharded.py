"""8 host devices, sharded as EasyDeL shards (parameters over fsdp, the vocabulary over
tp: the fused head streams its vocabulary shard by shard), give one device's loss, NTL
and gradients (`sharded_check.py`, run in a subprocess)."""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("easydel")

import numpy as np  # noqa: E402

from tests.easydel import sharded_check, tiny  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded") / "sharded.npz"
    env = sharded_check.environment(dict(os.environ, PYTHONPATH=str(ROOT)))
    run = subprocess.run([sys.executable, "-m", "tests.easydel.sharded_check", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    return dict(np.load(path))


@pytest.mark.parametrize("name", sorted(tiny.MODELS))
def test_eight_sharded_devices_equal_one(name, sharded):
    model = tiny.MODELS[name]()
    assert model.mesh.devices.size == 1, model.mesh  # the reference: one device, this process's only one
    one = sharded_check.results(model, tiny.tokenizer())
    params = [key for key in one if key.startswith("param")]
    assert params and all(np.array_equal(sharded[f"{name}/{key}"], one[key]) for key in params)  # the same model
    np.testing.assert_allclose(sharded[f"{name}/loss"], one["loss"], rtol=2e-6)
    np.testing.assert_allclose(sharded[f"{name}/ntl"], one["ntl"], rtol=2e-6)
    grads = {key: value for key, value in one.items() if key.startswith("grad")}
    assert grads
    tiny.assert_trees_close([sharded[f"{name}/{key}"] for key in grads], list(grads.values()), rtol=1e-4)
