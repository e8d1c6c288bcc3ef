"""Finding and loading libvdet_plugins.so, vdet's TensorRT plugin library (VdetDecodeNms).

This module owns where the library is looked for, the message that says how to build it when it
is missing, and registering it with TensorRT once per process (before an ONNX with the plugin
node is parsed, or an engine built from one is deserialized). It must not build the library:
that is CMake's job, from a source checkout (plugins/CMakeLists.txt, docs/tensorrt.md; the
installed package carries the kernels the plugin compiles, not its C++).

Search order: an explicit path (a file, or a folder holding the library: the setting
`engine.plugin_library`); the CMake build folders of a source checkout (build/plugins/,
plugins/build/); this package's folder.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

LIBRARY_NAME = "libvdet_plugins.so"
PLUGIN_NAME = "VdetDecodeNms"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "vdet"

PLUGINS_DIR = Path(__file__).resolve().parent
# In a source checkout this file is service/vdet/tensorrt/plugin_library.py: the repository root,
# whose plugins/ folder holds the library's C++ and CMake build.
_REPO_ROOT = PLUGINS_DIR.parents[2]
PLUGIN_SOURCE_DIR = _REPO_ROOT / "plugins"

_lock = threading.Lock()
_loaded: dict[Path, Any] = {}  # resolved library path -> TensorRT's library handle


class PluginLibraryError(RuntimeError):
    """The plugin library is missing or cannot be loaded; the message says how to fix it."""


def candidate_paths(explicit: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every path `find_plugin_library` tries, in order."""
    candidates: list[Path] = []
    if explicit is not None:
        path = Path(explicit)
        candidates.append(path / LIBRARY_NAME if path.is_dir() else path)
    candidates += [
        _REPO_ROOT / "build" / "plugins" / LIBRARY_NAME,
        PLUGIN_SOURCE_DIR / "build" / LIBRARY_NAME,
        PLUGINS_DIR / LIBRARY_NAME,
    ]
    return candidates


def build_command() -> str:
    """The commands that build the library from this checkout (or from a vdet source checkout)."""
    checkout = (PLUGIN_SOURCE_DIR / "CMakeLists.txt").is_file()
    source = PLUGIN_SOURCE_DIR if checkout else "<vdet source checkout>/plugins"
    return (
        f"cmake -S {source} -B build/plugins -DTensorRT_ROOT=<TensorRT prefix, /usr in "
        "NGC containers> && cmake --build build/plugins"
    )


def find_plugin_library(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The plugin library to load; PluginLibraryError listing every place searched if none.

    An explicit path that does not exist is an error even when another candidate exists: the
    caller asked for that one.
    """
    candidates = candidate_paths(explicit)
    if explicit is not None:
        chosen = candidates[0]
        if chosen.is_file():
            return chosen
        raise PluginLibraryError(_missing_message([chosen], explicit=True))
    for path in candidates:
        if path.is_file():
            return path
    raise PluginLibraryError(_missing_message(candidates, explicit=False))


def _missing_message(searched: list[Path], explicit: bool) -> str:
    where = "\n".join(f"  {path}" for path in searched)
    what = "the plugin library given" if explicit else f"{LIBRARY_NAME} was"
    return (
        f"vdet's TensorRT plugin library is needed (the model has a {PLUGIN_NAME} node) but "
        f"{what} not found. Searched:\n{where}\n"
        "Build it with the headers of the TensorRT version that will run it:\n"
        f"  {build_command()}\n"
        "then pass its path (--plugin-library, or engine.plugin_library / "
        "VDET_ENGINE__PLUGIN_LIBRARY)."
    )


def library_sha256(path: str | os.PathLike[str]) -> str:
    """The library's sha256: part of every engine key, so a rebuilt plugin rebuilds engines."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_into_tensorrt(trt: Any, path: str | os.PathLike[str] | None = None) -> Path:
    """Register the plugin library with TensorRT's plugin registry, once per process.

    `trt` is the imported `tensorrt` module (passed in so this module never imports it).
    `IPluginRegistry.load_library` calls the library's getCreators(); it returns None when the
    library cannot be opened (a missing CUDA runtime, a TensorRT ABI mismatch) or when its
    creators are already registered, which is checked before giving up.
    """
    library = find_plugin_library(path).resolve()
    with _lock:
        if library in _loaded:
            return library
        registry = trt.get_plugin_registry()
        handle = registry.load_library(str(library))
        if handle is None and not _creator_registered(registry):
            raise PluginLibraryError(
                f"TensorRT could not load {library} (see TensorRT's log above). It must be built "
                f"against this TensorRT's headers (tensorrt {trt.__version__}) and find the CUDA "
                f"runtime it was linked with; rebuild with:\n  {build_command()}"
            )
        if not _creator_registered(registry):
            raise PluginLibraryError(
                f"{library} loaded but registered no {PLUGIN_NAMESPACE}::{PLUGIN_NAME} "
                f"version {PLUGIN_VERSION}; is it vdet's plugin library?"
            )
        _loaded[library] = handle
        return library


def load_for_plan(trt: Any, recorded: str | None, expected_sha256: str) -> Path:
    """Register the plugin library an engine was built with, before deserializing it.

    `recorded` is the library path the engine's manifest names (used when it still exists,
    else the usual search); a library whose sha256 differs from the one the engine was built
    with is refused, since the engine's serialized plugin fields follow that build.
    """
    explicit = Path(recorded) if recorded and Path(recorded).is_file() else None
    library = find_plugin_library(explicit)
    digest = library_sha256(library)
    if digest != expected_sha256:
        raise PluginLibraryError(
            f"{library} is not the plugin library this engine was built with (sha256 "
            f"{digest[:12]}..., the engine wants {expected_sha256[:12]}...); rebuild the engine "
            "(vdet engine build) or point engine.plugin_library at the library it was built with"
        )
    return load_into_tensorrt(trt, library)


def _creator_registered(registry: Any) -> bool:
    try:
        creator = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    except (RuntimeError, TypeError):
        return False
    return creator is not None
