"""The tests' own data files under ``tests/data`` (codec and Go HAMi vectors): committed
with the tests, so a clone of the repository alone runs every test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"


def data_json(name: str) -> Any:
    return json.loads((DATA / name).read_text())
