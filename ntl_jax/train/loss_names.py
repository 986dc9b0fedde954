"""The trainer's names of the number losses, shared by the step (`step.LOSS_KINDS`) and
the catalogue of systems (`systems`), which imports the step only when it needs it."""

# Number losses the trainer names for themselves rather than as NTL variants: NTL's
# successors, each with its own weight flag (`--del-weight`, `--dist2-weight`, `--smmd-weight`).
OWN_NAMES = ("del", "dist2", "smmd")


def loss_name(kind: str) -> str:
    """The trainer's name of the number loss `ntl_kind=kind`: "del", "dist2", "smmd", or
    "ntl-<kind>" ("was_cdf" -> "ntl-was-cdf")."""
    return kind if kind in OWN_NAMES else "ntl-" + kind.replace("_", "-")
