"""What `ntl_jax.maxtext` relies on in MaxText is checked, and a MaxText release that
changed it stops the launch with the cause named: its tiled loss rewritten as such a
release would (its source edited), and its version faked."""

import dataclasses
import inspect
import textwrap
from importlib import metadata

import pytest

pytest.importorskip("maxtext")

import jax  # noqa: E402
from maxtext.trainers.pre_train import train  # noqa: E402
from maxtext.utils import vocabulary_tiling  # noqa: E402

from ntl_jax import maxtext as ntl_maxtext  # noqa: E402
from ntl_jax.maxtext import install, step  # noqa: E402
from ntl_jax.maxtext import train as train_launcher  # noqa: E402
from tests.maxtext import tiny  # noqa: E402
from tests.maxtext.test_maxtext_loss import MULTI_DIGIT, _installed_loss  # noqa: E402


def _release(*edits):
    """MaxText's `vocab_tiling_nnx_loss` with each `(old, new)` of `edits` made once in its
    source, run in its own module: a release that changed it so."""
    source = textwrap.dedent(inspect.getsource(vocabulary_tiling.vocab_tiling_nnx_loss))
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    defined = {}
    exec(compile(source, vocabulary_tiling.__file__, "exec"), vocabulary_tiling.__dict__, defined)  # noqa: S102
    return defined["vocab_tiling_nnx_loss"]


@pytest.fixture(scope="module")
def setup():
    config = tiny.config("num_vocab_tiling=2")
    model, mesh = tiny.model(config)
    return config, model, mesh, tiny.batch(config, ntl_maxtext.number_tokens(config, digit_level=False))


def _train_in_tiles(setup, monkeypatch, *edits):
    config, model, mesh, data = setup
    if edits:
        monkeypatch.setattr(train, "vocab_tiling_nnx_loss", _release(*edits))
    with jax.set_mesh(mesh):
        return _installed_loss(MULTI_DIGIT, model, config, data)


def test_the_stock_tiled_loss_passes_the_checks(setup, monkeypatch):
    # The edit that changes nothing: the source run as the tests' other releases are.
    _, aux, _, traced = _train_in_tiles(setup, monkeypatch,
                                        ("def vocab_tiling_nnx_loss(", "def vocab_tiling_nnx_loss("))
    assert traced.in_tiles == 1 and traced.backward_calls >= 1 and float(aux["ntl_sum"]) > 0


# The backward pass computes its cross-entropy itself, no longer through max_utils.
OWN_BACKWARD_CROSS_ENTROPY = (
    "xent, _ = max_utils.cross_entropy_with_logits(chunk_logits, one_hot_label_chunk, z_loss=config.z_loss_multiplier)",
    "xent = -jnp.sum(one_hot_label_chunk * jax.nn.log_softmax(chunk_logits, axis=-1), axis=-1)")


def test_a_tiled_backward_pass_that_no_longer_calls_the_cross_entropy_stops_the_step(setup, monkeypatch):
    with pytest.raises(RuntimeError, match=r"backward pass of MaxText's tiled loss .* to call "
                                           r"max_utils\.cross_entropy_with_logits.*never called it, so the step "
                                           r"would train without NTL.*install one of those"):
        _train_in_tiles(setup, monkeypatch, OWN_BACKWARD_CROSS_ENTROPY)
    assert step.current() is None


def test_a_tiled_loss_whose_cross_entropy_reads_the_z_loss_stops_the_step(setup, monkeypatch):
    # A release that no longer folds the z-loss into the cross-entropy and adds it in the tiles.
    consumer = ("masked_xent = jnp.sum(chunk_xent * (segmentation_chunk != 0))",
                "masked_xent = jnp.sum((chunk_xent + chunk_z_loss) * (segmentation_chunk != 0))")
    with pytest.raises(RuntimeError, match=r"cross-entropy sum that reads nothing of the z-loss .*its cross-entropy "
                                           r"sum reads it\. NTL travels in that slot"):
        _train_in_tiles(setup, monkeypatch, consumer)
    assert step.current() is None


def test_a_tiled_loss_that_drops_the_z_loss_stops_the_step(setup, monkeypatch):
    dropped = ("masked_z_loss = jnp.sum(chunk_z_loss * (segmentation_chunk != 0))",
               "masked_z_loss = jnp.zeros((), jnp.float32)")
    with pytest.raises(RuntimeError, match=r"to return the sum of the z-loss .*its z-loss sum does not read it"):
        _train_in_tiles(setup, monkeypatch, dropped)


def test_a_maxtext_version_not_tested_stops_the_launch(monkeypatch):
    stock_version = metadata.version
    monkeypatch.setattr(install.metadata, "version",
                        lambda name: "0.3.0" if name == "maxtext" else stock_version(name))
    monkeypatch.delenv(install.UNTESTED_MAXTEXT_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"expected MaxText 0\.2\.5, the version\(s\) ntl_jax\.maxtext is tested "
                                           r"with, got maxtext 0\.3\.0\. Install the tested one .*run tests/maxtext "
                                           r"with 0\.3\.0 .*NTL_JAX_UNTESTED_MAXTEXT=1"):
        train_launcher.main(["prog", tiny.BASE, "ntl_number_loss=was"])
    with pytest.raises(RuntimeError, match=r"got maxtext 0\.3\.0"):
        install.fine_tuning(dataclasses.replace(MULTI_DIGIT))
    # Told to, it installs.
    monkeypatch.setenv(install.UNTESTED_MAXTEXT_ENV, "1")
    with install.pretraining(MULTI_DIGIT):
        assert train.loss_fn.__wrapped__ is not None
