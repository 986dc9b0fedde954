"""The EasyDeL releases `ntl_jax.easydel` is tested with, checked before it touches one."""

from __future__ import annotations

from importlib import metadata

from ntl_jax._core.tested_releases import check_tested_release

# The EasyDeL releases the tests (tests/easydel) ran with.
TESTED_EASYDEL = ("0.3.0",)
# Set to 1 to use another EasyDeL, after tests/easydel pass with it (.ci/easydel).
UNTESTED_EASYDEL_ENV = "NTL_JAX_UNTESTED_EASYDEL"


def check_easydel_version(version: str | None = None) -> None:
    """Raises `RuntimeError` if the EasyDeL installed (or `version`) is none of
    `TESTED_EASYDEL`, unless `NTL_JAX_UNTESTED_EASYDEL=1`: the strategy plugs into
    EasyDeL's loss seam (`BaseLossStrategy`, `LOSS_MAPPING`, its models' heads and its
    trainer's metrics), which a release may change."""
    if version is None:
        try:
            version = metadata.version("easydel")
        except metadata.PackageNotFoundError as error:
            raise ModuleNotFoundError(
                "ntl_jax.easydel needs EasyDeL: pip install -e '.[easydel]' (Python 3.11-3.13, in an "
                "environment of its own: docs/guides/easydel.md)") from error
    check_tested_release("easydel", "EasyDeL", TESTED_EASYDEL, UNTESTED_EASYDEL_ENV, version)
