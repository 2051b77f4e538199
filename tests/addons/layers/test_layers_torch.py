"""The layers against PyTorch: GroupNorm, Conv2D, Linear and LayerNorm with weights copied by
their `torch_mapping` give torch's outputs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import popxl  # noqa: E402
from popxl_addons.layers import Conv2D, GroupNorm, LayerNorm, Linear  # noqa: E402
from popxl_addons.testing_utils import TensorInput, run_module  # noqa: E402

RNG = np.random.default_rng(5)


def _torch_out(layer, x):
    with torch.no_grad():
        return layer(torch.from_numpy(x)).numpy()


def _randomise(layer):
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.from_numpy(RNG.normal(size=p.shape).astype(np.float32)))
    return layer


@pytest.mark.parametrize("module,layer,shape", [
    (lambda: GroupNorm(2), lambda: torch.nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    (lambda: Conv2D(3, 2, paddings=(1, 0, 1, 0)),
     lambda: torch.nn.Conv2d(4, 3, 2, padding=(1, 0)), (2, 4, 5, 5)),
    (lambda: Linear(3), lambda: torch.nn.Linear(4, 3), (5, 4)),
    (lambda: LayerNorm(), lambda: torch.nn.LayerNorm(4), (5, 4)),
], ids=["GroupNorm", "Conv2D", "Linear", "LayerNorm"])
def test_layer_matches_torch(module, layer, shape):
    x = RNG.normal(size=shape).astype(np.float32)
    t_layer = _randomise(layer())
    m = module()
    out, = run_module(m, TensorInput(x),
                      weights=lambda vs: type(m).torch_mapping(vs, t_layer, popxl.float32))
    np.testing.assert_allclose(out, _torch_out(t_layer, x), rtol=1e-4, atol=1e-5)


def test_conv2d_attributes_as_upstream():
    c = Conv2D(8, (3, 2), partials_types="half")
    assert (c.k_h, c.k_w) == (3, 2) and c.partial_types == "half" and c.pad_type == "not_set"
