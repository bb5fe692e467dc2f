"""Who and where this scheduler replica is: its namespace and its identity.

In a pod both come from the downward API (``POD_NAMESPACE``, ``POD_NAME``) or, failing
that, the service account's namespace file and the host name (a pod's host name is its
name). A configured value always wins.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class PodInfoError(ValueError):
    """The namespace cannot be found; the message names the key to set."""


def namespace(
    configured: str,
    key: str,
    env: Mapping[str, str] | None = None,
    account_file: Path = SERVICE_ACCOUNT_NAMESPACE,
) -> str:
    if configured:
        return configured
    env = os.environ if env is None else env
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        found = account_file.read_text().strip()
    except OSError:
        found = ""
    if found:
        return found
    raise PodInfoError(
        f"config key {key}: not set, and neither POD_NAMESPACE nor {account_file} says which "
        "namespace this replica runs in; set it"
    )


def identity(configured: str, env: Mapping[str, str] | None = None) -> str:
    if configured:
        return configured
    env = os.environ if env is None else env
    return env.get("POD_NAME") or socket.gethostname()
