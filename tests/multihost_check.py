"""Run as one of several processes, each a host of 4 CPU devices, joined into one system
by `jax.distributed` (gloo collectives), as the hosts of a TPU pod are: the objective and
the fused head (also vocabulary-parallel) on global arrays that each process builds from
its own part of the data.

    python tests/multihost_check.py --port P --process-id I --num-processes 2 --out DIR

`tests/test_multihost.py` starts the processes and compares what each writes
(`DIR/process_I.npz`) with the same functions in one process on one device. The inputs
and the functions are importable without starting anything.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from tests.grid import long_run

LOCAL_DEVICES = 4
B, L, D, VOCAB = 8, 12, 16, 128
DIGIT_IDS = [3, 17, 30, 37, 50, 66, 80, 95, 101, 127]  # in every quarter of the vocabulary
CHUNK = 12
# (name, options): a spread of number losses (as spec strings: each process parses its
# own) and loss-normalising factors.
CASES = {
    "was": dict(number_loss="was", loss_normalizing_factor="NUM_REAL_TARGET_TOKENS"),
    "mse-gce-reweigh-z": dict(number_loss="mse(reweigh=true)", gce_sigma=0.5, z_loss=1e-3),
    "number_level-packed": dict(number_loss="number_level", loss_normalizing_factor="AVERAGE_PER_SEQUENCE",
                                packed=True),
}


# Each case on the mesh across whose hosts what it adds is summed: reweigh's number mass,
# the Gaussian label and z-loss are sums over the vocabulary, which the second mesh splits
# across the hosts; packing and per-sequence normalising read the batch's rows, which the
# first splits. With pytest --long: every case on both meshes.
CASES_ON = {"batch_across_hosts": ("was", "number_level-packed"),
            "vocab_across_hosts": ("was", "mse-gce-reweigh-z")}


def cases_on(mesh_name: str, every: bool) -> list[str]:
    return list(CASES) if every else [case for case in CASES if case in CASES_ON[mesh_name]]


def number_tokens():
    from ntl_jax import NumberTokens

    pieces = [f"w{i}" for i in range(VOCAB)]
    for digit, i in enumerate(DIGIT_IDS):
        pieces[i] = str(digit)
    pieces[0], pieces[1], pieces[64] = "<pad>", "</s>", "."
    return NumberTokens.from_pieces(pieces)


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """The global arrays, the same in every process (numpy, float32 / int32)."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(B, L, D)).astype(np.float32)
    kernel = rng.normal(size=(D, VOCAB)).astype(np.float32)
    targets = rng.choice(np.r_[DIGIT_IDS, DIGIT_IDS, [2, 20, 64, 70, 100, 126]], size=(B, L)).astype(np.int32)
    targets[:, -2:] = 0
    weights = ((rng.random((B, L)) > 0.15) & (targets != 0)).astype(np.float32)
    return {
        "hidden": hidden, "kernel": kernel, "logits": np.einsum("bld,dv->blv", hidden, kernel),
        "targets": targets, "weights": weights,
        "decoder_segment_ids": np.array([[1] * 5 + [2] * 5 + [0] * 2] * B, np.int32),
        "decoder_positions": np.array([list(range(5)) + list(range(5)) + [0, 0]] * B, np.int32),
    }


def functions(number_tokens, options: dict, mesh=None):
    """`{name: f}`, each `f(arrays) -> (loss, parts, grads)` jit-compiled: the objective
    on logits, the fused head, and (with a mesh) the vocabulary-parallel fused head."""
    import jax

    from ntl_jax import cross_entropy_and_ntl, fused_cross_entropy_and_ntl

    options = dict(options)
    packed = options.pop("packed", False)

    def extra(a):
        segments = ("decoder_segment_ids", "decoder_positions") if packed else ()
        return {k: a[k] for k in segments}

    def objective(a):
        def loss(logits):
            return cross_entropy_and_ntl(logits, a["targets"], number_tokens, weights=a["weights"],
                                         **extra(a), **options)
        (value, parts), grad = jax.value_and_grad(loss, has_aux=True)(a["logits"])
        return value, parts, {"d_logits": grad}

    def fused(vocab_axis):
        def f(a):
            def loss(h, k):
                return fused_cross_entropy_and_ntl(h, k, a["targets"], number_tokens, weights=a["weights"],
                                                   chunk_size=CHUNK, vocab_axis=vocab_axis,
                                                   mesh=mesh if vocab_axis else None, **extra(a), **options)
            (value, parts), (dh, dk) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(a["hidden"], a["kernel"])
            return value, parts, {"d_hidden": dh, "d_kernel": dk}
        return f

    out = {"objective": objective, "fused": fused(None)}
    if mesh is not None:
        out["fused_vocab_parallel"] = fused("model")
    return {name: jax.jit(f) for name, f in out.items()}


def flat(value, parts, grads) -> dict:
    return {"loss": value, **{f"part_{k}": v for k, v in parts.items()}, **grads}


def meshes():
    """Data 2 x model 4 with a host per data row (the batch split across hosts), and data
    4 x model 2 with a device of each host in every model pair (the vocabulary split
    across hosts)."""
    import jax
    from jax.sharding import Mesh

    by_host = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))).reshape(2, LOCAL_DEVICES)
    return {"batch_across_hosts": Mesh(by_host, ("data", "model")),
            "vocab_across_hosts": Mesh(by_host.T, ("data", "model"))}


def global_arrays(mesh, arrays: dict[str, np.ndarray]):
    """Each process puts only its own shards: the batch-sharded ones from this process's
    rows (`make_array_from_process_local_data`), the kernel from its columns."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    out = {}
    for name, x in arrays.items():
        spec = P(None, "model") if name == "kernel" else P("data")
        sharding = NamedSharding(mesh, spec)
        if name == "kernel":
            out[name] = jax.make_array_from_callback(x.shape, sharding, lambda index, x=x: x[index])
            continue
        rows = sorted({i for d in sharding.addressable_devices
                       for i in range(B)[sharding.devices_indices_map(x.shape)[d][0]]})
        out[name] = jax.make_array_from_process_local_data(sharding, x[rows], x.shape)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=int, default=120, help="seconds to wait for the other processes")
    args = parser.parse_args(argv)

    flags = os.environ.get("XLA_FLAGS", "")  # the caller's (the tests compile fast)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES} {flags}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address = f"localhost:{args.port}"
    try:
        jax.distributed.initialize(address, num_processes=args.num_processes, process_id=args.process_id,
                                   initialization_timeout=args.timeout)
    except Exception as error:  # the message names what went wrong; ours says where
        print(f"process {args.process_id}: could not join the {args.num_processes} processes at "
              f"{address} within {args.timeout} s: {error}", file=sys.stderr)
        return 3
    assert jax.device_count() == LOCAL_DEVICES * args.num_processes, jax.devices()

    arrays = inputs()
    results = {}
    for mesh_name, mesh in meshes().items():
        on_mesh = global_arrays(mesh, arrays)
        # What this host fed in: its rows of the batch.
        results[f"{mesh_name}/local_rows"] = np.array(sorted(
            {i for s in on_mesh["targets"].addressable_shards for i in range(B)[s.index[0]]}))
        for case in cases_on(mesh_name, long_run()):
            for name, f in functions(number_tokens(), CASES[case], mesh).items():
                for key, value in flat(*f(on_mesh)).items():
                    results[f"{mesh_name}/{case}/{name}/{key}"] = multihost_utils.process_allgather(value, tiled=True)
    np.savez(os.path.join(args.out, f"process_{args.process_id}.npz"), **results)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
