"""MaxText's pretraining on `CE + ntl_weight x NTL`:

    python -m ntl_jax.maxtext.train CONFIG.yml key=value ... ntl_weight=0.3 ntl_number_loss=was

Everything but the `ntl_*` keys goes to `maxtext.trainers.pre_train.train` as it is.
"""

from __future__ import annotations

from typing import Sequence

from ntl_jax.maxtext.install import launch, pretraining


def main(argv: Sequence[str], **settings) -> None:
    """Runs it on `argv`; `settings`: `NumberLossSettings` fields from Python in place of
    their keys (`number_loss=` a `NumberLoss` of your own)."""
    launch(argv, "maxtext.trainers.pre_train.train", pretraining, **settings)


if __name__ == "__main__":
    from absl import app

    app.run(main)
