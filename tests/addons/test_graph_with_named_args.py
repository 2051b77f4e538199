"""GraphWithNamedArgs / BoundGraph, and `print_schedule` against the seed tutorials' text."""
from functools import partial
from typing import Optional

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons


class Linear(addons.Module):
    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight", partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
            x.dtype)
        y = x @ w
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + b
        return y


class Net(addons.Module):
    def __init__(self, cache: Optional[addons.GraphCache] = None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc2 = Linear(512)
        self.fc3 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        x = self.fc4(x)
        return x


class NetOutlined(addons.Module):
    def __init__(self, cache: Optional[addons.GraphCache] = None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        facts, subgraph = Linear(512).create_graph(x)
        named_tensors_0 = self.add_variable_inputs("fc2", facts)
        fc2 = subgraph.bind(named_tensors_0)
        named_tensors_1 = self.add_variable_inputs("fc3", facts)
        fc3 = subgraph.bind(named_tensors_1)
        (x,) = fc2.call(x)
        x = ops.gelu(x)
        (x,) = fc3.call(x)
        x = ops.gelu(x)
        x = self.fc4(x)
        return x


# Copied from the seed tutorials (000 / 002).
LINEAR_SCHEDULE = """\
Graph : Linear_subgraph(0)
  (%1, weight=%2, bias=%3) -> (%5) {
    MatMul.100 (%1 [(2, 4) float32], %2 [(4, 32) float32]) -> (%4 [(2, 32) float32])
    Add.101 (%4 [(2, 32) float32], %3 [(32,) float32]) -> (%5 [(2, 32) float32])
  }"""

NET_SCHEDULE = """\
Graph : Net_subgraph(0)
  (%1, fc1.weight=%2, fc1.bias=%3, fc2.weight=%4, fc2.bias=%5, fc3.weight=%6, fc3.bias=%7, fc4.weight=%8, fc4.bias=%9) -> (%21) {
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    MatMul.104 (%13 [(1, 512) float32], %4 [(512, 512) float32]) -> (%14 [(1, 512) float32])
    Add.105 (%14 [(1, 512) float32], %5 [(512,) float32]) -> (%15 [(1, 512) float32])
    Gelu.106 (%15 [(1, 512) float32]) -> (%16 [(1, 512) float32])
    MatMul.107 (%16 [(1, 512) float32], %6 [(512, 512) float32]) -> (%17 [(1, 512) float32])
    Add.108 (%17 [(1, 512) float32], %7 [(512,) float32]) -> (%18 [(1, 512) float32])
    Gelu.109 (%18 [(1, 512) float32]) -> (%19 [(1, 512) float32])
    MatMul.110 (%19 [(1, 512) float32], %8 [(512, 10) float32]) -> (%20 [(1, 10) float32])
    Add.111 (%20 [(1, 10) float32], %9 [(10,) float32]) -> (%21 [(1, 10) float32])
  }"""

NET_OUTLINED_SCHEDULE = """\
Graph : NetOutlined_subgraph(0)
  (%1, fc1.weight=%2, fc1.bias=%3, fc2.weight=%4, fc2.bias=%5, fc3.weight=%6, fc3.bias=%7, fc4.weight=%8, fc4.bias=%9) -> (%19) {
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    Call.106(Linear_subgraph(1)) (%13 [(1, 512) float32], %4 [(512, 512) float32], %5 [(512,) float32]) -> (%14 [(1, 512) float32])
    Gelu.107 (%14 [(1, 512) float32]) -> (%15 [(1, 512) float32])
    Call.108(Linear_subgraph(1)) (%15 [(1, 512) float32], %6 [(512, 512) float32], %7 [(512,) float32]) -> (%16 [(1, 512) float32])
    Gelu.109 (%16 [(1, 512) float32]) -> (%17 [(1, 512) float32])
    MatMul.110 (%17 [(1, 512) float32], %8 [(512, 10) float32]) -> (%18 [(1, 10) float32])
    Add.111 (%18 [(1, 10) float32], %9 [(10,) float32]) -> (%19 [(1, 10) float32])
  }"""

# (module factory, input shape, expected schedule, expected factory keys)
SCHEDULES = [
    (lambda: Linear(32), (2, 4), LINEAR_SCHEDULE, ["weight", "bias"]),
    (Net, (28, 28), NET_SCHEDULE,
     ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
      "fc4.weight", "fc4.bias"]),
    (NetOutlined, (28, 28), NET_OUTLINED_SCHEDULE,
     ["fc1.weight", "fc1.bias", "fc4.weight", "fc4.bias", "fc2.weight", "fc2.bias",
      "fc3.weight", "fc3.bias"]),
]


@pytest.mark.parametrize("make, shape, expected, keys", SCHEDULES,
                         ids=["Linear", "Net", "NetOutlined"])
def test_print_schedule_matches_seed(make, shape, expected, keys):
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = make().create_graph(popxl.TensorSpec(shape, popxl.float32))
        assert graph.print_schedule() == expected
        assert list(facts.to_dict().keys()) == keys
        assert str(facts.to_dict().keys()) == f"dict_keys({keys!r})"


def test_seed_linear_program_prints_and_runs():
    np.random.seed(42)
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        facts, linear_graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        text = str(facts)
        assert text.startswith("{'weight': <popxl_addons.variable_factory.VariableFactory "
                               "object at 0x") and "'bias': <popxl_addons" in text
        variables = facts.init()
        assert repr(variables) == (
            "{'bias': Tensor[bias popxl.dtypes.float32 (32,)], "
            "'weight': Tensor[weight popxl.dtypes.float32 (4, 32)]}")
        bound = linear_graph.bind(variables)
        assert repr(bound).startswith("<popxl_addons.graph.BoundGraph object at 0x")
        x = np.random.rand(2, 4).astype(np.float32)
        (out,) = bound.call(popxl.variable(x, name="x"))
        stream = addons.host_store(out)
    session = popxl.Session(ir, "ipu_hw")
    data = session.get_tensors_data(variables.tensors)
    with session:
        y = session.run()[stream]
    np.testing.assert_allclose(y, x @ data[variables.weight] + data[variables.bias], rtol=1e-6)


def test_two_bound_graphs_share_the_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, g = Linear(3).create_graph(popxl.TensorSpec((1, 2), popxl.float32))
        v1, v2 = facts.init(), facts.init()
        b1, b2 = g.bind(v1), g.bind(v2)
        assert b1.graph is b2.graph and b1.args != b2.args
        x = popxl.variable(np.ones((1, 2), np.float32))
        info1 = b1.call_with_info(x)
        info2 = b2.call_with_info(x, args={g.args.bias: v1.bias})  # call-time args win
        assert info2.graph_to_parent(g.args.bias) == v1.bias
        assert info1.called_graph == g.graph
        rebound = b1.bind({g.args.weight: v2.weight})
        assert rebound.args[g.args.weight] == v2.weight and rebound.args[g.args.bias] == v1.bias
        io = b1.subgraph_io_map(x, outs=info1.outputs)
        assert io[g.graph.inputs[0]] == x and io[g.graph.outputs[0]] == info1.outputs[0]


def test_graph_with_named_args_misc():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, g = Linear(3).create_graph(popxl.TensorSpec((1, 2), popxl.float32))
        with pytest.raises(AttributeError, match="Not a gradient graph"):
            g.grad_graph_info
        c = g.copy()
        assert c.graph is g.graph and c.args is not g.args and c.args.to_dict() == g.args.to_dict()
        assert c.from_module is None and g.from_module is not None
        assert not hasattr(g, "subgraph")
        # bind only binds common keys; extras are ignored
        v = facts.init()
        extra = addons.NamedTensors.from_dict({**v.to_dict(), "other": v.bias})
        assert set(g.bind(extra).args) == set(g.args.tensors)
        with pytest.raises(ValueError, match="method should be one of"):
            g.autodiff(method="nope")


def test_print_schedule_named_args_use_sorted_unpack_and_grad_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, g = Linear(3).create_graph(popxl.TensorSpec((1, 2), popxl.float32))
        dg = addons.autodiff(g)
        text = dg.print_schedule()
        assert text.splitlines()[0] == f"Graph : {dg.graph.name}"
        assert text.splitlines()[1].startswith("  (%1") and text.endswith("  }")
        # the forward graph gained no stitched outputs it did not need
        assert g.print_schedule().splitlines()[1].startswith("  (%1, weight=%2, bias=%3)")
