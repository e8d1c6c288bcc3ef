"""The lab's scripts (bench/ of a checkout: plain scripts, not a package), loaded by path for
their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from support.tools import REPO

LAB = REPO / "bench"


def load_script(relative: str) -> ModuleType:
    """bench/`relative` as a module (cached in sys.modules under a name of its own)."""
    path = LAB / relative
    name = "vdet_lab_" + Path(relative).with_suffix("").as_posix().replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
