"""DeepMind mathematics data: module catalogue, release-layout reader, offline generator.

Importing this package needs only Python; the generator (`ntl_jax.data.generate`) needs
`mathematics-dataset` and sympy (the `train` or `seqio` extra) and the TF reader needs
TensorFlow.
"""

from ntl_jax.data.catalogue import (
    ABLATION_EXTRAPOLATE,
    ABLATION_MODULE,
    EXTRAPOLATE_MODULES,
    EXTRAPOLATION_FOR,
    EXTRAPOLATION_OF,
    PAPER13_EXTRAPOLATE,
    PAPER13_MODULES,
    SPLITS,
    TRAIN_MODULES,
)

__all__ = [
    "ABLATION_EXTRAPOLATE",
    "ABLATION_MODULE",
    "EXTRAPOLATE_MODULES",
    "EXTRAPOLATION_FOR",
    "EXTRAPOLATION_OF",
    "PAPER13_EXTRAPOLATE",
    "PAPER13_MODULES",
    "SPLITS",
    "TRAIN_MODULES",
]
