"""A failing T5X launch exits promptly with a non-zero status, even when the failed
program left threads that are not daemons (as T5X's input pipeline does).

Runs everywhere: a stand-in `t5x` package plays T5X.
"""

import subprocess
import sys
import time

FAILING_TRAIN = '''
import threading, time
threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon
raise ValueError("indivisible partitioning: expected 8 | 6, got 6")
'''


def _launch(tmp_path, body):
    t5x = tmp_path / "t5x"
    t5x.mkdir()
    (t5x / "__init__.py").write_text("")
    (t5x / "models.py").write_text("")
    (t5x / "train.py").write_text(body)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ntl_jax.t5x.train", "--gin_file=x.gin"],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    return done, time.monotonic() - start


def test_a_failing_launch_exits_at_once_with_its_error(tmp_path):
    done, seconds = _launch(tmp_path, FAILING_TRAIN)
    assert done.returncode == 1
    assert "ValueError: indivisible partitioning: expected 8 | 6, got 6" in done.stderr
    assert seconds < 60  # the thread would hold a normal exit for 600 s


def test_exit_statuses_and_success_pass_through(tmp_path):
    done, _ = _launch(tmp_path, "import sys\nprint('bye')\nsys.exit(3)\n")
    assert (done.returncode, done.stdout) == (3, "bye\n")
    (tmp_path / "ok").mkdir()
    done, _ = _launch(tmp_path / "ok", "print('trained')\n")
    assert (done.returncode, done.stdout) == (0, "trained\n")
