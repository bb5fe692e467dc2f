"""The project's read-only companion folder ``../shared`` (protocol docs and test vectors).

Tests that read it go through ``shared_file`` so a checkout without it fails with one line
that says where it looked and how to fix it, instead of a bare FileNotFoundError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

DEFAULT_SHARED = Path(__file__).resolve().parents[2] / "shared"


def shared_dir() -> Path:
    return Path(os.environ.get("HAMI_SHARED_DIR") or DEFAULT_SHARED)


def shared_file(relative: str) -> Path:
    path = shared_dir() / relative
    if not path.is_file():
        pytest.fail(
            f"{relative} not found at {path}: this test needs the project's shared folder "
            "(docs and vectors) next to the checkout as ../shared, or HAMI_SHARED_DIR "
            "pointing at it",
            pytrace=False,
        )
    return path


def shared_json(relative: str) -> Any:
    return json.loads(shared_file(relative).read_text())
