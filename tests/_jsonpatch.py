"""RFC 6902 ``add`` and ``remove``, all a webhook answers with, for tests that read the pod
a patch leaves behind."""

from __future__ import annotations

import copy
from typing import Any


def apply_patch(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``document`` after ``ops`` (a copy; the argument is left as it is)."""
    result = copy.deepcopy(document)
    for op in ops:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        elif op["op"] == "add":
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise AssertionError(f"unexpected patch operation {op}")
    return result
