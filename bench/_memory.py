"""Whether this machine has the memory for a benchmark's size (the 65,000-node rows).

Each benchmark that builds N nodes asks ``room_for`` before it does; when the machine's
available memory (``MemAvailable`` of /proc/meminfo) is below what the size needs, the
size is skipped with a printed reason instead of the machine running out of memory.
No ``__main__``: ``make bench`` skips it.
"""

from __future__ import annotations

from pathlib import Path

#: kept free beside a benchmark (the control plane, the other processes)
HEADROOM_MIB = 2048


def available_mib(meminfo: str = "/proc/meminfo") -> float:
    """MemAvailable in MiB (infinite where /proc/meminfo cannot be read)."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return float("inf")
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def room_for(
    nodes: int, mib_per_1000_nodes: float, what: str, meminfo: str = "/proc/meminfo"
) -> bool:
    """True when ``nodes`` nodes at ``mib_per_1000_nodes`` fit in the available memory
    (with ``HEADROOM_MIB`` to spare); otherwise print why the size is skipped."""
    needed = nodes * mib_per_1000_nodes / 1000
    have = available_mib(meminfo)
    if needed + HEADROOM_MIB <= have:
        return True
    print(
        f"-- {what} at {nodes} nodes skipped: it needs about {needed:,.0f} MiB "
        f"({mib_per_1000_nodes:g} MiB per 1,000 nodes) and {HEADROOM_MIB} MiB to spare; "
        f"{have:,.0f} MiB available",
        flush=True,
    )
    return False
