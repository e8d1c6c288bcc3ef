"""A fleet of `vdet serve` nodes on NATS JetStream (`cluster`; docs/fleet.md).

Without `servers` vdet is one node, as it has always been. With them, the node joins the fleet
named by `prefix` on those NATS servers: the desired streams live in the fleet's key-value
bucket (any node's API writes them; configured sources seed them), each stream runs on the one
node that holds its lease, and every node's WebSocket feed carries the whole fleet's results.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator

from vdet.config.base import Strict

# A node id is a key in the fleet's buckets and a label in metrics.
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_SERVER_PATTERN = r"^(nats|tls)://[^\s/?#]+$"


def default_node_id() -> str:
    """The host's name as a node id: what a StatefulSet's pods or compose services are called."""
    name = socket.gethostname().split(".")[0]
    cleaned = "".join(c if c.isalnum() or c in "_-" else "-" for c in name).strip("-_")
    return (cleaned or "node")[:64]


class ClusterSettings(Strict):
    """The NATS servers of the fleet and this node's part in it; empty `servers`: one node."""

    servers: list[Annotated[str, Field(pattern=_SERVER_PATTERN, max_length=512)]] = Field(
        default_factory=list,
        max_length=32,
        description="NATS server URLs (nats:// or tls://host:port); any one is enough to join, "
        "the client learns the rest. Empty: no fleet, this server is one node.",
        examples=[["nats://nats-1:4222", "nats://nats-2:4222", "nats://nats-3:4222"]],
    )
    node_id: str | None = Field(
        default=None,
        pattern=NODE_ID_PATTERN,
        description="This node's name in the fleet (1-64 letters, digits, '_', '-'); null: "
        "the host name. Two live nodes must not share one.",
    )
    capacity: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="Streams this node takes from the fleet at most; null: what it can run "
        "(max_streams, less where its worker processes' shares or gpu.max_streams_per_gpu "
        "over its GPUs are smaller). 0: the node serves the API and runs no stream.",
    )
    prefix: str = Field(
        default="vdet",
        pattern=r"^[A-Za-z0-9_-]{1,32}$",
        description="Names the fleet's buckets and subjects: fleets with different prefixes "
        "share NATS servers without meeting.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Copies of the fleet's state and results on the NATS cluster (3 survives "
        "one server lost). Fixed by the first node that creates them.",
    )
    lease_s: float = Field(
        default=6.0,
        ge=2.0,
        le=300.0,
        description="How long a node may go without renewing a stream's lease before another "
        "node takes the stream: the failover time after a crash. A node stops a stream whose "
        "lease it could not renew within three quarters of it.",
    )
    results_max_age_s: float = Field(
        default=3600.0,
        gt=0,
        le=30 * 86400,
        description="How long the servers keep results: the window in which a client can "
        "resume on any node.",
    )
    results_max_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="The most bytes of results the servers keep (oldest go first).",
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, le=120, description="Per connection attempt at start."
    )
    username: str | None = Field(
        default=None, min_length=1, max_length=256, description="NATS login, with password."
    )
    password: SecretStr | None = Field(default=None, description="Never logged.")
    token: SecretStr | None = Field(
        default=None, description="NATS token authentication; never logged."
    )
    creds_file: Path | None = Field(
        default=None, description="A NATS credentials file (JWT and NKey seed), decentralised auth."
    )
    tls_ca_file: Path | None = Field(
        default=None, description="PEM file of the CA(s) that signed the servers' certificates."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="Client certificate (PEM) for servers that ask for one."
    )
    tls_key_file: Path | None = Field(default=None, description="Its private key (PEM).")

    @property
    def enabled(self) -> bool:
        return bool(self.servers)

    @property
    def node(self) -> str:
        return self.node_id or default_node_id()

    @field_validator("servers")
    @classmethod
    def _no_userinfo(cls, value: list[str]) -> list[str]:
        for url in value:
            if "@" in url:
                raise ValueError(
                    "put NATS credentials in cluster.username/password, token or creds_file, "
                    "not in a server URL (URLs are logged)"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("cluster.username and cluster.password go together")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("cluster.tls_cert_file and cluster.tls_key_file go together")
        ways = [self.username is not None, self.token is not None, self.creds_file is not None]
        if sum(ways) > 1:
            raise ValueError("choose one of username/password, token or creds_file")
        return self
