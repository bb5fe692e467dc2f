"""Prepared claims kept in a JSON file under the plugin directory, so an agent restart
answers kubelet's repeated prepare with the same devices and unprepare still finds what to
remove. Written atomically after every change."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami import log

_log = log.get(__name__)
VERSION = 1


class Checkpoint:
    """claim uid -> what prepare answered (``{"namespace", "name", "devices": [...]}``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.claims: dict[str, dict[str, Any]] = {}

    def load(self) -> None:
        """Read the file; a missing file is an empty checkpoint, a corrupt one is logged
        and set aside (kubelet prepares again whatever it still needs)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            _log.error("dra_checkpoint_unreadable", path=str(self.path), error=str(exc))
            with contextlib.suppress(OSError):
                os.replace(self.path, f"{self.path}.corrupt")
            return
        claims = data.get("claims") if isinstance(data, Mapping) else None
        if isinstance(claims, Mapping):
            self.claims = {str(k): dict(v) for k, v in claims.items() if isinstance(v, Mapping)}

    def put(self, uid: str, entry: Mapping[str, Any]) -> None:
        self.claims[uid] = dict(entry)
        self._save()

    def drop(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".checkpoint-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"version": VERSION, "claims": self.claims}, out, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
