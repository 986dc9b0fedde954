"""`ntl-jax plot-loss --out`: formats, directories, missing folders, the path printed."""

import os

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from ntl_jax import cli  # noqa: E402
from ntl_jax.cli import plot_loss as cli_plot_loss  # noqa: E402


@pytest.fixture
def fast_curves(monkeypatch):
    """Skips the loss computation: these tests are about where the figure goes."""
    def fake(digit, distributions, specs):
        k = len(distributions)
        return {name: np.linspace(0, 1, k) for name in ["CE"] + [s.upper() for s in specs]}

    monkeypatch.setattr(cli_plot_loss, "loss_curves", fake)


@pytest.mark.parametrize("out, written", [
    ("fig.png", "fig.png"),
    ("fig.svg", "fig.svg"),
    ("fig", "fig.png"),
    ("existing", "existing/ntl_loss.png"),
    ("new/", "new/ntl_loss.png"),
    ("new/sub/fig.pdf", "new/sub/fig.pdf"),
])
def test_out_writes_and_prints_the_real_path(fast_curves, tmp_path, capsys, out, written):
    (tmp_path / "existing").mkdir()
    assert cli.main(["plot-loss", "--out", str(tmp_path / out) + ("/" if out.endswith("/") else "")]) == 0
    path = tmp_path / written
    assert path.is_file() and path.stat().st_size > 1_000
    assert capsys.readouterr().out.strip() == f"wrote {path}"


def test_out_with_unknown_extension_fails_before_computing(tmp_path, capsys, monkeypatch):
    def must_not_run(*_):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(cli_plot_loss, "loss_curves", must_not_run)
    with pytest.raises(SystemExit) as e:
        cli.main(["plot-loss", "--out", str(tmp_path / "x.txt")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --out: expected one of" in err and ".png" in err and ".pdf" in err
    assert "got '.txt'" in err
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_out_under_a_file_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_plot_loss, "loss_curves", lambda *_: pytest.fail("computed"))
    (tmp_path / "file").write_text("x")
    assert cli.main(["plot-loss", "--out", str(tmp_path / "file" / "x.png")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_writable_formats():
    formats = cli_plot_loss.writable_formats()
    assert {"png", "pdf", "svg"} <= set(formats)
    assert "txt" not in formats
