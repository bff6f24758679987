"""Test modules share helpers only through ``tests.support``: none imports a ``test_*`` module or a conftest.

Importing a test module runs its module-level code again under another name and ties one test
file's helpers to another file's tests; importing a conftest bypasses pytest's fixture scoping.
Every ``.py`` file under tests/ is parsed (not imported), and each import statement is resolved
to the modules it names, relative imports included.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def is_test_or_conftest(module: str) -> bool:
    """Whether any part of the dotted ``module`` is a test module (``test_*``) or a ``conftest``."""
    return any(part.startswith("test_") or part == "conftest" for part in module.split("."))


def _named(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The modules one import statement names.

    ``from a.b import c`` names ``a.b``, or, when ``a.b`` itself is not a test module, ``a.b.c``
    (``c`` may be a submodule). A relative import is resolved against ``package``, the dotted
    package of the importing file.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = package[:len(package) - node.level + 1] if node.level else []
    module = ".".join([*base, *([node.module] if node.module else [])])
    if is_test_or_conftest(module):
        return [module]
    return [f"{module}.{alias.name}".lstrip(".") for alias in node.names if alias.name != "*"]


def forbidden_imports(source: str, package: list[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for each test module or conftest that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += [(node.lineno, m) for m in _named(node, package) if is_test_or_conftest(m)]
    return sorted(found)


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        package = list(path.relative_to(ROOT).parent.parts)
        bad += [f"{path.relative_to(ROOT)}:{line} imports {module}"
                for line, module in forbidden_imports(path.read_text(), package)]
    assert not bad, "move the shared helper to tests/support and import it from there:\n" + "\n".join(bad)


def test_every_form_of_import_is_seen_and_only_tests_support_is_allowed() -> None:
    source = "\n".join([
        "import tests.agent.test_server",
        "from tests.aggregator.test_recovery import life, stored",
        "from tests.e2e import test_capture as capture",
        "from tests.e2e.conftest import agent",
        "import conftest",
        "from . import test_x",
        "from ..agent.test_server import RunningAgent",
        "from .conftest import fixture",
        "from tests.support.summaries import summary",
        "from tests.support import running_servers",
        "from tests.chopper.test_client import Recorder",
        "from tests.chopper import test_report as run_report",
        "import pytest",
    ])
    assert forbidden_imports(source, ["tests", "fuzz"]) == [
        (1, "tests.agent.test_server"),
        (2, "tests.aggregator.test_recovery"),
        (3, "tests.e2e.test_capture"),
        (4, "tests.e2e.conftest"),
        (5, "conftest"),
        (6, "tests.fuzz.test_x"),
        (7, "tests.agent.test_server"),
        (8, "tests.fuzz.conftest"),
        (11, "tests.chopper.test_client"),
        (12, "tests.chopper.test_report"),
    ]
