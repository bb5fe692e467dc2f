"""Realising the scheduler's MIG reservations on the node (issue 23 item 3), and removing
what the node made once its pods are gone.

``MigInstances.realise`` makes exactly the reserved GPU instance (the reserved profile at the
reserved placement, never another) and one compute instance over all of it, and returns the
reservation completed with the MIG device's UUID and the two ids. It is idempotent: an
instance this agent made for the same pod at that placement (the ledger says so, also after
a restart), or one the pod's own completed reservation names (GPU instance id, compute
instance id and MIG UUID all matching), is adopted instead. It refuses, naming what is in the
way, a placement where an instance it did not make lies, or one still held by another pod's.

``MigInstances.reconcile`` destroys the instances of the ledger whose pod is not active on
the node any more, and adopts the completed reservations of active pods it has no entry for
(an agent whose ledger was lost). It never destroys an instance the ledger does not name.

All calls block on NVML: run them in a worker thread. One lock serialises them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hami import log
from hami.backends import _nvml_mig_instances as gi
from hami.backends._nvml_mig import mig_enabled, possible_placements
from hami.backends.base import BackendError
from hami.backends.mig_ledger import ManagedInstance, MigLedger
from hami.protocol.mig import MigAllocation, MigPlacement, placements_overlap, profile_slice_key

_log = log.get(__name__)


@dataclass(frozen=True, slots=True)
class Owner:
    uid: str
    ref: str  # namespace/name


@dataclass(frozen=True, slots=True)
class ActivePod:
    """A pod on the node that may still run (not Succeeded or Failed, not gone), and the
    reservations of its ``hami.io/vgpu-mig-allocations`` (none when unreadable)."""

    ref: str
    allocations: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class Realised:
    allocation: MigAllocation  # completed: mig_uuid, gpu_instance_id, compute_instance_id
    created: bool  # made by this call (a rollback removes only those)
    entry: ManagedInstance


def _where(gpu: str, placement: MigPlacement) -> str:
    return f"placement {{start {placement.start}, size {placement.size}}} of GPU {gpu}"


def _remove_hint(index: int, gi_id: int) -> str:
    return (
        f"remove it with nvidia-smi mig -i {index} -dci -gi {gi_id} and nvidia-smi mig "
        f"-i {index} -dgi -gi {gi_id} once nothing runs on it"
    )


class MigInstances:
    def __init__(self, nvml: Callable[[], Any], ledger: MigLedger) -> None:
        """``nvml``: returns the started NVML module (raises BackendError when it cannot)."""
        self._nvml = nvml
        self.ledger = ledger
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ realise

    def realise(self, reservation: MigAllocation, owner: Owner) -> Realised:
        """The reserved instance, made or adopted. Raises BackendError saying why not."""
        with self._lock:
            nvml = self._nvml()
            try:
                return self._realise(nvml, reservation, owner)
            except nvml.NVMLError as exc:
                raise BackendError(
                    f"NVML failed on the MIG instance {reservation.profile} at "
                    f"{_where(reservation.gpu_uuid, reservation.placement)}: {exc}"
                ) from None

    def _realise(self, nvml: Any, want: MigAllocation, owner: Owner) -> Realised:
        gpu, placement = want.gpu_uuid, want.placement
        handle, index = self._gpu(nvml, gpu)
        word = profile_slice_key(want.profile)
        profile_id = gi.gi_profile_id(word)
        if profile_id is None or word not in gi.CI_PROFILE_BY_SLICES:
            raise BackendError(
                f"MIG profile {want.profile!r} has no NVML GPU instance profile "
                f"(known: {', '.join(sorted(gi.CI_PROFILE_BY_SLICES))}g slices)"
            )
        try:
            legal = possible_placements(nvml, handle, profile_id)
        except nvml.NVMLError as exc:
            raise BackendError(f"GPU {gpu} has no MIG profile {want.profile} ({exc})") from None
        if placement not in legal:
            raise BackendError(
                f"{_where(gpu, placement)} is not a legal placement of {want.profile} "
                f"(legal starts: {', '.join(str(p.start) for p in legal)})"
            )
        entry = self.ledger.get(gpu, placement)
        if entry is not None and entry.pod_uid != owner.uid:
            raise BackendError(
                f"{_where(gpu, placement)} holds the MIG instance this agent made for pod "
                f"{entry.pod}, which is still on this node: two pods reserve one placement "
                "(a scheduler that does not count both); delete one of them"
            )
        live = gi.live_instances(nvml, handle)
        at = next((i for i in live if i.placement == placement), None)
        if at is not None:
            return self._adopt(nvml, handle, index, want, owner, entry, at, profile_id)
        for other in live:
            if placements_overlap(other.placement, placement):
                mine = self._owned(gpu, other.placement)
                whose = (
                    f"this agent made for pod {mine.pod}"
                    if mine is not None
                    else f"this agent did not make ({_remove_hint(index, other.gi_id)})"
                )
                raise BackendError(
                    f"{_where(gpu, placement)} overlaps GPU instance {other.gi_id} at "
                    f"{{start {other.placement.start}, size {other.placement.size}}}, which "
                    f"{whose}"
                )
        return self._create(nvml, handle, want, owner, profile_id)

    def _gpu(self, nvml: Any, gpu: str) -> tuple[Any, int]:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu)
            index = int(nvml.nvmlDeviceGetIndex(handle))
        except nvml.NVMLError as exc:
            raise BackendError(
                f"GPU {gpu} of the MIG reservation is not on this node ({exc})"
            ) from None
        if not mig_enabled(nvml, handle):
            raise BackendError(
                f"GPU {gpu} (index {index}) is not in MIG mode, so the reserved instance "
                f"cannot be made: enable it (nvidia-smi -i {index} -mig 1, then reset the "
                "GPU) or stop reserving MIG here (operating_mode: hami-core)"
            )
        return handle, index

    def _owned(self, gpu: str, placement: MigPlacement) -> ManagedInstance | None:
        return self.ledger.get(gpu, placement)

    def _adopt(
        self,
        nvml: Any,
        handle: Any,
        index: int,
        want: MigAllocation,
        owner: Owner,
        entry: ManagedInstance | None,
        at: gi.LiveInstance,
        profile_id: int,
    ) -> Realised:
        gpu = want.gpu_uuid
        ci_id = at.ci_ids[0] if at.ci_ids else None
        uuid = gi.mig_device_uuid(nvml, handle, at.gi_id, ci_id) if ci_id is not None else None
        annotated = (
            want.gpu_instance_id == at.gi_id
            and want.compute_instance_id == ci_id
            and bool(uuid)
            and want.mig_uuid == uuid
        )
        ours = entry is not None and (entry.gi_id in (None, at.gi_id))
        if not (ours or annotated):
            raise BackendError(
                f"{_where(gpu, want.placement)} already holds GPU instance {at.gi_id}, which "
                f"this agent did not make; it may be in use: {_remove_hint(index, at.gi_id)}"
            )
        if at.profile_id != profile_id:
            raise BackendError(
                f"GPU instance {at.gi_id} at {_where(gpu, want.placement)} has NVML profile "
                f"{at.profile_id}, the reservation asks for {want.profile}: "
                f"{_remove_hint(index, at.gi_id)}"
            )
        if entry is None:
            entry = self._record(want, owner, profile_id)
        if ci_id is None or uuid is None:  # the agent stopped between the two creates
            ci_id = gi.create_compute_instance(nvml, at.handle, profile_slice_key(want.profile))
            uuid = self._uuid(nvml, handle, at.gi_id, ci_id)
        entry = entry.made_as(at.gi_id, ci_id, uuid)
        self._write(entry)
        _log.info("nvidia.mig_instance_adopted", pod=owner.ref, gpu=gpu, gi=at.gi_id, uuid=uuid)
        return Realised(_completed(want, entry), False, entry)

    def _create(
        self, nvml: Any, handle: Any, want: MigAllocation, owner: Owner, profile_id: int
    ) -> Realised:
        entry = self._record(want, owner, profile_id)
        made = None
        try:
            made = gi.create_gpu_instance(nvml, handle, profile_id, want.placement)
            gi_id, _ = gi.gi_info(nvml, made)
            ci_id = gi.create_compute_instance(nvml, made, profile_slice_key(want.profile))
            uuid = self._uuid(nvml, handle, gi_id, ci_id)
        except BaseException:
            if made is not None:
                self._undo(nvml, handle, made)
            self._forget(entry)
            raise
        entry = entry.made_as(gi_id, ci_id, uuid)
        self._write(entry)
        _log.info(
            "nvidia.mig_instance_created",
            pod=owner.ref,
            gpu=want.gpu_uuid,
            profile=want.profile,
            start=want.placement.start,
            size=want.placement.size,
            gi=gi_id,
            ci=ci_id,
            uuid=uuid,
        )
        return Realised(_completed(want, entry), True, entry)

    @staticmethod
    def _uuid(nvml: Any, handle: Any, gi_id: int, ci_id: int) -> str:
        uuid = gi.mig_device_uuid(nvml, handle, gi_id, ci_id)
        if not uuid:
            raise BackendError(
                f"NVML shows no MIG device for GPU instance {gi_id}, compute instance {ci_id}"
            )
        return uuid

    def _undo(self, nvml: Any, handle: Any, made: Any) -> None:
        try:
            gi_id, _ = gi.gi_info(nvml, made)
            gi.destroy_gpu_instance(nvml, handle, gi_id)
        except nvml.NVMLError as exc:
            _log.warning("nvidia.mig_rollback_failed", error=str(exc))

    def _record(self, want: MigAllocation, owner: Owner, profile_id: int) -> ManagedInstance:
        entry = ManagedInstance(
            gpu_uuid=want.gpu_uuid,
            start=want.placement.start,
            size=want.placement.size,
            profile=want.profile,
            profile_id=profile_id,
            pod_uid=owner.uid,
            pod=owner.ref,
        )
        self._write(entry)
        return entry

    def _write(self, entry: ManagedInstance) -> None:
        try:
            self.ledger.put(entry)
        except OSError as exc:
            raise BackendError(
                f"cannot record the MIG instance in {self.ledger.path} ({exc}); the agent "
                "makes no instance it could not remember: make the directory writable "
                "(option mig_state_file)"
            ) from None

    def _forget(self, entry: ManagedInstance) -> None:
        try:
            self.ledger.drop(entry)
        except OSError as exc:
            _log.warning(
                "nvidia.mig_ledger_write_failed", path=str(self.ledger.path), error=str(exc)
            )

    # ------------------------------------------------------------------ release

    def release(self, entries: Iterable[ManagedInstance]) -> None:
        """Destroy instances made by one failed Allocate (its rollback), best effort."""
        with self._lock:
            nvml = self._nvml()
            for entry in entries:
                self._destroy(nvml, entry, "rolled back")

    def remove(self, entries: Iterable[ManagedInstance], why: str) -> list[str]:
        """Destroy ``entries`` (what one owner holds: a DRA claim being unprepared); returns
        what could not be removed and why (the caller reports it and is asked again)."""
        with self._lock:
            nvml = self._nvml()
            return [p for e in list(entries) if (p := self._destroy(nvml, e, why))]

    def reconcile(self, active: Mapping[str, ActivePod]) -> list[str]:
        """Destroy the ledger's instances whose pod uid is not in ``active`` (the pods on the
        node that may still run: uid -> its readable reservations); adopt the completed
        reservations of active pods that the ledger lacks. Returns what was not removed and
        why (instances in use are tried again on the next call)."""
        with self._lock:
            if not len(self.ledger) and not any(_completed_ones(active)):
                return []
            nvml = self._nvml()
            kept: list[str] = []
            for entry in self.ledger:
                if entry.pod_uid in active:
                    continue
                problem = self._destroy(nvml, entry, "its pod is gone")
                if problem:
                    kept.append(problem)
            self._adopt_annotated(nvml, active)
            return kept

    def _destroy(self, nvml: Any, entry: ManagedInstance, why: str) -> str | None:
        where = _where(entry.gpu_uuid, entry.placement)
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(entry.gpu_uuid)
            live = gi.live_instances(nvml, handle)
            at = next((i for i in live if i.placement == entry.placement), None)
            if (
                at is not None
                and at.profile_id == entry.profile_id
                and entry.gi_id in (None, at.gi_id)
            ):
                gi.destroy_gpu_instance(nvml, handle, at.gi_id)
        except nvml.NVMLError as exc:
            _log.warning("nvidia.mig_instance_kept", pod=entry.pod, where=where, error=str(exc))
            return f"{where} (pod {entry.pod}): {exc}"
        self._forget(entry)
        _log.info("nvidia.mig_instance_removed", pod=entry.pod, where=where, why=why)
        return None

    def _adopt_annotated(self, nvml: Any, active: Mapping[str, ActivePod]) -> None:
        for uid, pod in active.items():
            for a in pod.allocations:
                if a.gpu_instance_id is None or self.ledger.get(a.gpu_uuid, a.placement):
                    continue
                profile_id = gi.gi_profile_id(profile_slice_key(a.profile))
                if profile_id is None or a.compute_instance_id is None:
                    continue
                try:
                    handle = nvml.nvmlDeviceGetHandleByUUID(a.gpu_uuid)
                    live = gi.live_instances(nvml, handle)
                    at = next((i for i in live if i.placement == a.placement), None)
                    if at is None or at.gi_id != a.gpu_instance_id or profile_id != at.profile_id:
                        continue
                    if a.compute_instance_id not in at.ci_ids:
                        continue
                    uuid = gi.mig_device_uuid(nvml, handle, at.gi_id, a.compute_instance_id)
                except nvml.NVMLError:
                    continue
                if uuid != a.mig_uuid:
                    continue
                entry = ManagedInstance(
                    gpu_uuid=a.gpu_uuid,
                    start=a.placement.start,
                    size=a.placement.size,
                    profile=a.profile,
                    profile_id=profile_id,
                    pod_uid=uid,
                    pod=pod.ref,
                ).made_as(at.gi_id, a.compute_instance_id, uuid)
                try:
                    self.ledger.put(entry)
                except OSError:
                    continue
                _log.info("nvidia.mig_instance_adopted", pod=pod.ref, uuid=uuid)


def _completed(want: MigAllocation, entry: ManagedInstance) -> MigAllocation:
    return replace(
        want,
        mig_uuid=entry.mig_uuid,
        gpu_instance_id=entry.gi_id,
        compute_instance_id=entry.ci_id,
    )


def _completed_ones(active: Mapping[str, ActivePod]) -> Iterable[MigAllocation]:
    return (a for pod in active.values() for a in pod.allocations if a.gpu_instance_id is not None)
