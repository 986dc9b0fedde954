"""Our fused linear + CE (+ NTL) head against the JAX fused cross-entropy kernels users
train with, compiled ahead of time for TPUs on this CPU machine (libtpu's compiler).

Anchors (`value_and_grad` of the mean loss w.r.t. the hidden states and the kernel,
bf16 hidden and kernel, 8,192 tokens):

- `ours`: `ntl_jax.fused_cross_entropy_and_ntl` (`[1, N, H]` hidden, `[H, V]` kernel,
  `loss_normalizing_factor=N`), CE only, CE + 0.3 NTL-WAS on the digits, and CE + 0.3
  NTL-WAS on the LLaMA-3-like table of 1,110 number tokens;
- `tokamax/mosaic_tpu`, `tokamax/chunked_xla`: tokamax's
  `linear_softmax_cross_entropy_loss(x [N, H], labels, w [H, V], reduction="mean")`;
- `jax_cce`: jax-cce's `linear_cross_entropy(x [N, H], w [V, H], labels)` (its own,
  embedding-like layout);
- `levanter/xla`, `levanter/pallas_tpu`: Levanter's
  `fused_cross_entropy_loss_and_logsumexp_penalty(x, labels, w, reduction="mean")` from
  the `marin-levanter` wheel (it pins `jax<0.12`, so its kernel package is imported from
  the unpacked wheel; see `load_levanter` for the stubs);
- `optax`: `optax.softmax_cross_entropy_with_integer_labels((x @ w).astype(f32), t)`, the
  unfused baseline.

Numerical check (`numerical_check`, the real CPU backend, float32, 256 tokens, H 128, V
2,176, 2,048 and 1,024): each anchor's loss and gradients against optax on the full logits.
Pallas kernels run in interpret mode where they can.

Per compiled row: `memory_analysis()` (temp; peak = argument + output + temp - alias),
`cost_analysis()` (flops, XLA's "bytes accessed", which counts a `while` body once and
VMEM-resident buffers too), and `hbm_bytes`, our count of HBM traffic from the optimised
HLO: every top-level instruction's operand and result bytes outside VMEM (layout `S(1)`),
each loop body multiplied by its trip count (nested loops multiply); slices read and
in-place updates write only their window; a Mosaic (Pallas) custom call is replaced by a
model of its DMAs from its grid and BlockSpecs (each block copied once per grid step in
which its block index changes). Method, checks and limits: benchmarks/README.md,
"Fused heads against the JAX fused cross-entropy kernels".

    python benchmarks/fused_anchors.py --quick
    python benchmarks/fused_anchors.py --check-only
    python benchmarks/fused_anchors.py --out benchmarks/results/fused_anchors_v5e.json
    python benchmarks/fused_anchors.py --only ours --shapes llama3 --chips v5e

Needs the packages of benchmarks/fused_anchors_requirements.txt (Python >= 3.12).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib
import importlib.metadata
import json
import math
import os
import re
import subprocess
import sys
import time
import types
import zipfile
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # vocabularies, loss_overhead
    sys.path.insert(0, HERE)

LIBTPU_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
for _key, _value in LIBTPU_ENV.items():
    os.environ.setdefault(_key, _value)

TOKENS = 8192
NTL_WEIGHT = 0.3
# name -> (hidden, vocab, what it stands for)
SHAPES = {
    "llama3": (4096, 128_256, "Llama-3 8B"),
    "qwen3": (1024, 151_936, "Qwen3-0.6B"),
    "gemma2": (2304, 256_000, "Gemma-2 2B"),
}
CHIPS = {"v5e": "v5e:1x1", "v5p": "v5p:1x1x1"}
LEVANTER_WHEEL = "marin-levanter==0.2.227.dev40316220070"
CHECK_TOKENS, CHECK_HIDDEN, CHECK_VOCABS = 256, 128, (2176, 2048, 1024)
# float32 everywhere in the check; the anchors reorder the vocabulary sum (chunks, online
# log-sum-exp), which moves a float32 loss by ~1e-6 relative: 1e-4 leaves 100x margin.
# Gradients are compared by norm (|g - g_ref| / |g_ref|), entries being small sums of
# products of float32 probabilities: 1e-3.
LOSS_RTOL, GRAD_RTOL = 1e-4, 1e-3
QUICK = {"tokens": 1024, "hidden": 256, "vocab": 8192}


# -- devices ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def tpu_device(chip: str):
    """The one device of a single-chip TPU topology to compile for (no TPU needed)."""
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="tpu", topology_name=CHIPS[chip]).devices[0]


def libtpu_version() -> str | None:
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


# -- Pallas calls: interpret mode on the CPU, and a record of grids and BlockSpecs --------

PALLAS_RECORDS: dict[str, list[dict]] = {}
_PALLAS = {"interpret": False}


_CURRENT_KERNEL: list[str] = []
_KERNEL_CORES: dict[str, int] = {}


def _install_pallas_hook():
    """Wrap the Pallas entry points the kernels here look up at call time:
    `pl.pallas_call` (Levanter) and `pl.kernel` + `pltpu.emit_pipeline` (tokamax), to
    record each kernel's grid, BlockSpecs and operand shapes under the kernel's name,
    and to run kernels in interpret mode while `_PALLAS["interpret"]`."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if getattr(pl.pallas_call, "_fused_anchors", False):
        return
    original_call, original_kernel, original_pipeline = pl.pallas_call, pl.kernel, pltpu.emit_pipeline

    def pallas_call(kernel, *args, **kwargs):
        if _PALLAS["interpret"]:
            kwargs["interpret"] = pltpu.InterpretParams()
        call = original_call(kernel, *args, **kwargs)

        def run(*operands):
            _record_pallas(kernel, kwargs, operands)
            return call(*operands)

        return run

    def kernel(body=None, *args, **kwargs):
        if _PALLAS["interpret"]:
            kwargs["interpret"] = pltpu.InterpretParams()
        name = kwargs.get("name") or "kernel"
        mesh_shape = dict(getattr(kwargs.get("mesh"), "shape", {}) or {})
        _KERNEL_CORES[name] = int(math.prod(mesh_shape.values())) if mesh_shape else 1

        def wrap(fn):
            made = original_kernel(fn, *args, **kwargs)

            def run(*operands):
                _CURRENT_KERNEL.append(name)
                try:
                    return made(*operands)
                finally:
                    _CURRENT_KERNEL.pop()

            return run

        return wrap if body is None else wrap(body)

    def emit_pipeline(body, *args, **kwargs):
        pipeline = original_pipeline(body, *args, **kwargs)
        name = _CURRENT_KERNEL[-1] if _CURRENT_KERNEL else "pipeline"

        def run(*refs, **kw):
            n_in = len(kwargs.get("in_specs") or ())
            record = {"name": name, "grid": tuple(int(g) for g in kwargs["grid"]),
                      "in": [(tuple(r.shape), str(r.dtype)) for r in refs[:n_in]],
                      "out": [(tuple(r.shape), str(r.dtype)) for r in refs[n_in:]],
                      "in_specs": list(kwargs.get("in_specs") or ()),
                      "out_specs": _as_list(kwargs.get("out_specs")), "prefetch": 0,
                      "core_axis": kwargs.get("core_axis_name")}
            PALLAS_RECORDS.setdefault(name, []).append(record)
            return pipeline(*refs, **kw)

        return run

    pallas_call._fused_anchors = True
    pl.pallas_call, pl.kernel, pltpu.emit_pipeline = pallas_call, kernel, emit_pipeline


def _as_list(specs):
    if specs is None:
        return []
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def _kernel_name(kernel, kwargs) -> str:
    if kwargs.get("name"):
        return kwargs["name"]
    fn = kernel
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", "kernel")


def _record_pallas(kernel, kwargs, operands):
    grid_spec = kwargs.get("grid_spec")
    grid = kwargs.get("grid") if grid_spec is None else grid_spec.grid
    in_specs = kwargs.get("in_specs") if grid_spec is None else grid_spec.in_specs
    out_specs = kwargs.get("out_specs") if grid_spec is None else grid_spec.out_specs
    out_shape = kwargs.get("out_shape")
    prefetch = 0 if grid_spec is None else getattr(grid_spec, "num_scalar_prefetch", 0)
    outs = out_shape if isinstance(out_shape, (list, tuple)) else [out_shape]
    record = {
        "name": _kernel_name(kernel, kwargs),
        "grid": tuple(int(g) for g in (grid or ())) if not isinstance(grid, int) else (grid,),
        "in": [(tuple(o.shape), str(o.dtype)) for o in operands[prefetch:]],
        "out": [(tuple(o.shape), str(o.dtype)) for o in outs],
        "in_specs": list(in_specs) if isinstance(in_specs, (list, tuple)) else [in_specs],
        "out_specs": list(out_specs) if isinstance(out_specs, (list, tuple)) else [out_specs],
        "prefetch": prefetch,
    }
    PALLAS_RECORDS.setdefault(record["name"], []).append(record)


def _block_dims(spec, shape):
    if spec is None or getattr(spec, "block_shape", None) is None:
        return None
    dims = []
    for b, s in zip(spec.block_shape, shape):
        if b is None or not isinstance(b, int):  # None / pl.Squeezed: one row; BoundedSlice: its size
            b = getattr(b, "block_size", 1) if b is not None else 1
        dims.append(int(b))
    return dims


def _memory_space_name(spec) -> str:
    space = getattr(spec, "memory_space", None)
    return str(space).lower() if space is not None else "blocked"


def pallas_model(record: dict) -> dict:
    """HBM bytes of one Pallas TPU kernel from its grid and BlockSpecs: the pipeline
    copies an operand's block in once per grid step in which the block (its index, or
    its `pl.ds` window) changes, and an output's block out likewise; an output block
    revisited after others (an accumulator, e.g. tokamax's weight gradient across batch
    blocks) is also read back in. Blocks are clipped to the array's edge. An index map
    that reads the core index (`lax.axis_index`) is evaluated per core and summed.
    Operands not given as blocked VMEM specs (`memory_space=ANY/HBM`: manual DMAs inside
    the kernel) are listed in `unmodelled`."""
    grid = record["grid"] or (1,)
    steps = list(np.ndindex(*grid))
    total, parts, unmodelled = 0, [], []
    for kind, specs, arrays in (("in", record["in_specs"], record["in"]), ("out", record["out_specs"], record["out"])):
        for k, (spec, (shape, dtype)) in enumerate(zip(specs, arrays)):
            itemsize = np.dtype(_np_dtype(dtype)).itemsize
            space = _memory_space_name(spec)
            dims = _block_dims(spec, shape)
            if "smem" in space or "semaphore" in space:
                continue
            if dims is None or "any" in space or "hbm" in space:
                unmodelled.append(f"{kind}[{k}] {shape} {space}")
                continue
            fn = spec.index_map
            while hasattr(fn, "index_map"):  # pallas' _IndexMapFunc wrapper
                fn = fn.index_map
            cells = [c for c in (getattr(fn, "__closure__", None) or ()) if _is_tracer(_cell(c))]
            cores = range(record.get("cores", 1)) if cells else [None]
            copies, moved = 0, 0
            for core in cores:
                saved = [c.cell_contents for c in cells]
                for c in cells:
                    c.cell_contents = core
                try:
                    last, seen = None, set()
                    for step in steps:
                        index = tuple(_window(i, b) for i, b in zip(_as_tuple(spec.index_map(*step)), dims))
                        if index != last:
                            extent = 1
                            for (start, size), s in zip(index, shape):
                                extent *= max(0, min(size, s - start))
                            revisit = kind == "out" and index in seen
                            moved += extent * itemsize * (2 if revisit else 1)
                            copies += 1
                            seen.add(index)
                            last = index
                finally:
                    for c, v in zip(cells, saved):
                        c.cell_contents = v
            total += moved
            parts.append({"operand": f"{kind}[{k}]", "shape": list(shape), "block": dims, "copies": copies,
                          "bytes": moved})
    return {"name": record["name"], "grid": list(grid), "cores": record.get("cores", 1), "bytes": total,
            "operands": parts, "unmodelled": unmodelled}


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _is_tracer(value) -> bool:
    from jax._src import core

    return isinstance(value, core.Tracer)


def _as_tuple(index):
    return tuple(index) if isinstance(index, (tuple, list)) else (index,)


def _window(index, block: int) -> tuple[int, int]:
    """(start, size) in elements of one dimension of a block: a block index, or a
    `pl.ds` slice (tokamax's bounded slices)."""
    if hasattr(index, "start") and hasattr(index, "size"):
        return int(np.asarray(index.start)), int(np.asarray(index.size))
    return int(np.asarray(index)) * block, block


def _np_dtype(name: str):
    import jax.numpy as jnp

    return np.dtype(jnp.dtype(name))


# -- Levanter's kernels from the marin-levanter wheel ---------------------------------------


def levanter_root() -> str:
    """The unpacked marin-levanter wheel (`$FUSED_ANCHORS_LEVANTER_DIR`, else downloaded
    once with `pip download --no-deps` into ~/.cache/ntl_jax)."""
    root = os.environ.get("FUSED_ANCHORS_LEVANTER_DIR")
    if root:
        return root
    version = LEVANTER_WHEEL.split("==")[1]
    root = os.path.join(os.path.expanduser("~"), ".cache", "ntl_jax", f"marin_levanter-{version}")
    if not os.path.isdir(os.path.join(root, "levanter")):
        os.makedirs(root, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", LEVANTER_WHEEL, "-d", root],
                       check=True)
        wheel = next(f for f in os.listdir(root) if f.endswith(".whl"))
        with zipfile.ZipFile(os.path.join(root, wheel)) as z:
            z.extractall(root)
    return root


class _Target:
    """What Levanter's kernel modules see as `jax.default_backend()` and `jax.devices()`
    while a program is traced: the TPU being compiled for (the process runs on the CPU)."""

    backend: str | None = None
    devices: tuple | None = None


class _JaxView(types.ModuleType):
    def __init__(self, jax):
        super().__init__("jax")
        self._jax = jax

    def __getattr__(self, name):
        if name == "default_backend" and _Target.backend is not None:
            return lambda: _Target.backend
        if name == "devices" and _Target.devices is not None:
            return lambda *a, **k: list(_Target.devices)
        return getattr(self._jax, name)


STUBS = ("finestore.cache.PersistentKvCache (no autotune cache)",
         "rigging.cache hashes (constant)",
         "levanter.utils.jax_utils.multihost_allgather_sync (single process only)",
         "jax.default_backend()/jax.devices() inside the kernel modules: the target TPU")


@functools.lru_cache(maxsize=None)
def load_levanter():
    """`levanter.kernels.pallas.fused_cross_entropy_loss` from the unpacked wheel, with
    the few imports it needs from Levanter's other packages stubbed (`STUBS`): nothing
    of those runs when the implementation and block sizes are passed explicitly."""
    import jax

    root = levanter_root()

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    class PersistentKvCache:
        @classmethod
        def for_prefix(cls, *a, **k):
            return cls()

        def load(self, *a, **k):
            return None

        def store(self, *a, **k):
            return None

    def allgather(*a, **k):
        raise NotImplementedError("multi-process autotuning is not available here")

    module("finestore").cache = module("finestore.cache", PersistentKvCache=PersistentKvCache)
    module("rigging").cache = module("rigging.cache", **{n: (lambda *a, **k: "0") for n in (
        "combined_content_hash", "directory_content_hash", "file_content_hash", "workspace_lock_hash")})
    if "levanter" not in sys.modules:
        lev = module("levanter")
        lev.__path__ = [os.path.join(root, "levanter")]
        utils = module("levanter.utils")
        utils.__path__ = []
        utils.jax_utils = module("levanter.utils.jax_utils", multihost_allgather_sync=allgather)
    os.environ.setdefault("LEVANTER_PALLAS_CE_AUTOTUNE_ON_MISS", "0")
    pkg = importlib.import_module("levanter.kernels.pallas.fused_cross_entropy_loss")
    for sub in ("api", "pallas_tpu", "tuned_block_sizes", "xla"):
        importlib.import_module(f"{pkg.__name__}.{sub}").jax = _JaxView(jax)
    return pkg


# -- the implementations ------------------------------------------------------------------

FAMILIES = ("ours", "tokamax", "jax_cce", "levanter", "optax")


@dataclass
class Impl:
    name: str
    family: str
    layout: str  # "[N,H]x[H,V]", "[1,N,H]x[H,V]", "[N,H]x[V,H]"
    make: Callable  # (tokens, hidden, vocab, target) -> loss(hidden, kernel, targets)
    pallas: bool = False
    note: str = ""


def _digits(vocab: int):
    from loss_overhead import vocabulary_pieces  # digits 0-9 once, a ".", filler words

    import ntl_jax

    return ntl_jax.NumberTokens.from_pieces(vocabulary_pieces(vocab))


def _llama3(vocab: int):
    from vocabularies import llama3_number_tokens

    return llama3_number_tokens(vocab)


def _ours(table: str | None, backward: str = "xla"):
    def make(tokens, hidden, vocab, target):
        import ntl_jax

        nt = (_llama3 if table == "llama3" else _digits)(vocab)
        options = ({"number_loss": None} if table is None else
                   {"number_loss": "was", "ntl_weight": NTL_WEIGHT})
        # The chip it is compiled for; on the CPU (the numerical check) the Pallas
        # kernels interpreted.
        options["device_kind"] = "cpu" if target is None else target.device_kind
        options["backward"] = "pallas_interpret" if backward == "pallas" and target is None else backward

        def loss(h, k, t):
            return ntl_jax.fused_cross_entropy_and_ntl(h, k, t, nt, loss_normalizing_factor=float(tokens),
                                                       **options)[0]

        return loss

    return make


def _tokamax(implementation):
    def make(tokens, hidden, vocab, target):
        import tokamax

        if implementation == "mosaic_tpu":
            return _tokamax_mosaic(target)

        def loss(h, k, t):
            return tokamax.linear_softmax_cross_entropy_loss(h, t, k, reduction="mean",
                                                             implementation=implementation)

        return loss

    return make


def _tokamax_mosaic(target):
    """tokamax's Mosaic op, traced under an abstract mesh of the TPU (its kernels read
    the chip's properties and core count from it). On the CPU (the check, `target`
    None): its device check bypassed, a v5e's properties, Pallas interpret mode."""
    import jax
    import tokamax
    from tokamax._src.ops.linear_softmax_cross_entropy_loss import pallas_mosaic_tpu as pmt

    mesh = jax.sharding.Mesh(np.array([target if target is not None else tpu_device("v5e")]), ("x",))
    if target is not None:
        def call(h, t, k):
            return tokamax.linear_softmax_cross_entropy_loss(h, t, k, reduction="mean", implementation="mosaic_tpu")
    else:
        op = pmt.PallasMosaicTpuLinearSoftmaxCrossEntropyLoss(bypass_device_check=True)
        object.__setattr__(op, "vjp", pmt.PallasMosaicTpuLinearSoftmaxCrossEntropyLossVjp(bypass_device_check=True))

        def call(h, t, k):
            return op(h, t, k, reduction="mean")

    def loss(h, k, t):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return call(h, t, k)

    return loss


def _jax_cce(tokens, hidden, vocab, target):
    from jax_cce import linear_cross_entropy

    return lambda h, k, t: linear_cross_entropy(h, k, t)


def levanter_block_sizes(tokens, hidden, vocab, target, override=None):
    lev = load_levanter()
    if override is not None:
        return lev.BlockSizes(**override)
    import jax.numpy as jnp

    kind = target.device_kind if target is not None else "cpu"
    return lev.infer_block_sizes(tokens, hidden, vocab, dtype=jnp.float32, x_dtype=jnp.bfloat16,
                                 w_dtype=jnp.bfloat16, device_kind=kind)


# In the numerical check (256 tokens): blocks the kernels accept there and that stream
# (the XLA path falls back to its full-logits reference where `v_block_size >= V`).
LEVANTER_CHECK_BLOCKS = {"b_block_size": 256, "h_block_size": 128, "v_block_size": 256}


def _levanter(implementation, block_sizes=None):
    def make(tokens, hidden, vocab, target):
        lev = load_levanter()
        if target is None:  # the CPU check
            blocks = lev.BlockSizes(**LEVANTER_CHECK_BLOCKS)
        elif implementation == "pallas_tpu":
            blocks = levanter_block_sizes(tokens, hidden, vocab, target, block_sizes)
        else:
            blocks = None  # its own choice

        def loss(h, k, t):
            return lev.fused_cross_entropy_loss_and_logsumexp_penalty(
                h, t, k, reduction="mean", implementation=implementation, block_sizes=blocks)

        return loss

    return make


def _optax(tokens, hidden, vocab, target):
    import jax.numpy as jnp
    import optax

    def loss(h, k, t):
        logits = (h @ k).astype(jnp.float32)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, t))

    return loss


# Levanter's Pallas forward keeps x [b_block, H] and w [H, 4 v_block] blocks in VMEM; its
# inferred blocks exceed a v5e's 16 MiB scoped VMEM. The smallest blocks it accepts at
# 8,192 tokens (b a multiple of 1,024 for B >= 1,024, all multiples of 128):
LEVANTER_SMALL_BLOCKS = {"b_block_size": 1024, "h_block_size": 128, "v_block_size": 128}

IMPLS = [
    Impl("ours CE", "ours", "[1,N,H]x[H,V]", _ours(None)),
    Impl("ours CE + NTL-WAS digits", "ours", "[1,N,H]x[H,V]", _ours("digits")),
    Impl("ours CE + NTL-WAS llama3 table", "ours", "[1,N,H]x[H,V]", _ours("llama3")),
    Impl("ours CE + NTL-WAS digits (Pallas backward)", "ours", "[1,N,H]x[H,V]", _ours("digits", "pallas"),
         pallas=True, note="opt-in: backward='pallas'"),
    Impl("tokamax/mosaic_tpu", "tokamax", "[N,H]x[H,V]", _tokamax("mosaic_tpu"), pallas=True),
    Impl("tokamax/chunked_xla", "tokamax", "[N,H]x[H,V]", _tokamax("chunked_xla")),
    Impl("jax_cce", "jax_cce", "[N,H]x[V,H]", _jax_cce),
    Impl("levanter/xla", "levanter", "[N,H]x[H,V]", _levanter("xla")),
    Impl("levanter/pallas_tpu", "levanter", "[N,H]x[H,V]", _levanter("pallas_tpu"), pallas=True),
    Impl("levanter/pallas_tpu small blocks", "levanter", "[N,H]x[H,V]",
         _levanter("pallas_tpu", LEVANTER_SMALL_BLOCKS), pallas=True,
         note=f"not its default: block_sizes={LEVANTER_SMALL_BLOCKS}"),
    Impl("optax (unfused)", "optax", "[N,H]x[H,V]", _optax),
]


def shapes_of(impl: Impl, tokens, hidden, vocab):
    """(hidden, kernel, targets) shapes as the implementation takes them."""
    if impl.layout.startswith("[1,"):
        return (1, tokens, hidden), (hidden, vocab), (1, tokens)
    if impl.layout.endswith("[V,H]"):
        return (tokens, hidden), (vocab, hidden), (tokens,)
    return (tokens, hidden), (hidden, vocab), (tokens,)


def value_and_grad(loss):
    import jax

    return jax.value_and_grad(loss, argnums=(0, 1))


@contextlib.contextmanager
def targeting(device, interpret=False):
    """Trace for `device`: the default device (tokamax reads the TPU's properties from
    it), what Levanter's modules see, and Pallas interpret mode (CPU checks). Ours takes
    the chip as an argument instead (`_ours`)."""
    import jax

    saved = (_Target.backend, _Target.devices, _PALLAS["interpret"])
    _Target.backend = "tpu" if (device.platform == "tpu" or interpret) else device.platform
    _Target.devices = (device,)
    _PALLAS["interpret"] = interpret
    try:
        with jax.default_device(device):
            yield
    finally:
        _Target.backend, _Target.devices, _PALLAS["interpret"] = saved


# -- numerical check -------------------------------------------------------------------------


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_inputs(tokens, hidden, vocab, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(tokens, hidden)).astype(np.float32)
    k = (rng.normal(size=(hidden, vocab)) / math.sqrt(hidden)).astype(np.float32)
    nt_ids = np.arange(4, 14)  # the digits of `loss_overhead.vocabulary_pieces`
    t = np.where(rng.uniform(size=tokens) < 0.5, rng.choice(nt_ids, size=tokens),
                 rng.integers(0, vocab, size=tokens)).astype(np.int32)
    t[:7] = vocab - 1 - np.arange(7)  # the last columns, the padded chunk's
    return h, k, t


def numerical_check(impls=None, tokens=CHECK_TOKENS, hidden=CHECK_HIDDEN, vocabs=CHECK_VOCABS, log=print):
    """Each implementation's loss and gradients against optax on the full logits, on
    the CPU in float32; ours with NTL also against the unfused `cross_entropy_and_ntl`."""
    import jax
    import jax.numpy as jnp
    import optax


    _install_pallas_hook()
    cpu = jax.devices("cpu")[0]
    out = {}
    refs = {}

    def reference(vocab):
        if vocab not in refs:
            h, k, t = check_inputs(tokens, hidden, vocab)

            def ref_loss(h, k, t):
                return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(h @ k, t))

            refs[vocab] = (h, k, t, *jax.jit(value_and_grad(ref_loss))(h, k, t))
        return refs[vocab]

    with jax.default_matmul_precision("highest"):
        for base in vocabs:
            for impl in impls or IMPLS:
                if impl.family == "optax" or impl.name.endswith("small blocks"):
                    continue
                # the LLaMA-3-like table needs V >= 4096: 5,248, 5,120, 4,096 (same conditions)
                vocab = base + 3072 if "llama3" in impl.name else base
                h, k, t, ref_l, (ref_gh, ref_gk) = reference(vocab)
                key = f"{impl.name} @V={base}"
                try:
                    with targeting(cpu, interpret=impl.pallas):
                        loss = impl.make(tokens, hidden, vocab, None)
                        hs, ks, ts = shapes_of(impl, tokens, hidden, vocab)
                        kk = k.T if impl.layout.endswith("[V,H]") else k
                        l, (gh, gk) = jax.jit(value_and_grad(loss))(h.reshape(hs), kk, t.reshape(ts))
                    gk = np.asarray(gk).T if impl.layout.endswith("[V,H]") else gk
                    row = {"vocab": vocab, "loss": float(l), "ref_loss": float(ref_l),
                           "loss_rel_err": abs(float(l) - float(ref_l)) / abs(float(ref_l)),
                           "grad_hidden_rel_err": _rel(np.asarray(gh).reshape(h.shape), ref_gh),
                           "grad_kernel_rel_err": _rel(gk, ref_gk)}
                    if impl.family == "ours" and "NTL" in impl.name:
                        with targeting(cpu, interpret=impl.pallas):
                            row.update(_ours_ntl_check(impl, h, k, t, vocab, ref_l))
                        # the CE part is what optax computes
                        row["loss_rel_err"] = row.pop("ce_part_rel_err")
                        row["grad_hidden_rel_err"] = row["grad_kernel_rel_err"] = None
                    row["passed"] = bool(row["loss_rel_err"] <= LOSS_RTOL and all(
                        row[g] is None or row[g] <= GRAD_RTOL for g in ("grad_hidden_rel_err", "grad_kernel_rel_err"))
                        and row.get("total_vs_unfused_rel_err", 0) <= LOSS_RTOL
                        and row.get("grads_vs_unfused_rel_err", 0) <= GRAD_RTOL)
                except Exception as exc:  # noqa: BLE001 - recorded in the row
                    row = {"vocab": vocab, "passed": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                out[key] = row
                if log:
                    log(f"check {key}: " + ", ".join(f"{a}={_fmt(b)}" for a, b in row.items() if a != "vocab"))
    return out


def _ours_ntl_check(impl, h, k, t, vocab, ref_l):
    """Ours with NTL: its CE part against optax, `ntl_weight=0` equal to CE only, and
    its total and gradients against the unfused `cross_entropy_and_ntl` on the logits."""
    import jax

    import ntl_jax

    table = "llama3" if "llama3" in impl.name else "digits"
    backward = "pallas_interpret" if impl.pallas else "xla"  # on the CPU
    nt = (_llama3 if table == "llama3" else _digits)(vocab)
    n = float(h.shape[0])
    h3, t2 = h[None], t[None]

    def fused(weight, number_loss="was"):
        def f(h, k):
            return ntl_jax.fused_cross_entropy_and_ntl(h, k, t2, nt, number_loss=number_loss, ntl_weight=weight,
                                                       loss_normalizing_factor=n, backward=backward)
        return f

    def unfused(h, k):
        return ntl_jax.cross_entropy_and_ntl(h @ k, t2, nt, number_loss="was", ntl_weight=NTL_WEIGHT,
                                             loss_normalizing_factor=n)

    (l, parts), grads = jax.jit(jax.value_and_grad(fused(NTL_WEIGHT), argnums=(0, 1), has_aux=True))(h3, k)
    (ul, _), ugrads = jax.jit(jax.value_and_grad(unfused, argnums=(0, 1), has_aux=True))(h3, k)
    zero = float(jax.jit(fused(0.0))(h3, k)[0])
    ce_only = float(jax.jit(fused(0.0, None))(h3, k)[0])
    return {"ce_part": float(parts["cross_entropy"]),
            "ce_part_rel_err": abs(float(parts["cross_entropy"]) - float(ref_l)) / abs(float(ref_l)),
            "ntl_weight_0_equals_ce_only": zero == ce_only,
            "ntl_weight_0_rel_err_vs_optax": abs(zero - float(ref_l)) / abs(float(ref_l)),
            "total": float(l), "unfused_total": float(ul),
            "total_vs_unfused_rel_err": abs(float(l) - float(ul)) / abs(float(ul)),
            "grads_vs_unfused_rel_err": max(_rel(grads[0], ugrads[0]), _rel(grads[1], ugrads[1]))}


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# -- HBM traffic from optimised HLO --------------------------------------------------------

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
             "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5,
             "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "token": 0,
             "s2": 0.25, "u2": 0.25, "s1": 0.125, "u1": 0.125, "f4e2m1fn": 0.5, "f8e8m0fnu": 1}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^{}]*(?:\([^()]*\))*[^{}]*\})?")
VMEM_SPACE = "S(1)"


def shape_bytes(shape: str, vmem_counts: bool = False) -> float:
    """Bytes of an HLO shape (tuples summed), leaving out arrays in VMEM (`S(1)` in
    their layout) unless `vmem_counts`."""
    total = 0.0
    for m in _ARRAY.finditer(shape):
        dtype, dims, layout = m.groups()
        if dtype not in _ITEMSIZE:
            continue
        if layout and VMEM_SPACE in layout and not vmem_counts:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _ITEMSIZE[dtype]
    return total


@dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list
    attrs: str
    root: bool


def _split_top(text: str, start: int, open_ch="(", close_ch=")") -> int:
    """Index just past the bracket matching the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")


def parse_instruction(line: str) -> Instr | None:
    m = _HEAD.match(line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _split_top(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        # array shape, its layout may hold spaces only inside braces
        i, depth = 0, 0
        while i < len(rest) and not (rest[i] == " " and depth == 0):
            depth += rest[i] == "{"
            depth -= rest[i] == "}"
            i += 1
        shape, rest = rest[:i], rest[i:].lstrip()
    p = rest.find("(")
    if p < 0:
        return None
    opcode = rest[:p]
    end = _split_top(rest, p)
    operands = [re.sub(r"/\*.*?\*/", "", o).strip().lstrip("%") for o in _split_commas(rest[p + 1:end - 1])]
    operands = [o.split(" ")[-1].lstrip("%") for o in operands if o]
    return Instr(m.group(2), shape, opcode, operands, rest[end:], bool(m.group(1)))


def _split_commas(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if cur:
        out.append("".join(cur))
    return out


_COMP = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")


def parse_module(hlo: str) -> tuple[dict[str, list[Instr]], str]:
    comps, entry, name = {}, None, None
    for line in hlo.splitlines():
        if not line.strip() or line.startswith("HloModule"):
            continue
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = _COMP.match(line)
            if m:
                name = m.group(2)
                comps[name] = []
                if m.group(1):
                    entry = name
                continue
        if line.startswith("}"):
            name = None
            continue
        if name is not None:
            ins = parse_instruction(line)
            if ins is not None:
                comps[name].append(ins)
    return comps, entry


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return m.group(1) if m else None


def _attr_list(attrs: str, key: str) -> list[str]:
    m = re.search(rf"\b{key}=\{{([^}}]*)\}}", attrs)
    return [x.strip().lstrip("%") for x in m.group(1).split(",")] if m else []


_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
         "replica-id", "opt-barrier", "add-dependency", "copy-done", "domain", "get-dimension-size"}


class TripCountError(ValueError):
    pass


def trip_count(comps, parent: list[Instr], loop: Instr) -> int:
    """A while loop's trip count: `known_trip_count` from its backend_config, else from
    its condition `i < N` (or `N > i`), the counter's start read from the loop's initial
    tuple (a constant) and its step from the body's update (`i + c`)."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
    if m:
        return int(m.group(1))
    cond = comps[_attr(loop.attrs, "condition")]
    body = comps[_attr(loop.attrs, "body")]
    cdefs = {i.name: i for i in cond}
    root = next(i for i in cond if i.root)
    if root.opcode == "fusion":  # the compare fused: read it inside, its parameters outside
        inner = comps[_attr(root.attrs, "calls")]
        iroot = next(i for i in inner if i.root)
        params = {i.name: int(i.operands[0]) for i in inner if i.opcode == "parameter"}
        if iroot.opcode == "compare" and all(o in params for o in iroot.operands):
            root = Instr(root.name, root.shape, "compare", [root.operands[params[o]] for o in iroot.operands],
                         iroot.attrs, True)
    direction = _attr(root.attrs, "direction")
    if root.opcode != "compare" or direction not in ("LT", "GT", "LE", "GE"):
        raise TripCountError(f"condition {root.opcode} {direction}")
    a, b = (cdefs.get(o) for o in root.operands)
    if direction in ("GT", "GE"):
        a, b = b, a
    defs = {i.name: i for i in parent}

    def value(ins):
        """A constant's value, or a tuple element's constant initial value."""
        while ins is not None and ins.opcode in ("copy", "bitcast", "convert"):
            ins = cdefs.get(ins.operands[0])
        if ins is None:
            return None, None
        if ins.opcode == "constant":
            return _constant(ins), None
        if ins.opcode == "get-tuple-element":
            index = int(_attr(ins.attrs, "index"))
            init = defs[loop.operands[0]]
            src = defs.get(init.operands[index]) if init.opcode == "tuple" else None
            while src is not None and src.opcode in ("copy", "bitcast", "convert"):
                src = defs.get(src.operands[0])
            return (_constant(src) if src is not None and src.opcode == "constant" else None), index
        return None, None

    start, index = value(a)
    bound, bound_index = value(b)
    if index is None or start is None or bound is None:
        raise TripCountError("cannot read the counter's start or the bound")
    broot = next(i for i in body if i.root)
    bdefs = {i.name: i for i in body}
    upd = bdefs.get(broot.operands[index]) if broot.opcode == "tuple" else None
    step = 1
    if upd is not None and upd.opcode == "add":
        consts = [bdefs[o] for o in upd.operands if o in bdefs and bdefs[o].opcode == "constant"]
        if consts:
            step = _constant(consts[0])
    if bound_index is not None and broot.opcode == "tuple":
        src = bdefs.get(broot.operands[bound_index])
        if src is None or src.opcode != "get-tuple-element" or int(_attr(src.attrs, "index")) != bound_index:
            raise TripCountError("the bound changes in the body")
    last = bound + (1 if direction in ("LE", "GE") else 0)
    return max(0, -(-(last - start) // step))


def _constant(ins: Instr) -> int:
    return int(float(ins.operands[0])) if ins.operands else 0


def _fusion_operand_bytes(comps, called: str, k: int, operand_shape: str) -> float:
    """Bytes read of a fusion's operand k: only the windows where the fused computation
    reads it through (dynamic-)slices or gathers (nested fusions followed); nothing
    where it is updated in place (operand 0 of the root's dynamic-update-slice); else
    all of it."""
    full = shape_bytes(operand_shape)
    if full == 0:
        return 0.0
    read = _param_read(comps, called, k)
    return full if read is None else min(read, full)


def _param_read(comps, called: str, k: int) -> float | None:
    """The windowed bytes parameter k of `called` is read through, None where it is read
    whole."""
    body = comps[called]
    param = next((i for i in body if i.opcode == "parameter" and i.operands == [str(k)]), None)
    if param is None:
        return None
    users: dict[str, list[Instr]] = {}
    for ins in body:
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    root = next(i for i in body if i.root).name
    total, frontier = 0.0, [param.name]
    while frontier:
        name = frontier.pop()
        if name == root:  # flows out whole: its consumer reads it
            return None
        for user in users.get(name, []):
            if user.opcode == "bitcast":
                frontier.append(user.name)
            elif user.opcode in ("dynamic-slice", "slice", "gather") and user.operands[0] == name:
                total += shape_bytes(user.shape, vmem_counts=True)
            elif user.opcode == "dynamic-update-slice" and user.operands[0] == name and _in_root(body, user):
                continue
            elif user.opcode == "fusion":
                inner = [_param_read(comps, _attr(user.attrs, "calls"), j)
                         for j, o in enumerate(user.operands) if o == name]
                if any(r is None for r in inner):
                    return None
                total += sum(inner)
            else:
                return None
    return total


def _in_root(body, ins) -> bool:
    root = next(i for i in body if i.root)
    defs = {i.name: i for i in body}
    names, todo = set(), [root.name]
    while todo:
        n = todo.pop()
        names.add(n)
        d = defs[n]
        if d.opcode in ("tuple", "bitcast"):
            todo.extend(d.operands)
    return ins.name in names


def _fusion_output_bytes(comps, called: str, shape: str) -> float:
    """Bytes written by a fusion: an in-place dynamic-update-slice root writes its
    update only."""
    body = comps[called]
    defs = {i.name: i for i in body}
    root = next(i for i in body if i.root)
    elements = [root] if root.opcode != "tuple" else [defs[o] for o in root.operands]
    out_shapes = [shape] if root.opcode != "tuple" else _tuple_elements(shape)
    total = 0.0
    for ins, s in zip(elements, out_shapes):
        while ins.opcode == "bitcast" and ins.operands[0] in defs:
            ins = defs[ins.operands[0]]
        if shape_bytes(s) == 0:
            continue
        if ins.opcode == "dynamic-update-slice":
            total += shape_bytes(defs[ins.operands[1]].shape, vmem_counts=True)
        else:
            total += shape_bytes(s)
    return total


def _tuple_elements(shape: str) -> list[str]:
    shape = re.sub(r"/\*[^*]*\*/", "", shape.strip())
    if not shape.startswith("("):
        return [shape]
    return [s.strip() for s in _split_commas(shape[1:-1])]


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _own_flops(comps, name, ins) -> float:
    return matmul_flops({"_": [i for i in comps[name] if i.opcode != "fusion" and (
        i is ins or i.name in ins.operands)]}, "_")


def matmul_flops(comps, name: str) -> float:
    """2 x output elements x contraction of every dot and convolution in a computation
    and the fusions it calls (once each)."""
    total = 0.0
    body = comps[name]
    defs = {i.name: i for i in body}
    for ins in body:
        if ins.opcode in ("dot", "convolution"):
            out = math.prod(_dims(ins.shape))
            lhs = _dims(defs[ins.operands[0]].shape) if ins.operands[0] in defs else []
            if ins.opcode == "dot":
                idx = [int(x) for x in _attr_list(ins.attrs, "lhs_contracting_dims") if x]
                contraction = math.prod(lhs[i] for i in idx) if lhs else 0
            else:
                labels = (_attr(ins.attrs, "dim_labels") or "").split("_")[0]
                contraction = lhs[labels.index("f")] if lhs and "f" in labels else 0
                m = re.search(r"window=\{size=([0-9x]+)", ins.attrs)
                if m:
                    contraction *= math.prod(int(x) for x in m.group(1).split("x"))
            total += 2.0 * out * contraction
        elif ins.opcode == "fusion":
            total += matmul_flops(comps, _attr(ins.attrs, "calls"))
    return total


def _mosaic_name(ins: Instr) -> str:
    """The kernel's name: the custom call's op_name path, else its instruction name."""
    m = re.search(r'op_name="([^"]+)"', ins.attrs)
    return m.group(1) if m else ins.name


def hbm_traffic(hlo: str, pallas_records: dict | None = None) -> dict:
    """Our count of HBM bytes of an optimised HLO module (see the module docstring):
    `{"bytes", "loops": [{body, trips, multiplier}], "mosaic": [...], "by_opcode"}`."""
    comps, entry = parse_module(hlo)
    report = {"bytes": 0.0, "matmul_flops": 0.0, "loops": [], "mosaic": [], "by_opcode": {}}

    def add(opcode, value):
        report["bytes"] += value
        report["by_opcode"][opcode] = report["by_opcode"].get(opcode, 0.0) + value

    def walk(name: str, mult: float):
        body = comps[name]
        defs = {i.name: i for i in body}

        def opnd(o):
            return defs[o].shape if o in defs else ""

        for ins in body:
            op = ins.opcode
            if op in _FREE:
                continue
            if op == "while":
                trips = trip_count(comps, body, ins)
                report["loops"].append({"body": _attr(ins.attrs, "body"), "trips": trips, "multiplier": mult * trips})
                walk(_attr(ins.attrs, "body"), mult * trips)
                walk(_attr(ins.attrs, "condition"), mult * (trips + 1))
            elif op == "conditional":
                branches = _attr_list(ins.attrs, "branch_computations") or [
                    b for b in (_attr(ins.attrs, "true_computation"), _attr(ins.attrs, "false_computation")) if b]
                for b in branches:  # each branch once: an upper bound
                    walk(b, mult)
            elif op == "call":
                walk(_attr(ins.attrs, "to_apply"), mult)
            elif op == "fusion":
                called = _attr(ins.attrs, "calls")
                report["matmul_flops"] += mult * matmul_flops(comps, called)
                value = sum(_fusion_operand_bytes(comps, called, k, opnd(o)) for k, o in enumerate(ins.operands))
                add(op, mult * (value + _fusion_output_bytes(comps, called, ins.shape)))
            elif op in ("dynamic-slice", "slice", "gather"):  # reads its window only
                window = shape_bytes(ins.shape, vmem_counts=True) if shape_bytes(opnd(ins.operands[0])) else 0
                add(op, mult * (window + shape_bytes(ins.shape)
                                + sum(shape_bytes(opnd(o)) for o in ins.operands[1:])))
            elif op == "dynamic-update-slice":
                upd = shape_bytes(opnd(ins.operands[1]))
                add(op, mult * (upd + (shape_bytes(opnd(ins.operands[1]), True) if shape_bytes(ins.shape) else 0)))
            elif op == "copy-start":
                src = shape_bytes(opnd(ins.operands[0]))
                dst = shape_bytes(_tuple_elements(ins.shape)[0])
                add(op, mult * (src + dst))
            elif op == "custom-call" and "tpu_custom_call" in ins.attrs:
                hlo_bytes = sum(shape_bytes(opnd(o)) for o in ins.operands) + shape_bytes(ins.shape)
                name = _mosaic_name(ins)
                model = _match_model(name, pallas_records or {})
                entry_ = {"name": name, "executions": mult, "hlo_operand_bytes": hlo_bytes,
                          "model": model}
                report["mosaic"].append(entry_)
                add("mosaic", mult * (model["bytes"] if model else hlo_bytes))
            elif op.endswith("-done"):
                add(op, mult * shape_bytes(ins.shape))
            elif op.endswith("-start"):
                add(op, mult * sum(shape_bytes(opnd(o)) for o in ins.operands))
            else:
                if op in ("dot", "convolution"):
                    report["matmul_flops"] += mult * _own_flops(comps, name, ins)
                add(op, mult * (sum(shape_bytes(opnd(o)) for o in ins.operands) + shape_bytes(ins.shape)))

    walk(entry, 1.0)
    return report


def _match_model(name: str, records: dict) -> dict | None:
    """The model of the recorded kernel whose name appears in the custom call's op_name
    (the longest such name); a kernel traced as several pipelines sums them."""
    keys = [k for k in records if k in name]
    if not keys and len(records) == 1:  # a pallas_call named after a partial or lambda: the one kernel traced
        keys = list(records)
    if not keys:
        return None
    key = max(keys, key=len)
    models = [pallas_model(r) for r in records[key]]
    if len(models) == 1:
        return models[0]
    return {"name": key, "bytes": sum(m["bytes"] for m in models), "pipelines": models,
            "unmodelled": [u for m in models for u in m["unmodelled"]]}


# -- compiling ---------------------------------------------------------------------------------


@dataclass
class Row:
    impl: str
    family: str
    shape: str
    chip: str
    tokens: int
    hidden: int
    vocab: int
    note: str = ""
    error: str | None = None
    figures: dict = field(default_factory=dict)


def compile_row(impl: Impl, chip: str, tokens: int, hidden: int, vocab: int, shape_name: str = "") -> Row:
    import jax
    import jax.numpy as jnp

    row = Row(impl.name, impl.family, shape_name, chip, tokens, hidden, vocab, note=impl.note)
    device = tpu_device(chip)
    sharding = jax.sharding.SingleDeviceSharding(device)
    hs, ks, ts = shapes_of(impl, tokens, hidden, vocab)
    args = (jax.ShapeDtypeStruct(hs, jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct(ks, jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct(ts, jnp.int32, sharding=sharding))
    _install_pallas_hook()
    PALLAS_RECORDS.clear()
    jax.clear_caches()  # kernels choose blocks per chip at trace time
    start = time.time()
    try:
        with targeting(device):
            fn = value_and_grad(impl.make(tokens, hidden, vocab, device))
            lowered = jax.jit(fn).lower(*args)
        compiled = lowered.compile()
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        row.error = f"{type(exc).__name__}: {_short(str(exc))}"
        row.figures["compile_s"] = round(time.time() - start, 1)
        return row
    row.figures.update(figures(compiled, dict(PALLAS_RECORDS)))
    row.figures["compile_s"] = round(time.time() - start, 1)
    return row


def _short(text: str, n: int = 600) -> str:
    text = " ".join(text.split())
    m = re.search(r"(RESOURCE_EXHAUSTED|INTERNAL|INVALID_ARGUMENT)[^.]*\.[^.]*\.", text)
    return (m.group(0) if m else text)[:n]


def figures(compiled, pallas_records=None) -> dict:
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    hlo = compiled.as_text()
    traffic = hbm_traffic(hlo, pallas_records)
    peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
            - mem.alias_size_in_bytes)
    return {
        "temp_bytes": int(mem.temp_size_in_bytes),
        "argument_bytes": int(mem.argument_size_in_bytes),
        "output_bytes": int(mem.output_size_in_bytes),
        "alias_bytes": int(mem.alias_size_in_bytes),
        "peak_bytes": int(peak),
        "flops": float(cost.get("flops", 0.0)),
        "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "hbm_bytes": float(traffic["bytes"]),
        "matmul_flops": float(traffic["matmul_flops"]),
        "loops": [{"trips": lp["trips"], "multiplier": lp["multiplier"]} for lp in traffic["loops"]],
        "mosaic": traffic["mosaic"],
        "by_opcode": {k: float(v) for k, v in sorted(traffic["by_opcode"].items(), key=lambda kv: -kv[1])},
    }


def counter_checks(chip: str = "v5e", tokens: int = TOKENS, hidden: int = 4096, vocab: int = 128_256) -> list[dict]:
    """Our HBM count against XLA's "bytes accessed" on loop-free programs (optax CE on
    logits, forward + backward; one matmul), where XLA's figure counts everything once."""
    import jax
    import jax.numpy as jnp
    import optax

    device = tpu_device(chip)
    sh = jax.sharding.SingleDeviceSharding(device)
    out = []
    programs = {
        "optax CE value_and_grad on bf16 logits [N, V]": (
            jax.value_and_grad(lambda z, t: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
                z.astype(jnp.float32), t))),
            (jax.ShapeDtypeStruct((tokens, vocab), jnp.bfloat16, sharding=sh),
             jax.ShapeDtypeStruct((tokens,), jnp.int32, sharding=sh))),
        "matmul [N, H] x [H, V] bf16": (
            lambda a, b: a @ b,
            (jax.ShapeDtypeStruct((tokens, hidden), jnp.bfloat16, sharding=sh),
             jax.ShapeDtypeStruct((hidden, vocab), jnp.bfloat16, sharding=sh))),
    }
    for name, (fn, args) in programs.items():
        compiled = jax.jit(fn).lower(*args).compile()
        f = figures(compiled)
        out.append({"program": name, "chip": chip, "hbm_bytes": f["hbm_bytes"],
                    "xla_bytes_accessed": f["xla_bytes_accessed"],
                    "ratio": f["hbm_bytes"] / f["xla_bytes_accessed"], "loops": len(f["loops"])})
    return out


# -- output -------------------------------------------------------------------------------------


def _gb(x):
    return "" if x is None else f"{x / 1e9:.2f}"


def markdown(rows: list[dict], checks: dict) -> str:
    lines = ["| shape | chip | implementation | peak GB | temp GB | TFLOP (XLA) | matmul TFLOP | XLA bytes GB "
             "| HBM traffic GB | check (loss / grad rel. err., V 2,176) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        f = r["figures"]
        c = checks.get(f"{r['impl']} @V={CHECK_VOCABS[0]}", {})
        if c.get("error"):
            check = "not run"
        elif c:
            gh = c.get("grad_hidden_rel_err")
            check = (f"{'pass' if c['passed'] else 'FAIL'} {c['loss_rel_err']:.1e}"
                     + (f" / {max(gh, c['grad_kernel_rel_err']):.1e}" if gh is not None else ""))
        else:
            check = ""
        if r.get("error"):
            error = r["error"][:120]
            lines.append(f"| {r['shape']} | {r['chip']} | {r['impl']} | error: {error} | | | | | | {check} |")
            continue
        lines.append(f"| {r['shape']} | {r['chip']} | {r['impl']} | {_gb(f['peak_bytes'])} | {_gb(f['temp_bytes'])} "
                     f"| {f['flops'] / 1e12:.2f} | {f['matmul_flops'] / 1e12:.2f} | {_gb(f['xla_bytes_accessed'])} "
                     f"| {_gb(f['hbm_bytes'])} | {check} |")
    return "\n".join(lines)


DOCS_NAMES = {
    "ours CE + NTL-WAS digits": "**ours, CE + NTL-WAS** (digits)",
    "ours CE + NTL-WAS llama3 table": "**ours, CE + NTL-WAS** (1,110 number tokens)",
    "ours CE + NTL-WAS digits (Pallas backward)": "**ours, CE + NTL-WAS** (digits), `backward=\"pallas\"` (opt-in)",
    "ours CE": "ours, CE only",
    "tokamax/mosaic_tpu": "tokamax, Mosaic TPU kernel",
    "tokamax/chunked_xla": "tokamax, chunked XLA",
    "jax_cce": "jax-cce",
    "levanter/xla": "Levanter, XLA",
    "levanter/pallas_tpu": "Levanter, Pallas TPU kernel",
    "levanter/pallas_tpu small blocks": "Levanter, Pallas, blocks 1,024/128/128 (not its default)",
    "optax (unfused)": "optax on the logits (unfused)",
}
DOCS_SHAPES = {"llama3": "Llama-3 (H 4,096, V 128,256)", "qwen3": "Qwen3-0.6B (H 1,024, V 151,936)",
               "gemma2": "Gemma-2 2B (H 2,304, V 256,000)"}


def docs_tables(result: dict) -> str:
    """The tables of docs/performance.md from a results file: per shape, each
    implementation's peak and HBM traffic on each chip and its numerical check."""
    out = []
    for shape, title in DOCS_SHAPES.items():
        out += ["", f"**{title}**, 8,192 tokens, bf16, GB:", "",
                "| implementation | v5e peak | v5e HBM traffic | v5p peak | v5p HBM traffic "
                "| check (V 2,176): loss / gradients |", "|---|---|---|---|---|---|"]
        for impl, label in DOCS_NAMES.items():
            cells = []
            found = [next((r for r in result["rows"] if (r["shape"], r["chip"], r["impl"]) == (shape, chip, impl)),
                          None) for chip in ("v5e", "v5p")]
            if not any(found):
                continue
            for r in found:
                if r is None:
                    cells += ["", ""]
                elif r.get("error"):
                    cells += ["does not compile", "—"]
                else:
                    cells += [f"{r['figures']['peak_bytes'] / 1e9:.2f}", f"{r['figures']['hbm_bytes'] / 1e9:.1f}"]
            c = result["checks"].get(f"{impl} @V={CHECK_VOCABS[0]}")
            if c is None:
                check = "the reference" if impl.startswith("optax") else "the kernel above"
            elif c.get("grad_hidden_rel_err") is not None:
                check = (f"{'pass' if c['passed'] else '**wrong**'}: {c['loss_rel_err']:.1e} / "
                         f"{max(c['grad_hidden_rel_err'], c['grad_kernel_rel_err']):.1e}")
            else:
                check = (f"{'pass' if c['passed'] else '**wrong**'}: {c['total_vs_unfused_rel_err']:.1e} / "
                         f"{c['grads_vs_unfused_rel_err']:.1e} (vs the unfused objective)")
            out.append(f"| {label} | " + " | ".join(cells + [check]) + " |")
    return "\n".join(out[1:])


def versions() -> dict:
    out = {}
    for name in ("jax", "jaxlib", "libtpu", "tokamax", "jax-cce", "optax", "ntl_jax"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["levanter"] = f"{LEVANTER_WHEEL} (kernel modules from the unpacked wheel)"
    out["python"] = sys.version.split()[0]
    return out


def select(only: str | None) -> list[Impl]:
    if not only:
        return IMPLS
    wanted = {w.strip() for w in only.split(",")}
    return [i for i in IMPLS if i.family in wanted or i.name in wanted]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {list(SHAPES)}")
    parser.add_argument("--chips", default="v5e,v5p", help=f"of {list(CHIPS)}")
    parser.add_argument("--only", default=None, help=f"families ({', '.join(FAMILIES)}) or implementation names")
    parser.add_argument("--check-only", action="store_true", help="the numerical check alone")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="the numerical check plus one small compile per implementation (not written)")
    parser.add_argument("--out", default=None, help="JSON file to write (merged by row with what it holds)")
    parser.add_argument("--docs-tables", metavar="RESULTS", default=None,
                        help="print docs/performance.md's tables from a results file, and nothing else")
    args = parser.parse_args(argv)
    if args.docs_tables:
        with open(args.docs_tables) as fh:
            print(docs_tables(json.load(fh)))
        return 0

    impls = select(args.only)
    command = [os.path.relpath(__file__, os.path.dirname(HERE))] + (argv or sys.argv[1:])
    result = {"command": "python " + " ".join(command),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "libtpu": libtpu_version(), "tokens": TOKENS, "ntl_weight": NTL_WEIGHT,
              "check": {"tokens": CHECK_TOKENS, "hidden": CHECK_HIDDEN, "vocabs": list(CHECK_VOCABS),
                        "loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL}, "levanter_stubs": list(STUBS)}
    checks = {} if args.no_check else numerical_check(impls)
    result["checks"] = checks
    rows = []
    if not args.check_only:
        if args.quick:
            plan = [("quick", "v5e", QUICK["tokens"], QUICK["hidden"], QUICK["vocab"])]
        else:
            plan = [(s, c, TOKENS, SHAPES[s][0], SHAPES[s][1]) for s in args.shapes.split(",")
                    for c in args.chips.split(",")]
            result["counter_checks"] = counter_checks("v5e")
            for c in result["counter_checks"]:
                print(f"counter check {c['program']}: ours {c['hbm_bytes'] / 1e9:.3f} GB, XLA "
                      f"{c['xla_bytes_accessed'] / 1e9:.3f} GB, ratio {c['ratio']:.4f}", flush=True)
        for shape, chip, n, h, v in plan:
            for impl in impls:
                row = compile_row(impl, chip, n, h, v, shape)
                f = row.figures
                print(f"{shape} {chip} {impl.name}: " + (row.error or
                      f"peak {_gb(f['peak_bytes'])} GB, temp {_gb(f['temp_bytes'])} GB, "
                      f"{f['flops'] / 1e12:.2f} TFLOP (XLA), {f['matmul_flops'] / 1e12:.2f} (matmuls, per trip), "
                      f"XLA {_gb(f['xla_bytes_accessed'])} GB, "
                      f"HBM {_gb(f['hbm_bytes'])} GB") + f" ({f.get('compile_s')} s)", flush=True)
                rows.append(row.__dict__)
    result["rows"] = rows
    print(markdown(rows, checks))
    if args.out and not args.quick:
        if os.path.exists(args.out):  # keep the rows not rerun (e.g. `--only ours`)
            with open(args.out) as fh:
                old = json.load(fh)
            keys = {(r["impl"], r["shape"], r["chip"]) for r in rows}
            result["rows"] = [r for r in old.get("rows", []) if (r["impl"], r["shape"], r["chip"]) not in keys] + rows
            result["checks"] = {**old.get("checks", {}), **checks}
            result["commands"] = old.get("commands", [old.get("command")]) + [result["command"]]
            if "counter_checks" not in result and "counter_checks" in old:
                result["counter_checks"] = old["counter_checks"]
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
            fh.write("\n")
    failed = [k for k, c in checks.items() if c.get("passed") is False]
    if failed:
        print("numerical check failed: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
