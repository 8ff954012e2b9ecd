"""The executor's settings that shape its sandboxes: the warm imports are module names, or nothing."""

import pytest
from pydantic import ValidationError

from executor.pool import DEFAULT_WARM_IMPORTS, prewarm_code
from executor.settings import ExecutorSettings


def test_the_warm_imports_default_to_none() -> None:
    assert ExecutorSettings().warm_imports == DEFAULT_WARM_IMPORTS == ()
    assert prewarm_code(DEFAULT_WARM_IMPORTS) == "exec('', {})"


@pytest.mark.parametrize(
    ("value", "modules"),
    [("", ()), ("numpy", ("numpy",)), (" numpy , pandas,matplotlib.pyplot ", ("numpy", "pandas", "matplotlib.pyplot"))],
)
def test_the_warm_imports_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, modules: tuple[str, ...]
) -> None:
    monkeypatch.setenv("PBE_WARM_IMPORTS", value)
    assert ExecutorSettings().warm_imports == modules


@pytest.mark.parametrize("value", ["os; import shutil", "numpy pandas", "../x", "numpy,,pandas", "1numpy"])
def test_anything_but_module_names_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PBE_WARM_IMPORTS", value)
    with pytest.raises(ValidationError, match="WARM_IMPORTS"):
        ExecutorSettings()


def test_the_warm_up_binds_no_name_in_the_kernel_namespace() -> None:
    namespace: dict[str, object] = {}
    exec(prewarm_code(("json", "no_such_module_here")), namespace)  # a missing module is skipped
    assert set(namespace) == {"__builtins__"}
