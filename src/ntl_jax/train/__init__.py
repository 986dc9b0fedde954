"""A single-machine trainer for small T5 models with the Number Token Loss.

`network` (the T5.1.1 encoder-decoder), `step` (the jitted optax step, the part to
copy), `data`, `evaluate`, `checkpoint` and `trainer` (the loop); the `ntl-jax train`
and `compare` commands that drive it live in `ntl_jax.cli.train` and `ntl_jax.cli.compare`.
Nothing is imported here, so `import ntl_jax.train` stays light.
"""
