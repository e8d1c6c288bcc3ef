"""What a set of vdet modules imports, read from their source, and which distributions provide it.

`third_party_imports` walks vdet modules (module-level and function-level imports, and
`importlib.import_module` / `find_spec` of a constant name; not `if TYPE_CHECKING:` blocks),
follows every vdet module they import, and returns each third-party top-level name with the vdet
modules that import it. `provided_distributions` is the transitive closure of what a `pip
install` of vdet with some extras (plus named packages) brings, from pyproject.toml and the
installed packages' metadata. Nothing is imported: it reads source and metadata only.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from support.tools import REPO

# The folder that holds the import package vdet (src layout: a module's path is its name).
SOURCE_ROOT = REPO / "service"

# Import names whose distributions cannot be installed where the tests run (they need an NVIDIA
# driver), so their metadata is not there to ask.
NOT_INSTALLABLE_HERE = {"PyNvVideoCodec": {"pynvvideocodec"}}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_file(module: str) -> Path | None:
    """The source file of a vdet module, or None when `module` is not one."""
    if module != "vdet" and not module.startswith("vdet."):
        return None
    base = SOURCE_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports_of(module: str) -> set[str]:
    """Absolute names a vdet module imports (for `from a import b`: `a` and `a.b`)."""
    path = module_file(module)
    assert path is not None, module
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    package = _package_of(module, path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            called = ast.unparse(node.func)
            first = node.args[0]
            if (
                called.endswith(("import_module", "find_spec"))
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and not first.value.startswith(".")
            ):
                names.add(first.value)
    return names


def third_party_imports(roots: Iterable[str]) -> dict[str, set[str]]:
    """Top-level third-party names imported from `roots` and every vdet module they reach."""
    seen: set[str] = set()
    todo = list(roots)
    found: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in imports_of(module):
            top = name.split(".")[0]
            if top == "vdet":
                if module_file(name) is not None and name not in seen:
                    todo.append(name)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, set()).add(module)
    return found


@functools.cache
def _installed_providers() -> dict[str, list[str]]:
    return md.packages_distributions()


@functools.cache
def _requires(name: str) -> tuple[str, ...]:
    try:
        requires = md.requires(name) or []
    except md.PackageNotFoundError:
        return ()
    return tuple(_requirement_name(r) for r in requires if "extra ==" not in r)


def distributions_of(import_name: str) -> set[str]:
    """The distributions (normalized) that install a top-level import name."""
    known = {normalize(d) for d in _installed_providers().get(import_name, [])}
    return known | NOT_INSTALLABLE_HERE.get(import_name, set())


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return normalize(match.group(1))


def vdet_requirements(extras: Iterable[str]) -> set[str]:
    """vdet's own dependencies plus those of `extras`, from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return {_requirement_name(r) for r in requirements}


def provided_distributions(direct: Iterable[str]) -> set[str]:
    """`direct` and everything they depend on (installed packages' metadata; a package that is
    not installed here counts with no dependencies of its own)."""
    provided: set[str] = set()
    todo = [normalize(d) for d in direct]
    while todo:
        name = todo.pop()
        if name in provided:
            continue
        provided.add(name)
        todo += _requires(name)
    return provided


def pip_install_targets(run: str) -> tuple[set[str], set[str]]:
    """(vdet extras, other packages) a `pip install` command line names: `".[a,b]"` and
    `"pkg==1.0"` (quoted or not; variables such as ${EXTRA_PIP} are ignored)."""
    assert "pip install" in run, run
    line = run.split("pip install", 1)[1].split("&&", 1)[0]
    extras: set[str] = set()
    packages: set[str] = set()
    for token in line.split():
        token = token.strip("\"'")
        if not token or token.startswith(("-", "$")):
            continue
        if token.startswith(".") or token.startswith("${whl}"):
            match = re.search(r"\[([^\]]*)\]", token)
            extras.update(e.strip() for e in match.group(1).split(",")) if match else None
            packages.add("vdet")
        else:
            packages.add(_requirement_name(token))
    return extras, packages


__all__ = [
    "distributions_of",
    "imports_of",
    "module_file",
    "normalize",
    "pip_install_targets",
    "provided_distributions",
    "third_party_imports",
    "vdet_requirements",
]
