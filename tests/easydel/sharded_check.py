"""Run as a script on 8 host CPU devices: a tiny Llama and Qwen3 sharded as EasyDeL shards
them (`sharding_axis_dims` (dp, fsdp, ep, tp, sp) = (1, 4, 1, 2, 1): parameters over
fsdp, the head's vocabulary over tp, which the fused head then streams shard by shard),
trained on CE + NTL through `ntl_jax.easydel.use`; writes the loss, NTL, the parameters
and the gradients to the .npz file named by its argument. `test_easydel_sharded.py`
starts it in a subprocess with `environment(os.environ)` (the device count is fixed when
JAX initialises) and compares with one device."""

import os
import sys

import jax
import numpy as np

from ntl_jax import easydel as ntl_easydel
from tests import xla_flags
from tests.easydel import tiny

SHARDING = (1, 4, 1, 2, 1)
DEVICES = 8


def environment(base: dict) -> dict:
    """The script's environment: `base` with 8 host CPU devices. Set for the subprocess
    only: importing this module changes nothing in the importing process (a test
    session that imported it and set the device count would run every test, its
    one-device references too, on 8 devices)."""
    return dict(base, XLA_FLAGS=f"{base.get('XLA_FLAGS', '')} {xla_flags.host_devices(DEVICES)}".strip(),
                JAX_PLATFORMS="cpu", ENABLE_DISTRIBUTED_INIT="0")


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
    assert jax.device_count() == DEVICES, (jax.devices(), os.environ.get("XLA_FLAGS"))
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
