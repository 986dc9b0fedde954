"""Loading a saved `.keras` model with its loss and metrics.

`model.save("model.keras")` stores the compile arguments beside the weights (the loss and
metrics by their configs: the number loss as its spec, the number tokens as their ids
and values). `keras.saving.load_model` compiles a model again from them only when the
model's class keeps Keras's own `compile`; KerasHub's `CausalLM` overrides it, so Keras
warns and leaves the loaded model uncompiled, whatever its loss. `load_model` here
compiles it with the stored arguments.
"""

from __future__ import annotations

import json
import warnings
import zipfile

import keras

from ntl_jax.keras.backend import require_jax_backend


def load_model(filepath, *, custom_objects=None, safe_mode: bool = True):
    """`keras.saving.load_model(filepath)`, compiled with the loss, metrics and optimizer
    it was saved with (the optimizer's state starts afresh). A model saved uncompiled
    comes back uncompiled.

    Args:
      filepath: a `.keras` file (`model.save`).
      custom_objects, safe_mode: as `keras.saving.load_model`.
    """
    require_jax_backend("ntl_jax.keras.load_model")
    filepath = str(filepath)
    if not filepath.endswith(".keras") or not zipfile.is_zipfile(filepath):
        raise ValueError(f"expected a .keras file written by model.save(...), got {filepath!r}")
    with zipfile.ZipFile(filepath) as archive:
        compile_config = json.loads(archive.read("config.json")).get("compile_config")
    with warnings.catch_warnings():  # Keras's "compile() was not called" note: we call it
        warnings.filterwarnings("ignore", message=r"`compile\(\)` was not called")
        model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=False, safe_mode=safe_mode)
    if compile_config:
        with keras.saving.custom_object_scope(custom_objects or {}):
            arguments = keras.saving.deserialize_keras_object(compile_config, safe_mode=safe_mode)
        model.compile(**arguments)
    return model
