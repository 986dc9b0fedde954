"""The systems `ntl-jax train` and `compare` train, and what each is built from.

Most are token-head losses (`loss_names`: "ce", "ntl-<variant>", "del", "dist2",
"smmd", a number loss's parameters in parentheses, and "gce", "gce+<number loss>"):
the trainer's network, the shipped digit-level vocabulary and greedy decoding. The
paper's baselines differ in one place each:

* "regression-head" (`regression_head`): its own network (encoder -> one number) and
  step; encoder-decoder only.
* "rt", "rt+ntl-mse" (`ntl_jax.data.rt_vocabulary`): the Regression Transformer's number
  tokens, a vocabulary of their own; trained as the token losses "ce" and "ntl-mse".
* "xval" (`xval`): numbers as one `[NUM]` token scaled by the value, with a number
  head; its own network and step; encoder-decoder only.

Every system sees the same batches for a seed (the baselines re-encode them), so
`compare` pairs each with the CE run of its seed.
"""

from __future__ import annotations

from typing import Any, Callable

from ntl_jax.train import loss_names
from ntl_jax.train.loss_names import OWN_NAMES, loss_name  # noqa: F401  (this module's API too)

REGRESSION_HEAD = "regression-head"
RT = "rt"
RT_NTL = "rt+ntl-mse"
XVAL = "xval"
# The token-head loss each RT system trains with (on its own vocabulary).
RT_TOKEN_LOSSES = {RT: "ce", RT_NTL: "ntl-mse"}
BASELINES = (REGRESSION_HEAD, RT, RT_NTL, XVAL)
# Systems with a network of their own that is built on the encoder only or on the
# encoder-decoder: they need encoder-decoder batches.
ENCODER_DECODER_ONLY = (REGRESSION_HEAD, XVAL)


# λ in CE + λ·loss by default, by the name of the system's number loss: DEL's and DIST²'s
# authors' settings on this objective; SMMD's released module adds its loss unweighted
# (docs/guides/losses.md, "Weights"); NTL's 0.3 (the paper's) for every other system.
DEFAULT_WEIGHTS = {"del": 0.001, "dist2": 0.1, "smmd": 1.0}
NTL_WEIGHT = 0.3


def default_weight(system: str) -> float:
    """The weight λ of `system` when none is given: `DEFAULT_WEIGHTS` of its number
    loss, else 0.3 (also for the systems without a number loss, which ignore it)."""
    loss = token_loss(system)
    if loss is None or loss in loss_names.PLAIN:
        return NTL_WEIGHT
    return DEFAULT_WEIGHTS.get(loss_names.number_loss(loss).name, NTL_WEIGHT)


def canonical(system: str) -> str:
    """The name runs record for `system` (`loss_names.canonical` for a token-head loss);
    raises ValueError for a name that is no system."""
    if system in BASELINES:
        return system
    return loss_names.canonical(system, others=BASELINES)


def token_loss(system: str) -> str | None:
    """The token-head loss (`loss_names`) a system trains with (RT's underlying loss),
    or None for a system with its own step (regression head, xVal)."""
    if system in (REGRESSION_HEAD, XVAL):
        return None
    return RT_TOKEN_LOSSES.get(system, system)


def trains_ntl(system: str) -> bool:
    """Whether `system` trains on NTL (and so takes `--ntl-weight`)."""
    from ntl_jax.train.step import trains_ntl as token_trains_ntl

    loss = token_loss(system)
    return loss is not None and token_trains_ntl(loss)


def starts_from_ce(system: str) -> bool:
    """Whether `system` can start from a CE run's parameters (`compare --protocol
    finetune`): the token-head losses on the shipped vocabulary, whose network is CE's."""
    return token_loss(system) is not None and vocabulary_name(system) == "default"


def check(system: str, architecture: str) -> None:
    """Raises ValueError if `system` is unknown or cannot train `architecture`."""
    try:
        canonical(system)
    except ValueError as e:
        raise ValueError(f"loss: {e}") from None
    if system in ENCODER_DECODER_ONLY and architecture != "encoder-decoder":
        raise ValueError(f"loss {system!r} expected architecture 'encoder-decoder', got "
                         f"{architecture!r}")


def vocabulary_name(system: str) -> str:
    """"rt" for the RT systems, else "default": runs whose batches can be shared."""
    return "rt" if system in RT_TOKEN_LOSSES else "default"


def vocabulary_name_of(vocabulary: Any) -> str:
    """"rt" for an RT vocabulary (its `system_vocabulary` attribute), else "default"."""
    return getattr(vocabulary, "system_vocabulary", "default")


def vocabulary(system: str) -> Any:
    """The vocabulary `system`'s batches are tokenized with."""
    from ntl_jax.train import data as data_lib

    if vocabulary_name(system) == "rt":
        from ntl_jax.data import rt_vocabulary

        return rt_vocabulary.vocabulary()
    return data_lib.default_vocabulary()


def build(system: str, config, model_config, vocabulary) -> tuple | None:
    """`(model, optimizer, train_step)` of a system with its own network and step, or
    None for the token-head systems (built by `trainer.build_step`)."""
    if system == REGRESSION_HEAD:
        from ntl_jax.train import regression_head

        return regression_head.build(config, model_config, vocabulary)
    if system == XVAL:
        from ntl_jax.train import xval

        return xval.build(config, model_config, vocabulary)
    return None


def evaluator(system: str) -> Callable:
    """`fn(model, params, eval_sets, vocabulary, max_length, batch_size) -> (metrics,
    predictions)` for `system`."""
    if system == REGRESSION_HEAD:
        from ntl_jax.train import regression_head

        return regression_head.evaluate
    if system == XVAL:
        from ntl_jax.train import xval

        return xval.evaluate
    from ntl_jax.train import evaluate

    return evaluate.evaluate
