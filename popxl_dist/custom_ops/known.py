"""The emulator's implementations of the C++ custom op bindings Graphcore's applications ship.

Each is registered for the exact C++ sources it implements (their `sources_digest`): a copy of
such a binding that differs in anything but comments and whitespace fails as unknown, rather
than running an implementation of other sources.

* `rotary_pos_embed_binding.RotaryPosEmbedOp` as popxl.addons ships it (interleaved pairs):
  the built-in `RotaryPosEmbed` op, as `popxl_addons.ops.rotary_pos_embed` builds it.
* `rotary_pos_embed_binding.RotaryPosEmbedOp` of the Dolly and Llama applications
  (`modelling/rotary_pos_embed/`): their forward rotates the two halves of the rotary features
  instead of interleaved pairs; their gradient op is popxl.addons' unchanged (the interleaved
  inverse rotation), so it is not the derivative of their forward. Both are emulated as the
  C++ computes them (the applications only run inference).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..tensor import Tensor, TensorSpec
from .index_map import index_map
from .op import CustomOp, GradInputs

__all__ = ["RotaryPosEmbedHalves", "ADDONS_ROTARY_SOURCES", "APPS_ROTARY_HALVES_SOURCES",
           "BUILTINS"]

# sources_digest() of popxl.addons' rotary_pos_embed binding (as released with SDK 3.4) and of
# the copy modified to rotate halves in the Dolly and Llama applications (graphcore/examples 3.4)
ADDONS_ROTARY_SOURCES = "51a4a1019f4ec65b950a0ebefbdf333f687e695c8b2b99e57165d86ace0cbfad"
APPS_ROTARY_HALVES_SOURCES = "a817d0b3791f5169413ef057ce9f3c001bf585953b228f90c51fa05d49784186"


class AddonsRotaryPosEmbedOp:
    """`RotaryPosEmbedOp` of popxl.addons' binding: builds the built-in `RotaryPosEmbed` op."""

    @staticmethod
    def createOpInGraph(graph, inputs, outputs, rotaryDim, settings=None):  # noqa: N803 (C++ name)
        from .._pb_shim import op_view
        from ..ops._custom import rotary_pos_embed

        g = getattr(graph, "_graph", graph)
        ins = [g._tensor(t) for t in index_map(inputs, "RotaryPosEmbedOp.createOpInGraph: "
                                                       "inputs")]
        if len(ins) != 3:
            raise ValueError(f"RotaryPosEmbedOp.createOpInGraph: expected 3 inputs (t, sin, "
                             f"cos), got {len(ins)}")
        out_ids = index_map(outputs, "RotaryPosEmbedOp.createOpInGraph: outputs")
        name = settings.get("name") if isinstance(settings, dict) else None
        out = rotary_pos_embed(*ins, rotaryDim, settings_name=name, out_ids=out_ids,
                               notify=False)
        return op_view(g, g._data.producer[out.id])


class RotaryPosEmbedHalves(CustomOp):
    """RoPE of Graphcore's Dolly and Llama applications: `t` `(batch, seq, heads, head_dim)`, its
    first `rotary_dim` features split into halves x1, x2, turned by the angle of the position:
    `(x1 cos - x2 sin, x2 cos + x1 sin)`; the other features pass through. `sin` / `cos` are
    `(1 or batch, seq, rotary_dim // 2)`. float16 computes in float32 and rounds once."""

    op_type = "RotaryPosEmbed"
    domain = "popxl.addons.ops"
    attributes = ("rotary_dim",)

    def setup(self, t: TensorSpec, sin: TensorSpec, cos: TensorSpec) -> TensorSpec:
        from ..ops._custom import check_rotary_args

        self.rotary_dim = check_rotary_args("RotaryPosEmbed (rotate halves)", t, sin, cos,
                                            self.rotary_dim)
        return t

    def compute(self, t: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> np.ndarray:
        r = int(self.rotary_dim)
        h = r // 2
        out = t.astype(np.float32)
        x1 = out[..., :h].copy()
        x2 = out[..., h:r].copy()
        s = sin.astype(np.float32)[:, :, None, :]
        c = cos.astype(np.float32)[:, :, None, :]
        out[..., :h] = x1 * c - x2 * s
        out[..., h:r] = x2 * c + x1 * s
        return out

    def grad(self, grad_outputs: Sequence[Optional[Tensor]],
             fwd: GradInputs) -> Sequence[Optional[Tensor]]:
        from ..ops._custom import rotary_pos_embed

        dx = rotary_pos_embed(grad_outputs[0], fwd.input(1), fwd.input(2), int(self.rotary_dim),
                              op_type="RotaryPosEmbedGrad")
        return [dx, None, None]


# (binding, class name, implementation, sources_digest): registered by `bindings` before the
# user's registrations are looked at
BUILTINS = [
    ("rotary_pos_embed_binding", "RotaryPosEmbedOp", AddonsRotaryPosEmbedOp,
     ADDONS_ROTARY_SOURCES),
    ("rotary_pos_embed_binding", "RotaryPosEmbedOp", RotaryPosEmbedHalves,
     APPS_ROTARY_HALVES_SOURCES),
]
