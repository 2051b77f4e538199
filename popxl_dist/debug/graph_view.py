"""Graphs as pictures (`popxl-inspect`): each graph of an Ir as a Graphviz `.dot` file, ops
labelled with their type, name and the source line that built them, tensors on the edges
(shape, dtype), and the graphs it calls drawn inside it as clusters. `render_svg` turns a `.dot`
file into SVG with Graphviz's `dot` when it is installed (`apt install graphviz`); the `.dot`
files are written either way (any Graphviz viewer opens them)."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Optional, Set

from .._ir.records import GraphData, IrData, TensorKind

__all__ = ["graph_dot", "write_graphs", "render_svg", "graph_file_name"]

_CONTROL = ("Call", "Loop", "If")
_KIND_STYLE = {TensorKind.VARIABLE: ("cylinder", "#fde8c8"),
               TensorKind.CONSTANT: ("note", "#eeeeee"),
               TensorKind.INPUT: ("ellipse", "#d8ecff")}


def _q(text: str) -> str:
    """A double-quoted dot string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _short_source(source: str) -> str:
    return os.path.basename(source) if source else ""


def _tensor_label(tid: str, info) -> str:
    return f"{tid}\n{info.shape} {info.dtype.name}"


def graph_file_name(gid: str) -> str:
    """A file name (without extension) for graph `gid` ('main' for the main graph)."""
    name = gid or "main"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class _Writer:
    def __init__(self, ir: IrData, max_depth: int):
        self.ir = ir
        self.max_depth = max_depth
        self.lines: List[str] = []
        self.drawn: Set[str] = set()

    def node(self, prefix: str, gd: GraphData, gid: str, depth: int) -> None:
        """The ops and tensors of one graph, with `prefix` making its node names unique."""
        produced: Dict[str, str] = {}
        ind = "  " * (depth + 1)
        for t in gd.inputs:
            info = gd.tensors[t]
            produced[t] = f"{prefix}in_{t}"
            self.lines.append(f"{ind}{_q(produced[t])} [shape=ellipse, style=filled, "
                              f"fillcolor=\"#d8ecff\", label={_q(_tensor_label(t, info))}];")
        calls = []
        for op in gd.ops:
            name = f"{prefix}op{op.id}"
            src = _short_source(op.debug)
            label = f"{op.type}\n{op.name}" + (f"\n{src}" if src else "")
            style = ("shape=box, style=\"rounded,filled\", fillcolor=\"#fff3b0\""
                     if op.type in _CONTROL else "shape=box, style=filled, fillcolor=white")
            self.lines.append(f"{ind}{_q(name)} [{style}, label={_q(label)}];")
            for i, t in enumerate(op.inputs):
                src_node = produced.get(t)
                info = gd.tensors.get(t)
                if src_node is None and info is not None:
                    src_node = f"{prefix}t_{t}"
                    shape, color = _KIND_STYLE.get(info.kind, ("ellipse", "#ffffff"))
                    label = _q(_tensor_label(t, info))
                    self.lines.append(f"{ind}{_q(src_node)} [shape={shape}, style=filled, "
                                      f"fillcolor=\"{color}\", label={label}];")
                    produced[t] = src_node
                if src_node is not None and info is not None:
                    self.lines.append(f"{ind}{_q(src_node)} -> {_q(name)} "
                                      f"[label={_q(f'{info.shape} {info.dtype.name}')}];")
            for t in op.outputs:
                produced[t] = name
            if op.type in _CONTROL:
                calls.append((name, op))
        for t in gd.outputs:
            if t in produced:
                out = f"{prefix}out_{t}"
                self.lines.append(f"{ind}{_q(out)} [shape=ellipse, style=filled, "
                                  f"fillcolor=\"#d8f5d0\", label={_q('output ' + t)}];")
                self.lines.append(f"{ind}{_q(produced[t])} -> {_q(out)};")
        for name, op in calls:
            for callee in op.called:
                self.cluster(name, callee, depth)

    def cluster(self, caller: str, callee: str, depth: int) -> None:
        """Called graph `callee` as a cluster (drawn once per file; nested down to max_depth),
        with a dashed edge from the op that calls it."""
        key = f"cluster_{graph_file_name(callee)}"
        anchor = f"{key}_anchor"
        if key not in self.drawn and depth < self.max_depth:
            self.drawn.add(key)
            gd = self.ir.graphs[callee]
            ind = "  " * (depth + 1)
            self.lines.append(f"{ind}subgraph {_q(key)} {{")
            self.lines.append(f"{ind}  label={_q(f'graph {callee} ({len(gd.ops)} ops)')}; "
                              f"style=\"rounded,dashed\"; color=\"#888888\";")
            self.lines.append(f"{ind}  {_q(anchor)} [shape=point, width=0.05];")
            self.node(f"{graph_file_name(callee)}/", gd, callee, depth + 1)
            self.lines.append(f"{ind}}}")
        if key in self.drawn:
            self.lines.append(f"  {_q(caller)} -> {_q(anchor)} [style=dashed, lhead={_q(key)}, "
                              f"label=\"calls\"];")


def graph_dot(ir: IrData, gid: str = "", max_depth: int = 3) -> str:
    """Graph `gid` of `ir` as Graphviz dot text; the graphs it calls are clusters inside it
    (down to `max_depth` levels of calls)."""
    gd = ir.graphs[gid]
    w = _Writer(ir, max_depth)
    title = f"graph {gid or 'main'} ({len(gd.ops)} ops)"
    w.lines += ["digraph popxl {", "  compound=true; rankdir=TB; "
                f"labelloc=t; label={_q(title)};",
                "  node [fontname=\"Helvetica\", fontsize=10]; "
                "edge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\"];"]
    w.node("", gd, gid, 0)
    w.lines.append("}")
    return "\n".join(w.lines) + "\n"


def render_svg(dot_path: str) -> Optional[str]:
    """`dot_path` rendered to SVG beside it with Graphviz (the SVG's path), or None when
    Graphviz's `dot` is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    svg = os.path.splitext(dot_path)[0] + ".svg"
    try:
        subprocess.run([exe, "-Tsvg", dot_path, "-o", svg], check=True, capture_output=True,
                       timeout=300)
    except (subprocess.SubprocessError, OSError):
        return None
    return svg


def write_graphs(ir: IrData, out_dir: str, prefix: str = "") -> List[str]:
    """Write every graph of `ir` as `<out_dir>/<prefix><graph>.dot` (and .svg where Graphviz is
    installed); the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for gid in ir.graphs:
        path = os.path.join(out_dir, f"{prefix}{graph_file_name(gid)}.dot")
        with open(path, "w") as f:
            f.write(graph_dot(ir, gid))
        written.append(path)
        svg = render_svg(path)
        if svg:
            written.append(svg)
    return written
