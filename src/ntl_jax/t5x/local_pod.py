"""Run T5X as a pod of several hosts on this one machine: each host a process with its
own CPU devices, joined by `jax.distributed` as the hosts of a TPU pod are.

    python -m ntl_jax.t5x.local_pod --processes=2 --devices_per_process=4 -- \\
        train --gin_file=t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin \\
        --gin_file=t5x_configs/runs/local.gin --gin.MODEL_DIR=\\"/tmp/pod\\"

After `--` comes `train` or `eval` (`ntl_jax.t5x.train` / `ntl_jax.t5x.eval`) and its
flags, the same on every host. Each host sees `devices_per_process` CPU devices
(`--xla_force_host_platform_device_count`), switches JAX's CPU collectives to gloo (the
default CPU collectives do not cross processes), joins the others at a free local port
(`jax.distributed.initialize`, which T5X's `--multiprocess_gpu` flags also call) and then
runs the T5X program, which from there on works as on a pod: each host feeds its shard
of the data into global arrays, the loss is normalised over the global batch, and all
hosts write and read each checkpoint together.

On a TPU pod none of this is needed: every TPU VM runs the same command
(`gcloud compute tpus tpu-vm ssh ... --worker=all --command="python -m
ntl_jax.t5x.train ..."`) and JAX finds the other hosts itself.

Host 0 prints to this terminal, host i > 0 to `<log_dir>/host_<i>.log`. When a host
fails, the others are stopped, the end of each log is shown, and the exit status is the
failed host's.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

PROGRAMS = {"train": "t5x.train", "eval": "t5x.eval"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit(f"expected `-- train|eval <T5X flags>` after the options, got {argv!r}")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m ntl_jax.t5x.local_pod", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="hosts (processes) to start")
    parser.add_argument("--devices_per_process", type=int, default=4, help="CPU devices on each host")
    parser.add_argument("--log_dir", default=None,
                        help="where hosts 1.. write their output (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before every host is stopped")
    parser.add_argument("--join_timeout", type=int, default=120,
                        help="seconds a host waits for the others to join")
    args = parser.parse_args(argv[:split])
    program = argv[split + 1:]
    if not program or program[0] not in PROGRAMS:
        parser.error(f"expected one of {sorted(PROGRAMS)} after `--`, got {program[:1] or 'nothing'}")
    if args.processes < 1 or args.devices_per_process < 1:
        parser.error(f"expected at least one process and one device each, got {args.processes} "
                     f"and {args.devices_per_process}")
    return args, program


def run(argv: Sequence[str]) -> int:
    """Starts the hosts, waits for all of them; returns the exit status (0, or the first
    failed host's; 124 after `--timeout`)."""
    args, program = _parse(argv)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="ntl_local_pod_")
    os.makedirs(log_dir, exist_ok=True)
    address = f"localhost:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={args.devices_per_process}").strip())
    print(f"{args.processes} hosts of {args.devices_per_process} CPU devices at {address}; logs in {log_dir}",
          file=sys.stderr, flush=True)
    hosts, logs, status = [], [], 1  # 1 if starting a host fails
    try:
        for i in range(args.processes):
            command = [sys.executable, "-m", "ntl_jax.t5x.local_pod", "--as_host", address, str(args.processes),
                       str(i), str(args.join_timeout), *program]
            if i:
                logs.append(open(os.path.join(log_dir, f"host_{i}.log"), "w"))
            hosts.append(subprocess.Popen(command, env=env, stdout=logs[-1] if i else None,
                                          stderr=subprocess.STDOUT if i else None))
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        status = _wait(hosts, deadline)
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
            host.wait()
        for log in logs:
            log.close()
    _show(log_dir, hosts, status)
    return status


def _wait(hosts, deadline) -> int:
    while True:
        codes = [h.poll() for h in hosts]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0] if failed[0] > 0 else 128 - failed[0]
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            return 124
        time.sleep(0.5)


def _show(log_dir, hosts, status) -> None:
    if not status:
        return
    codes = [h.returncode for h in hosts]
    print(f"local pod stopped with exit status {status}; the hosts' exit codes {codes} (negative: stopped "
          f"by a signal, -9 by this launcher after another host failed or the timeout)", file=sys.stderr)
    for i in range(1, len(hosts)):
        with open(os.path.join(log_dir, f"host_{i}.log")) as f:
            print(f"--- the end of host {i}'s log\n{f.read()[-3000:]}", file=sys.stderr)


def _as_host(address: str, count: str, index: str, join_timeout: str, program: str, *flags: str) -> None:
    """One host: join the others, then run the T5X program (never returns)."""
    import jax

    from ntl_jax.t5x.train import run_t5x_main

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(address, num_processes=int(count), process_id=int(index),
                               initialization_timeout=int(join_timeout))
    run_t5x_main(PROGRAMS[program], [f"ntl_jax.t5x.{program}", *flags])


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--as_host"]:
        _as_host(*argv[1:])
        sys.exit(0)
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
