"""Keywords that 0.3.0 removed, refused with the new form named (CHANGELOG.md has the
table): an old keyword is never silently accepted."""

from __future__ import annotations

import functools
import inspect

_NEW_FORM = {
    "ntl_kind": "number_loss= a name ('was', 'mse', 'smmd', ...) or a value of ntl_jax.losses (a function f: "
                "ntl_jax.losses.expected_value_loss(f); 'none': None)",
    "squash_factor": "number_loss=ntl_jax.losses.was(squash_factor=...) (or smmd(squash_factor=...))",
    "reweigh": "number_loss=ntl_jax.losses.was(reweigh=True) (each loss with a largest value takes reweigh)",
    "max_number_length": "number_loss=ntl_jax.losses.number_level(max_number_length=...)",
    "smmd_mode": "number_loss=ntl_jax.losses.smmd(mode=...)",
    "smmd_sigma": "number_loss=ntl_jax.losses.smmd(sigma=...)",
    "smmd_alpha": "number_loss=ntl_jax.losses.smmd(alpha=...)",
    "formulation": "nothing: each backend computes the number statistics its own way",
}


def refuses_old_keywords(fn=None, *, new_forms: dict | None = None, only: tuple | None = None):
    """Wraps `fn` so that a keyword removed in 0.3.0 that `fn` does not take raises a
    `TypeError` naming its new form (`new_forms` adds or overrides entries; `only`: the
    keywords `fn` itself once took, where not all of them)."""
    if fn is None:
        return functools.partial(refuses_old_keywords, new_forms=new_forms, only=only)
    table = {**_NEW_FORM, **(new_forms or {})}
    if only is not None:
        table = {key: table[key] for key in only}
    own = set(inspect.signature(fn).parameters)
    removed = {key: new for key, new in table.items() if key not in own}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for key in kwargs:
            if key in removed:
                raise TypeError(f"{fn.__name__}() no longer takes {key}= (ntl_jax 0.3.0); pass {removed[key]}")
        return fn(*args, **kwargs)

    return wrapper


def check_no_old_keywords(where: str, kwargs: dict) -> None:
    """The same refusal for a constructor that passes `kwargs` through to another class."""
    for key in kwargs:
        if key in _NEW_FORM:
            raise TypeError(f"{where} no longer takes {key}= (ntl_jax 0.3.0); pass {_NEW_FORM[key]}")
