"""Will this T5X config fit that TPU pod? Compile its train step for the pod on this
machine, ahead of time, and read what each chip needs.

    python -m ntl_jax.t5x.compile_check --topology=v5e:4x4 \\
        --gin_file=t5x_configs/experiments/finetune/xl_arithmetic.gin [--gin.X=...] [--json=out.json]

Nothing is written, so the gins' `MODEL_DIR` needs no value here.

The flags are T5X's train flags (`--gin_file`, `--gin.NAME=value`, `--gin_bindings`,
`--gin_search_paths`, with ntl_jax's gin files on the path) plus `--topology`, a name
libtpu knows (`v5e:4x4`, `v4:2x2x4`, `v5p:2x2x2`, `v6e:2x4`, ...; v4 and v5p chips as
one megacore device each, as T5X runs them). Nothing is read or trained: the gin's model,
partitioner (its `num_partitions` / `model_parallel_submesh` laid out over the pod's
chips as T5X lays them out; data-parallel, printed, on chips T5X has no default layout
for), batch size and feature lengths give the train step's
shapes; libtpu's compiler (`pip install 'jax[tpu]'`, no TPU needed) compiles T5X's train
step for the pod's chips, as host 0 of the pod would.

Printed, per chip: the parameters, the optimizer state and the batch it holds, the
temporaries XLA allocates in the step, the total against the chip's HBM, the bytes the
step moves through HBM (XLA's estimate), and each kind of collective with its count and
bytes. Exit status 0 when it fits, 2 when it does not, 1 on a bad flag or topology.

What it does not see: the input pipeline's host memory, XLA's and the runtime's own
reservations on the chip (keep a few percent free), and anything outside the train step
(evaluation, decoding).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from typing import Any, Optional, Sequence
from unittest import mock

GIB = 1024**3
# HBM per JAX device (a chip; for v4 and v5p a megacore chip), by `device_kind`.
HBM_GIB = {"TPU v2": 8, "TPU v3": 16, "TPU v4": 32, "TPU v4 lite": 8, "TPU v5 lite": 16, "TPU v5": 95,
           "TPU v5p": 95, "TPU v6 lite": 32, "TPU7x": 192}
MEGACORE = ("v4", "v5p", "v5")  # topology name prefixes whose chips T5X runs as megacores
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}


class CheckError(ValueError):
    """A topology libtpu does not know, or a layout T5X cannot build on it."""


def tpu_devices(topology: str):
    """The chips of `topology` as JAX devices of libtpu's compile-only client."""
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")  # quiets libtpu's probing for a TPU
    # Compiling takes no TPU: let this run beside another process that loaded libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    options = {"chip_config_name": "megacore"} if topology.split(":")[0] in MEGACORE else {}
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=topology, **options).devices
    except Exception as error:  # libtpu's own message names the valid forms
        raise CheckError(
            f"libtpu could not make the topology {topology!r}: {error}\nExpected '<chip>:<shape>', e.g. "
            f"v5e:2x2, v5e:4x4, v4:2x2x4, v5p:2x2x2, v6e:2x4 (libtpu comes with pip install 'jax[tpu]')") from None


# The layout taken where T5X has no default for the chips and the gin asks for one
# partition per model replica: each chip holds a whole replica (data-parallel).
DATA_PARALLEL_SUBMESH = (1, 1, 1, 1)


def mesh_for(partitioner, devices):
    """`(mesh, layout)`: the mesh T5X's partitioner would build on a host of the pod,
    from its `model_parallel_submesh` or its `num_partitions`, over `devices`, and how it
    was laid out (None: by T5X's own rule). Where T5X has no default layout for the
    chips (v5e among them) and the gin asks for one partition, the data-parallel one."""
    import jax
    from t5x import partitioning

    # T5X's default_mesh reads jax.devices(), which here are this machine's CPUs: for the
    # call, they are the pod's chips, and this process host 0. The layout settings are
    # the partitioner's private attributes (T5X has no accessor for them).
    host_0 = [d for d in devices if d.process_index == 0]
    with mock.patch.object(jax, "devices", lambda backend=None: list(devices)), \
            mock.patch.object(jax, "local_devices", lambda *a, **k: host_0):
        try:
            return partitioning.default_mesh(partitioner._num_partitions, partitioner._model_parallel_submesh,
                                             None, partitioner._ici_mesh_shape, partitioner._dcn_mesh_shape), None
        except ValueError as error:  # T5X has no default layout for some chips (v5e among them)
            if partitioner._model_parallel_submesh is None and partitioner._num_partitions in (None, 1):
                mesh = partitioning.default_mesh(None, DATA_PARALLEL_SUBMESH, None, partitioner._ici_mesh_shape,
                                                 partitioner._dcn_mesh_shape)
                return mesh, (f"data-parallel, model_parallel_submesh={DATA_PARALLEL_SUBMESH} (T5X has no default "
                              f"layout for these chips; a pod run needs --gin.partitioning.PjitPartitioner."
                              f"model_parallel_submesh={DATA_PARALLEL_SUBMESH} too)")
            raise CheckError(
                f"T5X would not start on this pod: {error}\nGive the model-parallel tile (x, y, z, core) of "
                f"each model replica, e.g. --gin.partitioning.PjitPartitioner.model_parallel_submesh=(1,1,1,1) "
                f"for {partitioner._num_partitions} partition(s) of one chip; its product is the number of "
                f"partitions.") from None


def _per_chip_bytes(tree, shardings) -> int:
    import jax
    import numpy as np

    leaves, shard = jax.tree.leaves(tree), jax.tree.leaves(shardings)
    return int(sum(np.prod(s.shard_shape(x.shape)) * x.dtype.itemsize for x, s in zip(leaves, shard)))


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """`{kind: {"count", "bytes"}}` of the collectives in optimised HLO text: each op's
    result bytes (a tuple's summed), once per op (a loop body counts once)."""
    out: dict[str, dict[str, int]] = {}
    pattern = re.compile(r"= ([^=]*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
    for line in hlo_text.splitlines():
        m = pattern.search(re.sub(r"/\*.*?\*/", "", line))
        if not m or "-done(" in line:
            continue
        nbytes = sum(_DTYPE_BYTES.get(dtype, 4) * _prod(dims)
                     for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)))
        entry = out.setdefault(m.group(2), {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += nbytes
    return out


def _prod(dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n


@dataclasses.dataclass
class Report:
    topology: str
    device_kind: str
    chips: int
    hosts: int
    mesh: dict
    batch_size: int
    feature_lengths: dict
    ntl: dict
    params_bytes: int
    optimizer_bytes: int
    batch_bytes: int
    temp_bytes: int
    total_bytes: int
    hbm_bytes: int
    bytes_accessed: float
    collectives: dict
    layout: Optional[str] = None  # how the mesh was laid out where T5X has no rule; None: T5X's

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    def text(self) -> str:
        def gib(n):
            return f"{n / GIB:9.3f} GiB" if n >= GIB else f"{n / 2**20:9.1f} MiB"

        lines = [
            f"{self.topology}: {self.chips} x {self.device_kind} on {self.hosts} hosts, mesh "
            + " x ".join(f"{k} {v}" for k, v in self.mesh.items()),
            *([f"layout: {self.layout}"] if self.layout else []),
            f"batch {self.batch_size}, lengths {self.feature_lengths}, NTL {self.ntl}",
            "per chip:",
            f"  parameters        {gib(self.params_bytes)}",
            f"  optimizer state   {gib(self.optimizer_bytes)}",
            f"  batch             {gib(self.batch_bytes)}",
            f"  temporaries       {gib(self.temp_bytes)}  (activations, gradients, the loss)",
            f"  total             {gib(self.total_bytes)}  of {gib(self.hbm_bytes)} HBM "
            f"({100 * self.total_bytes / self.hbm_bytes:.1f} %)",
            f"  HBM traffic       {gib(self.bytes_accessed)}  per step (XLA's estimate)",
            "collectives per step (per chip, result bytes):",
        ]
        for kind, c in sorted(self.collectives.items()):
            lines.append(f"  {kind:18s}{c['count']:5d} ops {gib(c['bytes'])}")
        if not self.collectives:
            lines.append("  none")
        lines.append("FITS" if self.fits else
                     f"DOES NOT FIT: {self.total_bytes / GIB:.3f} GiB per chip against {self.hbm_bytes / GIB:.0f} GiB")
        return "\n".join(lines)


def _feature_dtype(converter, name: str):
    """The dtype of a model feature as the feature converter writes it (int32 but for a
    converter's own, such as xVal's float32 scales)."""
    import numpy as np

    spec = converter.MODEL_FEATURES.get(name)
    return np.dtype(spec.dtype.as_numpy_dtype) if spec is not None else np.dtype(np.int32)


def check(*, model, train_dataset_cfg, partitioner, topology: str, hbm_gib: Optional[float] = None,
          num_microbatches: Optional[int] = None) -> Report:
    """Compiles T5X's train step of `model` for `topology` and reports per-chip memory."""
    import jax
    from jax.sharding import NamedSharding
    from t5x import partitioning, utils
    from t5x import trainer as trainer_lib

    devices = tpu_devices(topology)
    mesh, layout = mesh_for(partitioner, devices)
    partitioner.__dict__["mesh"] = mesh  # T5X's cached property, set before any use
    converter = model.FEATURE_CONVERTER_CLS(pack=train_dataset_cfg.pack)
    lengths = converter.get_model_feature_lengths(train_dataset_cfg.task_feature_lengths)
    batch_size = train_dataset_cfg.batch_size
    input_shapes = {k: (batch_size, n) for k, n in lengths.items()}
    input_types = {k: _feature_dtype(converter, k) for k in lengths}
    initializer = utils.TrainStateInitializer(optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables,
                                              input_shapes=input_shapes, input_types=input_types,
                                              partitioner=partitioner)
    state_shape, state_axes = initializer.global_train_state_shape, initializer.train_state_axes
    data_spec = partitioning.PartitionSpec(*partitioner.data_partition_spec)
    batch = {k: jax.ShapeDtypeStruct(s, input_types[k], sharding=NamedSharding(mesh, data_spec))
             for k, s in input_shapes.items()}

    def train_step(train_state, batch):
        return trainer_lib.train_with_lr(train_state, batch, learning_rate=1e-3, dropout_rng=jax.random.key_data(
            jax.random.PRNGKey(0)), model=model, num_microbatches=num_microbatches, weight_metrics_computer=None)

    step = partitioner.partition(train_step, in_axis_resources=(state_axes, data_spec),
                                 out_axis_resources=(state_axes, None), donate_argnums=(0,))
    from ntl_jax._core import fused

    with fused.compiling_for(devices[0].device_kind):  # the fused head as that chip runs it
        compiled = step.lower(state_shape, batch).compile()

    def shardings(axes, shapes):
        return jax.tree.map(lambda spec, _: NamedSharding(mesh, spec if spec is not None else
                                                          partitioning.PartitionSpec()), axes, shapes,
                            is_leaf=lambda x: x is None or isinstance(x, partitioning.PartitionSpec))

    params_bytes = _per_chip_bytes(state_shape.params, shardings(state_axes.params, state_shape.params))
    state_bytes = _per_chip_bytes(state_shape, shardings(state_axes, state_shape))
    batch_bytes = _per_chip_bytes(batch, {k: v.sharding for k, v in batch.items()})
    memory = compiled.memory_analysis()
    # Arguments (the state and the batch) + outputs not aliased to them + temporaries.
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
             + memory.temp_size_in_bytes)
    kind = devices[0].device_kind
    if hbm_gib is None:
        if kind not in HBM_GIB:
            raise CheckError(f"the HBM of a {kind!r} chip is not known here; give it with --hbm_gib")
        hbm_gib = HBM_GIB[kind]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return Report(
        topology=topology, device_kind=kind, chips=len(devices), hosts=len({d.process_index for d in devices}),
        mesh=dict(mesh.shape), batch_size=batch_size, feature_lengths=dict(train_dataset_cfg.task_feature_lengths),
        ntl={**model.ntl_options, "fused": model.fused_loss} if hasattr(model, "ntl_options") else {},
        params_bytes=params_bytes, optimizer_bytes=state_bytes - params_bytes, batch_bytes=batch_bytes,
        temp_bytes=int(memory.temp_size_in_bytes), total_bytes=int(total), hbm_bytes=int(hbm_gib * GIB),
        bytes_accessed=float(cost.get("bytes accessed", float("nan"))), collectives=collectives(compiled.as_text()),
        layout=layout)


def _flags():
    from absl import flags

    flags.DEFINE_multi_string("gin_file", None, "gin files, as for T5X's train")
    flags.DEFINE_multi_string("gin_bindings", [], "gin bindings, as for T5X's train")
    flags.DEFINE_list("gin_search_paths", ["."], "gin search paths, as for T5X's train")
    flags.DEFINE_string("topology", None, "a TPU topology libtpu knows, e.g. v5e:4x4 or v4:2x2x4", required=True)
    flags.DEFINE_float("hbm_gib", None, "HBM per chip in GiB (default: by the chip's kind)")
    flags.DEFINE_string("json", None, "also write the report to this JSON file")
    return flags.FLAGS


def train(*, model, train_dataset_cfg, partitioner, **unused: Any):
    """Gin's `train_script.train` (the T5X gin files configure `__main__.train`): takes
    the model, the training data's config and the partitioner; ignores the rest."""
    return model, train_dataset_cfg, partitioner


def main(argv: Optional[Sequence[str]] = None) -> None:
    import gin
    from absl import app
    from t5x import gin_utils

    from ntl_jax.t5x.configs import gin_search_path

    FLAGS = _flags()

    def run(_):
        import __main__

        __main__.train = train  # what `import __main__ as train_script` in the gin files resolves
        configurable = gin.configurable("train", module="__main__")(train)
        bindings = list(FLAGS.gin_bindings)
        if not any(re.match(r"\s*MODEL_DIR\s*=", b) for b in bindings):
            # Nothing is written: the shipped gins' required MODEL_DIR gets a path never made.
            bindings.append(f"MODEL_DIR = {os.path.join(tempfile.gettempdir(), 'ntl_jax_compile_check_unused')!r}")
        gin_utils.parse_gin_flags(FLAGS.gin_search_paths + [gin_search_path()], FLAGS.gin_file, bindings)
        model, dataset_cfg, partitioner = configurable()
        try:
            microbatches = gin.query_parameter("trainer.Trainer.num_microbatches")
        except ValueError:
            microbatches = None
        try:
            report = check(model=model, train_dataset_cfg=dataset_cfg, partitioner=partitioner,
                           topology=FLAGS.topology, hbm_gib=FLAGS.hbm_gib, num_microbatches=microbatches)
        except CheckError as error:
            print(error, file=sys.stderr)
            sys.exit(1)
        print(report.text())
        if FLAGS.json:
            with open(FLAGS.json, "w") as f:
                json.dump(dataclasses.asdict(report) | {"fits": report.fits}, f, indent=1)
        sys.exit(0 if report.fits else 2)

    app.run(run, argv=list(sys.argv if argv is None else argv),
            flags_parser=lambda a: app.parse_flags_with_usage(gin_utils.rewrite_gin_args(a)))


if __name__ == "__main__":
    main()
