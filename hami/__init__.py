"""hami: share GPUs and other accelerators between Kubernetes pods (HAMi-compatible)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hami")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
