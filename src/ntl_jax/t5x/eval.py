"""Launch T5X evaluation with ntl_jax's gin files on the search path.

    python -m ntl_jax.t5x.eval \\
        --gin_file=t5x_configs/models/t5_1_1_tiny_byte_ntl.gin \\
        --gin_file=t5x_configs/runs/ntl_eval.gin \\
        --gin.MIXTURE_OR_TASK_NAME=\\"ntl_math_arithmetic__add_sub_multiple_byte\\" \\
        --gin.CHECKPOINT_PATH=\\"/tmp/ntl_run/checkpoint_100000\\" \\
        --gin.EVAL_OUTPUT_DIR=\\"/tmp/ntl_run/eval_interpolate\\"

`t5x.eval` decodes a split (here `test_interpolate` or `test_extrapolate`) with a
checkpoint and writes the task's metrics; see `ntl_jax.t5x.train` for the search path.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ntl_jax.t5x.train import run_t5x_main


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs `t5x.eval` with our gin search path; `argv` defaults to `sys.argv`."""
    run_t5x_main("t5x.eval", argv)


if __name__ == "__main__":
    main()
