"""The flags every ``hami`` subcommand shares and the configuration they produce.

Apart from ``hami.cli`` so that subcommands defined elsewhere (``hami explain``) use them
without importing the top-level command module.
"""

from __future__ import annotations

import argparse
import dataclasses

from hami import config


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML configuration file (see config/hami.yaml)")
    parser.add_argument("--log-level", choices=config.LOG_LEVELS, help="override log.level")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG)")


# what a command-line tool (devices, explain) logs at unless --log-level says otherwise: a
# person reading its output wants the answer, not the info lines a role writes for its logs
TOOL_LOG_LEVEL = "warning"


def tool_log_level(args: argparse.Namespace) -> str:
    level: str | None = getattr(args, "log_level", None)
    return level or TOOL_LOG_LEVEL


def load_config(args: argparse.Namespace) -> config.Config:
    cfg = config.load(args.config)
    if getattr(args, "log_level", None):
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, level=args.log_level))
    if getattr(args, "kubeconfig", None):
        cfg = dataclasses.replace(cfg, kubeconfig=args.kubeconfig)
    if getattr(args, "node_name", None):
        cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, name=args.node_name))
    return cfg
