"""The ``hami`` command line: ``version``, ``devices``, ``run --role``, and role tools."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hami import __version__, config
from hami.cliargs import add_common_flags, load_config, tool_log_level

if TYPE_CHECKING:
    from hami.backends.base import Backend

# role name -> module with ``async def main(cfg: config.Config) -> int``
ROLES = {"node": "hami.node.role", "scheduler": "hami.scheduler.role"}
# extra subcommands: module with ``add_parser(subparsers)``; each sets ``func`` on its parser.
# Such a module imports little at the top: ``hami version`` and ``--help`` build every parser,
# and the heavy libraries (kubernetes_asyncio, aiohttp, ...) are imported by ``func`` only.
EXTRA_COMMANDS = ("hami.scheduler.explain_cli", "hami.simulate.cli")
# The top-level --help text: plain text (the module docstring is reStructuredText for
# developers, and its backticks used to show up here).
DESCRIPTION = """\
Share GPUs and other AI accelerators between Kubernetes pods (a Python HAMi).
One program for both roles: 'hami run --role node' is the node agent (a DaemonSet on
every GPU node), 'hami run --role scheduler' the scheduler extender and its webhook.
'hami COMMAND --help' describes a command."""
DEMO_DESCRIPTION = """\
Starts etcd, kube-apiserver and kube-scheduler as local processes (building them first when
they are missing), the hami scheduler role as kube-scheduler's extender and three simulated
GPU nodes; submits a mix of GPU pods, prints where each landed and why the one that cannot
fit stays Pending, and shuts everything down (--keep: keeps it running until Ctrl-C)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hami {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_version = sub.add_parser("version", help="print the version")
    p_version.set_defaults(func=_cmd_version)

    p_devices = sub.add_parser(
        "devices", help="enumerate devices here and show the annotations the node would write"
    )
    add_common_flags(p_devices)
    p_devices.add_argument("--backend", help="only this backend (default: the enabled ones)")
    p_devices.set_defaults(func=_cmd_devices)

    p_run = sub.add_parser("run", help="run a role: the node agent or the scheduler")
    add_common_flags(p_run)
    p_run.add_argument("--role", required=True, choices=sorted(ROLES))
    p_run.add_argument("--node-name", help="this node's name (node role; default: $NODE_NAME)")
    p_run.set_defaults(func=_cmd_run)

    _add_demo_parser(sub)
    for module_name in EXTRA_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that part of hami is not built yet
            raise
        module.add_parser(sub)
    return parser


def _add_demo_parser(sub: Any) -> None:
    # defined here, not in hami.demo.cli, which imports the test kit: ``hami run`` must not
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="a local cluster with simulated GPU nodes, sample pods and a placement table",
        description=DEMO_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    parser.add_argument(
        "--mode",
        default="extender",
        choices=("extender", "dra"),
        help="extender: hami as kube-scheduler's extender (default); dra: kube-scheduler "
        "alone allocates through Dynamic Resource Allocation (docs/dra.md)",
    )
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="do not build missing control plane binaries; just say how to get them",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=config.LOG_LEVELS,
        help="log level of the in-process roles (default: warning)",
    )
    parser.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from hami.demo import cli as demo_cli

    result: int = demo_cli.run(args)
    return result


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"hami {__version__}")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from hami import log

    cfg = load_config(args)
    log.configure(tool_log_level(args), cfg.log.format)
    if args.backend:
        section = cfg.backends.get(args.backend, config.BackendConfig())
        chosen = {args.backend: section}
    else:
        chosen = cfg.enabled_backends()
    return asyncio.run(_show_devices(chosen))


async def _show_devices(chosen: dict[str, config.BackendConfig]) -> int:
    from hami.backends import registry
    from hami.backends.base import BackendError

    failures = 0
    now = datetime.now(UTC)
    for name, section in chosen.items():
        backend: Backend | None = None
        try:
            backend = registry.create(name, section.settings(name))
            devices = await backend.enumerate()
            node_devices = backend.to_node_devices(devices)
        except (BackendError, config.ConfigError) as exc:
            print(f"backend {name}: {exc}", file=sys.stderr)
            failures += 1
            continue
        finally:
            if backend is not None:
                await backend.close()
        print(f"backend {name} (type {backend.type_word}): {len(devices)} device(s)")
        rows = [("INDEX", "UUID", "MODEL", "MEMORY MiB", "NUMA", "HEALTHY", "SPLIT", "CORES")]
        rows += [
            (
                str(d.index),
                d.uuid,
                d.model,
                str(d.memory),
                str(d.numa),
                str(d.healthy).lower(),
                str(d.count),
                str(d.cores),
            )
            for d in node_devices
        ]
        _print_table(rows)
        if node_devices:
            form = backend.settings.register_format
            print(f"annotations the node agent would write (register_format: {form}):")
            for key, value in backend.registration(node_devices, now).items():
                print(f"  {key}: {value}")
        print()
    return 1 if failures else 0


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _cmd_run(args: argparse.Namespace) -> int:
    from hami import log

    cfg = load_config(args)
    log.configure(cfg.log.level, cfg.log.format)
    module_name = ROLES[args.role]
    try:
        module: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"hami: the {args.role} role is not available in this build", file=sys.stderr)
            return 2
        raise
    result: int = asyncio.run(module.main(cfg))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except config.ConfigError as exc:
        print(f"hami: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result
