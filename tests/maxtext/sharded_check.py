"""Run as a script on 8 host CPU devices (FSDP over all eight): with vocabulary tiling, NTL
computed inside MaxText's tiles, each tile's tokens spread over the devices, equals the
untiled loss in value, NTL and gradients, for a loss read position by position, one read
across positions and one of one's own. `test_maxtext_sharded.py` starts it in a subprocess, because the
device count is fixed when JAX initialises."""

import dataclasses
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ntl_jax import maxtext as ntl_maxtext  # noqa: E402
from tests.maxtext import tiny  # noqa: E402
from tests.maxtext.test_maxtext_loss import MULTI_DIGIT, _assert_trees_close, _installed_loss  # noqa: E402

# One sequence per device: each of the 2 tiles holds 4 whole sequences over 8 devices.
SHARDED = ["per_device_batch_size=1", "ici_fsdp_parallelism=-1"]


def main():
    assert jax.device_count() == 8, jax.devices()
    config = tiny.config(*SHARDED)
    tiled = tiny.config(*SHARDED, "num_vocab_tiling=2")
    numbers = ntl_maxtext.number_tokens(config, digit_level=False)
    data = tiny.batch(config, numbers)
    assert data["targets"].shape == (8, 32)
    model, mesh = tiny.model(config)
    tiled_model, _ = tiny.model(tiled)
    for number_loss in ("was", "del", tiny.SQUARED_DISTANCE):
        settings = dataclasses.replace(MULTI_DIGIT, number_loss=number_loss)
        name = settings.number_loss.name
        with jax.set_mesh(mesh):
            loss, aux, grads, _ = _installed_loss(settings, model, config, data)
            tiled_loss, tiled_aux, tiled_grads, traced = _installed_loss(settings, tiled_model, tiled, data)
        assert traced.in_tiles == 1 and traced.backward_calls, name  # computed inside the tiles
        np.testing.assert_allclose(float(tiled_aux["ntl_sum"]), float(aux["ntl_sum"]), rtol=2e-6)
        assert float(tiled_aux["ntl_weight_sum"]) == float(aux["ntl_weight_sum"]) > 0, name
        np.testing.assert_allclose(float(tiled_loss), float(loss), rtol=2e-6)
        _assert_trees_close(tiled_grads, grads, rtol=1e-5)
        print(f"{name}: tiled and sharded equals untiled", flush=True)
    print("OK")


if __name__ == "__main__":
    main()
