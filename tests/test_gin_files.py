"""The T5X gin files in `t5x_configs/`, checked as text (no T5X needed).

- every gin file the README and the documentation name exists, and the T5X guide's table
  describes every file;
- the T5X guide maps each of the earlier one-file-per-loss experiments to a command;
- every `include` resolves: ntl_jax's to a file here, T5X's to a file under `t5x/`;
- no gin file hard-codes a rounded vocabulary size (384 for bytes) that the network can
  compute from the vocabulary (`@ntl_models.padded_vocab_size()`).

`tests/t5x/test_t5x_gin.py` builds the models with real T5X.
"""

import importlib.util
import itertools
import pathlib
import re

import pytest

from tests import docs_pages

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "t5x_configs"
T5X_GUIDE = docs_pages.page("guides/t5x.md")
GIN_FILES = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.gin"))
EXPERIMENTS = [f for f in GIN_FILES if f.startswith("experiments/")]
LOSS_FILES = [f for f in GIN_FILES if f.startswith("losses/")]
# The loss of each earlier experiment file, by its suffix: (NTL_KIND, NTL_WEIGHT).
EARLIER_LOSSES = {"ce": ("was", 0.0), "ntl_mse": ("mse", 0.3), "ntl_was": ("was", 0.3)}
# NTL's successors at their authors' weights (docs/guides/losses.md).
SUCCESSOR_LOSSES = {"del": ("del", 0.003), "dist2": ("dist2", 0.1), "smmd": ("smmd", 1.0)}
# Integer vocab sizes allowed in gin files: T5X's own value in a file that restates T5X's.
LITERAL_VOCAB_SIZES = {"models/decoder_only_base_ntl.gin": 32128}


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
    """(NTL_KIND, NTL_WEIGHT) after the defaults, `files` (and what they include), `bindings`."""
    values = {}

    def visit(name):
        for included in includes(name):
            if included.startswith("t5x_configs/"):
                visit(included[len("t5x_configs/"):])
        values.update(macros(name))

    for name in files:
        visit(name)
    for binding in bindings:
        key, value = (s.strip() for s in binding.split("=", 1))
        values[key] = value
    return values["NTL_KIND"].strip("'\""), float(values["NTL_WEIGHT"])


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
        assert set(macros(name)) == {"NTL_KIND", "NTL_WEIGHT"}, name
        want = (EARLIER_LOSSES | SUCCESSOR_LOSSES)[pathlib.PurePosixPath(name).stem]
        assert effective_loss([EXPERIMENTS[0], name], []) == want


@pytest.mark.parametrize("name", ["models/ntl_encoder_decoder.gin", "models/ntl_decoder_only.gin"])
def test_the_ntl_models_bind_every_loss_macro(name):
    # Gaussian-smoothed cross-entropy is off unless NTL_GCE_SIGMA is set (e.g. with NTL_KIND 'was_cdf').
    assert macros(name)["NTL_GCE_SIGMA"] == "0.0"
    text = code((CONFIGS / name).read_text())
    for option, macro in (("ntl_weight", "NTL_WEIGHT"), ("ntl_kind", "NTL_KIND"), ("reweigh", "NTL_REWEIGH"),
                          ("squash_factor", "NTL_SQUASH_FACTOR"), ("gce_sigma", "NTL_GCE_SIGMA"),
                          ("fused_loss", "NTL_FUSED_LOSS")):
        assert re.search(rf"^\s+{option} = %{macro}$", text, re.M), (name, option)


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
