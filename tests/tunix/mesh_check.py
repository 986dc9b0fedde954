"""Run as a script on 8 host devices: `ntl_jax.tunix`'s loss and gradients on a Qwen2
model sharded over Tunix's ("fsdp", "tp") mesh by its own sharding annotations, the batch
over "fsdp", equal to one device's, from the logits and fused."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags.host_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from ntl_jax import tunix as ntl_tunix  # noqa: E402
from tests.tunix.families import NUMBERS, batch, qwen2_model  # noqa: E402

# Rounded up to divide over the "tp" axis; the ids past the table are no numbers.
VOCAB = 64


def loss_and_grads(model, inputs, fused):
    loss_fn = ntl_tunix.number_token_loss_fn(NUMBERS, ntl_weight=0.3, fused=fused)
    step = nnx.jit(lambda m, x: nnx.value_and_grad(loss_fn, has_aux=True)(m, **x))
    (loss, parts), grads = step(model, inputs)
    return float(loss), jax.tree_util.tree_map(np.asarray, grads)


def main():
    assert jax.device_count() == 8, jax.devices()
    inputs = batch(seed=4, batch_size=8)
    single = {fused: loss_and_grads(qwen2_model(tied=False, vocab=VOCAB), inputs, fused) for fused in (False, True)}

    # As Tunix's examples make it; "tp" divides the key-value heads.
    mesh = jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with mesh:
        model = qwen2_model(tied=False, vocab=VOCAB)
        state = nnx.state(model)
        nnx.update(model, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
        kernel_sharding = model.lm_head.w[...].sharding
        assert len(kernel_sharding.device_set) == 8 and not kernel_sharding.is_fully_replicated, kernel_sharding
        data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
        sharded_inputs = {name: jax.device_put(value, data) for name, value in inputs.items()}
        sharded = {fused: loss_and_grads(model, sharded_inputs, fused) for fused in (False, True)}

    for fused in (False, True):
        loss, grads = sharded[fused]
        expected_loss, expected_grads = single[fused]
        np.testing.assert_allclose(loss, expected_loss, rtol=2e-5)
        flat, expected = (jax.tree_util.tree_leaves(g) for g in (grads, expected_grads))
        assert len(flat) == len(expected) > 0
        for g, e in zip(flat, expected):
            assert float(np.max(np.abs(g - e))) <= 1e-4 * float(np.max(np.abs(e))) and np.max(np.abs(e)) > 0
    np.testing.assert_allclose(sharded[True][0], sharded[False][0], rtol=2e-5)
    print(f"sharded == one device on {jax.device_count()} devices, from the logits and fused")


if __name__ == "__main__":
    main()
