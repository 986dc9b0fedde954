"""The top-level `ntl-jax` command: --version, --help and no command at all."""

import subprocess
import sys

import pytest

import ntl_jax
from ntl_jax import cli


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"ntl-jax {cli.version()}"
    assert cli.version() == ntl_jax.__version__


def test_help_says_what_the_tool_is_and_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "Number Token Loss (NTL) for JAX" in out
    assert "--version" in out
    for name, (_, help_text) in cli.COMMANDS.items():
        # one line per command: its name, then its one-line help
        assert any(line.split() == [name] + help_text.split() for line in out.splitlines()), name


def test_no_command_prints_the_help(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "Number Token Loss (NTL) for JAX" in err
    assert all(name in err for name in cli.COMMANDS)
    assert "required" not in err


def test_console_entry_point_version():
    out = subprocess.run([sys.executable, "-m", "ntl_jax.cli", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"ntl-jax {ntl_jax.__version__}"
