"""The guard every integration into a framework's internals runs before it touches one."""

import pytest

from ntl_jax._core.tested_releases import check_tested_release

ENV = "NTL_JAX_UNTESTED_EXAMPLE"


def test_a_tested_release_passes_and_another_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    check_tested_release("maxtext", "MaxText", ("0.2.5",), ENV, "0.2.5")
    expected = (r"^expected MaxText 0\.2\.5 or 0\.2\.6, the version\(s\) ntl_jax\.maxtext is tested with, got "
                r"maxtext 0\.3\.0\. Install the tested one \(pip install -e '\.\[maxtext\]', which pins it\), or "
                r"run tests/maxtext with 0\.3\.0 \(\.ci/maxtext\) and, if they pass, set NTL_JAX_UNTESTED_EXAMPLE=1$")
    with pytest.raises(RuntimeError, match=expected):
        check_tested_release("maxtext", "MaxText", ("0.2.5", "0.2.6"), ENV, "0.3.0")
    monkeypatch.setenv(ENV, "0")
    with pytest.raises(RuntimeError):
        check_tested_release("maxtext", "MaxText", ("0.2.5",), ENV, "0.3.0")
    monkeypatch.setenv(ENV, "1")
    check_tested_release("maxtext", "MaxText", ("0.2.5",), ENV, "0.3.0")
