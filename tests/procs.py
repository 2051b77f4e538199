"""Finding the processes of one job among everything else running on the machine (other jobs
run at the same time): the job's processes inherit an environment marker."""
from __future__ import annotations

import os
from typing import List

__all__ = ["marked_processes"]


def marked_processes(var: str, tag: str) -> List[int]:
    """Pids of the live (not zombie) processes whose environment has `var=tag`."""
    want = f"{var}={tag}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as st:
                if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(name))
        except OSError:
            continue
    return found
