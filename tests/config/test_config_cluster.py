"""The `cluster` settings: one node without servers, credentials never in a URL, the fleet's
streams never in a streams file."""

from __future__ import annotations

import pytest

from vdet.config.base import ConfigError
from vdet.config.cluster import default_node_id
from vdet.config.settings import load_settings


def test_without_servers_a_server_is_one_node() -> None:
    settings = load_settings()
    assert not settings.cluster.enabled
    fleet = load_settings(cluster={"servers": ["nats://nats-1:4222", "tls://nats-2:4222"]})
    assert fleet.cluster.enabled and fleet.cluster.node == default_node_id()
    assert load_settings(cluster={"servers": ["nats://n:4222"], "node_id": "gpu-7"}).cluster.node


@pytest.mark.parametrize(
    ("cluster", "extra", "message"),
    [
        ({"servers": ["nats://user:pw@n:4222"]}, {}, "not in a server URL"),
        ({"servers": ["http://n:4222"]}, {}, "cluster.servers"),
        ({"servers": ["nats://n:4222"], "node_id": "a.b"}, {}, "cluster.node_id"),
        ({"servers": ["nats://n:4222"], "username": "u"}, {}, "go together"),
        ({"servers": ["nats://n:4222"], "tls_cert_file": "/c.pem"}, {}, "go together"),
        ({"servers": ["nats://n:4222"], "token": "t", "creds_file": "/x"}, {}, "choose one"),
        ({"servers": ["nats://n:4222"], "lease_s": 1}, {}, "cluster.lease_s"),
        ({"servers": ["nats://n:4222"]}, {"streams_file": "/tmp/s.json"}, "exclude each other"),
    ],
)
def test_what_a_fleet_refuses(
    cluster: dict[str, object], extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings(cluster=cluster, **extra)
    assert "user:pw" not in str(caught.value), "a password is never shown"


def test_default_node_id_is_a_valid_key() -> None:
    import re

    from vdet.config.cluster import NODE_ID_PATTERN

    assert re.match(NODE_ID_PATTERN, default_node_id())
