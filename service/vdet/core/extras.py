"""How to install an optional extra of pyproject.toml, said the same way by every message that
needs one. vdet is installed from its checkout (it is not on PyPI), so the hint is a command
that works there."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The commands that install `extra`: the checkout's setup script, or pip in one's own
    environment, both from the checkout's root."""
    return (
        f"scripts/setup.sh --extras {extra} (or, in your own environment, "
        f"pip install -e '.[{extra}]' from the checkout)"
    )


def needs_extra(what: str, extra: str) -> str:
    """'`what` needs the `extra` extra: <install_hint>', for an error message."""
    return f"{what} needs the {extra} extra: {install_hint(extra)}"
