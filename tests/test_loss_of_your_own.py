"""A loss of your own, named in any process: a spec `module:name` imports the module that
holds or registers it (tests/fixtures/own_loss_module, which no package names by an entry
point); registering a name again replaces it; the errors name every route."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import ntl_jax
from ntl_jax import losses

ROOT = pathlib.Path(__file__).resolve().parents[1]
OWN_MODULE = ROOT / "tests" / "fixtures" / "own_loss_module"
NT = ntl_jax.NumberTokens.from_pieces(["<pad>", "</s>"] + list("0123456789"))


def _fresh(code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter with the fixture module on its path only."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(OWN_MODULE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args, "-c", code] if code else [sys.executable, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def own_module_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(OWN_MODULE))
    yield
    sys.modules.pop("my_number_losses", None)
    for name in ("scaled_gap", "cubed_gap"):
        losses.LOSSES.pop(name, None)


def _expected_squared(logits, targets, scale):
    """scale x E_p[(v - y)^2] averaged over the number targets, by hand."""
    p = jax.nn.softmax(logits[..., 2:], axis=-1)
    y = (targets - 2).astype(jnp.float32)[..., None]
    per = scale * jnp.sum(p * (jnp.arange(10.0) - y) ** 2, axis=-1)
    counted = targets >= 2
    return float(jnp.sum(jnp.where(counted, per, 0.0)) / jnp.sum(counted))


def test_a_module_spec_gives_the_loss_that_module_registers_with_its_parameters(own_module_on_path):
    loss = losses.parse("my_number_losses:scaled_gap(scale=2)")
    assert loss.spec == "my_number_losses:scaled_gap(scale=2.0)" == loss.shown
    assert losses.parse(loss.spec) is loss and losses.parse("scaled_gap(scale=2.0)") is loss
    logits = jax.random.normal(jax.random.key(0), (2, 4, 12)) * 2
    targets = jnp.array([[6, 9, 1, 0], [3, 1, 11, 4]])
    _, parts = ntl_jax.cross_entropy_and_ntl(logits, targets, NT, number_loss=loss.spec)
    assert float(parts["ntl"]) == pytest.approx(_expected_squared(logits, targets, 2.0), rel=1e-5)
    # A loss the module holds but does not register: registered by the spec that names it.
    cubed = losses.parse("my_number_losses:cubed_gap")
    assert cubed.spec == "my_number_losses:cubed_gap" and losses.parse("cubed_gap") is cubed


def test_registering_a_name_again_replaces_it_and_a_shipped_name_stays_refused():
    first = losses.register(losses.expectation("again", lambda v, y: jnp.abs(v - y)))
    second = losses.register(losses.expectation("again", lambda v, y: (v - y) ** 2))  # a cell run twice
    try:
        assert losses.parse("again") is second is not first
        assert second.spec == "again"  # registered in a function's body: no module another process imports
        with pytest.raises(ValueError, match=r"^expected a number loss name that is not a shipped loss's .* got "
                                             r"'was': choose another name$"):
            losses.register(losses.expectation("was", lambda v, y: v - y))
        assert losses.register(losses.was) is losses.was  # the shipped loss itself: nothing changes
    finally:
        losses.LOSSES.pop("again")


def test_registering_a_constructor_at_a_modules_top_level_calls_it_once(tmp_path, monkeypatch):
    (tmp_path / "counted_losses.py").write_text(
        "import jax.numpy as jnp\n"
        "from ntl_jax import losses\n"
        "CALLS = []\n"
        "@losses.register\n"
        "def counted(*, scale=1.0):\n"
        "    CALLS.append(scale)\n"
        "    return losses.expectation('counted', lambda v, y: scale * jnp.abs(v - y))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import counted_losses
        assert counted_losses.CALLS == [1.0]
        losses.parse("counted(scale=3)")
        assert counted_losses.CALLS == [1.0, 3.0]
    finally:
        sys.modules.pop("counted_losses", None)
        losses.LOSSES.pop("counted", None)


def test_the_errors_name_every_route_and_how_a_loss_of_your_own_takes_parameters(own_module_on_path):
    with pytest.raises(ValueError) as info:
        losses.parse("nowhere")
    message = str(info.value)
    for route in ("'my_package.losses:squared'", "ntl_jax.losses.register", "entry point of the group "
                  "'ntl_jax.losses'"):
        assert route in message
    with pytest.raises(ValueError, match=r"^expected the module 'no_such_module' of the spec 'no_such_module:x' to "
                                         r"be importable, got ModuleNotFoundError"):
        losses.parse("no_such_module:x")
    with pytest.raises(ValueError, match=r"^expected the module 'my_number_losses' to hold or register a number loss "
                                         r"'absent', in the spec 'my_number_losses:absent'"):
        losses.parse("my_number_losses:absent")
    with pytest.raises(ValueError, match=r"has no parameter 'scale' \(it takes only mean_over: a loss of your own "
                                         r"takes parameters when it is registered as a constructor"):
        losses.parse("my_number_losses:cubed_gap(scale=2)")


def test_in_a_fresh_process_the_trainer_reads_a_module_spec(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mathematics_dataset")
    out = tmp_path / "run"
    spec = "my_number_losses:scaled_gap(scale=2)"
    done = _fresh("", "-m", "ntl_jax.cli", "train", "--loss", spec, "--steps", "2", "--out", str(out), "--preset",
                  "micro", "--train-examples", "16", "--eval-examples", "4", "--batch-size", "8", "--log-every", "1",
                  "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["loss"] == "my_number_losses:scaled_gap(scale=2.0)"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/ntl" in r] == [1, 2]
    assert all(r["train/ntl"] > 0 for r in records if "train/ntl" in r)
    # Without the module on the path, the name alone is refused, naming the routes.
    bare = subprocess.run([sys.executable, "-m", "ntl_jax.cli", "train", "--loss", "scaled_gap", "--out",
                           str(tmp_path / "bare")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bare.returncode == 2 and "'my_package.losses:squared'" in bare.stderr


def test_help_says_how_to_name_a_loss_of_your_own():
    done = subprocess.run([sys.executable, "-m", "ntl_jax.cli", "train", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "a loss of your own as 'module:name(...)'" in text
    for name in losses.NAMES:
        assert losses.parse(name).shown in text
