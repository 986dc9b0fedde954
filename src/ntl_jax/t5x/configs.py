"""Where ntl_jax's gin files are: a source checkout or the installed package.

The gin files live in `t5x_configs/` at the top of the repository (the package's source
is in `src/ntl_jax/`); the wheel ships a copy as `ntl_jax/t5x_configs/`. Either way gin resolves them as
`t5x_configs/<...>.gin` relative to `gin_search_path()`, so the same `include` lines
and `--gin_file` arguments work from a checkout and from an installed wheel.
"""

from __future__ import annotations

import pathlib
from typing import List

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]  # .../ntl_jax
_DIRNAME = "t5x_configs"


def _candidates() -> List[pathlib.Path]:
    # Installed wheel first, then the checkout this package was imported from
    # (<checkout>/src/ntl_jax).
    return [_PACKAGE_DIR, _PACKAGE_DIR.parents[1]]


def gin_search_path() -> str:
    """The directory that contains `t5x_configs/`, for `--gin_search_paths`.

    Raises:
      FileNotFoundError: if neither the package nor its checkout holds the files.
    """
    for root in _candidates():
        if (root / _DIRNAME / "models").is_dir():
            return str(root)
    tried = ", ".join(str(root / _DIRNAME) for root in _candidates())
    raise FileNotFoundError(
        f"expected ntl_jax's gin files in one of: {tried}; reinstall ntl-jax "
        "(the wheel ships them) or run from a source checkout"
    )


def configs_dir() -> pathlib.Path:
    """The `t5x_configs/` directory itself."""
    return pathlib.Path(gin_search_path()) / _DIRNAME


def gin_files() -> List[pathlib.Path]:
    """Every shipped gin file, sorted."""
    return sorted(configs_dir().rglob("*.gin"))
