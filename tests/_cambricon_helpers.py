"""Builders for the Cambricon backend's tests: a fake ``cnmon`` run as a real subprocess,
the backend over it and an Allocate request."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from hami.backends import AllocationRequest, BackendSettings
from hami.backends.cambricon import CambriconBackend
from hami.protocol import ContainerDevice

FIXTURES = Path(__file__).parent / "fixtures"
X4_0 = "MLU-45013011-2257-0000-0000-000000000000"
X4_1 = "MLU-54043011-2257-0000-0000-000000000000"


def fake_cnmon(tmp_path: Path, mode: str, fixture: str = "cnmon_mlu370_x4x2.json") -> Path:
    """An executable standing in for cnmon; ``mode`` picks how it behaves."""
    script = tmp_path / f"cnmon-{mode}"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import sys, time
            if sys.argv[1:] != ["info", "-j"]:
                sys.exit("usage: cnmon info -j")
            data = open({str(FIXTURES / fixture)!r}).read()
            mode = {mode!r}
            if mode == "file":
                open("cnmon_info.json", "w").write(data)
                print("Card 0  MLU370-X4 ... (table)")
            elif mode == "stdout":
                print(data)
            elif mode == "fail":
                print("partial", flush=True)
                sys.stderr.write("noise\\n" * 200)
                sys.stderr.write("cndev: no MLU device found (driver not loaded)\\n")
                sys.exit(3)
            elif mode == "hang":
                time.sleep(30)
            elif mode == "junk":
                print("Error: unknown option -j")
            """
        )
    )
    script.chmod(0o755)
    return script


def backend(cnmon: Path | str, **options: Any) -> CambriconBackend:
    return CambriconBackend(BackendSettings(options={"cnmon": str(cnmon), **options}))


def request(devices: list[ContainerDevice], cards: list[Any]) -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="ml",
        pod_name="infer-0",
        pod_uid="5f1c",
        container_name="server",
        container_index=0,
        devices=devices,
        node_devices=cards,
    )
