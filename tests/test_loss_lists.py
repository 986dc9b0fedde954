"""Every list of the shipped losses that the docs and the command line give is the
registry's (`ntl_jax.losses.NAMES`), and says how to name a loss of your own."""

import pathlib
import re

from ntl_jax import losses

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def _row(page: str, first_cell: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))


def test_the_maxtext_guide_names_every_shipped_loss_and_one_of_your_own():
    row = _row("guides/maxtext.md", "`ntl_number_loss`")
    listed = re.findall(r"`(\w+)`", row.split("reads it:")[1].split("each with")[0])
    assert tuple(listed) == losses.NAMES
    assert "a loss of your own as `module:name`" in row


def test_the_losses_guide_tables_have_a_row_per_shipped_loss():
    text = (DOCS / "guides" / "losses.md").read_text(encoding="utf-8")
    specs = set(re.findall(r'^\| `[^|]*` \| ([^|]*) \|', text, re.M))
    in_specs = {name for cell in specs for name in re.findall(r'`"(\w+)"`', cell)}
    assert in_specs == set(losses.NAMES)
    constructors = {losses.LOSSES[name]().name for name in losses.NAMES}
    formulas = set(re.findall(r"^\| `(\w+)`", text.split("## What each loss computes")[1].split("## ")[0], re.M))
    assert {"digit_entropy" if name == "del" else name for name in constructors} - {"number_level_float"} \
        <= formulas | {"mse", "mae", "huber"}
