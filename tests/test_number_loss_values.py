"""The number losses as values (`ntl_jax.losses`): each constructor's checks, the spec
parser and its round trip, the keywords 0.3.0 removed, a loss a user writes in a few
lines going everywhere a shipped one goes (against a numpy reference), and the size of
the objective's signature."""

import dataclasses
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import NumberTokens, losses
from ntl_jax._core.number_stats import with_formulation
from tests.objective_options import SQUARED_DISTANCE

# Digits at scattered ids, a two-digit piece, a sign, words.
PIECES = ["<pad>", "</s>", "x", ".", "7", "3", "0", "9", "1", "5", "2", "8", "4", "6", "12", "-1", "y"]
NT = NumberTokens.from_pieces(PIECES, digit_level=False)
V = len(PIECES)

# -- each constructor checks its own parameters ------------------------------------------

BAD_PARAMETERS = [
    # name, call, error, the whole message
    ("smmd sigma -1", lambda: losses.smmd(sigma=-1), ValueError,
     "number loss 'smmd': expected sigma finite and > 0, got -1"),
    ("smmd sigma 0", lambda: losses.smmd(sigma=0.0), ValueError,
     "number loss 'smmd': expected sigma finite and > 0, got 0.0"),
    ("smmd sigma array", lambda: losses.smmd(sigma=jnp.float32(2.0)), TypeError,
     "number loss 'smmd': expected sigma to be a Python number, got ArrayImpl Array(2., dtype=float32)"),
    ("smmd mode", lambda: losses.smmd(mode="both"), ValueError,
     "number loss 'smmd': expected mode in ('smmd', 'mmd', 'smooth'), got 'both'"),
    ("smmd alpha", lambda: losses.smmd(alpha=-0.5), ValueError,
     "number loss 'smmd': expected alpha finite and >= 0, got -0.5"),
    ("smmd squash_factor", lambda: losses.smmd(squash_factor=1.0), ValueError,
     "number loss 'smmd': expected squash_factor finite and > 1, got 1.0"),
    ("was squash_factor 1", lambda: losses.was(squash_factor=1), ValueError,
     "number loss 'was': expected squash_factor finite and > 1, got 1"),
    ("was squash_factor nan", lambda: losses.was(squash_factor=math.nan), ValueError,
     "number loss 'was': expected squash_factor finite and > 1, got nan"),
    ("was squash_factor str", lambda: losses.was(squash_factor="2"), TypeError,
     "number loss 'was': expected squash_factor to be a Python number, got str '2'"),
    ("was reweigh str", lambda: losses.was(reweigh="yes"), TypeError,
     "number loss 'was': expected reweigh True or False, got str 'yes'"),
    ("number_level max_number_length 0", lambda: losses.number_level(max_number_length=0), ValueError,
     "number loss 'number_level': expected max_number_length to be an integer >= 1, got 0"),
    ("number_level max_number_length 2.5", lambda: losses.number_level(max_number_length=2.5), ValueError,
     "number loss 'number_level': expected max_number_length to be an integer >= 1, got 2.5"),
    ("number_level max_number_length True", lambda: losses.number_level(max_number_length=True), ValueError,
     "number loss 'number_level': expected max_number_length to be an integer >= 1, got True"),
    ("number_level_float max_number_length", lambda: losses.LOSSES["number_level_float"](max_number_length=-3),
     ValueError, "number loss 'number_level_float': expected max_number_length to be an integer >= 1, got -3"),
    ("number_level float_level", lambda: losses.number_level(float_level=1), TypeError,
     "number loss 'number_level_float': expected float_level True or False, got int 1"),
    ("was_cdf sigma -1", lambda: losses.was_cdf(sigma=-1), ValueError,
     "number loss 'was_cdf': expected sigma finite and >= 0, got -1"),
    ("was_cdf sigma inf", lambda: losses.was_cdf(sigma=math.inf), ValueError,
     "number loss 'was_cdf': expected sigma finite and >= 0, got inf"),
    ("was_cdf sigma bool", lambda: losses.was_cdf(sigma=True), TypeError,
     "number loss 'was_cdf': expected sigma to be a Python number, got bool True"),
    ("dist2 tau 0", lambda: losses.dist2(tau=0), ValueError, "number loss 'dist2': expected tau finite and > 0, got 0"),
    ("dist2 tau -1", lambda: losses.dist2(tau=-1.0), ValueError,
     "number loss 'dist2': expected tau finite and > 0, got -1.0"),
    ("mse reweigh 1", lambda: losses.mse(reweigh=1), TypeError,
     "number loss 'mse': expected reweigh True or False, got int 1"),
    ("mae reweigh None", lambda: losses.mae(reweigh=None), TypeError,
     "number loss 'mae': expected reweigh True or False, got NoneType None"),
    ("huber reweigh str", lambda: losses.huber(reweigh="true"), TypeError,
     "number loss 'huber': expected reweigh True or False, got str 'true'"),
    ("expected_value_loss fn", lambda: losses.expected_value_loss(3), TypeError,
     "number loss 'expected_value_loss': expected fn to be a function (prediction, target) -> loss, got 3"),
    ("expected_value_loss reweigh", lambda: losses.expected_value_loss(jnp.subtract, reweigh=0), TypeError,
     "number loss 'expected_value_loss': expected reweigh True or False, got int 0"),
    # DEL, DIST² and SMMD have no largest value for reweigh to charge: no such parameter.
    ("del reweigh", lambda: losses.digit_entropy(reweigh=True), TypeError,
     "digit_entropy() got an unexpected keyword argument 'reweigh'"),
    ("dist2 reweigh", lambda: losses.dist2(reweigh=True), TypeError,
     "dist2() got an unexpected keyword argument 'reweigh'"),
    ("smmd reweigh", lambda: losses.smmd(reweigh=True), TypeError,
     "smmd() got an unexpected keyword argument 'reweigh'"),
    ("del reweigh spec", lambda: losses.parse("del(reweigh=true)"), ValueError,
     "number loss 'del' has no parameter 'reweigh' (it takes (), and every loss mean_over); in the spec "
     "'del(reweigh=true)'"),
    ("dist2 reweigh spec", lambda: losses.parse("dist2(reweigh=true)"), ValueError,
     "number loss 'dist2' has no parameter 'reweigh' (it takes ('tau',), and every loss mean_over); in the spec "
     "'dist2(reweigh=true)'"),
    ("smmd reweigh spec", lambda: losses.parse("smmd(reweigh=true)"), ValueError,
     "number loss 'smmd' has no parameter 'reweigh' (it takes ('mode', 'sigma', 'alpha', 'squash_factor'), and every "
     "loss mean_over); in "
     "the spec 'smmd(reweigh=true)'"),
    # A loss written by hand is checked too.
    ("NumberLoss reweigh without ceiling", lambda: dataclasses.replace(losses.dist2(), reweigh=True), ValueError,
     "number loss 'dist2': expected reweigh=False (the loss has no largest value to charge for probability off "
     "the number tokens), got reweigh=True"),
    ("NumberLoss name", lambda: losses.NumberLoss("", losses.NumberReads(), lambda *a: a), TypeError,
     "expected a NumberLoss's name to be a word (letters, digits, _), got ''"),
    ("NumberLoss reads", lambda: losses.NumberLoss("mine", (), lambda *a: a), TypeError,
     "number loss 'mine': expected reads to be a NumberReads, got tuple"),
    ("NumberLoss loss", lambda: losses.NumberLoss("mine", losses.NumberReads(), 3), TypeError,
     "number loss 'mine': expected loss to be a function, got 3"),
]


@pytest.mark.parametrize("name,call,error,message", BAD_PARAMETERS, ids=[case[0] for case in BAD_PARAMETERS])
def test_each_constructor_names_the_loss_the_parameter_what_it_expected_and_what_came(name, call, error, message):
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_the_shipped_losses_by_name():
    assert losses.NAMES == ("was", "mse", "mae", "huber", "number_level", "number_level_float", "was_cdf", "del",
                            "dist2", "smmd", "ntil")
    assert tuple(losses.LOSSES)[:len(losses.NAMES)] == losses.NAMES  # then those registered
    for name in losses.NAMES:
        assert losses.LOSSES[name]().name == name
    # The same parameters give the same value (a constant `jit` can hash).
    assert losses.was(squash_factor=2.0) is losses.was(squash_factor=2) is losses.parse("was(squash_factor=2.0)")
    assert losses.smmd(sigma=2) is losses.smmd()
    assert losses.was(squash_factor=2.0) is not losses.was(squash_factor=3.0)


# -- parse: the one spec parser, and NumberLoss.spec its inverse ---------------------------

AT_DEFAULTS = [losses.LOSSES[name]() for name in losses.NAMES]
OFF_DEFAULTS = [
    losses.was(squash_factor=2.0), losses.was(reweigh=True), losses.was(squash_factor=3.5, reweigh=True),
    losses.mse(reweigh=True), losses.mae(reweigh=True), losses.huber(reweigh=True),
    losses.number_level(max_number_length=5), losses.number_level(reweigh=True),
    losses.number_level(float_level=True, max_number_length=3, reweigh=True),
    losses.was_cdf(sigma=1.5), losses.was_cdf(sigma=0.5, reweigh=True), losses.dist2(tau=0.25),
    losses.smmd(mode="mmd"), losses.smmd(alpha=0.0),
    losses.smmd(mode="smooth", sigma=0.7, alpha=0.4, squash_factor=3.0),
]


@pytest.mark.parametrize("loss", AT_DEFAULTS + OFF_DEFAULTS, ids=repr)
def test_parse_reads_back_every_spec(loss):
    assert losses.parse(loss.spec) is loss
    assert losses.resolve(loss.spec) is loss
    assert losses.resolve(loss) is loss
    assert repr(loss) == f"NumberLoss({loss.spec})"


def test_specs_are_written_with_the_parameters_off_their_defaults():
    assert [loss.spec for loss in AT_DEFAULTS] == list(losses.NAMES)
    assert losses.was(squash_factor=2.0).spec == "was(squash_factor=2.0)"
    assert losses.was(squash_factor=3.5, reweigh=True).spec == "was(squash_factor=3.5, reweigh=true)"
    assert losses.number_level(float_level=True, max_number_length=3, reweigh=True).spec == \
        "number_level_float(max_number_length=3, reweigh=true)"
    assert losses.was_cdf(sigma=1.5).spec == "was_cdf(sigma=1.5)"
    assert losses.smmd(mode="smooth", sigma=0.7, alpha=0.4, squash_factor=3.0).spec == \
        "smmd(mode=smooth, sigma=0.7, alpha=0.4, squash_factor=3.0)"
    # No string can carry a function: a loss on the expected value has no spec until registered.
    with pytest.raises(ValueError, match=r"no spec that parse reads back \(got 'expected_value_loss\(fn=subtract\)'\)"):
        losses.expected_value_loss(jnp.subtract).spec


def _unknown(name, spec):
    labels = tuple(loss.label for loss in map(losses.parse, losses.LOSSES) if loss.label)
    return (f"expected a number loss in {tuple(losses.LOSSES)} (or one of their labels {labels}, or 'none'), got "
            f"{name!r} in the spec {spec!r}. For a loss of your own: name the module that holds or registers it, "
            "'my_package.losses:squared' (any process imports it); register it in this process "
            "(ntl_jax.losses.register); or install a package naming it as an entry point of the group "
            "'ntl_jax.losses' (docs/guides/losses.md, 'A loss of your own')")


@pytest.mark.parametrize("spec,loss", [
    ("smmd(sigma=2, mode=smooth)", losses.smmd(mode="smooth")),
    ("  smmd ( mode = 'smooth' , sigma = 2.0 )  ", losses.smmd(mode="smooth")),
    ('smmd(mode="mmd", alpha=0)', losses.smmd(mode="mmd", alpha=0.0)),
    ("was(squash_factor=2.0, reweigh=true)", losses.was(squash_factor=2.0, reweigh=True)),
    ("was(squash_factor=2, reweigh=True)", losses.was(squash_factor=2.0, reweigh=True)),
    ("was(squash_factor=none)", losses.was()),
    ("was()", losses.was()),
    ("number_level_float(max_number_length=4)", losses.number_level(float_level=True, max_number_length=4)),
    ("number_level(float_level=true)", losses.number_level(float_level=True)),
    ("was_cdf(sigma=1e-1)", losses.was_cdf(sigma=0.1)),
    ("dist2(tau=4)", losses.dist2(tau=4.0)),
])
def test_parse_reads_each_way_of_writing_a_spec(spec, loss):
    assert losses.parse(spec) is loss


def test_none_is_no_number_loss():
    assert losses.resolve("none") is None and losses.resolve(" none ") is None and losses.resolve(None) is None
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 5, len(PIECES))) * 2
    targets = jnp.asarray([[4, 5, 2, 16, 1], [7, 3, 9, 0, 15]])
    loss, parts = ntl_jax.cross_entropy_and_ntl(logits, targets, NT, number_loss="none")
    none_loss, none_parts = ntl_jax.cross_entropy_and_ntl(logits, targets, NT, number_loss=None)
    assert float(loss) == float(none_loss) == float(parts["cross_entropy"]) > 0
    assert float(parts["ntl"]) == float(parts["ntl_term"]) == float(parts["ntl_weight_sum"]) == 0.0
    assert set(parts) == set(none_parts)
    # The standalone losses need a loss to compute.
    with pytest.raises(ValueError, match="expected number_loss a NumberLoss or a spec of one, got 'none'"):
        ntl_jax.number_token_loss(logits, targets, NT, number_loss="none")


EXAMPLE = "expected a spec such as 'was', 'smmd(sigma=2, mode=smooth)' or 'my_package.losses:squared(scale=2)', got"


@pytest.mark.parametrize("spec,message", [
    ("was(", EXAMPLE + " 'was('"),
    ("", EXAMPLE + " ''"),
    ("(was)", EXAMPLE + " '(was)'"),
    ("was(squash_factor=2.0) x", EXAMPLE + " "
                                 "'was(squash_factor=2.0) x'"),
    ("was(squash_factor)", "number loss 'was': expected param=value in the spec 'was(squash_factor)', got "
                           "'squash_factor'"),
    ("was(2.0)", "number loss 'was': expected param=value in the spec 'was(2.0)', got '2.0'"),
    ("was(reweigh=true, reweigh=false)", "number loss 'was': expected each parameter once in the spec "
                                         "'was(reweigh=true, reweigh=false)', got 'reweigh' twice"),
    ("l3", ("unknown", "l3")),
    ("Was(reweigh=true)", ("unknown", "Was")),
    ("expected_value_loss(fn=subtract)", ("unknown", "expected_value_loss")),
    ("smmd(sigmaa=2)", "number loss 'smmd' has no parameter 'sigmaa' (it takes ('mode', 'sigma', 'alpha', "
                       "'squash_factor'), and every loss mean_over); in the spec 'smmd(sigmaa=2)'"),
    ("mse(squash_factor=2.0)", "number loss 'mse' has no parameter 'squash_factor' (it takes ('reweigh',), and every "
                               "loss mean_over); in the spec 'mse(squash_factor=2.0)'"),
    ("was_cdf(gce_sigma=1.0)", "number loss 'was_cdf' has no parameter 'gce_sigma' (it takes ('sigma', "
                               "'reweigh'), and every loss mean_over); in the spec 'was_cdf(gce_sigma=1.0)'"),
    ("number_level_float(float_level=false)", "number loss 'number_level_float' has no parameter 'float_level' (it "
                                              "takes ('max_number_length', 'reweigh'), and every loss "
                                              "mean_over); in the spec 'number_level_float(float_level=false)'"),
    # Bad values: the constructor's message, and the spec.
    ("was(squash_factor=1)", "number loss 'was': expected squash_factor finite and > 1, got 1"),
    ("was(squash_factor=abc)", "number loss 'was': expected squash_factor to be a Python number, got str 'abc'; in "
                               "the spec 'was(squash_factor=abc)'"),
    ("was(reweigh=yes)", "number loss 'was': expected reweigh True or False, got str 'yes'; in the spec "
                         "'was(reweigh=yes)'"),
    ("smmd(mode=none)", "number loss 'smmd': expected mode in ('smmd', 'mmd', 'smooth'), got None"),
])
def test_parse_refuses_what_it_cannot_read_naming_the_loss_and_the_parameter(spec, message):
    if isinstance(message, tuple):  # the registry's names as they are when the test runs
        message = _unknown(message[1], spec)
    with pytest.raises(ValueError) as info:
        losses.parse(spec)
    assert str(info.value) == message
    # Every entry point reads its spec with `parse`.
    with pytest.raises(ValueError) as info:
        ntl_jax.cross_entropy_and_ntl(jnp.zeros((1, 1, len(PIECES))), jnp.zeros((1, 1), jnp.int32), NT,
                                      number_loss=spec)
    assert str(info.value) == message


def test_parse_and_resolve_take_strings_and_values_only():
    with pytest.raises(TypeError, match=r"expected a spec such as 'was', 'smmd\(sigma=2, mode=smooth\)' or "
                                        r"'my_package.losses:squared\(scale=2\)', got "
                                        r"NoneType None"):
        losses.parse(None)
    with pytest.raises(TypeError, match=r"expected number_loss a NumberLoss or a spec string, got the function "
                                        r".*ntl_jax.losses.expected_value_loss\(fn\)"):
        losses.resolve(jnp.subtract)
    with pytest.raises(TypeError, match=r"expected number_loss a NumberLoss \(ntl_jax.losses\), a spec such as "
                                        r"'was', .*, or None; got int 3"):
        ntl_jax.cross_entropy_and_ntl(jnp.zeros((1, 1, len(PIECES))), jnp.zeros((1, 1), jnp.int32), NT,
                                      number_loss=3)


# -- the keywords 0.3.0 removed: refused, the new form named ------------------------------

# Each removed keyword, a value it took, and the new form its refusal names.
REMOVED = {
    "ntl_kind": ("mse", "pass number_loss= a name ('was', 'mse', 'smmd', ...) or a value of ntl_jax.losses (a "
                        "function f: ntl_jax.losses.expected_value_loss(f); 'none': None)"),
    "squash_factor": (2.0, "pass number_loss=ntl_jax.losses.was(squash_factor=...) (or smmd(squash_factor=...))"),
    "reweigh": (True, "pass number_loss=ntl_jax.losses.was(reweigh=True) (each loss with a largest value takes "
                      "reweigh)"),
    "max_number_length": (3, "pass number_loss=ntl_jax.losses.number_level(max_number_length=...)"),
    "smmd_mode": ("mmd", "pass number_loss=ntl_jax.losses.smmd(mode=...)"),
    "smmd_sigma": (1.0, "pass number_loss=ntl_jax.losses.smmd(sigma=...)"),
    "smmd_alpha": (0.5, "pass number_loss=ntl_jax.losses.smmd(alpha=...)"),
    "formulation": ("columns", "pass nothing: each backend computes the number statistics its own way"),
}


def _call(name, **kwargs):
    logits = jnp.zeros((1, 2, V))
    targets = jnp.asarray([[4, 2]])
    if name == "fused_cross_entropy_and_ntl":
        return ntl_jax.fused_cross_entropy_and_ntl(jnp.ones((1, 2, 3)), jnp.zeros((3, V)), targets, NT, **kwargs)
    if name == "ntl_from_number_logits":
        return ntl_jax.ntl_from_number_logits(jnp.zeros((1, 2, NT.num_numbers)), targets, NT, **kwargs)
    return getattr(ntl_jax, name)(logits, targets, NT, **kwargs)


ENTRY_POINTS = ["number_token_loss", "cross_entropy_and_ntl", "fused_cross_entropy_and_ntl", "ntl_from_number_logits"]


@pytest.mark.parametrize("keyword", REMOVED)
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_removed_keywords_are_refused_with_their_new_form(name, keyword):
    value, new_form = REMOVED[keyword]
    if (name, keyword) == ("ntl_from_number_logits", "reweigh"):  # where reweighing works, not here
        new_form = ("pass number_loss=ntl_jax.losses.was(reweigh=True) to number_token_loss or cross_entropy_and_ntl "
                    "instead (reweighing needs the whole vocabulary's logits, which this function does not see)")
    with pytest.raises(TypeError) as info:
        _call(name, **{keyword: value})
    assert str(info.value) == f"{name}() no longer takes {keyword}= (ntl_jax 0.3.0); {new_form}"
    # Beside the new form too: an old keyword is never silently taken.
    with pytest.raises(TypeError, match=rf"no longer takes {keyword}="):
        _call(name, number_loss="was", **{keyword: value})


def test_the_ntloss_doorway_names_ntloss_own_arguments():
    with pytest.raises(TypeError) as info:
        _call("ntl_dot", ntl_kind="mae")
    assert str(info.value) == ("ntl_dot() no longer takes ntl_kind= (ntl_jax 0.3.0); pass loss_function= ('mse', "
                               "'mae', 'huber' or a function), ntloss's name")
    with pytest.raises(TypeError) as info:
        _call("number_level_loss", ntl_kind="number_level_float")
    assert str(info.value) == ("number_level_loss() no longer takes ntl_kind= (ntl_jax 0.3.0); pass float_level=True "
                               "for 'number_level_float' (ntloss's name)")
    for name in ("ntl_was", "ntl_dot", "number_level_loss"):
        with pytest.raises(TypeError, match=rf"^{name}\(\) no longer takes formulation= "):
            _call(name, formulation="columns")
    # ntloss's arguments stay: the same numbers as the values they name.
    logits = jax.random.normal(jax.random.PRNGKey(1), (2, 5, V)) * 2
    targets = jnp.asarray([[4, 5, 2, 14, 1], [7, 3, 15, 10, 6]])
    pairs = [
        (ntl_jax.ntl_was(logits, targets, NT, squash_factor=3.0, reweigh=True),
         losses.was(squash_factor=3.0, reweigh=True)),
        (ntl_jax.ntl_dot(logits, targets, NT, loss_function="huber", reweigh=True), losses.huber(reweigh=True)),
        (ntl_jax.number_level_loss(logits, targets, NT, float_level=True, max_number_length=2),
         losses.number_level(float_level=True, max_number_length=2)),
    ]
    for got, number_loss in pairs:
        want = ntl_jax.number_token_loss(logits, targets, NT, number_loss=number_loss)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert np.count_nonzero(np.asarray(got)) >= 5


# -- a loss a user writes goes everywhere a shipped one goes -------------------------------


VALUES = np.asarray(NT.values, np.float64)
IDS = np.asarray(NT.ids)
# Reweighed: its largest value, (max v - min v)^2, charged for the mass off the numbers.
CEILING = float((VALUES[IDS].max() - VALUES[IDS].min()) ** 2)
REWEIGHED = dataclasses.replace(SQUARED_DISTANCE, ceiling=lambda number_tokens: jnp.float32(CEILING), reweigh=True)
B, L, EXTRA = 3, 9, 2


def inputs(seed=0):
    """Logits (a few columns beyond the table), mostly number targets, some text, one id
    outside the logits, weights with zeros; NaN logits at one ignored position."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((B, L, V + EXTRA)) * 2
    targets = np.where(rng.random((B, L)) < 0.3, rng.choice([1, 2, 3, 16, V], size=(B, L)),
                       rng.choice(IDS, size=(B, L)))
    targets[2, 4] = V + EXTRA + 3  # outside the logits: ignored
    weights = rng.uniform(0.5, 2.0, (B, L))
    weights[1, 6] = 0.0
    logits[1, 6] = np.nan
    return jnp.asarray(logits, jnp.float32), jnp.asarray(targets, jnp.int32), jnp.asarray(weights, jnp.float32)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference(logits, targets, weights, *, reweigh=False):
    """numpy, float64: `(per_position, counted, grad)`: `sum_j softmax(z)_j (v_j - y)^2`
    over the number tokens' logits `z` at number targets, times the weight (reweighed:
    `loss m + 1.01 ceiling (1 - m)`, `m` the full softmax's mass on the numbers), and the
    gradient of its sum with respect to the logits."""
    x = np.nan_to_num(np.asarray(logits, np.float64))
    targets, weights = np.asarray(targets), np.asarray(weights, np.float64)
    keep = (weights > 0) & (targets >= 0) & (targets < x.shape[-1])
    counted = keep & np.isin(targets, IDS)
    y = np.where(counted, VALUES[np.clip(targets, 0, V - 1)], 0.0)
    p = _softmax(x[..., IDS])
    d = np.square(VALUES[IDS] - y[..., None])
    loss = np.sum(p * d, axis=-1)
    grad = np.zeros_like(x)
    grad[..., IDS] = p * (d - loss[..., None])
    if reweigh:
        full = _softmax(x)
        mass = full[..., IDS].sum(axis=-1)
        # d mass / d z_k: P_k (1 - m) at a number token, -m P_k elsewhere.
        dmass = -mass[..., None] * full
        dmass[..., IDS] = full[..., IDS] * (1 - mass[..., None])
        grad = grad * mass[..., None] + (loss - 1.01 * CEILING)[..., None] * dmass
        loss = loss * mass + 1.01 * CEILING * (1 - mass)
    w = np.where(counted, weights, 0.0)
    return loss * w, counted, grad * w[..., None]


def objective_reference(logits, targets, weights, *, factor, reweigh=False):
    """numpy, float64: `(loss, cross_entropy, ntl_sum, ntl_weight_sum, grad)` of
    `(CE + 0.3 * mean(NTL) * weight_sum) / factor` (ntl_jax 0.5: the number loss's
    weighted mean over the positions it counts, times the CE weights' sum)."""
    x = np.nan_to_num(np.asarray(logits, np.float64))
    targets, weights = np.asarray(targets), np.asarray(weights, np.float64)
    keep = (weights > 0) & (targets >= 0) & (targets < x.shape[-1])
    w = np.where(keep, weights, 0.0)
    full = _softmax(x)
    safe = np.where(keep, targets, 0)
    ce = -np.sum(w * np.log(np.take_along_axis(full, safe[..., None], axis=-1)[..., 0]))
    ce_grad = w[..., None] * (full - np.eye(x.shape[-1])[safe])
    per_position, counted, ntl_grad = reference(logits, targets, weights, reweigh=reweigh)
    ntl = per_position.sum()
    ntl_weight_sum = np.where(counted, weights, 0.0).sum()
    scale = w.sum() / ntl_weight_sum  # weight_sum / ntl_weight_sum: constants of the logits
    return ((ce + 0.3 * ntl * scale) / factor, ce / factor, ntl, ntl_weight_sum,
            (ce_grad + 0.3 * scale * ntl_grad) / factor)


def _assert_gradient(got, want):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("number_loss", [SQUARED_DISTANCE, REWEIGHED], ids=repr)
def test_a_loss_of_your_own_through_number_token_loss(number_loss, formulation):
    logits, targets, weights = inputs(seed=1)
    per_position, counted, grad = reference(logits, targets, weights, reweigh=number_loss.reweigh)
    assert counted.sum() >= 12 and (~counted).sum() >= 4
    nt = with_formulation(NT, formulation)
    got = ntl_jax.number_token_loss(logits, targets, nt, number_loss=number_loss, weights=weights)
    np.testing.assert_allclose(np.asarray(got, np.float64), per_position, rtol=1e-5, atol=1e-5)
    for reduction, want in (("sum", per_position.sum()),
                            ("mean", per_position.sum() / np.where(counted, weights, 0).sum())):
        value, got_grad = jax.value_and_grad(lambda x: ntl_jax.number_token_loss(
            x, targets, nt, number_loss=number_loss, weights=weights, reduction=reduction))(logits)
        np.testing.assert_allclose(float(value), want, rtol=1e-5)
        _assert_gradient(got_grad, grad * (want / per_position.sum()))
        assert not np.asarray(got_grad)[1, 6].any()  # the ignored position, NaN logits and all


@pytest.mark.parametrize("factor", [None, 7.0])
@pytest.mark.parametrize("number_loss", [SQUARED_DISTANCE, REWEIGHED], ids=repr)
def test_a_loss_of_your_own_through_the_objective(number_loss, factor, formulation):
    logits, targets, weights = inputs(seed=2)
    want, ce, ntl, ntl_weight_sum, want_grad = objective_reference(
        logits, targets, weights, factor=1.0 if factor is None else factor, reweigh=number_loss.reweigh)

    def objective(x):
        return ntl_jax.cross_entropy_and_ntl(x, targets, with_formulation(NT, formulation), weights=weights,
                                             number_loss=number_loss, loss_normalizing_factor=factor)

    (loss, parts), grad = jax.value_and_grad(objective, has_aux=True)(logits)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(parts["cross_entropy"]), ce, rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl"]), ntl / ntl_weight_sum, rtol=1e-5)
    weight_sum = np.where((np.asarray(weights) > 0) & (np.asarray(targets) >= 0) & (np.asarray(targets) < V + EXTRA),
                          np.asarray(weights, np.float64), 0.0).sum()
    np.testing.assert_allclose(float(parts["weight_sum"]), weight_sum, rtol=1e-6)
    assert ntl_weight_sum < weight_sum  # so the new normalisation differs from the old one
    np.testing.assert_allclose(float(parts["ntl_term"]),
                               0.3 * (ntl / ntl_weight_sum) * weight_sum / (1.0 if factor is None else factor),
                               rtol=1e-5)
    np.testing.assert_allclose(float(parts["ntl_weight_sum"]), ntl_weight_sum, rtol=1e-6)
    _assert_gradient(grad, want_grad)
    assert not np.asarray(grad)[1, 6].any()


def test_a_loss_of_your_own_through_the_fused_head_and_the_number_columns():
    """The fused head (hidden states and kernel, never the logits) and the number tokens'
    logits alone (`ntl_from_number_logits`) give what the logits give."""
    _, targets, weights = inputs(seed=3)
    rng = np.random.default_rng(3)
    hidden = jnp.asarray(rng.standard_normal((B, L, 6)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((6, V + EXTRA)), jnp.float32)
    options = dict(weights=weights, number_loss=SQUARED_DISTANCE, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")

    def unfused(h, k):
        return ntl_jax.cross_entropy_and_ntl(h @ k, targets, NT, **options)

    def fused(h, k):
        return ntl_jax.fused_cross_entropy_and_ntl(h, k, targets, NT, chunk_size=5, **options)

    (_, parts_u), grads_u = jax.value_and_grad(unfused, argnums=(0, 1), has_aux=True)(hidden, kernel)
    (_, parts_f), grads_f = jax.value_and_grad(fused, argnums=(0, 1), has_aux=True)(hidden, kernel)
    logits = np.asarray(hidden @ kernel)
    want = objective_reference(logits, targets, weights, factor=1.0)
    assert float(parts_u["ntl"]) > 1.0
    np.testing.assert_allclose(float(parts_u["ntl"]), want[2] / want[3], rtol=1e-5)
    for name in parts_u:
        np.testing.assert_allclose(float(parts_f[name]), float(parts_u[name]), rtol=2e-5, atol=1e-6, err_msg=name)
    for a, b in zip(grads_u, grads_f):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-5 * float(jnp.abs(a).max()))
    per_position = reference(logits, targets, weights)[0]
    columns = jnp.asarray(logits)[..., jnp.asarray(NT.ids)]
    got = ntl_jax.ntl_from_number_logits(columns, targets, NT, number_loss=SQUARED_DISTANCE, weights=weights)
    np.testing.assert_allclose(np.asarray(got, np.float64), per_position, rtol=1e-5, atol=1e-5)


def test_a_loss_of_your_own_under_jit_with_the_table_an_argument():
    logits, targets, weights = inputs(seed=4)
    f = jax.jit(lambda x, table: ntl_jax.number_token_loss(x, targets, table, number_loss=SQUARED_DISTANCE,
                                                           weights=weights, reduction="sum"))
    np.testing.assert_allclose(float(f(logits, NT)), reference(logits, targets, weights)[0].sum(), rtol=1e-5)


# -- the objective's signature stays small -------------------------------------------------


def test_the_objective_takes_at_most_twelve_parameters():
    parameters = inspect.signature(ntl_jax.cross_entropy_and_ntl).parameters
    assert len(parameters) <= 12, list(parameters)
    assert "number_loss" in parameters
    # No parameter that belongs to one loss.
    for name in ("ntl_kind", "squash_factor", "reweigh", "max_number_length", "float_level", "tau", "formulation"):
        assert name not in parameters
    assert not any(name.startswith(("smmd_", "del_")) for name in parameters)


def test_the_migration_hints_lead_somewhere_that_works():
    nt = ntl_jax.NumberTokens.from_pieces(["<pad>", "0", "1", "2", "3"])
    logits, targets = jnp.zeros((1, 1, 5)), jnp.array([[2]])
    hint = r"no longer takes reweigh=.*pass number_loss=ntl_jax.losses.was\(reweigh=True\) to number_token_loss or"
    with pytest.raises(TypeError, match=hint):
        ntl_jax.ntl_from_number_logits(logits[..., 1:], targets, nt, reweigh=True)
    ntl_jax.number_token_loss(logits, targets, nt, number_loss=losses.was(reweigh=True))  # where it leads: works
    # The squashed distance table (ntloss's `dist_lookup` with `squash_factor`) is public.
    np.testing.assert_allclose(nt.distance_table(squash_factor=3.0)[0], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(losses.distance_table(nt), nt.distance_table())
    with pytest.raises(ValueError, match="squash_factor finite and > 1"):
        nt.distance_table(squash_factor=0.5)
    # The trainer's names are specs too.
    assert losses.parse("ntl-was") is losses.was() and losses.parse("ntl-was-cdf(sigma=1)") is losses.was_cdf(sigma=1)
