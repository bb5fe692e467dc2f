"""The node agent's record of the MIG instances it made, kept in a host file so a restarted
agent knows them (and never touches an instance it did not make).

One entry per GPU instance: the GPU, the placement (the key: two live GPU instances never
share one), the profile, the pod it was made for, and once made its GPU instance id, compute
instance id and MIG UUID. An entry is written *before* NVML is asked to create the instance
(``made`` false), so an agent that dies between the two still knows the instance at that
placement is its own. The file is replaced whole (written beside, then renamed).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hami import log
from hami.protocol.mig import MigPlacement

_log = log.get(__name__)
VERSION = 1


@dataclass(frozen=True, slots=True)
class ManagedInstance:
    gpu_uuid: str
    start: int
    size: int
    profile: str  # the reservation's profile name (3g.40gb)
    profile_id: int  # NVML's GPU instance profile id
    pod_uid: str
    pod: str  # namespace/name, for messages
    gi_id: int | None = None
    ci_id: int | None = None
    mig_uuid: str = ""
    made: bool = False  # False: recorded before the create call (it may not exist)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.gpu_uuid, self.start, self.size)

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(self.start, self.size)

    def made_as(self, gi_id: int, ci_id: int, mig_uuid: str) -> ManagedInstance:
        return replace(self, gi_id=gi_id, ci_id=ci_id, mig_uuid=mig_uuid, made=True)


class MigLedger:
    """The entries of ``path``; every change is written through at once."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: dict[tuple[str, int, int], ManagedInstance] = {}
        self._load()

    def _load(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Unreadable: the agent knows no instance as its own, so it destroys none.
            _log.warning(
                "nvidia.mig_ledger_unreadable",
                path=str(self.path),
                error=str(exc),
                hint="instances recorded there are no longer removed by the agent; remove "
                "them with nvidia-smi mig -dci / -dgi once their pods are gone",
            )
            return
        for item in raw.get("instances", []) if isinstance(raw, dict) else []:
            entry = _entry(item)
            if entry is not None:
                self._entries[entry.key] = entry

    def __iter__(self) -> Iterator[ManagedInstance]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, gpu_uuid: str, placement: MigPlacement) -> ManagedInstance | None:
        return self._entries.get((gpu_uuid, placement.start, placement.size))

    def put(self, entry: ManagedInstance) -> None:
        """Record ``entry`` (replacing one at its placement). Raises OSError when the file
        cannot be written; the entry is then not kept either."""
        before = self._entries.get(entry.key)
        self._entries[entry.key] = entry
        try:
            self._save()
        except OSError:
            if before is None:
                self._entries.pop(entry.key, None)
            else:
                self._entries[entry.key] = before
            raise

    def drop(self, entry: ManagedInstance) -> None:
        """Forget ``entry``. Raises OSError when the file cannot be written."""
        if self._entries.pop(entry.key, None) is not None:
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"version": VERSION, "instances": [asdict(e) for e in self._entries.values()]}
        fd, tmp = tempfile.mkstemp(prefix=".mig-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(body, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _entry(item: Any) -> ManagedInstance | None:
    try:
        entry = ManagedInstance(**item)
    except TypeError:
        _log.warning("nvidia.mig_ledger_entry_skipped", entry=repr(item)[:200])
        return None
    return entry
