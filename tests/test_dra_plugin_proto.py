"""The committed DRA and plugin-registration gRPC code is what scripts/gen-proto.sh generates,
and it names the services kubelet 1.36 calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_grpc.py")
DIRS = ("hami/_proto/dra/v1", "hami/_proto/pluginregistration/v1")


def test_generated_dra_code_is_up_to_date(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"gen-proto.sh failed:\n{proc.stdout}\n{proc.stderr}"
    stale = [
        f"{d}/{name}"
        for d in DIRS
        for name in GENERATED
        if (tmp_path / d / name).read_text() != (ROOT / d / name).read_text()
    ]
    assert not stale, f"{stale} differ from a fresh generation; run `make proto` and commit"


def test_generated_code_names_the_kubelet_dra_services() -> None:
    from hami._proto.dra.v1 import api_grpc as dra_grpc
    from hami._proto.dra.v1 import api_pb2 as dra_pb2
    from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
    from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2

    req = dra_pb2.NodePrepareResourcesRequest(
        claims=[dra_pb2.Claim(namespace="ns", uid="u1", name="c")]
    )
    assert dra_pb2.NodePrepareResourcesRequest.FromString(req.SerializeToString()) == req
    info = reg_pb2.PluginInfo(type="DRAPlugin", name="nvidia.hami.io")
    assert reg_pb2.PluginInfo.FromString(info.SerializeToString()) == info

    class Plugin(dra_grpc.DRAPluginBase):
        async def NodePrepareResources(self, stream: object) -> None:  # type: ignore[override]
            raise NotImplementedError

        async def NodeUnprepareResources(self, stream: object) -> None:  # type: ignore[override]
            raise NotImplementedError

    class Registration(reg_grpc.RegistrationBase):
        async def GetInfo(self, stream: object) -> None:  # type: ignore[override]
            raise NotImplementedError

        async def NotifyRegistrationStatus(self, stream: object) -> None:  # type: ignore[override]
            raise NotImplementedError

    assert sorted(Plugin().__mapping__()) == [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ]
    assert sorted(Registration().__mapping__()) == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
