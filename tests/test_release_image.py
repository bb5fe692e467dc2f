"""The image of both roles as far as it can be checked without an OCI builder (issue 19,
item 2): docker/Dockerfile's paths against the repository and the deployment, and `make
image` (scripts/build-image.sh) picking a builder or saying in one line why it cannot."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hami import buildinfo, cli

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SCRIPT = ROOT / "scripts" / "build-image.sh"
DEFAULT_IMAGE = "ghcr.io/hami-py/hami"
DAEMON_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword, args.strip()))
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"{args}: exec form (a JSON list), as the chart's args need"
    return [str(v) for v in value]


def copies(instructions: list[Instruction]) -> list[tuple[int, list[str], str, bool]]:
    """(stage, sources, destination, from another stage) of every COPY."""
    out = []
    for ins in instructions:
        if ins.keyword != "COPY":
            continue
        words = ins.args.split()
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        from_stage = any(f.startswith("--from=") for f in flags)
        out.append((ins.stage, paths[:-1], paths[-1], from_stage))
    return out


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps a path out of the build context (enough of Docker's
    rules for this file: a pattern matches the path or one of its leading folders)."""
    parts = relative.split("/")
    for pattern in patterns:
        for end in range(1, len(parts) + 1):
            head = "/".join(parts[:end])
            if fnmatch.fnmatch(head, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatch(parts[end - 1], pattern[3:])
            ):
                return True
    return False


def dockerignore() -> list[str]:
    path = ROOT / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def tracked(under: str) -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "--", under], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_every_copy_source_is_in_the_build_context() -> None:
    instructions = parse_dockerfile(DOCKERFILE)
    patterns = dockerignore()
    checked = 0
    for _, sources, _, from_stage in copies(instructions):
        if from_stage:
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source, patterns), f"COPY {source}: left out by .dockerignore"
            inside = [f for f in tracked(source) if not ignored(f, patterns)]
            assert inside, f"COPY {source}: no tracked file reaches the build context"
            checked += 1
    assert checked >= 4  # pyproject.toml, README.md, hami, config/hami.yaml
    # The package's own files reach the context: a wheel without them fails at import.
    left_out = [f for f in tracked("hami") if ignored(f, patterns)]
    assert left_out == []


def test_the_build_stage_has_what_the_wheel_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    instructions = parse_dockerfile(DOCKERFILE)
    build_sources = {s for stage, srcs, _, f in copies(instructions) if stage == 0 for s in srcs}
    assert {"pyproject.toml", project["readme"], "hami"} <= build_sources
    assert any(i.stage == 0 and "pip wheel" in i.args for i in instructions)


def test_entrypoint_and_command_run_a_role_from_files_the_image_has() -> None:
    instructions = parse_dockerfile(DOCKERFILE)
    final = max(i.stage for i in instructions)
    last = {i.keyword: i for i in instructions if i.stage == final}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = exec_form(last["ENTRYPOINT"].args)
    assert entrypoint == ["hami"] and "hami" in scripts
    command = exec_form(last["CMD"].args)
    assert command[command.index("--role") + 1] in cli.ROLES
    config_path = command[command.index("--config") + 1]
    image_files = {dest: srcs for stage, srcs, dest, f in copies(instructions) if stage == final}
    assert config_path in image_files, f"{config_path}: no COPY puts it in the image"
    assert all((ROOT / s).is_file() for s in image_files[config_path])


def test_the_deployment_runs_what_the_image_holds() -> None:
    instructions = parse_dockerfile(DOCKERFILE)
    final = max(i.stage for i in instructions)
    copied = {dest for stage, _, dest, _ in copies(instructions) if stage == final}
    containers = []
    for path in sorted((ROOT / "docker" / "manifests").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            containers += [c for c in spec.get("containers", []) if DEFAULT_IMAGE in c["image"]]
    roles = {c["args"][c["args"].index("--role") + 1] for c in containers}
    assert roles == set(cli.ROLES)  # one image, both roles
    for c in containers:
        assert "command" not in c, "the chart relies on the image's ENTRYPOINT"
        assert c["args"][c["args"].index("--config") + 1] in copied


def test_build_arguments_feed_build_info() -> None:
    text = DOCKERFILE.read_text()
    for arg, env in (("REVISION", "HAMI_BUILD_REVISION"), ("BUILD_DATE", "HAMI_BUILD_DATE")):
        assert f"ARG {arg}=" in text
        assert f"{env}=${{{arg}}}" in text
    assert "HAMI_BUILD_REVISION" in Path(buildinfo.__file__).read_text()


def test_default_image_is_the_charts() -> None:
    values = yaml.safe_load((ROOT / "charts" / "hami" / "values.yaml").read_text())
    for image in (values["scheduler"]["extender"]["image"], values["devicePlugin"]["image"]):
        assert f"{image['registry']}/{image['repository']}" == DEFAULT_IMAGE
    assert f'image="${{IMAGE:-{DEFAULT_IMAGE}}}"' in SCRIPT.read_text()
    chart = yaml.safe_load((ROOT / "charts" / "hami" / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The image's default tag (the project's version) is what the chart pulls by default.
    assert chart["appVersion"] == project["version"]


# ------------------------------------------------------------------ make image


# What the script runs besides the builder; the test's PATH has only these and the fakes,
# so a builder installed on the test machine cannot be picked up.
TOOLS = ("bash", "sed", "git", "date", "timeout", "grep", "dirname", "cat", "env", "sh")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed by scripts/build-image.sh"
        (path / tool).symlink_to(found)
    return path


def fake(bin_dir: Path, name: str, info_exit: int, info_err: str = "") -> Path:
    log = bin_dir.parent / f"{name}.log"
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$1" = info ]; then\n'
        "  echo 'Client:'\n"
        f"  printf '%s\\n' '{info_err}' >&2\n"
        f"  exit {info_exit}\n"
        "fi\n"
    )
    script.chmod(0o755)
    return log


def build_image(bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "TAG", "IMAGE_BUILDER")}
    return subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)],
        env={**clean, **env, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_builder_says_so(bin_dir: Path) -> None:
    done = build_image(bin_dir)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "make image: no OCI image builder here (docker, podman or buildah); install one, "
        "or let the release workflow build it (.github/workflows/release.yaml)"
    )


def test_docker_without_its_daemon_says_so(bin_dir: Path) -> None:
    fake(bin_dir, "docker", 1, DAEMON_DOWN)
    done = build_image(bin_dir)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "make image: cannot build the image here: docker: installed but its daemon does not "
        f"answer ({DAEMON_DOWN}); podman: not installed; buildah: not installed"
    ]


def test_podman_builds_when_docker_has_no_daemon(bin_dir: Path) -> None:
    fake(bin_dir, "docker", 1, DAEMON_DOWN)
    podman = fake(bin_dir, "podman", 0)
    done = build_image(bin_dir, TAG="9.9.9")
    assert done.returncode == 0, done.stderr
    calls = podman.read_text().splitlines()
    assert calls[0] == "info"
    build = calls[1].split()
    assert build[0] == "build" and build[-1] == "."
    assert build[build.index("-f") + 1] == "docker/Dockerfile"
    assert build[build.index("-t") + 1] == f"{DEFAULT_IMAGE}:9.9.9"
    assert any(w.startswith("REVISION=") and w != "REVISION=unknown" for w in build)
    assert "with podman" in done.stdout


def test_docker_with_its_daemon_builds_the_charts_default(bin_dir: Path) -> None:
    docker = fake(bin_dir, "docker", 0)
    done = build_image(bin_dir)
    assert done.returncode == 0, done.stderr
    build = docker.read_text().splitlines()[1].split()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert build[build.index("-t") + 1] == f"{DEFAULT_IMAGE}:{version}"


def test_buildah_and_a_chosen_builder(bin_dir: Path) -> None:
    fake(bin_dir, "docker", 0)
    buildah = fake(bin_dir, "buildah", 0)
    done = build_image(bin_dir, IMAGE_BUILDER="buildah", IMAGE="registry.example/x/hami")
    assert done.returncode == 0, done.stderr
    assert buildah.read_text().splitlines()[1].startswith("bud -f docker/Dockerfile")
    assert not (bin_dir.parent / "docker.log").exists()
    broken = build_image(bin_dir, IMAGE_BUILDER="kaniko")
    assert broken.returncode == 2
    assert "IMAGE_BUILDER=kaniko" in broken.stderr


def test_readme_install_commands_run_the_image_make_image_builds() -> None:
    from test_chart import helm, helm_binary

    if not helm_binary().is_file():
        pytest.skip(f"no helm at {helm_binary()} (make controlplane builds it)")
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Running on a cluster") :]
    block = section[section.index("```sh\n") + 6 :]
    block = block[: block.index("```")].replace("\\\n", " ")
    lines = [line.split("#")[0].split() for line in block.splitlines()]
    make = next(words for words in lines if words[:2] == ["make", "image"])
    image = make[2].removeprefix("IMAGE=")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    push = next(words for words in lines if words[1:2] == ["push"])
    assert push[2] == f"{image}:{version}"  # the tag build-image.sh gives by default
    install = next(words for words in lines if words[:2] == ["helm", "install"])
    sets = [install[i + 1] for i, word in enumerate(install) if word == "--set"]
    args = [a for s in sets for a in ("--set", s)]
    rendered = helm("template", "hami", str(ROOT / "charts" / "hami"), *args).stdout
    hami_images = {
        line.split("image:")[1].strip()
        for line in rendered.splitlines()
        if "image:" in line and "hami-py/hami" in line
    }
    assert hami_images == {f"{image}:{version}"}
