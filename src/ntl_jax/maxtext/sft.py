"""MaxText's supervised fine-tuning (Tunix's `PeftTrainer` on MaxText's loss) on
`CE + ntl_weight x NTL`:

    python -m ntl_jax.maxtext.sft CONFIG.yml key=value ... ntl_weight=0.3 ntl_number_loss=was

Everything but the `ntl_*` keys goes to `maxtext.trainers.post_train.sft.train_sft`.
"""

from __future__ import annotations

from typing import Sequence

from ntl_jax.maxtext.install import fine_tuning, launch


def main(argv: Sequence[str], **settings) -> None:
    """Runs it on `argv`; `settings`: `NumberLossSettings` fields from Python in place of
    their keys (`number_loss=` a `NumberLoss` of your own)."""
    launch(argv, "maxtext.trainers.post_train.sft.train_sft", fine_tuning, **settings)


if __name__ == "__main__":
    from absl import app

    app.run(main)
