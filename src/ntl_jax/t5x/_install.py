"""The one check that T5X is installed, with how to install it when it is not."""

INSTALL_HINT = (
    "ntl_jax.t5x needs T5X, which is not on PyPI. Install it from its Git repository, "
    "e.g.\n"
    "    pip install 'ntl-jax[t5x]' 't5x @ git+https://github.com/google-research/t5x'\n"
    "(on a TPU VM add: pip install 'jax[tpu]' -f "
    "https://storage.googleapis.com/jax-releases/libtpu_releases.html)."
)


def require_t5x() -> None:
    """Raises an ImportError that says how to install T5X unless `t5x.models` imports."""
    try:
        import t5x  # noqa: F401  (presence check)
    except ImportError as error:  # ModuleNotFoundError included
        raise ImportError(f"{INSTALL_HINT}\n(import t5x failed: {error})") from error
    try:
        import t5x.models  # noqa: F401  (fails here when one of T5X's own dependencies is missing)
    except ImportError as error:
        raise ImportError(
            f"T5X is present at {getattr(t5x, '__file__', '?')} but importing t5x.models failed: "
            f"{error}. Install T5X with its dependencies:\n{INSTALL_HINT}"
        ) from error
