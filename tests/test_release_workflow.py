"""The release workflow (.github/workflows/release.yaml, issue 19 item 2): on a `v*` tag it
pushes the multi-arch image to the chart's default repository with an SBOM and a keyless
signature, and the packaged chart to an OCI registry. Checked here by its structure, by
actionlint when it is installed, and by running its version check and `helm package` step.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def _steps(workflow: dict[Any, Any], job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow["jobs"][job]["steps"]
    return steps


def _uses(workflow: dict[Any, Any], job: str) -> dict[str, dict[str, Any]]:
    """action name (no version) -> its step"""
    return {s["uses"].split("@")[0]: s for s in _steps(workflow, job) if "uses" in s}


def _run(workflow: dict[Any, Any], job: str) -> str:
    return "\n".join(s.get("run", "") for s in _steps(workflow, job))


def test_runs_on_version_tags_only(workflow: dict[Any, Any]) -> None:
    # YAML 1.1 reads the key `on` as True.
    trigger = workflow.get("on", workflow.get(True))
    assert trigger == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read"}


def test_pushes_the_charts_default_image(workflow: dict[Any, Any]) -> None:
    values = yaml.safe_load((ROOT / "charts" / "hami" / "values.yaml").read_text())
    for image in (values["scheduler"]["extender"]["image"], values["devicePlugin"]["image"]):
        assert workflow["env"]["IMAGE"] == f"{image['registry']}/{image['repository']}"
    assert workflow["env"]["IMAGE"].startswith(workflow["env"]["REGISTRY"] + "/")


def test_image_job_builds_multi_arch_with_sbom_and_signs(workflow: dict[Any, Any]) -> None:
    job = workflow["jobs"]["image"]
    assert job["permissions"]["packages"] == "write"
    assert job["permissions"]["id-token"] == "write"  # cosign keyless: the OIDC token
    uses = _uses(workflow, "image")
    order = [s["uses"].split("@")[0] for s in _steps(workflow, "image") if "uses" in s]
    for action in (
        "actions/checkout",
        "docker/setup-qemu-action",
        "docker/setup-buildx-action",
        "docker/login-action",
        "docker/build-push-action",
        "sigstore/cosign-installer",
    ):
        assert action in uses, action
    assert order.index("docker/setup-qemu-action") < order.index("docker/build-push-action")
    assert order.index("docker/login-action") < order.index("docker/build-push-action")
    assert uses["docker/login-action"]["with"]["registry"] == "${{ env.REGISTRY }}"
    build = uses["docker/build-push-action"]["with"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True
    assert build["sbom"] is True
    assert build["file"] == "docker/Dockerfile" and build["context"] == "."
    assert (ROOT / build["file"]).is_file()
    assert "REVISION=" in build["build-args"] and "BUILD_DATE=" in build["build-args"]
    meta = uses["docker/metadata-action"]["with"]
    assert meta["images"] == "${{ env.IMAGE }}"
    # the chart's default tag is its appVersion, "0.1.0": the tag's version without the v
    assert "type=semver,pattern={{version}}" in meta["tags"]
    build_id = uses["docker/build-push-action"]["id"]
    signing = _run(workflow, "image")
    assert re.search(r"cosign sign --yes \"\$IMAGE@\$DIGEST\"", signing)
    sign_step = next(s for s in _steps(workflow, "image") if "cosign sign" in s.get("run", ""))
    assert sign_step["env"]["DIGEST"] == f"${{{{ steps.{build_id}.outputs.digest }}}}"


def test_chart_job_packages_pushes_and_signs(workflow: dict[Any, Any]) -> None:
    job = workflow["jobs"]["chart"]
    assert "image" in job["needs"]  # the chart never names an image that is not there yet
    assert job["permissions"]["id-token"] == "write"
    script = _run(workflow, "chart")
    assert "helm package charts/hami" in script
    assert 'helm push "dist/hami-$VERSION.tgz" "$CHART_REPO"' in script
    assert "cosign sign --yes" in script
    assert workflow["env"]["CHART_REPO"].startswith("oci://" + workflow["env"]["REGISTRY"] + "/")


def test_python_job_builds_and_installs_the_wheel(workflow: dict[Any, Any]) -> None:
    script = _run(workflow, "python")
    for line in ("python -m build", "pip install dist/*.whl", "hami version", "hami run --help"):
        assert line in script


def _version_check(workflow: dict[Any, Any], tag: str, tmp_path: Path) -> tuple[int, str, str]:
    step = next(s for s in _steps(workflow, "version") if s.get("id") == "check")
    output = tmp_path / "output"
    output.write_text("")
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=ROOT,
        env={**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout, output.read_text()


def test_version_check_accepts_the_projects_tag_only(
    workflow: dict[Any, Any], tmp_path: Path
) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    rc, _, output = _version_check(workflow, f"v{version}", tmp_path)
    assert (rc, output) == (0, f"version={version}\n")
    rc, said, output = _version_check(workflow, "v99.0.0", tmp_path)
    assert rc == 1 and output == ""
    assert f"::error::tag v99.0.0 is version 99.0.0 but pyproject.toml says {version}" in said


def test_helm_package_step_packages_the_chart(workflow: dict[Any, Any], tmp_path: Path) -> None:
    from test_chart import helm, helm_binary

    if not helm_binary().is_file():
        pytest.skip(f"no helm at {helm_binary()} (make controlplane builds it)")
    line = next(x for x in _run(workflow, "chart").splitlines() if "helm package" in x)
    args = line.split()[2:]  # after "helm package"
    args = [a.replace('"$VERSION"', "9.8.7") for a in args]
    args[args.index("--destination") + 1] = str(tmp_path)
    done = helm("package", *[str(ROOT / a) if a == "charts/hami" else a for a in args])
    assert done.returncode == 0
    packaged = tmp_path / "hami-9.8.7.tgz"
    assert packaged.is_file()
    shown = yaml.safe_load(helm("show", "chart", str(packaged)).stdout)
    assert (shown["version"], shown["appVersion"]) == ("9.8.7", "9.8.7")


def _actionlint() -> str | None:
    found = shutil.which("actionlint")
    if found:
        return found
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidate = Path(gopath) / "bin" / "actionlint"
    return str(candidate) if candidate.is_file() else None


def test_actionlint_is_clean() -> None:
    binary = _actionlint()
    if binary is None:
        pytest.skip(
            "actionlint is not installed (go install "
            "github.com/rhysd/actionlint/cmd/actionlint@v1.7.7); the structure tests still ran"
        )
    done = subprocess.run(
        [binary, "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
