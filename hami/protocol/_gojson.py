"""What Go's encoding/json does when it reads JSON into a struct, where Python's json
differs: how object keys are matched to fields, and ``-0`` (signed types only)."""

from __future__ import annotations

# Go matches keys with Unicode simple case folding (strings.EqualFold): ASCII letters, and
# the two non-ASCII letters whose fold is an ASCII one, long s and the Kelvin sign; a dotless
# i does not match ``i`` (tools/gohami-vectors/mig vectors register_decode long-s-*).
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ\u017f\u212a", "abcdefghijklmnopqrstuvwxyzsk")


def fold_key(name: str) -> str:
    """The key as a struct field's lower-case JSON name matches it."""
    return name.translate(_FOLD)


class MinusZero(int):
    """The literal ``-0``: Go reads it into a signed integer, not into an unsigned one."""


def parse_int_literal(literal: str) -> int:
    """``json.loads(parse_int=...)``: integers, with ``-0`` marked."""
    return MinusZero(0) if literal == "-0" else int(literal)
