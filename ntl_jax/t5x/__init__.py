"""T5X integration: NTL model classes, gin configs and a training launcher.

This is the only part of ntl_jax that imports T5X. T5X is not on PyPI, so importing
this package without it raises an ImportError that says how to install it;
`import ntl_jax` never needs it.

Use it from gin (see `t5x_configs/`):

    from ntl_jax.t5x import models as ntl_models
    MODEL = @ntl_models.NTLEncoderDecoderModel()

and launch with `python -m ntl_jax.t5x.train --gin_file=...`.
"""

INSTALL_HINT = (
    "ntl_jax.t5x needs T5X, which is not on PyPI. Install it from its Git repository, "
    "e.g.\n"
    "    pip install 'ntl-jax[t5x]' 't5x @ git+https://github.com/google-research/t5x'\n"
    "(on a TPU VM add: pip install 'jax[tpu]' -f "
    "https://storage.googleapis.com/jax-releases/libtpu_releases.html)."
)

try:
    import t5x  # noqa: F401  (presence check; the submodules are imported where used)
except ImportError as error:  # ModuleNotFoundError included
    raise ImportError(f"{INSTALL_HINT}\n(import t5x failed: {error})") from error

try:
    import t5x.models  # noqa: F401  (fails here when one of T5X's own dependencies is missing)
except ImportError as error:
    raise ImportError(
        f"T5X is present at {getattr(t5x, '__file__', '?')} but importing t5x.models failed: "
        f"{error}. Install T5X with its dependencies:\n{INSTALL_HINT}"
    ) from error
