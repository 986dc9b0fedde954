"""The training loop: data, model, jitted step, checkpoints, logs and evaluation."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import threading
import time
from typing import Any

import jax
import numpy as np

from ntl_jax._core.number_losses.number_loss import MEAN_OVERS
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax._core.objective import ntl_mean
from ntl_jax.train import data as data_lib
from ntl_jax.train import loss_names, network, optim, systems
from ntl_jax.train import step as step_lib
from ntl_jax.train.checkpoint import Checkpointer, CheckpointError, DamagedCheckpoint  # noqa: F401 (CheckpointError: re-export)
from ntl_jax.train.logging_utils import MetricsLog, finite_or_none, write_json


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (saved with each checkpoint).

    `loss` is a system (`systems`): a baseline, or a token-head loss whose number loss
    and its parameters travel in the name ("smmd(mode=mmd)", `loss_names`); it is kept
    as `systems.canonical` writes it, so equal losses are equal identities.
    """

    loss: str = loss_names.DEFAULT
    preset: str = "tiny"
    steps: int = 2000
    seed: int = 0
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    ntl_weight: float = 0.3
    # How the number loss's term is normalised (`NumberLoss.mean_over`); None: the loss's
    # own ("counted" for every shipped loss; "targets" is ntl_jax 0.4's).
    ntl_mean_over: str | None = None
    z_loss: float = 1e-4
    # The width of the Gaussian label of the "gce" losses; part of those runs' identity only.
    gce_sigma: float = step_lib.DEFAULT_GCE_SIGMA
    dropout_rate: float = 0.0
    # The loss from hidden states and the logits kernel, without the logits
    # (`ntl_jax.fused_cross_entropy_and_ntl`); equal to float32 rounding, so part of
    # a checkpoint's identity (a resumed run repeats its arithmetic bit for bit).
    fused_loss: bool = True
    # The RT systems: add the authors' fixed float encodings to the input embeddings of
    # the RT number tokens (`ntl_jax.flax.number_embeddings`); part of those runs' identity only.
    rt_float_encodings: bool = True
    data: data_lib.DataConfig = data_lib.DataConfig()
    architecture: str = "encoder-decoder"  # network.ARCHITECTURES; = data.architecture
    # Another run's directory: start from its final parameters (fresh optimizer state,
    # this run's own schedule). Empty: initialise from `seed`.
    init_from: str = ""
    # Bookkeeping (not part of a checkpoint's identity).
    log_every: int = 50
    checkpoint_every: int = 500
    eval_every: int = 0  # 0: evaluate at the end only
    eval_batch_size: int = 250

    def __post_init__(self):
        try:
            object.__setattr__(self, "loss", systems.canonical(self.loss))
        except ValueError:
            pass  # `validate` says what was expected

    def validate(self) -> None:
        systems.check(self.loss, self.architecture)
        if self.preset not in network.PRESETS:
            raise ValueError(f"preset must be one of {sorted(network.PRESETS)}, got {self.preset!r}")
        for name in ("steps", "log_every", "checkpoint_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every % self.log_every:
            raise ValueError(f"checkpoint_every ({self.checkpoint_every}) must be a multiple of "
                             f"log_every ({self.log_every}) so resumed logs match")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"expected a finite learning_rate > 0, got {self.learning_rate}")
        if not 0 <= self.ntl_weight < math.inf or not 0 <= self.dropout_rate < 1:
            raise ValueError(f"expected a finite ntl_weight >= 0 and 0 <= dropout_rate < 1, got "
                             f"{self.ntl_weight} and {self.dropout_rate}")
        if self.ntl_mean_over is not None and self.ntl_mean_over not in MEAN_OVERS:
            raise ValueError(f"expected ntl_mean_over None or one of {MEAN_OVERS}, got {self.ntl_mean_over!r}")
        if step_lib.uses_gce(self.loss) and not 0 < self.gce_sigma < math.inf:
            raise ValueError(f"expected a finite gce_sigma > 0 for loss {self.loss!r}, got {self.gce_sigma}")
        if self.optimizer not in optim.OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {optim.OPTIMIZERS}, got {self.optimizer!r}")
        if self.architecture not in network.ARCHITECTURES:
            raise ValueError(f"architecture must be one of {network.ARCHITECTURES}, got "
                             f"{self.architecture!r}")
        if self.architecture != self.data.architecture:
            raise ValueError(f"architecture is {self.architecture!r} but data.architecture is "
                             f"{self.data.architecture!r}: the batches' features must be "
                             f"those of the network; set both")

    def identity(self) -> dict:
        """The fields a resumed run must share with its checkpoint."""
        d = dataclasses.asdict(self)
        for key in ("log_every", "checkpoint_every", "eval_every", "eval_batch_size"):
            d.pop(key)
        if not self.fused_loss:  # as runs saved before the option existed, which resume unfused
            d.pop("fused_loss")
        if not step_lib.uses_gce(self.loss):  # not used: as runs saved before the option existed
            d.pop("gce_sigma")
        # Not used; or off, as RT runs saved before the option existed, which resume without it.
        if systems.vocabulary_name(self.loss) != "rt" or not self.rt_float_encodings:
            d.pop("rt_float_encodings")
        # How the number loss is normalised; runs saved before the option existed normalised
        # over the targets, and resume so under the name they recorded.
        d.pop("ntl_mean_over")
        mean_over = self.mean_over()
        if mean_over == "targets" and self.loss == systems.token_loss(self.loss):
            d["loss"] = loss_names.recorded(self.loss)
        elif mean_over is not None:
            d["ntl_mean_over"] = mean_over
        return d

    def mean_over(self) -> str | None:
        """How the number loss trained on is normalised (`ntl_mean_over`, else the loss's
        own); None for a run that trains on none."""
        if not systems.trains_ntl(self.loss):
            return None
        return self.ntl_mean_over or loss_names.number_loss(systems.token_loss(self.loss)).mean_over

    def float_encodings(self) -> str:
        """What the network adds to its input embeddings (`network.FLOAT_ENCODINGS`)."""
        return "rt" if systems.vocabulary_name(self.loss) == "rt" and self.rt_float_encodings else "none"


class Interrupted(Exception):
    """Training stopped on SIGINT after saving a checkpoint at `step`."""

    def __init__(self, step: int, checkpoint: str):
        super().__init__(f"interrupted at step {step}; rerun the same command to resume")
        self.step, self.checkpoint = step, checkpoint

    def __reduce__(self):  # picklable, for runs in worker processes
        return Interrupted, (self.step, self.checkpoint)


class Diverged(Exception):
    """The training loss or state became NaN or infinite; nothing of it was saved."""

    def __init__(self, out_dir: str, what: str, checkpoint_step: int | None):
        kept = (f"the last checkpoint (step {checkpoint_step}) is from before"
                if checkpoint_step else "no checkpoint was written")
        super().__init__(f"{out_dir}: training diverged: {what}; {kept}. Expected finite "
                         "values: lower --learning-rate or --ntl-weight")
        self._args = (out_dir, what, checkpoint_step)

    def __reduce__(self):  # picklable, for runs in worker processes
        return Diverged, self._args


def _check_finite(window: list[dict], last: int, checkpointer, out_dir: str) -> dict[str, float]:
    """The window's metrics (`window_metrics`); raises `Diverged` if its loss is not finite."""
    mean = window_metrics(window)
    if not math.isfinite(mean["loss"]):
        raise Diverged(out_dir, f"the mean loss of steps {last - len(window) + 1}..{last} is "
                       f"{mean['loss']}", checkpointer.latest_step())
    return mean


def _save_finite(checkpointer, step: int, state, identity: dict, out_dir: str) -> None:
    """Saves a checkpoint of `state` after checking that all of it is finite (the loss
    checks the parameters before the last update, this the parameters after it)."""
    finite = all(bool(jax.numpy.isfinite(x).all()) for x in jax.tree_util.tree_leaves(state)
                 if jax.numpy.issubdtype(getattr(x, "dtype", np.int32), jax.numpy.inexact))
    if not finite:
        raise Diverged(out_dir, f"the training state after step {step} is not finite",
                       checkpointer.latest_step())
    checkpointer.save(step, state, identity)


FINAL_PARAMS = "final_params.msgpack"  # a finished run's parameters, for --init-from
FINAL_PARAMS_INFO = "final_params.json"  # their checksum, network and vocabulary


def vocabulary_fingerprint(vocabulary) -> str:
    """A hash of every piece of `vocabulary`: two runs can share parameters only if equal."""
    piece = getattr(vocabulary, "id_to_piece", None) or (lambda i: vocabulary.decode([i]))
    pieces = [str(piece(i)) for i in range(int(vocabulary.vocab_size))]
    return hashlib.sha256("\n".join(pieces).encode()).hexdigest()[:16]


def _network_identity(model_config) -> dict:
    return {k: str(v) for k, v in dataclasses.asdict(model_config).items()}


def check_output_dir(out_dir: str) -> str:
    """Creates `out_dir` if needed and checks it is writable (clear error otherwise)."""
    out_dir = os.path.abspath(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write_test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"output directory {out_dir} is not writable: {e.strerror or e}") from e
    return out_dir


def number_tokens_of(vocabulary) -> NumberTokens:
    """`NumberTokens` of `vocabulary` (the network's rounded-up ids beyond it are no
    numbers); a vocabulary whose pieces are not plain numbers (RT's) gives its own."""
    return NumberTokens.from_vocabulary(vocabulary)


def number_tokens_digest(number_tokens: NumberTokens) -> str:
    """A hash of the tables of `number_tokens`: equal digests, equal loss terms."""
    h = hashlib.sha256(repr(number_tokens.dot_id).encode())
    tables = (number_tokens.values, number_tokens.ids, number_tokens.number_values, number_tokens.digit_counts,
              number_tokens.opens_number)
    for table in tables:
        table = np.asarray(table)
        h.update(f"{table.dtype}{table.shape}".encode())
        h.update(table.tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything the network, optimizer and jitted step of a run are built from.

    Hashable and compared by value: the number tokens take part through their digest
    (`number_tokens_digest`), and the table itself rides along outside the comparison.
    """

    architecture: str
    model_config: network.T5Config
    number_tokens_digest: str
    optimizer: str
    learning_rate: float
    total_steps: int
    warmup_steps: int
    schedule: str
    weight_decay: float
    clip_norm: float
    loss: str
    ntl_weight: float
    ntl_mean_over: str | None
    z_loss: float
    fused_loss: bool
    gce_sigma: float
    float_encodings: str
    number_tokens: NumberTokens = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, config: TrainConfig, model_config, number_tokens: NumberTokens) -> StepSpec:
        return cls(architecture=config.architecture, model_config=model_config,
                   number_tokens_digest=number_tokens_digest(number_tokens),
                   optimizer=config.optimizer, learning_rate=config.learning_rate,
                   total_steps=config.steps, warmup_steps=config.warmup_steps,
                   schedule=config.schedule, weight_decay=config.weight_decay,
                   clip_norm=config.clip_norm, loss=systems.token_loss(config.loss),
                   ntl_weight=config.ntl_weight, ntl_mean_over=config.ntl_mean_over,
                   z_loss=config.z_loss, fused_loss=config.fused_loss,
                   gce_sigma=config.gce_sigma if step_lib.uses_gce(config.loss) else 0.0,
                   float_encodings=config.float_encodings(), number_tokens=number_tokens)


# Only the latest is kept: a resumed or repeated run in the same process (tests,
# `compare` reruns) reuses its compiled step, and a long-lived process holds one.
@functools.lru_cache(maxsize=1)
def build_step(spec: StepSpec):
    """`(model, optimizer, train_step)` of `spec`; the same objects for equal specs."""
    model = network.make_model(spec.architecture, spec.model_config, spec.float_encodings)
    optimizer = optim.make_optimizer(
        spec.optimizer, learning_rate=spec.learning_rate, total_steps=spec.total_steps,
        warmup_steps=spec.warmup_steps, schedule=spec.schedule,
        weight_decay=spec.weight_decay, clip_norm=spec.clip_norm)
    train_step = step_lib.make_train_step(
        model, optimizer, spec.number_tokens, loss=spec.loss, ntl_weight=spec.ntl_weight,
        ntl_mean_over=spec.ntl_mean_over,
        z_loss=spec.z_loss, fused_loss=spec.fused_loss, gce_sigma=spec.gce_sigma)
    return model, optimizer, train_step


def window_metrics(records: list[dict]) -> dict[str, float]:
    """The metrics of a logging window's steps: each the mean of the steps' values, but
    `ntl` pooled from their sums and counts (`ntl_jax.ntl_mean`)."""
    host = jax.device_get(records)
    metrics = {k: float(np.mean([r[k] for r in host])) for k in host[0]}
    if "ntl_sum" in metrics:
        metrics["ntl"] = float(ntl_mean([r["ntl_sum"] for r in host], [r["ntl_weight_sum"] for r in host]))
    return metrics


def save_final_params(out_dir: str, params: Any, model_config, vocabulary, step: int) -> None:
    """Writes the parameters of a finished run with their checksum (for `--init-from`)."""
    from flax import serialization

    blob = serialization.to_bytes(jax.device_get(params))
    path = os.path.join(out_dir, FINAL_PARAMS)
    with open(f"{path}.tmp", "wb") as f:
        f.write(blob)
    os.replace(f"{path}.tmp", path)
    write_json(os.path.join(out_dir, FINAL_PARAMS_INFO), {
        "sha256": hashlib.sha256(blob).hexdigest(), "step": step,
        "network": _network_identity(model_config),
        "vocabulary": vocabulary_fingerprint(vocabulary)})


def load_init_params(run_dir: str, target_params: Any, model_config, vocabulary) -> Any:
    """The final parameters of the finished run in `run_dir`, checked against this run.

    Raises:
      ValueError: `run_dir` holds no finished run, its file fails its checksum, or its
        network or vocabulary differs from this run's.
    """
    from flax import serialization

    info_path = os.path.join(run_dir, FINAL_PARAMS_INFO)
    params_path = os.path.join(run_dir, FINAL_PARAMS)
    if not (os.path.exists(info_path) and os.path.exists(params_path)):
        raise ValueError(f"--init-from expected a finished run directory with {FINAL_PARAMS} "
                         f"and {FINAL_PARAMS_INFO}, got {run_dir} (train it to the end first)")
    with open(info_path) as f:
        info = json.load(f)
    with open(params_path, "rb") as f:
        blob = f.read()
    if hashlib.sha256(blob).hexdigest() != info.get("sha256"):
        raise ValueError(f"--init-from: {params_path} does not match the checksum in "
                         f"{info_path}; the file is damaged")
    diffs = [f"{k}: {run_dir} has {info['network'].get(k)!r}, this run has {v!r}"
             for k, v in _network_identity(model_config).items()
             if info["network"].get(k) != v]
    if info.get("vocabulary") != vocabulary_fingerprint(vocabulary):
        diffs.append("vocabulary: the pieces differ")
    if diffs:
        raise ValueError(f"--init-from expected a run with this network and vocabulary; "
                         f"differences: {'; '.join(diffs)}")
    try:
        return serialization.from_bytes(target_params, blob)
    except (ValueError, KeyError) as e:
        raise ValueError(f"--init-from: the parameters in {params_path} do not fit this "
                         f"network ({e})") from e


class _StopOnSigint:
    """While active, the first Ctrl-C asks the loop to stop at the next step boundary
    (a second one interrupts at once, as usual)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _say(message: str) -> None:
    print(message, flush=True)


def _restore_newest(checkpointer: Checkpointer, state, identity: dict, steps: int):
    """(step, state) of the newest checkpoint that verifies, or (None, `state`) if there
    is none. Damaged checkpoints newer than it are reported and moved to
    `damaged_checkpoints/` (never deleted); if none verifies, `CheckpointError` lists
    them all and nothing is moved."""
    saved = checkpointer.all_steps()
    if saved and saved[0] > steps:
        raise CheckpointError(
            f"the newest checkpoint ({os.path.join(checkpointer.directory, str(saved[0]))}) "
            f"is at step {saved[0]}, beyond this run's {steps} steps: expected checkpoints "
            "of this run only. Nothing was deleted; rerun with the --steps that wrote it, or "
            "train into a new --out directory.")
    damaged: list[tuple[int, str]] = []
    for step in saved:
        try:
            restored = checkpointer.restore(step, state, identity)
        except DamagedCheckpoint as e:
            damaged.append((step, str(e)))
            continue
        for bad, message in damaged:
            _say(f"{message}\nmoved it to {checkpointer.set_aside(bad)}; falling back to "
                 f"the checkpoint of step {step}, which verifies")
        return step, restored
    if damaged:
        raise CheckpointError("no checkpoint verifies; nothing was moved or deleted: "
                              + " | ".join(message for _, message in damaged))
    return None, state


def train(config: TrainConfig, out_dir: str, *, data: data_lib.ProblemData | None = None,
          progress: bool = True, tensorboard: bool = True, stop_after: int | None = None
          ) -> dict[str, Any]:
    """Trains (or resumes) a run in `out_dir`; returns the final evaluation metrics.

    Args:
      config: the run.
      out_dir: created if missing; holds checkpoints/, metrics.jsonl, tensorboard/,
        results.json and predictions.json.
      data: reuse already generated data (it must have been built from `config.data`).
      progress: show a tqdm progress bar; its clock starts once the first (compiling) step is done.
      tensorboard: also write TensorBoard event files.
      stop_after: stop (after checkpointing) once this step is reached, as if interrupted; to test resuming.

    Returns:
      A dict with "step", "eval" (`{"<split>/<metric>": value}`, None where a metric is
      undefined, e.g. the correlation of constant predictions), "train" (last logged
      training metrics), "seconds" and "state".

    Raises:
      ValueError: bad configuration, unwritable `out_dir`, or another process training there.
      CheckpointError: an existing checkpoint is unreadable or from another configuration.
      Interrupted: Ctrl-C (SIGINT); a checkpoint of the last finished step was saved.
      Diverged: the mean training loss of a logging window is NaN or infinite; checked
        before every checkpoint, so no checkpoint holds a non-finite state.
    """

    config.validate()
    out_dir = check_output_dir(out_dir)
    with _RunLock(out_dir):
        return _train(config, out_dir, data, progress, tensorboard, stop_after)


class _RunLock:
    """One run per directory, held by the kernel: an exclusive `flock` on `<out>/.lock`.

    The kernel drops the lock when its process exits, however it dies (SIGKILL included),
    so a killed run's lock is free again, and nothing is decided by reading the file: the
    PID written into it once the lock is held only names the holder in a second run's
    error. The descriptor is not inherited by exec'd children (PEP 446), so a child
    cannot keep the lock past its parent.

    On exit the file is unlinked while still locked. A process that opened the old file
    just before and locks it just after would then hold a lock on a file that is no longer
    at the path while a third process locks a new one, so after locking each process checks
    that its descriptor is still the file at the path (same device and inode) and otherwise
    tries again on the new file.
    """

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, ".lock")
        self.fd: int | None = None

    def __enter__(self):
        import fcntl

        for _ in range(100):  # a retry needs another run to finish in between: a few at most
            # No O_EXCL (an existing file is the normal case) and no O_TRUNC (that would
            # erase the holder's PID before this process knows whether it holds the lock).
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_holder(fd)
                os.close(fd)
                raise ValueError(
                    f"another process (PID {holder}) is training in {os.path.dirname(self.path)}: "
                    "expected one run per --out directory. Wait for it to finish or stop it; "
                    "its lock is released when it exits") from None
            except OSError as e:
                os.close(fd)
                raise ValueError(f"could not lock {self.path}: expected a file system with "
                                 f"flock support, got {e}") from e
            if _same_file(fd, self.path):
                try:
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                except OSError:
                    os.close(fd)
                    raise
                self.fd = fd
                return self
            os.close(fd)  # the previous holder unlinked this file before it was locked here
        raise ValueError(f"could not take the lock {self.path}: other runs kept replacing it")

    def __exit__(self, *exc):
        try:
            os.unlink(self.path)  # while still locked: see the class docstring
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _lock_holder(fd: int) -> str:
    """The PID in a lock file, or "unknown" while its holder has not written it yet."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "unknown"


def _train(config, out_dir, data, progress, tensorboard, stop_after):
    from tqdm import tqdm

    if data is None:
        _say(f"generating {config.data.train_examples} training problems of "
             f"{config.data.module} (seed {config.data.seed}) ...")
        data = data_lib.ProblemData(config.data, vocabulary=systems.vocabulary(config.loss))
    elif data.config != config.data:
        raise ValueError(f"data was built from {data.config}, the run wants {config.data}")
    elif systems.vocabulary_name_of(data.vocabulary) != systems.vocabulary_name(config.loss):
        raise ValueError(f"loss {config.loss!r} expected data tokenized with the "
                         f"{systems.vocabulary_name(config.loss)} vocabulary, got the "
                         f"{systems.vocabulary_name_of(data.vocabulary)} one")

    vocabulary = data.vocabulary
    model_config = network.make_config(config.preset, int(vocabulary.vocab_size),
                                       dropout_rate=config.dropout_rate)
    own = systems.build(config.loss, config, model_config, vocabulary)
    if own is not None:  # a baseline with its own network and step
        model, optimizer, train_step = own
        model_config = getattr(model, "config", model_config)  # xVal may widen the vocabulary
    else:
        model, optimizer, train_step = build_step(
            StepSpec.of(config, model_config, number_tokens_of(vocabulary)))

    state = step_lib.create_train_state(model, optimizer, data.batch(0), config.seed)
    checkpointer = Checkpointer(os.path.join(out_dir, "checkpoints"))
    identity = config.identity()
    start, state = _restore_newest(checkpointer, state, identity, config.steps)
    if start is not None:
        finished = _finished_results(out_dir, config.steps)
        if start >= config.steps and finished is not None:
            checkpointer.close()  # a finished run reports its results and changes nothing
            return finished | {"state": state}
        _say(f"resuming from step {start} (checkpoint "
             f"{os.path.join(checkpointer.directory, str(start))})")
    else:
        start = 0
        if config.init_from:
            params = load_init_params(config.init_from, state.params, model_config, vocabulary)
            state = state.replace(params=params, opt_state=optimizer.init(params))
            _say(f"starting from the final parameters of {config.init_from}")
    write_json(os.path.join(out_dir, "config.json"), identity)
    log = MetricsLog(out_dir, resume_step=start if start else None, tensorboard=tensorboard)
    end = config.steps if stop_after is None else min(stop_after, config.steps)
    bar = tqdm(total=config.steps, initial=start, disable=not progress, desc=config.loss,
               dynamic_ncols=True, leave=True)
    t_start = time.perf_counter()
    sigint = _StopOnSigint()
    try:
        with sigint:
            state, last_train = _train_loop(config, state, data, train_step, checkpointer,
                                            identity, log, bar, sigint, start, end, model,
                                            out_dir)
        step_done = int(jax.device_get(state.step))
        results: dict[str, Any] = {"step": step_done, "train": last_train,
                                   "seconds": time.perf_counter() - t_start}
        if step_done >= config.steps:
            results["eval"] = _evaluate_and_log(model, state, data, config, log, step_done,
                                                out_dir, final=True)
            save_final_params(out_dir, state.params, model_config, vocabulary, step_done)
            write_json(os.path.join(out_dir, "results.json"), results)
        return finite_or_none(results) | {"state": state}
    finally:
        bar.close()
        log.close()
        checkpointer.close()


def _finished_results(out_dir: str, steps: int) -> dict | None:
    """The stored results of a run that reached `steps`, or None."""
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        results = json.load(f)
    return results if results.get("step") == steps and "eval" in results else None


def finished_run(config: TrainConfig, out_dir: str) -> dict | None:
    """The stored results of `out_dir` if it holds this configuration's finished run.

    Lets a caller skip generating data for a run that `train` would only report.
    """
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return None
    if stored != json.loads(json.dumps(config.identity())):
        return None
    return _finished_results(out_dir, config.steps)


def _train_loop(config, state, data, train_step, checkpointer, identity, log, bar, sigint,
                start, end, model, out_dir):
    """Steps `start..end`; returns the state and the last logged training metrics."""
    window: list[dict] = []
    last_train: dict[str, float] = {}
    t_window = time.perf_counter()
    for step in range(start, end):
        if sigint.requested:
            if window:
                _check_finite(window, step, checkpointer, out_dir)
            _save_finite(checkpointer, step, state, identity, out_dir)
            raise Interrupted(step, os.path.join(checkpointer.directory, str(step)))
        state, metrics = train_step(state, data.batch(step))
        if step == start:
            # The first call compiled the step (seconds to minutes): restart the bar's
            # clock after it, so that its rate and time left count training steps only.
            bar.unpause()
        window.append(metrics)
        done = step + 1
        if done % config.log_every == 0 or done == end:
            last_train = _check_finite(window, done, checkpointer, out_dir)
            now = time.perf_counter()
            rate = len(window) * config.data.batch_size / (now - t_window)
            window, t_window = [], now
            log.write(done, {f"train/{k}": v for k, v in last_train.items()}
                      | {"train/examples_per_second": rate})
            bar.set_postfix(_bar_fields(last_train), ex_s=f"{rate:.0f}")
        bar.update(1)
        if done % config.checkpoint_every == 0 or done == end:
            _save_finite(checkpointer, done, state, identity, out_dir)
        if config.eval_every and done % config.eval_every == 0 and done < config.steps:
            _evaluate_and_log(model, state, data, config, log, done, out_dir)
    return state, last_train


def _bar_fields(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's figures: `loss = ce + z_loss + ntl_term`, the parts adding up
    (z_loss: T5X's z-loss, 1e-4 · log² of the softmax's normaliser, which keeps the logits
    from drifting; ntl_term: λ × the number loss, shown in the runs that train on one), and
    `ntl`, the number loss's mean over the number targets, which CE runs log too without
    training on it. The regression head has its loss only."""
    shown = {"loss": "loss", "ce": "cross_entropy", "z_loss": "z_loss", "ntl_term": "ntl_term", "ntl": "ntl"}
    return {name: f"{metrics[key]:.3f}" for name, key in shown.items()
            if key in metrics and not (key == "ntl_term" and metrics[key] == 0)}


def _evaluate_and_log(model, state, data, config, log, step, out_dir, final=False):
    evaluate = systems.evaluator(config.loss)
    metrics, preds = evaluate(model, state.params, data.eval_sets, data.vocabulary,
                              data.target_length, config.eval_batch_size)
    log.write(step, {f"eval/{k}": v for k, v in metrics.items()})
    if final:
        write_json(os.path.join(out_dir, "predictions.json"),
                   {split: [{"question": q, "target": a, "prediction": p}
                            for q, a, p in zip(s.questions, s.answers, preds[split])]
                    for split, s in data.eval_sets.items()})
    return metrics
