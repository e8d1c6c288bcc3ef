"""Every Kubernetes manifest of deploy/k8s (one node, static shards) and deploy/k8s-fleet (the
fleet) against the Kubernetes API's own OpenAPI schemas (kubernetes-validate, offline), strict:
a misspelt or misplaced field fails here instead of on `kubectl apply`. No cluster here; the
Prometheus operator's ServiceMonitor is a custom resource whose schema is not among them (its
fields are checked in tests/deploy/test_deploy_k8s*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.tools import REPO

# The Kubernetes release whose schemas the manifests are checked against (deploy/README.md).
VERSION = "1.29"
CUSTOM = {"monitoring.coreos.com/v1"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for folder in ("deploy/k8s", "deploy/k8s-fleet"):
        for path in sorted((REPO / folder).glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    name = (
                        f"{Path(folder).name}/{path.name}:{doc['kind']}/{doc['metadata']['name']}"
                    )
                    found.append((name, doc))
    return found


MANIFESTS = manifests()


def test_every_folder_has_manifests_of_the_core_api() -> None:
    kinds = {doc["kind"] for _, doc in MANIFESTS if doc["apiVersion"] not in CUSTOM}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap"} <= kinds


@pytest.mark.parametrize(("name", "doc"), MANIFESTS, ids=[n for n, _ in MANIFESTS])
def test_a_manifest_is_valid_to_the_kubernetes_api(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"] in CUSTOM:
        pytest.skip(f"{name}: a custom resource (the Prometheus operator's), no schema here")
    kubernetes_validate.validate(doc, VERSION, strict=True)
