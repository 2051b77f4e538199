"""What every benchmark table says about where it was measured: the machine, its load, the
code's commit and the command, printed above the table (`--markdown`) so a table in the docs is
one run's output, never edited by hand."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from typing import Sequence

__all__ = ["machine_line", "markdown_table", "text_table"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_LOAD = os.getloadavg()     # the scripts import this module first: the load they started in


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if out.returncode != 0 or not out.stdout.strip():
            return "unknown (not a git checkout)"
        return out.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_line() -> str:
    """One line: date, CPU and cores, the load average when the script started (other work on the
    machine) and now (the benchmark's own included), commit, the command that ran."""
    load = os.getloadavg()
    command = " ".join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    return (f"{datetime.date.today().isoformat()}, {_cpu()}, {os.cpu_count()} CPUs, load "
            f"average {START_LOAD[0]:.2f} at the start, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
            f"at the end; commit {_commit()}; "
            f"`{command}`")


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(head: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """The same table as aligned plain text, for the terminal."""
    cells = [[str(c) for c in row] for row in (head, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in cells)
