"""The repository's map holds: a folder path is an import path, and data flows one way.

docs/architecture.md draws the rooms (vdet's sub-packages and top-level modules) and who may
import whom; these tests read every module's imports from its source (nothing is imported) and
fail when a module reaches back up the frame's path or into the code that assembles the system.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages
from support.import_closure import SOURCE_ROOT, imports_of, module_file
from support.tools import REPO

PACKAGE = SOURCE_ROOT / "vdet"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(path) for path in PACKAGE.rglob("*.py"))


def room(module: str) -> str:
    """The room a vdet module lives in: its sub-package, or its own name for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vdet"


def vdet_imports(module: str) -> set[str]:
    return {name for name in imports_of(module) if module_file(name) is not None}


# A frame's path through the rooms. No stage imports a later one: results flow forward only.
FRAME_PATH = ("ingest", "pipeline", "tracking", "hub", "api")
# The rooms that assemble the running system; the stages and the kernels never import them.
ASSEMBLY = {"streams", "stream_store", "gpu_workers", "runtime", "workers", "api", "cli"}
# Rooms that hold a stage, the kernels or the numbers they share.
STAGES = {"ingest", "pipeline", "tracking", "hub", "plugins", "contract", "types", "engines"}


def test_every_module_is_found_where_its_name_says() -> None:
    assert "vdet.inference.detector" in MODULES and "vdet.cuda.launch" in MODULES
    for module in MODULES:
        path = module_file(module)
        assert path is not None and path.is_relative_to(PACKAGE), module


def test_every_python_folder_is_a_package_the_wheel_ships() -> None:
    """A folder of Python files without __init__.py would install but not type-check."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["where"] == ["service"]
    found = set(find_namespace_packages(where=str(SOURCE_ROOT), include=["vdet*"]))
    for folder in {path.parent for path in PACKAGE.rglob("*.py")}:
        assert (folder / "__init__.py").is_file(), folder
        assert _module_name(folder / "__init__.py") in found, folder


def test_python_and_kernels_live_only_in_the_package() -> None:
    """A module or kernel left in service/, engines/ or plugins/ (say, by a merge from before the
    package moved to service/vdet/) would be neither installed nor imported: move it in."""
    stray = [*(REPO / "service").glob("*.py"), *(REPO / "engines").rglob("*.py")]
    stray += [*(REPO / "plugins").glob("*.py"), *(REPO / "plugins" / "kernels").glob("*")]
    assert not stray, [str(p.relative_to(REPO)) for p in stray]


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) in FRAME_PATH])
def test_no_stage_imports_a_later_one(module: str) -> None:
    later = set(FRAME_PATH[FRAME_PATH.index(room(module)) + 1 :])
    reached = {name for name in vdet_imports(module) if room(name) in later}
    assert not reached, f"{module} reaches forward into {sorted(reached)}"


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) in STAGES])
def test_stages_and_kernels_do_not_import_the_assembly(module: str) -> None:
    reached = {name for name in vdet_imports(module) if room(name) in ASSEMBLY}
    assert not reached, f"{module} imports {sorted(reached)}"


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) == "plugins"])
def test_kernel_layer_imports_only_the_contract_and_types(module: str) -> None:
    allowed = {"vdet", "vdet.core.contract", "vdet.core.types"}
    reached = {name for name in vdet_imports(module) if room(name) != "plugins"}
    assert reached <= allowed, f"{module} imports {sorted(reached - allowed)}"
