"""Graphcore's PopXL applications on popxl-dist: every entry point's tiny preset, one process
each (and, with `--launchers`, under `poprun --num-instances 2` and `popxl-run --backend ray
--instances 2`), with its wall time (start-up included) and the application's own step time
where it logs one.

The applications are not part of popxl-dist: point `--examples` at a clone of graphcore/examples
and run this with a Python whose environment has the applications' requirements and popxl-dist
(not the real popxl-addons; see docs/applications.md).

    python benchmarks/bench_apps.py --examples ~/examples --markdown
    python benchmarks/bench_apps.py --examples ~/examples --only gpt3_pretraining --launchers one poprun
    python benchmarks/bench_apps.py --examples ~/examples --env POPXL_DEBUG_NANS=1 POPXL_CHECK_REPLICAS=1

A run that fails is reported with the last line of its output; nothing asserts on time.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from _report import machine_line, markdown_table

F32 = ["--precision", "float32"]
BLOOM = ("--config bloom_560M_pod16 --layers 2 --tensor_parallel_1 2 --tensor_parallel_2 2 "
         "--vocab_size 128 --sequence_length 8 --hidden_size 64 --heads 4").split()
LLAMA = ("--layers 2 --tensor_parallel 4 --attention_tensor_parallel 4 --vocab_size 128 "
         "--sequence_length 16 --hidden_size 128 --heads 8 --micro_batch_size 1").split()
MAGMA = ("--width 36 --image_resolution 384 --sequence_length 8 --vocab_size 128 "
         "--hidden_size 64 --transformer.layers 2 --heads 8 --rotary_dim 8 --tensor_parallel 2 "
         "--downsample_factor 4 --attention_serialisation 1").split()
TINY = ["--config", "tiny"]


class Entry(NamedTuple):
    name: str
    folder: str
    script: str
    args: List[str]
    replicas: int          # global replicas of the preset (for the multi-instance launchers)
    instances: bool        # run under poprun / Ray instances too


ENTRIES = [
    Entry("bert_pretraining", "nlp/bert/popxl", "pretraining.py", TINY + F32, 1, False),
    Entry("bert_squad_training", "nlp/bert/popxl", "squad_training.py", TINY + F32, 1, False),
    Entry("bert_squad_inference", "nlp/bert/popxl", "squad_inference.py", TINY, 1, False),
    Entry("gpt3_pretraining", "nlp/gpt3_2.7B/popxl", "pretraining.py", TINY + F32, 8, True),
    Entry("gpt3_mnli_finetuning", "nlp/gpt3_2.7B/popxl", "mnli_finetuning.py", TINY, 1, False),
    Entry("gpt3_generative_inference", "nlp/gpt3_2.7B/popxl", "generative_inference.py", TINY,
          1, False),
    Entry("gpt3_mnli_inference", "nlp/gpt3_2.7B/popxl", "mnli_inference.py", TINY, 1, False),
    Entry("gptj_inference", "nlp/gpt_j/popxl", "inference.py", TINY, 1, False),
    Entry("gptj_finetuning", "nlp/gpt_j/popxl", "finetuning.py", TINY, 8, True),
    Entry("gpt3_175B_pretraining", "nlp/gpt3_175B/popxl", "pretraining.py", TINY + F32, 8, True),
    Entry("t5_inference", "nlp/t5/popxl", "inference.py", TINY, 1, False),
    Entry("t5_finetuning", "nlp/t5/popxl", "finetuning.py", TINY, 4, True),
    Entry("bloom_inference", "nlp/bloom/popxl", "inference.py", BLOOM, 4, True),
    Entry("dolly_inference", "nlp/dolly/popxl", "inference.py", TINY, 4, True),
    Entry("llama_inference", "nlp/llama/popxl", "inference.py", LLAMA, 4, True),
    Entry("magma_inference", "multimodal/magma/popxl", "inference.py", MAGMA, 2, True),
]
LAUNCHERS = ("one", "poprun", "ray")
_STEP = re.compile(r"(?:[Dd]uration|step time|Step time)[^0-9]*([0-9.]+)\s*s")


def command(entry: Entry, launcher: str) -> List[str]:
    py = [sys.executable, entry.script, *entry.args]
    if launcher == "one":
        return py
    if launcher == "poprun":
        return [sys.executable, "-m", "popxl_launch.poprun", "--num-instances", "2",
                "--num-replicas", str(entry.replicas), *py]
    return [sys.executable, "-m", "popxl_launch", "--backend", "ray", "--instances", "2",
            "--replicas", str(entry.replicas), entry.script, *entry.args]


def run(entry: Entry, launcher: str, examples: str, env: Dict[str, str],
        timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        res = subprocess.run(command(entry, launcher), cwd=os.path.join(examples, entry.folder),
                             env=env, capture_output=True, text=True, timeout=timeout)
        code, text = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        code, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(
            e.stdout, bytes) else (e.stdout or "")
    wall = time.monotonic() - t0
    steps = [float(m) for m in _STEP.findall(text)]
    last = next((line for line in reversed(text.strip().splitlines()) if line.strip()), "")
    return {"ok": code == 0, "wall": wall, "step": statistics.median(steps) if steps else None,
            "last": last[-160:], "code": code}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", required=True, help="a clone of graphcore/examples")
    p.add_argument("--launchers", nargs="+", default=["one"], choices=LAUNCHERS)
    p.add_argument("--only", nargs="+", default=[], help="entry names (default: all)")
    p.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                   help="extra environment for every run (e.g. POPXL_DEBUG_NANS=1)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    if not os.path.isdir(os.path.join(args.examples, "nlp")):
        p.error(f"--examples {args.examples!r} is not a clone of graphcore/examples (no nlp/)")
    env = dict(os.environ)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            p.error(f"--env takes NAME=VALUE, got {item!r}")
        env[name] = value
    entries = [e for e in ENTRIES if not args.only or e.name in args.only]
    rows = []
    for e in entries:
        row = [e.name]
        for launcher in args.launchers:
            if launcher != "one" and not e.instances:
                row.append("")
                continue
            r = run(e, launcher, args.examples, env, args.timeout)
            cell = (f"{r['wall']:.1f} s" + (f" ({r['step']:.3g} s/step)" if r["step"] else "")
                    if r["ok"] else f"failed ({r['code']}): {r['last']}")
            row.append(cell)
            print(f"{e.name} [{launcher}]: {cell}", file=sys.stderr, flush=True)
        rows.append(row)
    names = {"one": "one process", "poprun": "poprun, 2 instances", "ray": "Ray, 2 instances"}
    head = ["entry point"] + [names[launcher] for launcher in args.launchers]
    if args.markdown:
        extra = f"; environment {' '.join(args.env)}" if args.env else ""
        print(f"Measured: {machine_line()}{extra}\n")
        print(markdown_table(head, rows))
    else:
        for row in [head] + rows:
            print("  ".join(str(c) for c in row))
    return 0 if all("failed" not in str(c) for row in rows for c in row) else 1


if __name__ == "__main__":
    sys.exit(main())
