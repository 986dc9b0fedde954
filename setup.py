"""Build hook: ship the T5X gin files (`t5x_configs/`) inside the package.

All metadata lives in pyproject.toml. The gin files sit at the top of the repository
so that a checkout reads `t5x_configs/...`; this copies them to
`ntl_jax/t5x_configs/` in the wheel, where `ntl_jax.t5x.configs` finds them.
"""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

_ROOT = pathlib.Path(__file__).resolve().parent


class BuildPyWithGinConfigs(build_py):
    def run(self):
        super().run()
        source = _ROOT / "t5x_configs"
        target = pathlib.Path(self.build_lib) / "ntl_jax" / "t5x_configs"
        # A reused build directory may hold gin files the checkout no longer has.
        shutil.rmtree(target, ignore_errors=True)
        for path in sorted(source.rglob("*.gin")):
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildPyWithGinConfigs})
