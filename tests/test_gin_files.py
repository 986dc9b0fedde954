"""The T5X gin files in `t5x_configs/`, checked as text and parsed by gin's own parser
(no T5X needed).

- every gin file parses; the number loss is one value, a constructor of
  `ntl_jax.losses` (`NTL_LOSS = @losses.was()`) whose own parameters are bound on it
  (`losses.smmd.mode = 'mmd'`), never on the model;
- every gin file the README and the documentation name exists, and the T5X guide's table
  describes every file;
- the T5X guide maps each of the earlier one-file-per-loss experiments to a command;
- every `include` resolves: ntl_jax's to a file here, T5X's to a file under `t5x/`;
- no gin file hard-codes a rounded vocabulary size (384 for bytes) that the network can
  compute from the vocabulary (`@ntl_models.padded_vocab_size()`).

`tests/t5x/test_t5x_gin.py` builds the models with real T5X.
"""

import importlib.util
import inspect
import itertools
import pathlib
import re

import pytest

from ntl_jax import losses
from ntl_jax._core import migration
from tests import docs_pages

config_parser = pytest.importorskip("gin.config_parser", reason="gin-config is not installed")

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "t5x_configs"
T5X_GUIDE = docs_pages.page("guides/t5x.md")
GIN_FILES = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.gin"))
EXPERIMENTS = [f for f in GIN_FILES if f.startswith("experiments/")]
LOSS_FILES = [f for f in GIN_FILES if f.startswith("losses/")]
# The loss of each earlier experiment file, by its suffix: (the NTL_LOSS's spec, NTL_WEIGHT).
EARLIER_LOSSES = {"ce": ("was", 0.0), "ntl_mse": ("mse", 0.3), "ntl_was": ("was", 0.3)}
# NTL's successors at their authors' weights (docs/guides/losses.md).
SUCCESSOR_LOSSES = {"del": ("del", 0.001), "dist2": ("dist2", 0.1), "smmd": ("smmd", 1.0)}
# Integer vocab sizes allowed in gin files: T5X's own value in a file that restates T5X's.
LITERAL_VOCAB_SIZES = {"models/decoder_only_base_ntl.gin": 32128}


# The NTL models, and the arguments a gin file may bind on them besides T5X's own.
NTL_MODELS = ("NTLEncoderDecoderModel", "NTLDecoderOnlyModel")
NTL_ARGUMENTS = {"number_loss", "ntl_weight", "gce_sigma", "digit_level", "fused_loss", "fused_chunk_size",
                 "fused_vocab_axis"}
# The macros the model files define for the loss.
LOSS_MACROS = {"NTL_WEIGHT", "NTL_LOSS", "NTL_GCE_SIGMA", "NTL_FUSED_LOSS"}


class _Reference:
    """A gin `@name()` (or `@name`) as the parser gives it."""

    def __init__(self, name, evaluate):
        self.name, self.evaluate = name, evaluate


class _Macro:
    def __init__(self, name):
        self.name = name


class _Recorder(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return _Reference(scoped_configurable_name, evaluate)

    def macro(self, macro_name):
        return _Macro(macro_name)


def parse(text: str) -> list:
    """The statements of gin `text`, by gin's own parser (nothing imported or bound)."""
    return list(config_parser.ConfigParser(text, _Recorder()))


def statements(name: str) -> list:
    return parse((CONFIGS / name).read_text())


def code(text: str) -> str:
    """`text` without gin comments (no gin string here contains '#')."""
    return "\n".join(line.split("#", 1)[0].rstrip() for line in text.splitlines())


def includes(name: str) -> list:
    return re.findall(r"^include\s+['\"]([^'\"]+)['\"]", code((CONFIGS / name).read_text()), re.M)


def macros(name: str) -> dict:
    """Top-level `NAME = value` macro bindings of a gin file, values as written."""
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.+?)\s*$", code((CONFIGS / name).read_text()), re.M))


def brace_expand(pattern: str) -> list:
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def gin_files_section() -> str:
    text = T5X_GUIDE.read_text()
    start = text.index("## The gin files\n")
    return text[start:text.index("\n## ", start + 1)]


def _tables(section: str) -> list:
    """The markdown tables of `section`, each a list of rows of cells (header dropped)."""
    tables, rows = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append([r for r in rows[1:] if not set("".join(r)) <= set("-: ")])
            rows = []
    return tables


def readme_file_table() -> list:
    """The file patterns in the first column of the T5X guide's gin files table."""
    return [re.fullmatch(r"`([^`]+)`", row[0]).group(1) for row in _tables(gin_files_section())[0]]


def earlier_experiments() -> dict:
    """{earlier file: [(gin files, gin bindings), ...]}, the T5X guide's equivalent commands.

    The guide maps `<protocol>/<size>_<task>_<loss>.gin` to commands on
    `experiments/<protocol>/<size>_<task>.gin`; here the placeholders are filled in
    from the experiment files there are now.
    """
    out = {}
    for row in _tables(gin_files_section())[1]:
        old = re.fullmatch(r"`<protocol>/<size>_<task>_(\w+)\.gin`", row[0]).group(1)
        files = re.findall(r"--gin_file=t5x_configs/(\S+?\.gin)", row[1])
        bindings = [f"{k} = {v.replace(chr(92), '')}" for k, v in re.findall(r"--gin\.(\w+)=([^`\s]+)", row[2])]
        for experiment in EXPERIMENTS:
            protocol, stem = experiment.split("/")[1], pathlib.PurePosixPath(experiment).stem
            fill = lambda f: f.replace("<protocol>/<size>_<task>", f"{protocol}/{stem}")  # noqa: E731
            commands = [([fill(f) for f in files], [])]
            if bindings:
                commands.append(([fill(files[0])], bindings))
            out[f"experiments/{protocol}/{stem}_{old}.gin"] = commands
    return out


def effective_loss(files, bindings) -> tuple:
    """(the number loss's spec, NTL_WEIGHT) after the defaults, `files` (and what they
    include), `bindings`: `NTL_LOSS` a reference to a constructor of `ntl_jax.losses`,
    called with the parameters bound on it, or a spec string (`ntl_jax.losses.resolve`)."""
    values, parameters = {}, {}

    def apply(parsed):
        for statement in parsed:
            if isinstance(statement, config_parser.IncludeStatement):
                if statement.filename.startswith("t5x_configs/"):
                    apply(statements(statement.filename[len("t5x_configs/"):]))
            elif isinstance(statement, config_parser.BindingStatement) and not statement.scope:
                if not statement.arg_name:
                    values[statement.selector] = statement.value
                elif statement.selector.startswith("losses."):
                    parameters.setdefault(statement.selector, {})[statement.arg_name] = statement.value

    for name in files:
        apply(statements(name))
    known = set(values)
    for binding in bindings:
        (statement,) = parse(binding)
        assert statement.arg_name or statement.selector in known, f"{binding!r} binds a macro no gin file defines"
        apply([statement])
    spec, weight = _spec(values["NTL_LOSS"], parameters), values["NTL_WEIGHT"]
    if weight is None:  # the loss's own λ
        weight = losses.DEFAULT_WEIGHT if spec == "none" else losses.parse(spec).default_weight
    return spec, float(weight)


def _spec(value, parameters) -> str:
    if isinstance(value, str):
        loss = losses.resolve(value)
        return "none" if loss is None else loss.spec
    assert isinstance(value, _Reference) and value.evaluate, f"expected NTL_LOSS = @losses.<constructor>(), got {value}"
    module, constructor = value.name.rsplit(".", 1)
    assert module == "losses", f"expected a constructor of ntl_jax.losses, got @{value.name}()"
    return getattr(losses, constructor)(**parameters.get(value.name, {})).spec


def test_the_layout():
    sizes = {"scratch": ("small", "base"), "finetune": ("small", "base", "large", "xl")}
    expected = {f"experiments/{p}/{s}_{t}.gin" for p in sizes for s in sizes[p] for t in ("arithmetic", "math13")}
    assert set(EXPERIMENTS) == expected | {"experiments/scratch/tiny_byte_arithmetic.gin"}
    assert LOSS_FILES == [f"losses/{loss}.gin" for loss in sorted(EARLIER_LOSSES | SUCCESSOR_LOSSES)]


def test_every_gin_file_the_documentation_names_exists():
    text = docs_pages.all_text()
    named = set(re.findall(r"t5x_configs/([\w/.-]+\.gin)", text))
    assert named, "the documentation names no gin file"
    assert sorted(named - set(GIN_FILES)) == []
    listed = [f for pattern in readme_file_table() for f in brace_expand(pattern)]
    assert sorted(set(listed) - set(GIN_FILES)) == [], "the gin files table names missing files"
    assert sorted(set(GIN_FILES) - set(listed)) == [], "the gin files table misses files"


def test_the_readme_maps_every_earlier_experiment():
    earlier = earlier_experiments()
    assert len(earlier) == 39
    for old, commands in earlier.items():
        assert not (CONFIGS / old).exists()
        expected = EARLIER_LOSSES[re.search(r"_(ce|ntl_mse|ntl_was)\.gin$", old).group(1)]
        for files, bindings in commands:
            assert all((CONFIGS / f).is_file() for f in files), (old, files)
            assert effective_loss(files, bindings) == expected, (old, files, bindings)


@pytest.mark.parametrize("name", GIN_FILES)
def test_includes_resolve(name):
    spec = importlib.util.find_spec("t5x")
    t5x_root = pathlib.Path(spec.origin).parents[1] if spec and spec.origin else None
    for included in includes(name):
        if included.startswith("t5x_configs/"):
            assert (REPO / included).is_file(), f"{name}: include {included!r} is not in the repository"
        elif included.startswith("t5x/"):
            if t5x_root is None:
                continue  # T5X's own file; checked where t5x is installed
            assert (t5x_root / included).is_file(), f"{name}: include {included!r} is not in T5X"
            # gin-config reads an include as a resource of the Python package named by
            # its folder first, and fails on a namespace package (a folder with no
            # __init__.py) before it tries the search paths.
            folder = (t5x_root / included).parent
            while folder != t5x_root:
                assert (folder / "__init__.py").is_file(), f"{name}: gin cannot include {included!r}"
                folder = folder.parent
        else:
            pytest.fail(f"{name}: include {included!r} is neither ntl_jax's (t5x_configs/) nor T5X's (t5x/)")


@pytest.mark.parametrize("name", GIN_FILES)
def test_no_hard_coded_vocabulary_size(name):
    text = code((CONFIGS / name).read_text())
    assert not re.search(r"\b384\b", text), f"{name}: use @ntl_models.padded_vocab_size()"
    literal = [int(v) for v in re.findall(r"^\s*(?:[\w.]+\.)?vocab_size\s*=\s*(\d+)", text, re.M)]
    assert literal == ([LITERAL_VOCAB_SIZES[name]] if name in LITERAL_VOCAB_SIZES else [])


def test_experiments_leave_the_loss_to_the_macros():
    for name in EXPERIMENTS:
        assert not {k for k in macros(name) if k.startswith("NTL_")}, name
        assert effective_loss([name], []) == ("was", 0.3), name
    for name in LOSS_FILES:
        assert set(macros(name)) == {"NTL_LOSS", "NTL_WEIGHT"}, name
        want = (EARLIER_LOSSES | SUCCESSOR_LOSSES)[pathlib.PurePosixPath(name).stem]
        assert effective_loss([EXPERIMENTS[0], name], []) == want


@pytest.mark.parametrize("name", ["models/ntl_encoder_decoder.gin", "models/ntl_decoder_only.gin"])
def test_the_ntl_models_bind_every_loss_macro(name):
    # Gaussian-smoothed cross-entropy is off unless NTL_GCE_SIGMA is set (e.g. with NTL-WAS-CDF).
    assert macros(name)["NTL_GCE_SIGMA"] == "0.0"
    assert set(macros(name)) == LOSS_MACROS | {"MODEL"}
    assert macros(name)["NTL_LOSS"] == "@losses.was()"  # the paper's NTL-WAS, a constructor of ntl_jax.losses
    text = code((CONFIGS / name).read_text())
    for option, macro in (("ntl_weight", "NTL_WEIGHT"), ("number_loss", "NTL_LOSS"),
                          ("gce_sigma", "NTL_GCE_SIGMA"), ("fused_loss", "NTL_FUSED_LOSS")):
        assert re.search(rf"^\s+{option} = %{macro}$", text, re.M), (name, option)
    imports = {(s.module, s.alias) for s in statements(name) if isinstance(s, config_parser.ImportStatement)}
    assert ("ntl_jax.losses", None) in imports  # `from ntl_jax import losses`, under dynamic registration


@pytest.mark.parametrize("name", GIN_FILES)
def test_every_gin_file_parses(name):
    parsed = statements(name)
    assert parsed, name
    imports = [s for s in parsed if isinstance(s, config_parser.ImportStatement)]
    if imports:  # T5X's gin files register what they import
        assert imports[0].module == "__gin__.dynamic_registration", name


def _loss_parameters() -> set:
    """Every parameter of a shipped loss's constructor."""
    return {p for constructor in losses.LOSSES.values() for p in inspect.signature(constructor).parameters}


@pytest.mark.parametrize("name", GIN_FILES)
def test_the_number_loss_is_one_value_bound_on_its_constructor(name):
    """No binding names a loss's parameter on a model (or a removed keyword, or a macro
    for one); `NTL_LOSS` and `number_loss` are constructors of `ntl_jax.losses`, and
    each binding on one names a parameter it takes."""
    removed = set(migration._NEW_FORM) | {"NTL_KIND", "NTL_REWEIGH", "NTL_SQUASH_FACTOR"}
    own = _loss_parameters()
    for statement in statements(name):
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        selector, argument, value = statement.selector, statement.arg_name, statement.value
        assert selector not in removed and argument not in removed, (name, selector, argument)
        if selector.rsplit(".", 1)[-1] in NTL_MODELS:
            assert argument not in own - NTL_ARGUMENTS, f"{name}: {selector}.{argument} is the loss's own parameter"
        if selector.startswith("losses."):
            constructor = selector[len("losses."):]
            assert argument in inspect.signature(getattr(losses, constructor)).parameters, (name, selector, argument)
        if (selector == "NTL_LOSS" and not argument) or argument == "number_loss":
            if isinstance(value, _Macro):
                assert value.name == "NTL_LOSS", (name, selector, argument)
            else:
                _spec(value, {})  # a constructor of ntl_jax.losses (or a spec), called as the file calls it


def test_byte_model_sizes_its_network_from_the_vocabulary():
    text = code((CONFIGS / "models/t5_1_1_tiny_byte_ntl.gin").read_text())
    assert "vocab_size = @ntl_models.padded_vocab_size()" in text
    assert "ntl_models.padded_vocab_size.vocabulary = %VOCABULARY" in text


PAPER_RUNS = [f for f in GIN_FILES if f.startswith("paper/")]


def test_the_paper_runs_leave_the_loss_to_the_macros():
    assert PAPER_RUNS == ["paper/gsm8k_t5_3b.gin", "paper/rjokes_t5_small.gin"]
    for name in PAPER_RUNS:
        assert not {k for k in macros(name) if k.startswith("NTL_")}, name
        assert effective_loss([name], []) == ("was", 0.3), name
        for loss in LOSS_FILES:
            expected = (EARLIER_LOSSES | SUCCESSOR_LOSSES)[pathlib.PurePosixPath(loss).stem]
            assert effective_loss([name, loss], []) == expected, (name, loss)
