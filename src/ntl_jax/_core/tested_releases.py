"""The releases of a framework an integration is tested with, checked before it touches one.

An integration that plugs into a framework's internals (MaxText's module attributes,
EasyDeL's loss seam) relies on what they do, which a release may change.
"""

from __future__ import annotations

import os


def check_tested_release(distribution: str, shown: str, tested: tuple, untested_env: str, version: str) -> None:
    """Raises `RuntimeError` if `version` of `distribution` (`shown` by its own spelling)
    is none of `tested`, unless the environment sets `untested_env=1`: what to install,
    or how to test another release and then allow it."""
    if version in tested or os.environ.get(untested_env) == "1":
        return
    raise RuntimeError(
        f"expected {shown} {' or '.join(tested)}, the version(s) ntl_jax.{distribution} is tested with, got "
        f"{distribution} {version}. Install the tested one (pip install -e '.[{distribution}]', which pins it), or "
        f"run tests/{distribution} with {version} (.ci/{distribution}) and, if they pass, set {untested_env}=1")
