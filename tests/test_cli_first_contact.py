"""First contact with the ``hami`` command: what the quick commands import and print."""

from __future__ import annotations

import json
import subprocess
import sys

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
