"""Launch T5X training with ntl_jax's gin files on the search path.

    python -m ntl_jax.t5x.train \\
        --gin_file=t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin \\
        --gin.MODEL_DIR=\\"/tmp/ntl_run\\"

Every flag is T5X's own (`python -m t5x.train --help`). This module only adds the
directory that holds `t5x_configs/` (the source checkout, or the installed package) to
`--gin_search_paths`, after any paths given on the command line, and then runs
`t5x.train` as `__main__`, which its gin files require (`import __main__ as
train_script`).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import List, Optional, Sequence

from ntl_jax.t5x._install import require_t5x
from ntl_jax.t5x.configs import gin_search_path

require_t5x()  # says how to install T5X before a run is attempted

_FLAG = "--gin_search_paths"


def with_search_path(argv: Sequence[str], path: str) -> List[str]:
    """`argv` with `path` appended to `--gin_search_paths` (default `.`).

    T5X's flag is a comma-separated list and the last occurrence wins, so every
    occurrence is merged into one, keeping the user's order first.
    """
    argv = list(argv)
    paths: List[str] = []
    rest: List[str] = argv[:1]
    seen = False
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == _FLAG or arg == "-" + _FLAG[2:]:
            if i + 1 >= len(argv):
                raise ValueError(f"expected a value after {arg}, got the end of the command line")
            value, i = argv[i + 1], i + 2
        elif arg.startswith(_FLAG + "=") or arg.startswith("-" + _FLAG[2:] + "="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        seen = True
        paths = [p for p in value.split(",") if p]
    if not seen:
        paths = ["."]  # T5X's default
    if path not in paths:
        paths.append(path)
    return rest[:1] + [f"{_FLAG}={','.join(paths)}"] + rest[1:]


def run_t5x_main(module: str, argv: Optional[Sequence[str]] = None) -> None:
    """Runs T5X's `module` (e.g. `t5x.train`) as `__main__` with our gin search path.

    `argv` defaults to `sys.argv`.
    """
    argv = list(sys.argv if argv is None else argv)
    sys.argv = with_search_path(argv, gin_search_path())
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        _exit_now(e.code if isinstance(e.code, int) else 1)
    except KeyboardInterrupt:
        _exit_now(130)
    except BaseException:  # noqa: BLE001 (any failure: report it, then exit at once)
        traceback.print_exc()
        _exit_now(1)


def _exit_now(code: int) -> None:
    """Exits without waiting for other threads. After a failure at start-up, threads of
    T5X's input pipeline that are not daemons keep a normal exit waiting for minutes."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs `t5x.train` with our gin search path; `argv` defaults to `sys.argv`."""
    run_t5x_main("t5x.train", argv)


if __name__ == "__main__":
    main()
