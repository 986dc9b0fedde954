"""DeepMind mathematics data: module catalogue, release-layout reader, offline generator.

Importing this package needs only Python; the generator (`ntl_jax.data.generate`) needs
`mathematics-dataset` and sympy (the `train` or `seqio` extra) and the TF reader needs
TensorFlow.
"""

from ntl_jax.data.catalogue import ABLATION_EXTRAPOLATE
from ntl_jax.data.catalogue import ABLATION_MODULE
from ntl_jax.data.catalogue import EXTRAPOLATE_MODULES
from ntl_jax.data.catalogue import EXTRAPOLATION_FOR
from ntl_jax.data.catalogue import EXTRAPOLATION_OF
from ntl_jax.data.catalogue import PAPER13_EXTRAPOLATE
from ntl_jax.data.catalogue import PAPER13_MODULES
from ntl_jax.data.catalogue import SPLITS
from ntl_jax.data.catalogue import TRAIN_MODULES
