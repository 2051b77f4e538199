"""Draw one run of a popxl-dist profiler trace (POPXL_PROFILE) as a PNG timeline, offline, with
matplotlib (the `plot` extra): one row per track (the host's requests, each worker's runs, each
replica's ops), nested slices stacked, colours by category, names where they fit.

    python tools/trace_png.py DIR/popxl-trace-HOST-PID.json trace.png [--run N] [--session TAG]

(docs/profiling.md's picture was made this way from a 2-rank MPI run.)
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

__all__ = ["draw", "main"]

COLOURS = {"host": "#4c9f9b", "run": "#b8b8b8", "op": "#6a9fd8", "control_flow": "#e3e3e3",
           "collective": "#f2a33a", "collective.wait": "#e8685a",
           "collective.transfer": "#67b86a", "host_transfer": "#a57fd0",
           "remote_transfer": "#c9a0dc"}
LEGEND = [("op", "op"), ("control_flow", "call / loop"), ("host_transfer", "host transfer"),
          ("collective", "collective"), ("collective.wait", "wait for peers"),
          ("collective.transfer", "transfer"), ("host", "host request"), ("run", "worker run")]


def _window(events: List[dict], run: int, session: str) -> Tuple[float, float]:
    """The span of host request `Session.run` number `run` (1-based) of `session`."""
    runs = sorted((e for e in events if e["pid"] == 0 and e["name"] == "Session.run"
                   and (not session or e["args"].get("session") == session)),
                  key=lambda e: e["ts"])
    if not runs:
        raise SystemExit("trace_png: the trace has no Session.run")
    e = runs[min(run, len(runs)) - 1]
    return e["ts"], e["ts"] + e["dur"]


def draw(doc: dict, out: str, run: int = 1, session: str = "", width: float = 15.0) -> None:
    """Draw host request `run` of `session` (default: the first Session with runs) to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["name"] == "thread_name"}
    t0, t1 = _window(events, run, session)
    pad = 0.02 * (t1 - t0)
    lo, hi = t0 - pad, t1 + pad
    shown = [e for e in events if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    tracks: Dict[Tuple[int, int], List[dict]] = {}
    for e in shown:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    rows: List[Tuple[str, List[Tuple[dict, int]]]] = []
    for key in sorted(tracks):
        evs = sorted(tracks[key], key=lambda e: (e["ts"], -e["dur"]))
        stack: List[float] = []
        placed = []
        for e in evs:
            while stack and stack[-1] <= e["ts"] + 0.01:      # (ts and dur are rounded)
                stack.pop()
            placed.append((e, len(stack)))
            stack.append(e["ts"] + e["dur"])
        pname = procs.get(key[0], str(key[0])).split(" (")[0]
        rows.append((f"{pname}: {threads.get(key, key[1])}", placed))
    depth = [max(d for _, d in placed) + 1 for _, placed in rows]
    height = sum(depth) * 0.32 + 1.4
    fig, ax = plt.subplots(figsize=(width, height))
    y = 0.0
    ticks = []
    for (label, placed), n in zip(rows, depth):
        for e, d in placed:
            s, w = max(e["ts"], lo), min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)
            top = y + d
            ax.barh(top + 0.45, w / 1e3, left=(s - t0) / 1e3, height=0.86,
                    color=COLOURS.get(e["cat"], "#999999"), edgecolor="#555555", linewidth=0.3)
            fits = int(w / (hi - lo) * width * 14)      # characters of 6.5 pt that fit
            if fits >= 4:
                name = e["name"] if len(e["name"]) <= fits else e["name"][:fits - 1] + "."
                ax.text((s - t0 + w / 2) / 1e3, top + 0.45, name, ha="center", va="center",
                        fontsize=6.5, clip_on=True)
        ticks.append((y + n / 2, label))
        y += n
        ax.axhline(y, color="#dddddd", linewidth=0.6)
    ax.set_ylim(y, 0)
    ax.set_xlim((lo - t0) / 1e3, (hi - t0) / 1e3)
    ax.set_yticks([t for t, _ in ticks], [lbl for _, lbl in ticks], fontsize=8)
    ax.set_xlabel("ms from the start of the Session.run request", fontsize=9)
    ax.set_title(f"popxl-dist profile: Session.run #{run}"
                 + (f" of {session}" if session else ""), fontsize=10)
    ax.legend(handles=[Patch(color=COLOURS[c], label=lbl) for c, lbl in LEGEND],
              loc="upper center", bbox_to_anchor=(0.5, -0.9 / height - 0.06), ncol=8,
              fontsize=7.5, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("png")
    p.add_argument("--run", type=int, default=1, help="which Session.run (1-based)")
    p.add_argument("--session", default="", help="the Session's tag (e.g. session0)")
    p.add_argument("--width", type=float, default=15.0, help="inches")
    ns = p.parse_args(argv)
    with open(ns.trace) as f:
        draw(json.load(f), ns.png, ns.run, ns.session, ns.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
