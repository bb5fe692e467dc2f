"""The committed device plugin gRPC code must be what scripts/gen-proto.sh generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_grpc.py")


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"gen-proto.sh failed:\n{proc.stdout}\n{proc.stderr}"
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "hami/_proto/v1beta1" / name).read_text()
        != (ROOT / "hami/_proto/v1beta1" / name).read_text()
    ]
    assert not stale, (
        f"{stale} differ from a fresh generation; run `make proto` and commit the result "
        "(the pinned grpcio-tools/grpclib versions in pyproject.toml must be installed)"
    )


def test_generated_code_imports_and_names_the_kubelet_services() -> None:
    from hami._proto.v1beta1 import api_grpc, api_pb2

    req = api_pb2.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="a/b")
    assert api_pb2.RegisterRequest.FromString(req.SerializeToString()) == req

    class Registration(api_grpc.RegistrationBase):
        async def Register(self, stream: object) -> None:  # type: ignore[override]
            raise NotImplementedError

    assert list(Registration().__mapping__()) == ["/v1beta1.Registration/Register"]
