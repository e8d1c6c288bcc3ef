"""The repository's map holds: a folder path is an import path, every import runs one way.

docs/architecture.md draws the packages of `vdet` and who may import whom; these tests read every
module's imports from its source (nothing is imported; imports inside functions and under
TYPE_CHECKING count too, since they are dependencies all the same) and fail on:
- an import cycle between modules of the package;
- a package importing one that the layers below put above it;
- anything but the API and the CLI importing the composition root, the API or the CLI;
- a product module importing a benchmark (only the CLI runs them) or a test.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
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


def package(module: str) -> str:
    """The package of `vdet` a module belongs to: `vdet.streams.manager` -> `streams`;
    `vdet.root` -> `root`; `vdet` itself -> `vdet`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vdet"


def vdet_imports(module: str) -> set[str]:
    return {name for name in imports_of(module) if module_file(name) is not None}


# Who may import whom, by package: each layer may import the layers before it and its own,
# never a later one. Within a layer, packages import each other only as listed in SIDEWAYS.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"vdet", "core"}),  # value types, the numeric contract, geometry, assets
    frozenset({"config"}),  # settings: what every other package is told
    frozenset({"cuda", "metrics", "results"}),  # kernels; the metric registry; results out
    # stages
    frozenset({"ingest", "tracking", "modelkit", "tensorrt", "inference", "gpu", "clips"}),
    frozenset({"streams"}),  # a stream's threads, the stream service and its values
    frozenset({"workers", "notify", "fleet"}),  # worker processes; events out; other nodes
    frozenset({"root"}),  # the composition root
    frozenset({"api", "cli", "bench"}),  # what users run
)
# Stages that use each other: NVDEC readers are ingest's, run by the GPU's devices; the GPU
# runs inference's networks; inference's TensorRT backend runs engines the tensorrt package
# builds, which converts to FP16 with modelkit; modelkit quantizes with inference's letterbox on
# frames ingest reads; tracking knows nothing of the others.
SIDEWAYS: dict[str, frozenset[str]] = {
    "ingest": frozenset(),
    "tracking": frozenset(),
    "clips": frozenset(),
    "gpu": frozenset({"ingest", "inference"}),
    "inference": frozenset({"tensorrt"}),
    "tensorrt": frozenset({"modelkit"}),
    "modelkit": frozenset({"inference", "ingest", "tracking"}),
    "workers": frozenset(),
    "notify": frozenset(),
    "fleet": frozenset(),
    "api": frozenset(),
    "cli": frozenset({"api", "bench"}),
    "bench": frozenset(),
}
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# Only these may import the composition root, the API or the CLI.
ASSEMBLERS = {"root", "api", "cli"}


def test_every_package_has_a_layer() -> None:
    packages = {package(m) for m in MODULES}
    assert packages <= set(LAYER_OF), sorted(packages - set(LAYER_OF))


def test_every_module_is_found_where_its_name_says() -> None:
    assert "vdet.inference.detector" in MODULES and "vdet.cuda.launch" in MODULES
    for module in MODULES:
        path = module_file(module)
        assert path is not None and path.is_relative_to(PACKAGE), module


def test_the_root_of_the_package_holds_only_the_composition_root() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "root.py"], loose


def test_every_python_folder_is_a_package_the_wheel_ships() -> None:
    """A folder of Python files without __init__.py would install but not type-check."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["where"] == ["service"]
    found = set(find_namespace_packages(where=str(SOURCE_ROOT), include=["vdet*"]))
    for folder in {path.parent for path in PACKAGE.rglob("*.py")}:
        assert (folder / "__init__.py").is_file(), folder
        assert _module_name(folder / "__init__.py") in found, folder


def test_python_and_kernels_live_only_in_the_package() -> None:
    """A module or kernel left in service/, engines/ or plugins/ would be neither installed nor
    imported: move it in."""
    stray = [*(REPO / "service").glob("*.py"), *(REPO / "engines").rglob("*.py")]
    stray += [*(REPO / "plugins").glob("*.py"), *(REPO / "plugins" / "kernels").glob("*")]
    assert not stray, [str(p.relative_to(REPO)) for p in stray]


def _cycles() -> Iterator[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan)."""
    graph = {m: sorted(vdet_imports(m) & set(MODULES)) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    yield from found


def test_no_import_cycles() -> None:
    cycles = list(_cycles())
    assert not cycles, cycles


@pytest.mark.parametrize("module", MODULES)
def test_imports_follow_the_layers(module: str) -> None:
    own = package(module)
    wrong = set()
    for name in vdet_imports(module):
        other = package(name)
        if other == own:
            continue
        if LAYER_OF[other] > LAYER_OF[own] or (
            LAYER_OF[other] == LAYER_OF[own] and other not in SIDEWAYS.get(own, frozenset())
        ):
            wrong.add(name)
    assert not wrong, f"{module} imports {sorted(wrong)}"


@pytest.mark.parametrize("module", [m for m in MODULES if package(m) not in ASSEMBLERS])
def test_only_the_api_and_the_cli_import_the_root(module: str) -> None:
    reached = {name for name in vdet_imports(module) if package(name) in ASSEMBLERS}
    assert not reached, f"{module} imports {sorted(reached)}"


@pytest.mark.parametrize("module", [m for m in MODULES if package(m) not in {"bench", "cli"}])
def test_the_product_imports_no_benchmark_and_no_test(module: str) -> None:
    names = imports_of(module)
    benchmarks = {n for n in names if n == "vdet.bench" or n.startswith("vdet.bench.")}
    tests = {n for n in names if n.split(".")[0] in {"tests", "support", "conftest"}}
    assert not benchmarks | tests, f"{module} imports {sorted(benchmarks | tests)}"


@pytest.mark.parametrize("module", [m for m in MODULES if package(m) == "cuda"])
def test_the_kernel_layer_imports_only_core(module: str) -> None:
    reached = {name for name in vdet_imports(module) if package(name) not in {"cuda", "core"}}
    assert not reached, f"{module} imports {sorted(reached)}"
