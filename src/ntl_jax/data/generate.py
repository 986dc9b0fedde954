"""Offline, deterministic generation of DeepMind mathematics pairs.

Wraps DeepMind's generator (`mathematics-dataset` on PyPI, shims from `compat`). Every
example is a pure function of `(seed, namespace, regime, module, index)`: Python's and
numpy's global generators (the ones DeepMind's code draws from) are re-seeded from a
hash of that key before each example, under a lock, and restored afterwards. So a
stream is the same whatever the interleaving with other streams, the number of worker
processes or the order in which chunks finish.

Each release file is one stream (`write_release` writes exactly these pairs). The
splits (`split_parts`): `validation` is the first 333 pairs of each train difficulty,
`train` the rest, easy/medium/hard taken in turn; `test_interpolate` is
interpolate/<module>; `test_extrapolate` is extrapolate/<module's extrapolation>.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import random
import threading
from collections.abc import Iterator

import numpy as np

from ntl_jax.data import catalogue, compat

_LOCK = threading.RLock()

# regime -> (entropy level, number of levels) as in DeepMind's generate.init_modules.
_TRAIN_ENTROPY = {"train-easy": (0, 3), "train-medium": (1, 3), "train-hard": (2, 3)}


@functools.lru_cache(maxsize=None)
def _module_table(regime: str) -> dict:
    """Flat `{module name: sampler}` for one release folder."""
    generate, modules = compat.import_generator()
    if regime in _TRAIN_ENTROPY:
        tree = modules.train(generate._make_entropy_fn(*_TRAIN_ENTROPY[regime]))
    elif regime == "interpolate":
        tree = modules.test()
    elif regime == "extrapolate":
        tree = modules.test_extra()
    else:
        raise ValueError(f"expected a regime in {catalogue.REGIMES}, got {regime!r}")
    flat: dict = {}

    def add(node, prefix):
        for key, value in node.items():
            name = f"{prefix}__{key}" if prefix else key
            if isinstance(value, dict):
                add(value, name)
            else:
                flat[name] = value

    add(tree, "")
    return flat


def example_seed(seed: int, namespace: str, regime: str, module: str, index: int) -> int:
    """A 32-bit seed for one example; stable across processes and Python versions."""
    key = f"{int(seed)}/{namespace}/{regime}/{module}/{int(index)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def sample(module: str, regime: str, index: int, *, seed: int = 0,
           namespace: str = "train") -> tuple[str, str]:
    """Generates example `index` of `module` in `regime` as `(question, answer)`.

    Applies DeepMind's length filter (question <= 160, answer <= 30 characters) by
    drawing again from the same seeded stream, as `generate.sample_from_module` does.
    """
    table = _module_table(regime)
    if module not in table:
        catalogue.check_module(module, regime=regime)
    fn = table[module]
    s = example_seed(seed, namespace, regime, module, index)
    with _LOCK:
        rngs = _python_rngs()
        saved = [r.getstate() for r in rngs], np.random.get_state()
        try:
            for r in rngs:
                r.seed(s)
            np.random.seed(s)
            compat.reset_entity_counter()
            while True:
                problem = fn()
                question = str(problem.question)
                answer = str(problem.answer)
                if (len(question) <= catalogue.MAX_QUESTION_LENGTH
                        and len(answer) <= catalogue.MAX_ANSWER_LENGTH):
                    return question, answer
        finally:
            for r, state in zip(rngs, saved[0]):
                r.setstate(state)
            np.random.set_state(saved[1])


@functools.lru_cache(maxsize=None)
def _python_rngs() -> tuple[random.Random, ...]:
    """Python generators the sampler draws from: the global one and sympy's own
    (sympy >= 1.10 keeps a private `random.Random`, e.g. for `randprime`)."""
    rngs = [random._inst]  # the instance behind random.seed/random.randint/...
    try:
        sympy_random = importlib.import_module("sympy.core.random")
        rngs += [sympy_random.rng, getattr(sympy_random, "_assumptions_rng", None)]
    except ImportError:  # older sympy draws from the global generator
        pass
    return tuple(r for r in rngs if r is not None)


Part = tuple  # (regime, module, namespace, start, count); count None = unbounded


def split_parts(module: str, split: str, *,
                train_per_difficulty: int = catalogue.RELEASE_TRAIN_PER_DIFFICULTY,
                validation_per_difficulty: int = catalogue.VALIDATION_PER_DIFFICULTY,
                test_size: int | None = catalogue.RELEASE_TEST_PER_MODULE) -> list[Part]:
    """The streams that make up `split` of `module`, as `(regime, module, namespace,
    start, count)` parts that `interleave` takes in turn.

    The train file of each difficulty is one stream: `validation` is its first
    `validation_per_difficulty` pairs and `train` the rest (so the files written by
    `write_release` and on-the-fly generation give the same splits). Train regimes
    (`train-easy`, ...) and `interpolate`/`extrapolate` are accepted as splits too:
    one whole release file each. For `test_extrapolate`, `module` may be a training
    module with an extrapolation set or an extrapolation module.
    """
    k = validation_per_difficulty
    if split == "train":
        catalogue.check_module(module)
        rest = None if train_per_difficulty is None else max(0, train_per_difficulty - k)
        return [(r, module, "train", k, rest) for r in catalogue.TRAIN_REGIMES]
    if split == "validation":
        catalogue.check_module(module)
        return [(r, module, "train", 0, k) for r in catalogue.TRAIN_REGIMES]
    if split in catalogue.TRAIN_REGIMES:
        catalogue.check_module(module)
        return [(split, module, "train", 0, train_per_difficulty)]
    if split in ("test_interpolate", "interpolate"):
        catalogue.check_module(module)
        return [("interpolate", module, "interpolate", 0, test_size)]
    if split in ("test_extrapolate", "extrapolate"):
        target = module if module in catalogue.EXTRAPOLATION_OF else catalogue.EXTRAPOLATION_FOR.get(module)
        if target is None:
            raise ValueError(
                f"expected a module with an extrapolation set (one of "
                f"{sorted(catalogue.EXTRAPOLATION_FOR)}) or an extrapolation module, "
                f"got {module!r}"
            )
        return [("extrapolate", target, "extrapolate", 0, test_size)]
    raise ValueError(
        f"expected a split in {catalogue.SPLITS + catalogue.REGIMES}, got {split!r}"
    )


def interleave(parts: list[Part], *, seed: int = 0) -> Iterator[tuple[str, str]]:
    """Yields pairs from `parts` in turn (one from each, round robin) until all are
    exhausted; deterministic per `seed`."""
    cursors = [[regime, module, namespace, start, count, 0]
               for regime, module, namespace, start, count in parts]
    while cursors:
        for cur in list(cursors):
            regime, module, namespace, start, count, done = cur
            if count is not None and done >= count:
                cursors.remove(cur)
                continue
            cur[5] += 1
            yield sample(module, regime, start + done, seed=seed, namespace=namespace)


def iterate(module: str, split: str, *, seed: int = 0, n: int | None = None,
            **sizes) -> Iterator[tuple[str, str]]:
    """Yields `(question, answer)` pairs of `split` (see `split_parts`), at most `n`."""
    stream = interleave(split_parts(module, split, **sizes), seed=seed)
    for j, pair in enumerate(stream):
        if n is not None and j >= n:
            return
        yield pair


def examples(module: str, split: str = "train", n: int = 8, seed: int = 0,
             **sizes) -> list[tuple[str, str]]:
    """The first `n` `(question, answer)` pairs of a split, e.g. for a quick demo.

    >>> examples("arithmetic__add_or_sub", "train", 1) == examples("arithmetic__add_or_sub", "train", 1)
    True
    """
    if n < 0:
        raise ValueError(f"expected n >= 0, got {n}")
    return list(iterate(module, split, seed=seed, n=n, **sizes))


def _chunk_text(job: tuple[str, str, int, int, int]) -> tuple[int, str]:
    """Worker: the file text of pairs `start..stop` of one (regime, module)."""
    regime, module, start, stop, seed = job
    namespace = "train" if regime in catalogue.TRAIN_REGIMES else regime
    lines = []
    for i in range(start, stop):
        q, a = sample(module, regime, i, seed=seed, namespace=namespace)
        lines.append(f"{q}\n{a}\n")
    return stop - start, "".join(lines)


def release_plan(train_modules, extrapolate_modules, per_train_module: int,
                 per_test_module: int, regimes=catalogue.REGIMES) -> list[tuple[str, str, int]]:
    """`[(regime, module, count), ...]` for `write_release`, in file order.

    `per_train_module` is split evenly over the three difficulties, as DeepMind's
    `generate_to_file --per_train_module` does.
    """
    plan = []
    for regime in regimes:
        if regime in catalogue.TRAIN_REGIMES:
            plan += [(regime, m, per_train_module // 3) for m in train_modules]
        elif regime == "interpolate":
            plan += [(regime, m, per_test_module) for m in train_modules]
        elif regime == "extrapolate":
            plan += [(regime, m, per_test_module) for m in extrapolate_modules]
        else:
            raise ValueError(f"expected regimes from {catalogue.REGIMES}, got {regime!r}")
    return plan


class ExistingFilesError(FileExistsError):
    """`write_release` would replace files and `overwrite` is False; `.paths` lists them."""

    def __init__(self, paths: list[str]):
        self.paths = list(paths)
        super().__init__(f"{len(self.paths)} file(s) already exist, e.g. {self.paths[0]}; "
                         "pass overwrite=True to replace them")


def write_release(output_dir: str, train_modules, extrapolate_modules=(), *,
                  per_train_module: int = 3_000, per_test_module: int = 1_000,
                  seed: int = 0, workers: int | None = None, regimes=catalogue.REGIMES,
                  overwrite: bool = False, progress: bool = True,
                  chunk_size: int = 250) -> list[str]:
    """Writes DeepMind's release layout under `output_dir`; returns the files written.

    Files hold the same pairs as the on-the-fly `train` (per difficulty),
    `test_interpolate` and `test_extrapolate` streams of the same seed. Work is spread
    over `workers` processes (default: all cores) in chunks; the output does not
    depend on the number of workers.
    """
    import multiprocessing as mp
    import os

    for m in train_modules:
        catalogue.check_module(m)
    for m in extrapolate_modules:
        catalogue.check_module(m, regime="extrapolate")
    if per_train_module < 0 or per_test_module < 0:
        raise ValueError(
            f"expected non-negative sizes, got per_train_module={per_train_module}, "
            f"per_test_module={per_test_module}"
        )
    plan = [p for p in release_plan(train_modules, extrapolate_modules, per_train_module,
                                    per_test_module, regimes) if p[2] > 0]
    paths = [os.path.join(output_dir, r, f"{m}.txt") for r, m, _ in plan]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not overwrite:
        raise ExistingFilesError(existing)
    jobs, owners = [], []
    for k, (regime, module, count) in enumerate(plan):
        for start in range(0, count, chunk_size):
            jobs.append((regime, module, start, min(count, start + chunk_size), seed))
            owners.append(k)
    total = sum(c for _, _, c in plan)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))

    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="ex", desc="generating", disable=not progress)
    handles: dict[int, object] = {}
    try:
        if workers > 1:
            # spawn, not fork: the caller may have JAX's threads running, and forking
            # those can deadlock. Workers apply the shims themselves; chunks come back
            # in order.
            pool = mp.get_context("spawn").Pool(workers, initializer=compat.apply)
            results = pool.imap(_chunk_text, jobs)
        else:
            pool = None
            results = map(_chunk_text, jobs)
        for k, (count, text) in zip(owners, results):
            if k not in handles:
                os.makedirs(os.path.dirname(paths[k]), exist_ok=True)
                handles[k] = open(paths[k], "w", encoding="utf-8")
            handles[k].write(text)
            bar.update(count)
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        for h in handles.values():
            h.close()
        bar.close()
    return paths
