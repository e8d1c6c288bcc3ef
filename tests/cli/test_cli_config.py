"""`vdet config check|show|reference`, and the configuration reference kept current."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.serve import vdet_command
from support.tools import REPO

from vdet.cli.config import REFERENCE_BEGIN, REFERENCE_END
from vdet.config.reference import keys, markdown
from vdet.config.settings import Settings


def vdet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    return subprocess.run(
        [vdet_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **(env or {})},
    )


def write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "vdet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_reference_in_docs_is_current() -> None:
    document = (REPO / "docs/configuration.md").read_text()
    section = document.split(REFERENCE_BEGIN, 1)[1].split(REFERENCE_END, 1)[0]
    assert section.strip() == markdown(Settings).strip(), (
        "docs/configuration.md is stale: vdet config reference --update docs/configuration.md"
    )


def test_the_reference_has_every_key_with_its_environment_variable() -> None:
    docs = {d.path: d for d in keys(Settings)}
    assert docs["port"].env == "VDET_PORT" and docs["port"].bounds == ">= 1, <= 65535"
    policy = docs["ingest.source_policy.max_redirects"]
    assert policy.env == "VDET_INGEST__SOURCE_POLICY__MAX_REDIRECTS" and policy.default == "3"
    assert docs["sources[].url"].env is None  # inside a list: the whole list as JSON only
    assert all(d.description for d in docs.values()), [
        p for p, d in docs.items() if not d.description
    ]


def test_check_accepts_a_valid_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"port": 9001, "sources": [{"id": "cam", "url": "rtsp://c.example/s"}]})
    done = vdet("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    assert "valid; 1 configured source(s)" in done.stdout


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"detecton": {"conf_threshold": 0.3}}, "detecton: unknown key; did you mean 'detection'?"),
        ({"ingest": {"stal_timeout_s": 3}}, "did you mean 'stall_timeout_s'?"),
        (
            {"notify": {"webhooks": [{"id": "a", "url": "not a url"}]}},
            "notify.webhooks.0.url: must be an http:// or https:// URL without spaces",
        ),
        (
            {"sources": [{"id": "a", "url": "/etc/hostname"}]},
            "outside ingest.source_policy.file_roots",
        ),
    ],
    ids=["typo", "nested-typo", "webhook-url", "file-off-policy"],
)
def test_check_refuses_with_the_reason_and_status_2(
    tmp_path: Path, config: dict[str, object], said: str
) -> None:
    done = vdet("config", "check", str(write(tmp_path, config)))
    assert done.returncode == 2
    assert said in done.stderr
    assert "Traceback" not in done.stderr and "^https?" not in done.stderr


def test_an_unknown_environment_variable_gets_a_suggestion(tmp_path: Path) -> None:
    done = vdet("config", "check", str(write(tmp_path, {})), env={"VDET_PROT": "9000"})
    assert done.returncode == 2 and "did you mean VDET_PORT?" in done.stderr


def test_show_says_where_each_value_came_from_and_hides_secrets(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "port": 9001,
            "api_key": "hunter2hunter2",
            "notify": {
                "webhooks": [
                    {"id": "a", "url": "https://h.example/x?token=abc123", "secret": "s3cretvalue"}
                ]
            },
            "sources": [{"id": "cam", "url": "rtsp://admin:pw1234@c.example/s"}],
        },
    )
    done = vdet("config", "show", "--config", str(path), env={"VDET_LIVE__MAX_FPS": "10"})
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" = ", 1) for line in done.stdout.splitlines() if " = " in line)
    assert lines["port"] == "9001  # config file"
    assert lines["host"] == '"127.0.0.1"  # default'
    assert lines["live.max_fps"] == "10.0  # environment VDET_LIVE__MAX_FPS"
    for secret in ("hunter2hunter2", "abc123", "s3cretvalue", "pw1234"):
        assert secret not in done.stdout
    every = {d.path for d in keys(Settings) if "[]" not in d.path and not d.section}
    unset_sections = {key for key, value in lines.items() if value.startswith("null")}
    assert set(lines) >= {
        p for p in every if not any(p.startswith(s + ".") for s in unset_sections)
    }


def test_reference_update_of_a_file_it_cannot_use_says_so(tmp_path: Path) -> None:
    missing = vdet("config", "reference", "--update", str(tmp_path / "nope.md"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    plain = tmp_path / "plain.md"
    plain.write_text("# no markers\n")
    unmarked = vdet("config", "reference", "--update", str(plain))
    assert unmarked.returncode == 2 and "no reference section" in unmarked.stderr
    assert plain.read_text() == "# no markers\n"
