"""MaxText's pretraining on `CE + ntl_weight x NTL`:

    python -m ntl_jax.maxtext.train CONFIG.yml key=value ... ntl_weight=0.3 ntl_kind=was

Everything but the `ntl_*` keys goes to `maxtext.trainers.pre_train.train` as it is.
"""

from __future__ import annotations

from typing import Sequence

from ntl_jax.maxtext.install import pretraining
from ntl_jax.maxtext.settings import split_argv


def main(argv: Sequence[str]) -> None:
    maxtext_argv, settings = split_argv(argv)
    from maxtext.trainers.pre_train import train

    with pretraining(settings):
        train.main(maxtext_argv)


if __name__ == "__main__":
    from absl import app

    app.run(main)
