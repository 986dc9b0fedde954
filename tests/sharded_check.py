"""Run as a script on 8 host CPU devices: sharded losses must equal unsharded ones.

`tests/test_sharding.py` starts it in a subprocess, because the device count is fixed
when JAX initialises.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

import ntl_jax  # noqa: E402
from ntl_jax._core.number_losses import registry  # noqa: E402
from tests.grid import long_run  # noqa: E402

PIECES = ["<pad>", "</s>", "."] + list("0123456789") + [f"w{i}" for i in range(19)]  # 32 tokens
NT = ntl_jax.NumberTokens.from_pieces(PIECES)
KINDS = list(registry.NAMES)
# NTL's successors (DEL, DIST², SMMD) have no largest value for reweigh to charge: never reweighed.
REWEIGHABLE = [kind for kind in KINDS if registry.LOSSES[kind]().ceiling is not None]
# Every variant over batch + vocabulary, reweighed or not in turn (reweigh's number mass is
# one more sum over the vocabulary, the same for every variant); over the batch alone and
# the vocabulary alone these two. With pytest --long: every variant
# with and without reweigh over every layout.
ON_ONE_AXIS = ("was", "number_level")


def number_loss(kind, reweigh):
    """The shipped loss `kind` at its defaults, reweighed or not."""
    return registry.LOSSES[kind](reweigh=True) if reweigh else registry.LOSSES[kind]()


def objective(logits, targets, weights, kind, reweigh):
    return ntl_jax.cross_entropy_and_ntl(
        logits, targets, NT, weights=weights, number_loss=number_loss(kind, reweigh), z_loss=1e-4,
        loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")[0]


def main() -> int:
    assert jax.device_count() == 8, jax.devices()
    key = jax.random.PRNGKey(0)
    logits = jax.random.normal(key, (8, 16, len(PIECES))) * 3
    targets = jax.random.randint(jax.random.PRNGKey(1), (8, 16), 0, 16)
    weights = jnp.asarray(targets > 0, jnp.float32)
    layouts = {
        "batch": (Mesh(np.array(jax.devices()), ("data",)), P("data", None, None), P("data", None)),
        "vocab": (Mesh(np.array(jax.devices()), ("model",)), P(None, None, "model"), P(None, None)),
        "batch+vocab": (Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model")),
                        P("data", None, "model"), P("data", None)),
    }
    every_layout = long_run()
    checked = 0
    for i, kind in enumerate(KINDS):
        reweighs = (False, True) if every_layout else (i % 2 == 1,)
        for reweigh in dict.fromkeys(r and kind in REWEIGHABLE for r in reweighs):
            f = jax.jit(jax.value_and_grad(objective), static_argnums=(3, 4))
            want_value, want_grad = f(logits, targets, weights, kind, reweigh)
            per_token = jax.jit(lambda l: ntl_jax.number_token_loss(l, targets, NT,
                                                                    number_loss=number_loss(kind, reweigh)))
            want_tokens = per_token(logits)
            for name, (mesh, logit_spec, token_spec) in layouts.items():
                if name != "batch+vocab" and kind not in ON_ONE_AXIS and not every_layout:
                    continue
                sharded_logits = jax.device_put(logits, NamedSharding(mesh, logit_spec))
                sharded_targets = jax.device_put(targets, NamedSharding(mesh, token_spec))
                sharded_weights = jax.device_put(weights, NamedSharding(mesh, token_spec))
                assert len(sharded_logits.sharding.device_set) == 8
                value, grad = f(sharded_logits, sharded_targets, sharded_weights, kind, reweigh)
                np.testing.assert_allclose(value, want_value, rtol=1e-5, err_msg=f"{kind} {reweigh} {name}")
                np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7, err_msg=f"{kind} {name}")
                np.testing.assert_allclose(per_token(sharded_logits), want_tokens, rtol=1e-5, atol=1e-6)
                checked += 1
    print(f"sharded == unsharded for {checked} layouts x variants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
