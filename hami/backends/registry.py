"""Backend discovery through the ``hami.backends`` entry-point group."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from hami.backends.base import Backend, BackendError, BackendSettings

GROUP = "hami.backends"


def available() -> dict[str, EntryPoint]:
    """Installed backends by name (built-in and third-party alike)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_class(name: str) -> type[Backend]:
    found = available()
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise BackendError(
            f"unknown backend {name!r}: installed backends are {known}; install the package "
            f"that provides it or fix the name in the config"
        )
    try:
        loaded = found[name].load()
    except Exception as exc:  # a broken plug-in must not take the process down
        raise BackendError(
            f"backend {name!r} ({found[name].value}) failed to load: {exc!r}"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, Backend)):
        raise BackendError(
            f"backend {name!r} ({found[name].value}) is not a subclass of hami.backends.Backend"
        )
    return loaded


def create(name: str, settings: BackendSettings | None = None) -> Backend:
    cls = load_class(name)
    try:
        return cls(settings)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"backend {name!r} could not start: {exc!r}") from exc
