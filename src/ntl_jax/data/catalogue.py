"""Module catalogue of the DeepMind mathematics dataset v1.0 and the paper's subsets.

The names are those of the release files (`<module>.txt`) and of the generator
(`mathematics_dataset.modules`). Kept as plain data so that importing this file needs
nothing but Python; a test checks the lists against the installed generator.
"""

from __future__ import annotations

# Every training module; the release holds each under train-easy/, train-medium/,
# train-hard/ and interpolate/.
TRAIN_MODULES: tuple[str, ...] = (
    "algebra__linear_1d",
    "algebra__linear_1d_composed",
    "algebra__linear_2d",
    "algebra__linear_2d_composed",
    "algebra__polynomial_roots",
    "algebra__polynomial_roots_composed",
    "algebra__sequence_next_term",
    "algebra__sequence_nth_term",
    "arithmetic__add_or_sub",
    "arithmetic__add_or_sub_in_base",
    "arithmetic__add_sub_multiple",
    "arithmetic__div",
    "arithmetic__mixed",
    "arithmetic__mul",
    "arithmetic__mul_div_multiple",
    "arithmetic__nearest_integer_root",
    "arithmetic__simplify_surd",
    "calculus__differentiate",
    "calculus__differentiate_composed",
    "comparison__closest",
    "comparison__closest_composed",
    "comparison__kth_biggest",
    "comparison__kth_biggest_composed",
    "comparison__pair",
    "comparison__pair_composed",
    "comparison__sort",
    "comparison__sort_composed",
    "measurement__conversion",
    "measurement__time",
    "numbers__base_conversion",
    "numbers__div_remainder",
    "numbers__div_remainder_composed",
    "numbers__gcd",
    "numbers__gcd_composed",
    "numbers__is_factor",
    "numbers__is_factor_composed",
    "numbers__is_prime",
    "numbers__is_prime_composed",
    "numbers__lcm",
    "numbers__lcm_composed",
    "numbers__list_prime_factors",
    "numbers__list_prime_factors_composed",
    "numbers__place_value",
    "numbers__place_value_composed",
    "numbers__round_number",
    "numbers__round_number_composed",
    "polynomials__add",
    "polynomials__coefficient_named",
    "polynomials__collect",
    "polynomials__compose",
    "polynomials__evaluate",
    "polynomials__evaluate_composed",
    "polynomials__expand",
    "polynomials__simplify_power",
    "probability__swr_p_level_set",
    "probability__swr_p_sequence",
)

# Interpolation tests reuse the training modules' names (same kind of question, pairs
# held out from training by the generator's hash split).
INTERPOLATE_MODULES: tuple[str, ...] = TRAIN_MODULES

# Extrapolation module -> the training module it extends (bigger numbers, longer
# expressions, more samples). `measurement__conversion` keeps its name.
EXTRAPOLATION_OF: dict[str, str] = {
    "algebra__polynomial_roots_big": "algebra__polynomial_roots",
    "arithmetic__add_or_sub_big": "arithmetic__add_or_sub",
    "arithmetic__add_sub_multiple_longer": "arithmetic__add_sub_multiple",
    "arithmetic__div_big": "arithmetic__div",
    "arithmetic__mixed_longer": "arithmetic__mixed",
    "arithmetic__mul_big": "arithmetic__mul",
    "arithmetic__mul_div_multiple_longer": "arithmetic__mul_div_multiple",
    "comparison__closest_more": "comparison__closest",
    "comparison__kth_biggest_more": "comparison__kth_biggest",
    "comparison__sort_more": "comparison__sort",
    "measurement__conversion": "measurement__conversion",
    "numbers__place_value_big": "numbers__place_value",
    "numbers__round_number_big": "numbers__round_number",
    "probability__swr_p_level_set_more_samples": "probability__swr_p_level_set",
    "probability__swr_p_sequence_more_samples": "probability__swr_p_sequence",
}
EXTRAPOLATE_MODULES: tuple[str, ...] = tuple(sorted(EXTRAPOLATION_OF))

# Training module -> its extrapolation module, where one exists.
EXTRAPOLATION_FOR: dict[str, str] = {v: k for k, v in EXTRAPOLATION_OF.items()}

# Release folders ("regimes").
TRAIN_REGIMES: tuple[str, ...] = ("train-easy", "train-medium", "train-hard")
REGIMES: tuple[str, ...] = TRAIN_REGIMES + ("interpolate", "extrapolate")

# The paper's 13 training modules (Zausinger et al. 2025, mathematics experiments).
PAPER13_MODULES: tuple[str, ...] = (
    "algebra__linear_1d",
    "algebra__linear_1d_composed",
    "algebra__linear_2d",
    "algebra__linear_2d_composed",
    "algebra__sequence_next_term",
    "arithmetic__add_or_sub",
    "arithmetic__add_sub_multiple",
    "arithmetic__mul",
    "numbers__div_remainder",
    "numbers__div_remainder_composed",
    "numbers__place_value",
    "numbers__round_number",
    "numbers__round_number_composed",
)
# ... and its 7 extrapolation test modules (two of them extend modules outside the 13).
PAPER13_EXTRAPOLATE: tuple[str, ...] = (
    "arithmetic__add_or_sub_big",
    "arithmetic__add_sub_multiple_longer",
    "arithmetic__mixed_longer",
    "arithmetic__mul_big",
    "arithmetic__mul_div_multiple_longer",
    "numbers__place_value_big",
    "numbers__round_number_big",
)

# The arithmetic ablation: one module, 33,333 training pairs per difficulty, 1,000
# validation pairs per difficulty, tested on interpolate and the longer extrapolation.
ABLATION_MODULE = "arithmetic__add_sub_multiple"
ABLATION_EXTRAPOLATE = "arithmetic__add_sub_multiple_longer"
ABLATION_TRAIN_PER_DIFFICULTY = 33_333
ABLATION_VALIDATION_PER_DIFFICULTY = 1_000

# Sizes of the v1.0 release, which on-the-fly generation reproduces by default.
RELEASE_TRAIN_PER_DIFFICULTY = 666_666
RELEASE_TEST_PER_MODULE = 10_000
# Held-out validation pairs per training difficulty: 3 x 333 ~ 1,000 per module, the
# paper's 0.05 % of a module's two million training pairs.
VALIDATION_PER_DIFFICULTY = 333

# Generator length filter (mathematics_dataset.generate_settings).
MAX_QUESTION_LENGTH = 160
MAX_ANSWER_LENGTH = 30

SPLITS: tuple[str, ...] = ("train", "validation", "test_interpolate", "test_extrapolate")


def check_module(module: str, *, regime: str = "train") -> str:
    """Returns `module` if the release has it in `regime`, else raises ValueError."""
    known = EXTRAPOLATE_MODULES if regime == "extrapolate" else TRAIN_MODULES
    if module not in known:
        close = [m for m in known if module.split("__")[-1] in m][:5]
        hint = f"; did you mean one of {close}?" if close else ""
        raise ValueError(
            f"expected a mathematics module of the {regime!r} set (e.g. {known[0]!r}), "
            f"got {module!r}{hint}"
        )
    return module


def select_modules(spec: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Resolves a module selection used by the command line.

    Args:
      spec: None or "all" for every module, "paper13", "ablation", or a
        comma-separated list of module names or prefixes ("arithmetic__" selects the
        arithmetic family). A training module brings its interpolation and
        extrapolation files; an extrapolation module name brings only its own file.

    Returns:
      `(train_modules, extrapolate_modules)`, each sorted.
    """
    if spec is None or spec == "all":
        return TRAIN_MODULES, EXTRAPOLATE_MODULES
    if spec == "paper13":
        return tuple(sorted(PAPER13_MODULES)), PAPER13_EXTRAPOLATE
    if spec == "ablation":
        return (ABLATION_MODULE,), (ABLATION_EXTRAPOLATE,)
    train: set[str] = set()
    extra: set[str] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in TRAIN_MODULES:
            hits = [part]
        elif part in EXTRAPOLATION_OF:
            extra.add(part)
            continue
        else:
            hits = [m for m in TRAIN_MODULES if m.startswith(part)]
            extra.update(m for m in EXTRAPOLATE_MODULES if m.startswith(part))
            if not hits:
                raise ValueError(
                    "expected 'all', 'paper13', 'ablation' or module names/prefixes "
                    f"such as 'arithmetic__', got {part!r}"
                )
        train.update(hits)
        extra.update(EXTRAPOLATION_FOR[m] for m in hits if m in EXTRAPOLATION_FOR)
    return tuple(sorted(train)), tuple(sorted(extra))
