"""hami.kube.kubeconfig and hami.kube.session: the project's own kubeconfig / in-cluster
loader and HTTP session (the node agent must not import kubernetes_asyncio.client).

Unit tests talk to a local HTTP server that records what arrived; the controlplane ones
authenticate to the real kube-apiserver with client certificates from relative paths,
service account tokens (in-cluster, rotated) and an exec plugin.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from hami.kube.client import ApiSession, Kube, open_client
from hami.kube.kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    TokenFile,
    load_cluster_config,
    load_incluster,
    load_kubeconfig,
)
from hami.testkit.controlplane import ControlPlane


def kubeconfig(
    path: Path,
    server: str,
    user: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    current: str | None = "ctx",
    name: str = "c",
) -> Path:
    """A one-context kubeconfig file."""
    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "ctx", "context": {"cluster": name, "user": "u"}}],
    }
    if current:
        data["current-context"] = current
    path.write_text(yaml.safe_dump(data))
    return path


class Recorder:
    """An HTTP server that answers {"ok": true} and keeps every request it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": await request.read(),
            }
        )
        return web.json_response({"ok": True})


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield rec
    await runner.cleanup()


async def test_requests_carry_token_query_and_json_body(tmp_path: Path, recorder: Recorder) -> None:
    path = kubeconfig(tmp_path / "config", recorder.url + "/", {"token": "abc"})
    async with open_client(path) as kube:
        await kube.request("GET", "/api/v1/pods", query=[("watch", True), ("limit", 5)])
        await kube.merge_patch("/api/v1/nodes/n", {"metadata": {"labels": {"a": "é"}}})
    get, patch = recorder.requests
    assert get["method"] == "GET" and get["path"] == "/api/v1/pods?watch=True&limit=5"
    assert get["headers"]["Authorization"] == "Bearer abc"
    assert get["headers"]["User-Agent"].startswith("hami/")
    assert get["body"] == b""
    assert patch["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch["body"]) == {"metadata": {"labels": {"a": "é"}}}


async def test_basic_auth_and_default_headers(tmp_path: Path, recorder: Recorder) -> None:
    path = kubeconfig(tmp_path / "config", recorder.url, {"username": "ann", "password": "pw"})
    async with open_client(path) as kube:
        kube.api.set_default_header("Impersonate-User", "bob")  # type: ignore[attr-defined]
        await kube.get_node("n")
    headers = recorder.requests[0]["headers"]
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"ann:pw").decode()
    assert headers["Impersonate-User"] == "bob"


async def test_no_user_sends_no_authorization(tmp_path: Path, recorder: Recorder) -> None:
    path = tmp_path / "config"
    kubeconfig(path, recorder.url)
    data = yaml.safe_load(path.read_text())
    del data["contexts"][0]["context"]["user"]
    path.write_text(yaml.safe_dump(data))
    async with open_client(path) as kube:
        await kube.get_node("n")
    assert "Authorization" not in recorder.requests[0]["headers"]


async def test_token_file_is_relative_to_the_kubeconfig_and_reread(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("first\n")
    cfg = await load_kubeconfig(
        str(kubeconfig(tmp_path / "config", "http://h", {"tokenFile": "creds/token"}))
    )
    assert isinstance(cfg.credentials, TokenFile)
    assert await cfg.authorization() == "Bearer first"
    now = [0.0]
    rotating = TokenFile(str(tmp_path / "creds" / "token"), period=60, clock=lambda: now[0])
    assert await rotating.authorization() == "Bearer first"
    (tmp_path / "creds" / "token").write_text("second")
    now[0] = 59
    assert await rotating.authorization() == "Bearer first"  # read at most once a minute
    now[0] = 60
    assert await rotating.authorization() == "Bearer second"
    (tmp_path / "creds" / "token").unlink()
    now[0] = 200
    assert await rotating.authorization() == "Bearer second"  # the last token is kept


async def test_certificate_data_and_paths(tmp_path: Path) -> None:
    async def load(cluster: dict[str, Any], user: dict[str, Any]) -> ClusterConfig:
        path = kubeconfig(tmp_path / "config", "https://10.0.0.1:6443/", user, cluster)
        return await load_kubeconfig(str(path))

    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_text("CA")
    (tmp_path / "pki" / "tls.crt").write_text("CERT")
    (tmp_path / "pki" / "tls.key").write_text("KEY")
    cfg = await load(
        {"certificate-authority": "pki/ca.crt", "tls-server-name": "kubernetes"},
        {"client-certificate": "pki/tls.crt", "client-key": str(tmp_path / "pki/tls.key")},
    )
    assert cfg.host == "https://10.0.0.1:6443"
    assert cfg.ssl_ca_cert == str(tmp_path / "pki" / "ca.crt")
    assert (cfg.cert_file, cfg.key_file) == (
        str(tmp_path / "pki" / "tls.crt"),
        str(tmp_path / "pki" / "tls.key"),
    )
    assert cfg.tls_server_name == "kubernetes" and cfg.verify_ssl
    b64 = base64.b64encode(b"PEM").decode()
    cfg = await load(
        {"certificate-authority-data": b64, "insecure-skip-tls-verify": True},
        {"client-certificate-data": b64, "client-key-data": b64},
    )
    assert (cfg.ca_data, cfg.cert_data, cfg.key_data) == (b"PEM", b"PEM", b"PEM")
    assert cfg.ssl_ca_cert is None and cfg.verify_ssl is False
    with pytest.raises(KubeConfigError) as err:
        cfg.ssl_context()
    assert "kubeconfig" in str(err.value) and "certificate-authority" in str(err.value)


async def test_merged_files_first_one_wins(tmp_path: Path, recorder: Recorder) -> None:
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.write_text(yaml.safe_dump({"current-context": "ctx", "users": [], "clusters": []}))
    kubeconfig(second, recorder.url, {"token": "from-b"}, current="other")
    cfg = await load_kubeconfig(f"{first}:{tmp_path / 'missing'}:{second}")
    assert cfg.host == recorder.url
    assert await cfg.authorization() == "Bearer from-b"


async def test_auth_provider_users_are_loaded_by_kubernetes_asyncio(tmp_path: Path) -> None:
    """The legacy gcp/oidc auth-providers stay with kubernetes_asyncio's loader: an oidc
    id-token that has not expired is sent as is."""
    claims = base64.b64encode(json.dumps({"exp": 4102444800}).encode()).decode().rstrip("=")
    id_token = f"e30.{claims}.sig"
    user = {"auth-provider": {"name": "oidc", "config": {"id-token": id_token}}}
    cfg = await load_kubeconfig(str(kubeconfig(tmp_path / "config", "http://h", user)))
    assert cfg.host == "http://h"
    assert await cfg.authorization() == f"Bearer {id_token}"


EXEC_PLUGIN = """
import json, os, pathlib, sys
runs = pathlib.Path(sys.argv[1])
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
status = {"token": os.environ["TOKEN"] + str(len(runs.read_text()))}
if len(sys.argv) > 2:
    status["expirationTimestamp"] = sys.argv[2]
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": status}))
"""


def exec_user(script: Path, *args: str, token: str = "tok") -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script), *args],
            "env": [{"name": "TOKEN", "value": token}],
        }
    }


async def test_exec_plugin_token_renewed_when_it_expires(tmp_path: Path) -> None:
    script = tmp_path / "plugin.py"
    script.write_text(EXEC_PLUGIN)
    runs = tmp_path / "runs"
    user = exec_user(script, str(runs), "2030-01-01T00:00:00Z")
    cfg = await load_kubeconfig(str(kubeconfig(tmp_path / "config", "http://h", user)))
    assert await cfg.authorization() == "Bearer tok1"
    assert await cfg.authorization() == "Bearer tok1"  # cached until it expires
    assert runs.read_text() == "x"
    cfg.credentials.clock = lambda: 1893456000.0 - 10  # type: ignore[union-attr]
    assert await cfg.authorization() == "Bearer tok2"  # within the skew of 2030-01-01
    never = await load_kubeconfig(
        str(kubeconfig(tmp_path / "config2", "http://h", exec_user(script, str(runs))))
    )
    assert await never.authorization() == "Bearer tok3"
    assert await never.authorization() == "Bearer tok3"  # no expiry: kept


async def test_exec_plugin_failure_names_the_file_and_the_fix(tmp_path: Path) -> None:
    script = tmp_path / "plugin.py"
    script.write_text("import sys; sys.stderr.write('login required'); sys.exit(3)")
    path = kubeconfig(tmp_path / "config", "http://h", exec_user(script))
    with pytest.raises(KubeConfigError) as err:
        await load_kubeconfig(str(path))
    message = str(err.value)
    assert str(path) in message and "exited 3: login required" in message
    assert "fix users[].user.exec" in message
    user = exec_user(script)
    user["exec"]["command"] = str(tmp_path / "no-such-plugin")
    with pytest.raises(KubeConfigError, match="did not start"):
        await load_kubeconfig(str(kubeconfig(tmp_path / "config", "http://h", user)))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update({"current-context": "nope"}), "context 'nope' is not in contexts"),
        (lambda d: d.pop("current-context"), "no current-context"),
        (lambda d: d["clusters"][0]["cluster"].pop("server"), "has no server"),
        (lambda d: d["contexts"][0]["context"].update({"cluster": "x"}), "names cluster 'x'"),
        (
            lambda d: d["clusters"][0]["cluster"].update({"certificate-authority": "ca.pem"}),
            "ca.pem does not exist; fix the path",
        ),
        (
            lambda d: d["users"][0]["user"].update({"client-key-data": "!!"}),
            "client-key-data is not base64",
        ),
        (lambda d: d["users"][0]["user"].update({"tokenFile": "t"}), "fix tokenFile"),
        (lambda d: d.update({"clusters": {"a": 1}}), "clusters must be a list"),
    ],
)
async def test_kubeconfig_errors_name_the_file_and_the_fix(
    tmp_path: Path, change: Any, expected: str
) -> None:
    path = kubeconfig(tmp_path / "config", "https://h:6443")
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KubeConfigError) as err:
        await load_kubeconfig(str(path))
    assert expected in str(err.value) and str(path) in str(err.value)


async def test_unreadable_kubeconfigs(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no such file; pass --kubeconfig"):
        await load_kubeconfig(str(tmp_path / "none"))
    (tmp_path / "bad").write_text("clusters: [")
    with pytest.raises(KubeConfigError, match="bad: not YAML"):
        await load_kubeconfig(str(tmp_path / "bad"))


def service_account_dir(path: Path, token: str, ca: bytes = b"CA") -> Path:
    path.mkdir(exist_ok=True)
    (path / "token").write_text(token)
    (path / "ca.crt").write_bytes(ca)
    return path


async def test_in_cluster_config_and_token_rotation(tmp_path: Path) -> None:
    sa = service_account_dir(tmp_path / "sa", "one\n")
    now = [0.0]
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = load_incluster(env, str(sa), clock=lambda: now[0])
    assert cfg.host == "https://10.96.0.1:443" and cfg.ssl_ca_cert == str(sa / "ca.crt")
    assert await cfg.authorization() == "Bearer one"
    (sa / "token").write_text("two")  # kubelet rotated the projected token
    now[0] = 61
    assert await cfg.authorization() == "Bearer two"
    v6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert load_incluster(v6, str(sa)).host == "https://[fd00::1]:443"


def test_in_cluster_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError) as err:
        load_incluster(env, str(tmp_path))
    assert str(tmp_path / "token") in str(err.value)
    assert "automountServiceAccountToken" in str(err.value)
    sa = service_account_dir(tmp_path / "sa", "t", ca=b"")
    with pytest.raises(KubeConfigError, match=r"ca\.crt is empty"):
        load_incluster(env, str(sa))
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_PORT"):
        load_incluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, str(sa))


async def test_the_choice_in_cluster_then_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(KubeConfigError, match="in-cluster config: token file /var/run/secrets"):
        await load_cluster_config()
    given = kubeconfig(tmp_path / "given", "http://given")
    assert (await load_cluster_config(str(given))).host == "http://given"  # --kubeconfig wins
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeConfigError, match="pass --kubeconfig or set KUBECONFIG"):
        await load_cluster_config()
    kubeconfig(tmp_path / "env", "http://from-env")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "env"))
    assert (await load_cluster_config()).host == "http://from-env"


_PROBE = """
import asyncio, sys
import hami.node.role, hami.node.agent
from hami.kube.client import open_client

async def main() -> None:
    async with open_client(sys.argv[1]) as kube:
        await kube.api.configuration.authorization()

asyncio.run(main())
heavy = sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio"))
assert not heavy, heavy
print(len(sys.modules))
"""


def test_the_node_role_and_its_client_do_not_import_kubernetes_asyncio(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", "https://127.0.0.1:1", {"token": "t"})
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- real API server


async def whoami(kube: Kube) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    review = await kube.create("/apis/authentication.k8s.io/v1/selfsubjectreviews", body)
    return str(review["status"]["userInfo"]["username"])


async def service_account_token(kube: Kube, namespace: str, name: str) -> str:
    accounts = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    await kube.create(accounts, {"metadata": {"name": name}})
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    path = f"{accounts}/{name}/token"
    return str((await kube.create(path, body))["status"]["token"])


@pytest.mark.controlplane
async def test_client_certificate_files_from_relative_paths(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    for src in (controlplane.ca_path, controlplane.admin_cert_path, controlplane.admin_key_path):
        shutil.copy(src, pki / src.name)
    user = {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key"}
    cluster = {"certificate-authority": "pki/ca.crt"}
    path = kubeconfig(tmp_path / "config", controlplane.server, user, cluster)
    async with open_client(path) as kube:
        answer = await kube.request("GET", "/api/v1/namespaces/default")
        assert answer["metadata"]["name"] == "default"


@pytest.mark.controlplane
async def test_in_cluster_token_rotation_against_the_api_server(
    controlplane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    first = await service_account_token(kube, namespace, "first")
    second = await service_account_token(kube, namespace, "second")
    sa = service_account_dir(tmp_path / "sa", first, controlplane.ca_path.read_bytes())
    host, port = controlplane.server.removeprefix("https://").rsplit(":", 1)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    now = [0.0]
    async with ApiSession(load_incluster(env, str(sa), clock=lambda: now[0])) as session:
        pod_kube = Kube(session)
        assert await whoami(pod_kube) == f"system:serviceaccount:{namespace}:first"
        (sa / "token").write_text(second)
        now[0] = 60
        assert await whoami(pod_kube) == f"system:serviceaccount:{namespace}:second"


@pytest.mark.controlplane
async def test_exec_plugin_token_against_the_api_server(
    controlplane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    token = await service_account_token(kube, namespace, "plugin")
    script = tmp_path / "plugin.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1",
                              "kind": "ExecCredential", "status": {{"token": {token!r}}}}}))
            """
        )
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
        }
    }
    ca = {"certificate-authority": str(controlplane.ca_path)}
    path = kubeconfig(tmp_path / "config", controlplane.server, user, ca)
    async with open_client(path) as plugin_kube:
        assert await whoami(plugin_kube) == f"system:serviceaccount:{namespace}:plugin"
