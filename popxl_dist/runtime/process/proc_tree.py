"""The live descendants of a process, read from /proc (launchers and the Ray backend use it to
leave no process behind)."""
from __future__ import annotations

import os
from typing import Dict, List

__all__ = ["descendants"]


def descendants(root: int) -> List[int]:
    """Pids of every live descendant of `root`, parents before children (empty without /proc)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out
