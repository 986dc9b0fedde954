"""Tests of ntl_jax.easydel against EasyDeL itself, in EasyDeL's own environment
(.ci/easydel); they skip where easydel is not installed. EasyDeL starts distributed
initialisation when imported unless told not to."""

import os

os.environ.setdefault("ENABLE_DISTRIBUTED_INIT", "0")
