"""Integer and boolean parsing with Go's strconv rules, which the other HAMi components use."""

from hami.protocol.errors import ProtocolError

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


# Amounts that repeat across many objects (device memory in MiB: one value per GPU model,
# a few per pod size) share one int object each instead of 28 bytes per copy; CPython
# only shares -5..256 itself. Bounded, so a writer of odd values cannot grow it.
_SHARED: dict[int, int] = {}
SHARED_MAX = 4096


def shared_int(value: int) -> int:
    """``value``, as the one object kept for that value when there is room for it."""
    found = _SHARED.get(value)
    if found is not None:
        return found
    if len(_SHARED) < SHARED_MAX:
        _SHARED[value] = value
    return value


def parse_int32(text: str, *, what: str, field: str) -> int:
    """Parse like Go's ``strconv.ParseInt(text, 10, 32)``: optional sign, ASCII digits only."""
    return parse_int(text, what=what, field=field, bits=32)


def parse_int(text: str, *, what: str, field: str, bits: int) -> int:
    """Parse like Go's ``strconv.ParseInt(text, 10, bits)`` (``Atoi`` is ``bits=64``)."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ProtocolError(what, f"{field} is not an integer", text)
    if len(digits.lstrip("0")) > 20:
        # int() refuses strings over 4300 digits with a plain ValueError, which would escape
        # callers that catch ProtocolError; anything over 20 digits is out of int64 anyway.
        raise ProtocolError(what, f"{field} does not fit in int{bits}", text)
    value = int(text)
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ProtocolError(what, f"{field} does not fit in int{bits}", text)
    return value


def parse_go_bool(text: str, *, what: str, field: str) -> bool:
    """Parse like Go's ``strconv.ParseBool``."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise ProtocolError(what, f"{field} is not a boolean (true/false)", text)
