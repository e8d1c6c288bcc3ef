"""deploy/k8s-fleet: a 3-server NATS JetStream cluster and vdet nodes as a StatefulSet. No
cluster here: the manifests parse and fit together, the NATS config routes its three servers
and runs JetStream, and the nodes' settings are valid to vdet with each pod's name as its node
id."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.tools import REPO

from vdet.config.settings import load_settings

FLEET = REPO / "deploy/k8s-fleet"


def load_all() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((FLEET / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((FLEET / name).read_text()) if d]
    return docs


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in load_all() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((FLEET / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in FLEET.glob("*.yaml")} - {"kustomization.yaml"}


def test_nats_runs_three_routed_jetstream_servers() -> None:
    nats = named("StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["serviceName"] == "nats"
    conf = named("ConfigMap", "nats")["data"]["nats.conf"]
    assert "jetstream" in conf and "store_dir: /data" in conf
    routes = re.findall(r"nats-route://(nats-\d)\.nats:6222", conf)
    assert routes == ["nats-0", "nats-1", "nats-2"]
    assert named("Service", "nats")["spec"]["clusterIP"] == "None"
    claim = nats["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"


def test_vdet_nodes_join_the_fleet_as_their_pod_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("VDET_"):
            monkeypatch.delenv(name)
    nodes = named("StatefulSet", "vdet")
    pod = nodes["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["VDET_CLUSTER__NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] >= 30, "time to hand the streams off"
    config = tmp_path / "vdet.yaml"
    config.write_text(named("ConfigMap", "vdet-fleet")["data"]["vdet.yaml"])
    monkeypatch.setenv("VDET_CLUSTER__NODE_ID", "vdet-1")
    settings = load_settings(config)
    assert settings.cluster.enabled and settings.cluster.node == "vdet-1"
    assert settings.cluster.replicas == 3 and settings.streams_file is None
    servers = {re.sub(r":\d+$", "", s.removeprefix("nats://")) for s in settings.cluster.servers}
    assert servers == {"nats-0.nats", "nats-1.nats", "nats-2.nats"}


def test_the_api_service_spreads_over_every_node() -> None:
    api = named("Service", "vdet")
    labels = named("StatefulSet", "vdet")["spec"]["template"]["metadata"]["labels"]
    assert api["spec"]["selector"].items() <= labels.items()
    monitor = named("ServiceMonitor", "vdet")
    assert monitor["spec"]["selector"]["matchLabels"] == api["metadata"]["labels"]
    headless = named("Service", "vdet-nodes")
    assert headless["spec"]["clusterIP"] == "None"
    # Scraped once per pod: the headless Service is not matched by the ServiceMonitor.
    assert (
        not monitor["spec"]["selector"]["matchLabels"].items()
        <= headless["metadata"]["labels"].items()
    )
