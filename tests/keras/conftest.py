"""Keras reads its backend once, when it is first imported: JAX, before any test here
imports it."""

import os

os.environ["KERAS_BACKEND"] = "jax"
