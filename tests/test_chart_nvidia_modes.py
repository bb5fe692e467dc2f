"""The chart's NVIDIA operating modes (devicePlugin.operatingMode: hami-core, mig, mps;
issue 23): each renders into the node agent's config, which builds an NVIDIA backend in that
mode with those settings, and into the DaemonSet what the agent needs in it (mig: the
mig-config capability; mps: the daemon's host directories at the same paths). Settings the
agent would refuse at start fail `helm template` with the fix; the mig and mps DaemonSets
pass the real API server's validation (server-side dry run).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _manifest_helpers import apply
from test_chart import CHART, Docs, by_key, configs, container, helm, pod_spec, render

from hami.backends import registry
from hami.backends.mps import MpsSettings
from hami.backends.nvidia import NvidiaBackend
from hami.kube.client import Kube
from hami.protocol.mig import AllowedMigProfiles

ALLOWLIST = [
    {"models": ["A100-SXM4-40GB", "A100-PCIE-40GB"], "profiles": ["1g.5gb", "3g.20gb"]},
    {"models": ["H100"], "profiles": ["1g.10gb", "7g.80gb"]},
]
BAD_PROFILE = [{"models": ["A100"], "profiles": ["big"]}]
JSON_FORM = ("--set", "devicePlugin.registerFormat=json")
MIG = (
    "--set", "devicePlugin.operatingMode=mig", *JSON_FORM,
    "--set-json", f"devicePlugin.migProfileAllowlist={json.dumps(ALLOWLIST)}",
)  # fmt: skip
MPS = ("--set", "devicePlugin.operatingMode=mps", *JSON_FORM)
MPS_PATHS = (
    *MPS,
    "--set", "devicePlugin.mps.pipeDir=/var/run/mps/pipe",
    "--set", "devicePlugin.mps.logDir=/var/log/mps",
    "--set", "devicePlugin.mps.shmDir=/run/mps-shm",
    "--set", "devicePlugin.mps.daemon=attach",
)  # fmt: skip


def nvidia_backend(docs: Docs) -> NvidiaBackend:
    """The NVIDIA backend the node agent builds from the rendered hami.yaml."""
    hami_cfg, _ = configs(docs)
    backend = registry.create("nvidia", hami_cfg.backends["nvidia"].settings("nvidia"))
    assert isinstance(backend, NvidiaBackend)
    return backend


def agent(docs: Docs) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the node agent's pod spec, its hami container)."""
    spec = pod_spec(docs, "DaemonSet", "hami-node")
    return spec, container(spec, "hami")


def env_of(ctr: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in ctr["env"] if "value" in e}


def host_mounts(spec: dict[str, Any], ctr: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """container path -> (host path, hostPath type) for the container's host mounts."""
    host = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    return {
        m["mountPath"]: (host[m["name"]]["path"], host[m["name"]]["type"])
        for m in ctr["volumeMounts"]
        if m["name"] in host
    }


@pytest.mark.parametrize("args", [MIG, MPS_PATHS], ids=["mig", "mps"])
def test_helm_lint_is_clean_in_each_mode(args: tuple[str, ...]) -> None:
    result = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in result.stdout, result.stdout


def test_default_is_hami_core_with_nothing_of_the_other_modes() -> None:
    docs = render()
    backend = nvidia_backend(docs)
    assert backend.operating_mode == "hami-core" and backend.mps is None
    assert backend.mig_allowlist == ()
    spec, ctr = agent(docs)
    assert env_of(ctr)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not {"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"} & set(env_of(ctr))
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert not [v for v in spec["volumes"] if v["name"].startswith("mps-")]


def test_mig_mode_renders_the_allowlist_and_the_mig_config_capability() -> None:
    docs = render(*MIG)
    backend = nvidia_backend(docs)
    assert backend.operating_mode == "mig" and backend.mps is None
    assert backend.mig_allowlist == tuple(
        AllowedMigProfiles(tuple(e["models"]), tuple(e["profiles"])) for e in ALLOWLIST
    )
    spec, ctr = agent(docs)
    env = env_of(ctr)
    assert env["NVIDIA_MIG_CONFIG_DEVICES"] == env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    security = ctr["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert "privileged" not in security and "allowPrivilegeEscalation" not in security
    # the ledger of instances it made lives beside HAMi-core's files, on the host
    assert host_mounts(spec, ctr)["/usr/local/vgpu"][0] == "/usr/local/vgpu"
    assert not [v for v in spec["volumes"] if v["name"].startswith("mps-")]


def test_mps_mode_mounts_the_daemons_directories_where_the_config_names_them() -> None:
    docs = render(*MPS_PATHS)
    backend = nvidia_backend(docs)
    assert backend.operating_mode == "mps" and backend.mps is not None
    assert backend.mps.settings == MpsSettings(
        pipe_dir="/var/run/mps/pipe",
        log_dir="/var/log/mps",
        shm_dir="/run/mps-shm",
        daemon="attach",
    )
    spec, ctr = agent(docs)
    assert env_of(ctr)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # the control program
    mounts = host_mounts(spec, ctr)
    assert mounts["/var/run/mps/pipe"] == ("/var/run/mps/pipe", "DirectoryOrCreate")
    assert mounts["/var/log/mps"] == ("/var/log/mps", "DirectoryOrCreate")
    assert mounts["/dev/shm"] == ("/run/mps-shm", "Directory")
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    # the defaults: hami's own paths, and no shared /dev/shm
    docs = render(*MPS)
    backend = nvidia_backend(docs)
    assert backend.mps is not None and backend.mps.settings == MpsSettings()
    mounts = host_mounts(*agent(docs))
    for path in (MpsSettings().pipe_dir, MpsSettings().log_dir):
        assert mounts[path] == (path, "DirectoryOrCreate")
    assert "/dev/shm" not in mounts


def test_mounts_follow_a_mode_set_through_the_config_value() -> None:
    """`config` merges over the values: the DaemonSet mounts what the agent will read."""
    docs = render(
        *JSON_FORM,
        "--set", "config.backends.nvidia.operating_mode=mps",
        "--set", "config.backends.nvidia.mps.pipe_dir=/srv/mps",
    )  # fmt: skip
    backend = nvidia_backend(docs)
    assert backend.operating_mode == "mps" and backend.mps is not None
    assert backend.mps.settings.pipe_dir == "/srv/mps"
    mounts = host_mounts(*agent(docs))
    assert mounts["/srv/mps"] == ("/srv/mps", "DirectoryOrCreate")
    assert mounts[MpsSettings().log_dir] == (MpsSettings().log_dir, "DirectoryOrCreate")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--set", "devicePlugin.operatingMode=mig"), ["operatingMode mig", "registerFormat json"]),
        (("--set", "devicePlugin.operatingMode=mps"), ["operatingMode mps", "registerFormat json"]),
        (
            ("--set", "devicePlugin.operatingMode=mig", *JSON_FORM),
            ["operatingMode mig", "migProfileAllowlist", "1g.5gb"],
        ),
        (("--set", "config.backends.nvidia.operating_mode=mig"), ["registerFormat json"]),
        (("--set", "devicePlugin.operatingMode=time-slicing"), ["operatingMode", "hami-core"]),
        (
            ("--set-json", f"devicePlugin.migProfileAllowlist={json.dumps(BAD_PROFILE)}"),
            ["migProfileAllowlist", "big"],
        ),
        (("--set", "devicePlugin.mps.pipeDir=run/mps"), ["pipeDir", "run/mps"]),
        (("--set", "devicePlugin.mps.daemon=spawn"), ["mps/daemon", "start", "attach"]),
        (("--set", "devicePlugin.mps.pipeDirectory=/x"), ["pipeDirectory"]),
    ],
    ids=[
        "mig-seed", "mps-seed", "mig-no-allowlist", "config-mig-seed", "unknown-mode",
        "bad-profile", "relative-pipe", "bad-daemon", "typo",
    ],
)  # fmt: skip
def test_a_mode_the_agent_would_refuse_fails_the_install(
    args: tuple[str, ...], words: list[str]
) -> None:
    result = helm("template", "hami", str(CHART), *args, check=False)
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize("args", [MIG, MPS_PATHS], ids=["mig", "mps"])
async def test_mode_daemonsets_pass_server_side_dry_run(kube: Kube, args: tuple[str, ...]) -> None:
    namespace = "hami-modes"
    docs = render(*args, "--set", "createNamespace=true", namespace=namespace)
    objs = by_key(docs)
    await apply(kube, objs[("Namespace", namespace)])
    for key in (("ConfigMap", "hami-config"), ("DaemonSet", "hami-node")):
        created = await apply(kube, objs[key], dry_run=True)
        assert (created["kind"], created["metadata"]["name"]) == key
