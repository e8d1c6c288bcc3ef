"""deploy/k8s: the manifests parse, fit together, and follow the sharding rule.

No cluster here: these are structural checks, plus vdet's own validation of each shard's
settings and vdet.gpu.placement.shard_of for the sources each shard lists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.tools import REPO

from vdet.config.settings import load_settings
from vdet.gpu.placement import shard_of

K8S = REPO / "deploy/k8s"
SHARD_LABEL = "vdet.example.com/shard"
SHARD_COUNT_ANNOTATION = "vdet.example.com/shard-count"


def load_all() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_each_shard_lists_exactly_its_own_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("VDET_"):
            monkeypatch.delenv(name)
    config_maps = of_kind(load_all(), "ConfigMap")
    assert config_maps
    for config_map in config_maps:
        shard = int(config_map["metadata"]["labels"][SHARD_LABEL])
        count = int(config_map["metadata"]["annotations"][SHARD_COUNT_ANNOTATION])
        path = tmp_path / f"{config_map['metadata']['name']}.yaml"
        path.write_text(config_map["data"]["vdet.yaml"])
        settings = load_settings(path)
        assert settings.host == "0.0.0.0" and settings.port == 8000
        assert settings.sources
        for source in settings.sources:
            assert shard_of(source.id, count) == shard, f"{source.id} belongs to another shard"


def test_deployment_takes_one_gpu_runs_as_non_root_and_probes_health() -> None:
    docs = load_all()
    (deployment,) = of_kind(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # APP_UID in deploy/Dockerfile.gpu
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"name": "VDET_CONFIG", "value": "/etc/vdet/vdet.yaml"} in container["env"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/vdet"
    assert mounts["engines"] == "/var/lib/vdet/engines"
    volumes = {v["name"]: v for v in pod["volumes"]}
    (config_map,) = of_kind(docs, "ConfigMap")
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    (claim,) = of_kind(docs, "PersistentVolumeClaim")
    assert volumes["engines"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"


def test_service_and_service_monitor_reach_the_pods() -> None:
    docs = load_all()
    (deployment,) = of_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (service,) = of_kind(docs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http" and port["targetPort"] == "http"
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
