"""The scripts in bench/ and bench/gpu/ import the installed package and nothing of tests/.

Read from the source (nothing is imported: most need a GPU). A script that edits `sys.path` or
imports the tests' `support` helpers works only from a checkout laid out as today's, and hides
what it needs from mypy; what it shares with the tests belongs in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.lab import LAB

BENCH = LAB
SCRIPTS = sorted(BENCH.rglob("*.py"))


def test_the_scripts_are_found() -> None:
    names = {path.name for path in SCRIPTS}
    assert {"streams.py", "pipeline.py", "accuracy.py", "live_view.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCH)))
def test_no_path_edits_and_no_test_helpers(script: Path) -> None:
    tree = ast.parse(script.read_text(), filename=str(script))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path":
            assert not (isinstance(node.value, ast.Name) and node.value.id == "sys"), (
                f"{script.name}:{node.lineno} uses sys.path"
            )
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in {"support", "tests", "conftest"}
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & {"support", "tests"}
