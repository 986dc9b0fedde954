"""The core: the number tokens, the losses, the objective and the fused head, in jax and
numpy alone. Private: `ntl_jax/__init__.py` exports what is public."""
