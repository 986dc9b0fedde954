"""`python -m ntl_jax.cli`: the `ntl-jax` command without the console script."""

import sys

from ntl_jax.cli import main

sys.exit(main())
