"""First contact with the ``hami`` command: what the quick commands import and print."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HEAVY = ("kubernetes_asyncio", "grpclib", "aiohttp", "prometheus_client", "pynvml")

# Runs the command in a fresh interpreter and reports which modules it imported.
_PROBE = """
import json, sys
from hami.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules_after(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    line = done.stderr.rsplit("MODULES=", 1)[1]
    return set(json.loads(line))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.parametrize("argv", [("version",), ("--help",), ("--version",)])
def test_quick_commands_import_no_heavy_module(argv: tuple[str, ...]) -> None:
    modules = _modules_after(*argv)
    assert _heavy(modules) == []
    assert not [m for m in modules if m.startswith(("hami.testkit", "hami.demo.cli"))]


def test_run_parser_does_not_import_demo_or_testkit() -> None:
    # an unknown role fails in argparse, after the whole parser was built
    modules = _modules_after("run", "--role", "nobody")
    assert not [m for m in modules if m.startswith(("hami.testkit", "hami.demo"))]


def _configured_levels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from hami import log

    levels: list[str] = []
    monkeypatch.setattr(log, "configure", lambda level, *a, **k: levels.append(level))
    return levels


@pytest.fixture
def info_config(tmp_path: Path) -> str:
    path = tmp_path / "hami.yaml"
    path.write_text("log:\n  level: info\n")
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [
        ("devices", "--backend", "fake"),
        ("explain", "some-pod", "--offline", "--json"),
    ],
)
def test_tools_log_at_warning_unless_asked(
    monkeypatch: pytest.MonkeyPatch, info_config: str, argv: tuple[str, ...]
) -> None:
    from hami.cli import main
    from hami.scheduler import explain_cli

    async def no_cluster(*args: object) -> dict[str, object]:
        return {"pod": "some-pod"}

    monkeypatch.setattr(explain_cli, "compute", no_cluster)
    levels = _configured_levels(monkeypatch)
    main([*argv, "--config", info_config])
    main([*argv, "--config", info_config, "--log-level", "debug"])
    assert levels == ["warning", "debug"]


def test_roles_keep_the_configured_level(monkeypatch: pytest.MonkeyPatch, info_config: str) -> None:
    from hami import cli

    levels = _configured_levels(monkeypatch)
    monkeypatch.setitem(cli.ROLES, "node", "hami.no_such_role_module")
    cli.main(["run", "--role", "node", "--config", info_config])
    assert levels == ["info"]


@pytest.mark.parametrize("backend", ["nvidia", "mlu"])
def test_backend_option_typo_is_the_one_line_config_error(tmp_path: Path, backend: str) -> None:
    from hami import config

    path = tmp_path / "hami.yaml"
    path.write_text(f"backends:\n  {backend}:\n    splitcount: 3\n")
    cfg = config.load(str(path))
    with pytest.raises(config.ConfigError) as caught:
        cfg.backends[backend].settings(backend)
    message = str(caught.value)
    assert message.startswith(f"config key backends.{backend}.splitcount: unknown key;")
    assert "\n" not in message
    for shared in ("split_count", "memory_scaling", "core_scaling", "resources", "register_format"):
        assert shared in message


def test_backend_options_that_exist_still_pass(tmp_path: Path) -> None:
    from hami import config

    path = tmp_path / "hami.yaml"
    path.write_text("backends:\n  nvidia:\n    health_checks: false\n    split_count: 3\n")
    settings = config.load(str(path)).backends["nvidia"].settings("nvidia")
    assert settings.options == {"health_checks": False}


def test_nvml_missing_is_said_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pynvml = pytest.importorskip("pynvml")
    from structlog.testing import capture_logs

    from hami.cli import main

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with capture_logs() as logs:
        assert main(["devices", "--backend", "nvidia"]) == 1
    said = capsys.readouterr()
    assert (said.out + said.err).count("libnvidia-ml.so.1 not found") == 1
    assert [e for e in logs if "libnvidia-ml.so.1" in str(e)] == []


def test_demo_explain_hint_works_without_an_activated_venv() -> None:
    import os
    import shlex

    from hami.demo.cli import UNFIT, explain_command

    argv = shlex.split(explain_command("demo ns", "/tmp/kube config", 8765))
    assert argv[:3] == [sys.executable, "-m", "hami"]
    assert argv[3:] == [
        "explain",
        UNFIT,
        "-n",
        "demo ns",
        "--kubeconfig",
        "/tmp/kube config",
        "--url",
        "http://127.0.0.1:8765",
    ]
    bare = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PATH")}
    done = subprocess.run(
        [*argv[:3], "explain", "--help"], env={**bare, "PATH": "/usr/bin:/bin"}, timeout=60
    )
    assert done.returncode == 0


def test_the_license_is_an_spdx_expression(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    probe = (
        "import sys\n"
        "from setuptools.build_meta import prepare_metadata_for_build_wheel as meta\n"
        "print(meta(sys.argv[1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    metadata = (tmp_path / done.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


def _all_help(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    yield parser.prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_help(sub)


def test_help_is_plain_text() -> None:
    from hami.cli import build_parser

    pages = dict(_all_help(build_parser()))
    assert {"hami", "hami run", "hami devices", "hami explain", "hami demo"} <= set(pages)
    # reStructuredText from docstrings (``literal``, :role:) is markup, not help.
    leaks = {prog: text for prog, text in pages.items() if "``" in text or ":func:" in text}
    assert leaks == {}
    top = pages["hami"]
    assert "hami run --role node" in top
    assert "hami run --role scheduler" in top
