"""Device link scores on a node (``hami.io/node-{type}-score``), as Go HAMi writes them.

Go HAMi's NVIDIA plugin (and this project's NVIDIA backend) writes, per device, its link
score to every other device, higher for a better interconnect (NVLink, a shared PCIe
switch, ...), as JSON::

    [{"uuid": "GPU-a", "score": {"GPU-b": 1210, "GPU-c": 10}}, ...]

The ``topology-aware`` device policy picks by these scores (``hami.core.fit``). Pure. A
value that does not read is no scores at all: the node stays schedulable, without a
topology preference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_VALUE = 1 << 20  # an annotation is far smaller; larger is not a score value


def score_key(type_word: str) -> str:
    """``hami.io/node-nvidia-score`` for NVIDIA (Go HAMi's ``RegisterGPUPairScore``)."""
    return f"hami.io/node-{type_word}-score"


def parse_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """uuid -> peer uuid -> score; ValueError naming what is wrong.

    As Go HAMi's decoder: a JSON list of objects with ``uuid`` and ``score`` (either may
    be missing), scores whole numbers; the first entry of a uuid counts."""
    if len(value) > MAX_VALUE:
        raise ValueError(f"value is {len(value)} characters, more than {MAX_VALUE}")
    try:
        items = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if items is None:
        return {}
    if not isinstance(items, list):
        raise ValueError("expected a JSON list of {uuid, score} objects")
    scores: dict[str, dict[str, int]] = {}
    for position, item in enumerate(items):
        entry = _entry(item, position)
        if entry is not None and entry[0] not in scores:
            scores[entry[0]] = entry[1]
    return scores


def _entry(item: Any, position: int) -> tuple[str, dict[str, int]] | None:
    if item is None:
        return None
    if not isinstance(item, dict):
        raise ValueError(f"entry {position} is not an object")
    uuid = item.get("uuid", "")
    peers = item.get("score")
    if not isinstance(uuid, str):
        raise ValueError(f"entry {position}: uuid is not a string")
    if peers is None:
        peers = {}
    if not isinstance(peers, dict):
        raise ValueError(f"entry {position}: score is not an object")
    out: dict[str, int] = {}
    for peer, score in peers.items():
        if isinstance(score, bool) or not isinstance(score, int) or abs(score) >= 2**63:
            raise ValueError(f"entry {position}: score of {peer!r} is not a whole number")
        out[peer] = score
    return uuid, out


def read_pair_scores(value: str | None) -> tuple[dict[str, dict[str, int]], str | None]:
    """``parse_pair_scores`` that never raises: (scores, error); no value is no scores."""
    if value is None:
        return {}, None
    try:
        return parse_pair_scores(value), None
    except ValueError as exc:
        return {}, str(exc)


def encode_pair_scores(uuids: Sequence[str], scores: Mapping[tuple[str, str], int]) -> str:
    """The value for ``uuids`` (in this order) as Go HAMi's plugin marshals it: one entry
    per device, ``uuid`` then ``score`` with peers in sorted order, no spaces."""
    items = [
        {"uuid": a, "score": {b: scores.get((a, b), 0) for b in sorted(uuids) if b != a}}
        for a in uuids
    ]
    return json.dumps(items, separators=(",", ":"))
