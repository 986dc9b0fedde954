"""The Keras backend `ntl_jax.keras` runs on: JAX, set before Keras is imported."""

from __future__ import annotations

import keras


def require_jax_backend(what: str) -> None:
    """Raises unless Keras runs on JAX: the losses are JAX functions, and a JAX array
    cannot enter a TensorFlow or PyTorch graph."""
    backend = keras.backend.backend()
    if backend != "jax":
        raise RuntimeError(
            f"{what} expected the Keras backend 'jax', got {backend!r}; set KERAS_BACKEND=jax in the "
            "environment (or os.environ['KERAS_BACKEND'] = 'jax') before Keras is first imported"
        )
