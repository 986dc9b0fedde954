"""The data: the DeepMind mathematics data (module catalogue, release-layout reader,
offline generator), the shipped SentencePiece vocabulary (`default_vocabulary`) and the
Regression Transformer's on it (`ntl_jax.data.rt_vocabulary`), the number metrics on
decoded text (`ntl_jax.data.metrics`) and the diabetes task.

Importing this package needs only Python and numpy; the generator
(`ntl_jax.data.generate`) needs
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
from ntl_jax.data.vocabulary import SentencePieceVocabulary, default_vocabulary

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
    "SentencePieceVocabulary",
    "default_vocabulary",
]
