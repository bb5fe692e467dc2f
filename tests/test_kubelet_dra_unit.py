"""Pure parts of the kubelet emulator's DRA side and of the optional controller manager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami.testkit.controlplane import (
    ControllerManagerProcess,
    ControlPlane,
    ControlPlaneError,
    find_binaries,
)
from hami.testkit.kubelet_dra import CDIRegistry, PrepareError, pod_claim_names


def test_claim_names_of_a_pod() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "tpl"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
    }
    assert pod_claim_names(pod) == {"a": "shared", "b": "p-b-x1"}
    del pod["status"]
    with pytest.raises(PrepareError, match="waiting for resource claim of 'b'"):
        pod_claim_names(pod)


def test_cdi_env_applies_spec_then_device_edits(tmp_path: Path) -> None:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "x.hami.io/claim",
        "containerEdits": {"env": ["COMMON=1"]},
        "devices": [
            {"name": "u1", "containerEdits": {"env": ["A=1", "COMMON=2"]}},
            {"name": "u2", "containerEdits": {"env": ["B=2"]}},
        ],
    }
    (tmp_path / "x.json").write_text(json.dumps(spec))
    (tmp_path / "broken.json").write_text("{not json")  # skipped, as a runtime would
    registry = CDIRegistry([tmp_path, tmp_path / "missing"])
    assert registry.env(["x.hami.io/claim=u1"]) == ["COMMON=1", "A=1", "COMMON=2"]
    assert registry.env(["x.hami.io/claim=u2"]) == ["COMMON=1", "B=2"]
    with pytest.raises(PrepareError, match=r"x\.hami\.io/claim=u3"):
        registry.env(["x.hami.io/claim=u3"])


def test_controller_manager_missing_says_how_to_get_it(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler"):
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    binaries = find_binaries({"HAMI_CONTROLPLANE_DIR": str(tmp_path)})
    assert binaries.kube_controller_manager is None  # optional: the others still start
    plane = ControlPlane(workdir=tmp_path / "w", binaries=binaries)
    with pytest.raises(ControlPlaneError, match=r"kube-controller-manager not found.*make"):
        ControllerManagerProcess(plane, ["resourceclaim-controller"], "kcm")
