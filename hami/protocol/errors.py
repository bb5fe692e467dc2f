"""The one error type the protocol codec raises."""


class ProtocolError(ValueError):
    """A value on the wire does not follow protocol.md.

    ``what`` names the value (e.g. ``node register``), ``detail`` says what is wrong and
    ``text`` is the offending piece, so a log line tells an operator exactly what to fix.
    """

    def __init__(self, what: str, detail: str, text: str) -> None:
        shown = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"invalid {what}: {detail} in {shown!r}")
        self.what = what
        self.detail = detail
        self.text = text
