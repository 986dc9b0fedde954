"""Run as a script on 8 host CPU devices: a tiny Llama and Qwen3 sharded as EasyDeL shards
them (`sharding_axis_dims` (dp, fsdp, ep, tp, sp) = (1, 4, 1, 2, 1): parameters over
fsdp, the head's vocabulary over tp, which the fused head then streams shard by shard),
trained on CE + NTL through `ntl_jax.easydel.use`; writes the loss, NTL, the parameters
and the gradients to the .npz file named by its argument. `test_easydel_sharded.py`
starts it in a subprocess (the device count is fixed when JAX initialises) and compares
with one device."""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ENABLE_DISTRIBUTED_INIT", "0")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ntl_jax import easydel as ntl_easydel  # noqa: E402
from tests.easydel import tiny  # noqa: E402

SHARDING = (1, 4, 1, 2, 1)


def results(model, tokenizer) -> dict:
    ntl_easydel.use(model, tokenizer, number_loss="was")
    loss, metrics, grads = tiny.loss_and_grads(model, tiny.batch(size=8))
    from flax import nnx

    params = nnx.state(model, nnx.Param)
    out = {"loss": float(loss), "ntl": float(metrics.other_metrics["ntl"])}
    for prefix, tree in (("param", params), ("grad", grads)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            out[f"{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(jax.device_get(leaf))
    return out


def main(path: str):
    assert jax.device_count() == 8, jax.devices()
    saved = {}
    for name, build in sorted(tiny.MODELS.items()):
        model = build(sharding_axis_dims=SHARDING)
        assert dict(model.mesh.shape)["tp"] == 2 and dict(model.mesh.shape)["fsdp"] == 4, model.mesh
        saved.update({f"{name}/{key}": value for key, value in results(model, tiny.tokenizer()).items()})
        print(f"{name}: sharded over {dict(model.mesh.shape)}", flush=True)
    np.savez(path, **saved)
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
