"""T5X integration: NTL model classes, gin configs and a training launcher.

Its modules that run T5X (`models`, `train`, `eval`, `compile_check`) import it, and
without T5X (not on PyPI) raise an ImportError that says how to install it; `import
ntl_jax` never needs it. The loss the models compute (`ntl_jax.t5x._loss`) is pure
JAX, importable and tested without T5X.

Use it from gin (see `t5x_configs/`):

    from ntl_jax.t5x import models as ntl_models
    MODEL = @ntl_models.NTLEncoderDecoderModel()

and launch with `python -m ntl_jax.t5x.train --gin_file=...`.
"""

__all__: list[str] = []
