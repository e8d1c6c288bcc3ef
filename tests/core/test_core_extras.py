"""Every install hint names an extra that pyproject.toml defines, and the command it gives
works from a checkout (scripts/setup.sh --extras)."""

from __future__ import annotations

import re
import tomllib

from support.tools import REPO

from vdet.core.extras import install_hint, needs_extra

EXTRAS = set(
    tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
# needs_extra("...", "eval"), install_hint('quant'), install_hint("report")
HINT_RE = re.compile(
    r"""(?:needs_extra|install_hint)\((?:[^()]|\([^()]*\))*?["']([a-z0-9-]+)["']\s*\)"""
)


def hinted_extras() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for root in ("service/vdet", "bench"):
        for path in (REPO / root).rglob("*.py"):
            for extra in HINT_RE.findall(path.read_text()):
                found.setdefault(extra, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_hint_names_a_defined_extra() -> None:
    found = hinted_extras()
    assert {"eval", "train", "quant", "gpu", "tensorrt-rtx", "bench", "report"} <= set(found)
    assert set(found) <= EXTRAS, {e: found[e] for e in set(found) - EXTRAS}


def test_no_message_sends_users_to_a_package_index_vdet_is_not_on() -> None:
    stale = re.compile(r"pip install ['\"]?vdet\[")
    offenders = [
        str(p.relative_to(REPO))
        for root in ("service/vdet", "bench", "docs", "deploy")
        for p in (REPO / root).rglob("*")
        if p.suffix in (".py", ".md", ".sh", ".yml") and stale.search(p.read_text())
    ]
    offenders += ["README.md"] if stale.search((REPO / "README.md").read_text()) else []
    assert offenders == []


def test_the_hint_is_the_setup_script_and_pip_from_the_checkout() -> None:
    assert install_hint("eval") == (
        "scripts/setup.sh --extras eval (or, in your own environment, "
        "pip install -e '.[eval]' from the checkout)"
    )
    assert needs_extra("--track", "eval").startswith("--track needs the eval extra: scripts/")
    setup = (REPO / "scripts/setup.sh").read_text()
    assert "--extras)" in setup and '-e ".[$extras]"' in setup
