"""orbax-checkpoint saving and resuming of the train state.

Every checkpoint holds the train state, the SHA-256 of its arrays and, as JSON, the
run's identity (model, data, loss and optimizer settings). Orbax writes each step to a
temporary directory and renames it when complete, so an interrupted save never shadows
the previous checkpoint; the checksum catches damage after that (a flipped bit loads
without error otherwise). Restoring never deletes anything: a checkpoint that cannot be
read or fails its checksum raises `DamagedCheckpoint`, one written by a different
configuration `CheckpointError`, each naming the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used by this run."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint's files cannot be read or do not match their checksum."""


def state_checksum(state: Any) -> str:
    """SHA-256 over every array of `state` (path, dtype, shape and bytes, in tree order)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        array = np.ascontiguousarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class Checkpointer:
    """Saves and restores `(state, identity)` under `<out>/checkpoints/<step>/`."""

    def __init__(self, directory: str, *, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "identity", "checksum"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Saved steps, newest first."""
        return sorted(self._manager.all_steps(), reverse=True)

    def set_aside(self, step: int) -> str:
        """Moves checkpoint `step` out of the way (to `<out>/damaged_checkpoints/`), so
        that training can save that step again; returns where it went."""
        target = os.path.join(os.path.dirname(self.directory), "damaged_checkpoints", str(step))
        suffix = 1
        while os.path.exists(target):
            target = os.path.join(os.path.dirname(self.directory), "damaged_checkpoints",
                                  f"{step}.{suffix}")
            suffix += 1
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(os.path.join(self.directory, str(step)), target)
        self._manager.reload()
        return target

    def save(self, step: int, state: Any, identity: dict) -> None:
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), identity=ocp.args.JsonSave(identity),
            checksum=ocp.args.JsonSave({"sha256": state_checksum(state)})), force=True)
        self._manager.wait_until_finished()

    def restore(self, step: int, target_state: Any, identity: dict) -> Any:
        """Restores `step` into the structure of `target_state` after checking identity.

        Raises:
          DamagedCheckpoint: unreadable files, or arrays that fail their checksum.
          CheckpointError: a different run configuration.
        """
        where = os.path.join(self.directory, str(step))
        try:
            saved = self._manager.restore(step, args=ocp.args.Composite(
                identity=ocp.args.JsonRestore()))["identity"]
        except Exception as e:  # orbax raises many types for damaged files
            raise DamagedCheckpoint(
                f"the checkpoint at {where} cannot be read ({type(e).__name__}: {e}). "
                "Nothing was deleted; move that directory aside to resume from an earlier "
                "checkpoint, or train into a new --out directory.") from e
        diffs = _differences(_jsonable(identity), saved)
        if diffs:
            raise CheckpointError(
                f"the checkpoint at {where} was written by a different configuration "
                f"({'; '.join(diffs)}). Nothing was deleted; rerun with the same flags to "
                "resume, or train into a new --out directory.")
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, target_state)
        try:
            read_every_array(os.path.join(where, "state"))
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), checksum=ocp.args.JsonRestore()))
            state, expected = restored["state"], restored["checksum"]["sha256"]
        except Exception as e:
            raise DamagedCheckpoint(
                f"the train state in the checkpoint at {where} is damaged or does not match "
                f"this model ({type(e).__name__}: {e}). Nothing was deleted; move that "
                "directory aside or train into a new --out directory.") from e
        found = state_checksum(state)
        if found != expected:
            raise DamagedCheckpoint(
                f"the train state in the checkpoint at {where} fails its checksum (expected "
                f"SHA-256 {expected[:16]}…, got {found[:16]}…): its files changed after "
                "they were written.")
        return state

    def close(self) -> None:
        self._manager.close()


def read_every_array(directory: str) -> None:
    """Reads every array orbax stored in `directory` (an OCDBT store of zarr arrays),
    one at a time; raises what tensorstore raises for a damaged one.

    Run before orbax restores the state: orbax reads all arrays at once on an event
    loop that it closes as soon as one read fails, and the reads still in flight end
    on tensorstore's threads by calling that closed loop ("RuntimeError: Event loop is
    closed", reported as an exception ignored). Read synchronously, one after
    another, a damaged array fails here with nothing left running. A directory that is
    no OCDBT store (no `manifest.ocdbt`) is left to orbax.
    """
    import tensorstore as ts

    if not os.path.exists(os.path.join(directory, "manifest.ocdbt")):
        return
    context = ts.Context()
    store = {"driver": "ocdbt", "base": {"driver": "file", "path": directory.rstrip("/") + "/"}}
    for key in ts.KvStore.open(store, context=context).result().list().result():
        name, _, leaf = key.decode().rpartition("/")
        driver = {".zarray": "zarr", "zarr.json": "zarr3"}.get(leaf)
        if driver is not None:
            array = ts.open({"driver": driver, "kvstore": dict(store, path=name + "/")}, open=True,
                            context=context).result()
            array.read().result()


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _differences(current: Any, saved: Any, prefix: str = "") -> list[str]:
    if isinstance(current, dict) and isinstance(saved, dict):
        out = []
        for key in sorted(set(current) | set(saved)):
            name = f"{prefix}{key}"
            if key not in saved:
                out.append(f"{name}: not in the checkpoint")
            elif key not in current:
                out.append(f"{name}: only in the checkpoint")
            else:
                out.extend(_differences(current[key], saved[key], name + "."))
        return out
    if current != saved:
        return [f"{prefix.rstrip('.')}: checkpoint has {saved!r}, this run has {current!r}"]
    return []
