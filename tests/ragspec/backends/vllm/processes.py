"""Process facts from ``/proc`` for the tests that check no vLLM process outlives its server."""

from __future__ import annotations

from pathlib import Path


def parent_pid(proc: Path) -> int | None:
    """The parent of the process ``/proc/PID`` describes; None once it is gone."""
    try:
        return int(proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and parent_pid(p) == pid]


def gone(pids: list[int]) -> bool:
    """Whether none of `pids` still runs (a zombie awaiting its reaper does not run)."""
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            return False
    return True
