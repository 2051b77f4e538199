"""The layers' `torch_mapping`: GroupNorm, Conv2D, Linear and LayerNorm with weights copied from a
torch-shaped layer give the outputs of PyTorch's GroupNorm, Conv2d, Linear and LayerNorm, written
in NumPy (the layer is a stand-in with torch's parameter shapes: tests/references.py). With torch
installed (the optional `torch` extra), the mappings also read real `torch.nn` layers."""
import numpy as np
import pytest

import popxl
import references as ref
from popxl_addons.layers import Conv2D, GroupNorm, LayerNorm, Linear
from popxl_addons.testing_utils import TensorInput, run_module

RNG = np.random.default_rng(5)
F64 = np.float64


def _group_norm(x, p, groups):
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1).astype(F64)
    y = ((xg - xg.mean(2, keepdims=True)) / np.sqrt(xg.var(2, keepdims=True) + 1e-5))
    cs = (1, c) + (1,) * (x.ndim - 2)
    return y.reshape(x.shape) * p["weight"].reshape(cs) + p["bias"].reshape(cs)


# (popxl layer, torch.nn class name and arguments, torch's parameter shapes, input shape,
#  torch's forward in NumPy)
CASES = [
    (lambda: GroupNorm(2), ("GroupNorm", (2, 4), {}), {"weight": (4,), "bias": (4,)},
     (2, 4, 3, 3), lambda x, p: _group_norm(x, p, 2)),
    (lambda: Conv2D(3, 2, paddings=(1, 0, 1, 0)), ("Conv2d", (4, 3, 2), {"padding": (1, 0)}),
     {"weight": (3, 4, 2, 2), "bias": (3,)}, (2, 4, 5, 5),
     lambda x, p: ref.conv(x, p["weight"], pads=(1, 0, 1, 0)) + p["bias"].reshape(1, -1, 1, 1)),
    (lambda: Linear(3), ("Linear", (4, 3), {}), {"weight": (3, 4), "bias": (3,)}, (5, 4),
     lambda x, p: x.astype(F64) @ p["weight"].T + p["bias"]),
    (lambda: LayerNorm(), ("LayerNorm", (4,), {}), {"weight": (4,), "bias": (4,)}, (5, 4),
     lambda x, p: ref.layer_norm(x, p["weight"], p["bias"], eps=1e-5)),
]
IDS = ["GroupNorm", "Conv2D", "Linear", "LayerNorm"]


def _run(module, layer, x):
    m = module()
    out, = run_module(m, TensorInput(x),
                      weights=lambda vs: type(m).torch_mapping(vs, layer, popxl.float32))
    return out


@pytest.mark.parametrize("module,torch_layer,shapes,shape,forward", CASES, ids=IDS)
def test_layer_matches_torch_definition(module, torch_layer, shapes, shape, forward):
    x = RNG.normal(size=shape).astype(np.float32)
    params = {k: RNG.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    out = _run(module, ref.TorchLikeLayer(**params), x)
    want = forward(x, {k: v.astype(F64) for k, v in params.items()})
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("module,torch_layer,shapes,shape,forward", CASES, ids=IDS)
def test_torch_mapping_reads_real_torch_layers(module, torch_layer, shapes, shape, forward):
    """Needs torch (optional extra): the mapping reads a real `torch.nn` layer's parameters
    (shapes as the stand-in's, `.data` of tensors that require grad)."""
    torch = pytest.importorskip("torch")
    name, args, kwargs = torch_layer
    layer = getattr(torch.nn, name)(*args, **kwargs)
    params = {k: p.detach().numpy().copy() for k, p in layer.named_parameters()}
    assert {k: v.shape for k, v in params.items()} == shapes
    x = RNG.normal(size=shape).astype(np.float32)
    np.testing.assert_array_equal(_run(module, layer, x),
                                  _run(module, ref.TorchLikeLayer(**params), x))


def test_conv2d_attributes_as_upstream():
    c = Conv2D(8, (3, 2), partials_types="half")
    assert (c.k_h, c.k_w) == (3, 2) and c.partial_types == "half" and c.pad_type == "not_set"
