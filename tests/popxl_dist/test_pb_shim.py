"""`_pb_ir` / `_pb_graph` / `_pb_tensor` / `_pb_session` views and `popart._internal.ir`: graph
and op counts, op identity strings, isinstance on op classes, tensors, hooks, topo constraints,
and the `_from_pb` round trips."""
import numpy as np
import pytest

import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popxl.tensor import Tensor


def _program():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((4, 3), np.float32), name="w")

        def lin(x, w):
            return ops.gelu(x @ w)

        g = ir.create_graph(lin, popxl.TensorSpec((2, 4), popxl.float32), w.spec)
        x = popxl.variable(np.ones((2, 4), np.float32), name="x")
        y, = ops.call(g, x, w)
    return ir, g, x, w, y


def test_graphs_ops_and_op_strings():
    ir, g, x, w, y = _program()
    graphs = ir._pb_ir.getAllGraphs()
    assert len(graphs) == 2 and {pg.id.str() for pg in graphs} == {"", g.id}
    ops_ = g._pb_graph.getOps()
    assert [o.opType() for o in ops_] == ["MatMul", "Gelu"]
    mm = ops_[0]
    assert mm.id >= 100 and mm.str() == f"{mm.id} (ai.onnx.MatMul:9)"
    assert str(mm.opid) == "ai.onnx.MatMul:9" and ops_[1].opid.domain == "ai.graphcore"
    assert mm.getName() == "matmul" and mm.name() == "matmul"
    assert mm.debugName() == (f"Op(matmul (ai.onnx.MatMul:9), inputs=[{g.id}/x, {g.id}/w], "
                              f"outputs=[{mm.outId(0)}])")
    assert [t.id for t in mm.getInputTensors()] == [f"{g.id}/x", f"{g.id}/w"]
    assert mm.inTensorCount() == 2 and mm.outTensorCount() == 1 and mm.hasInput(1)
    assert g._pb_graph.getOpSchedule(True) == ops_
    call, = ir.main_graph._pb_graph.getOps()
    assert call.getCalledGraph().id == g.id
    assert call.debugName().startswith(f"Op(--call--{g.id} (ai.graphcore.Call:1), "
                                       f"subgraphs=[{g.id}({g.id}/x, {g.id}/w; ")
    assert mm.settings.executionContext == popxl.ExecutionContext.Normal
    assert mm.settings.tileSet == popxl.TileSet.Compute and mm.getVirtualGraphId() == 0


def test_isinstance_on_op_classes():
    ir, g, *_ = _program()
    call, = ir.main_graph._pb_graph.getOps()
    mm, gelu = g._pb_graph.getOps()
    assert isinstance(call, _ir.op.CallOp) and isinstance(call, _ir.op.SubgraphOp)
    assert isinstance(mm, _ir.op.MatMulOp) and isinstance(mm, _ir.Op)
    assert not isinstance(mm, _ir.op.CallOp)
    assert _ir.op.collectives.ReplicatedAllReduceOp is _ir.op.ReplicatedAllReduceOp
    from popxl_addons.testing_utils import ops_of_type
    assert ops_of_type(g._pb_graph.getOps(), _ir.op.GeluOp) == 1
    assert ops_of_type(g._pb_graph.getOps(), "MatMul") == 1
    with pytest.raises(AttributeError, match="<OpType>Op"):
        _ir.op.Matmul


def test_tensor_views_and_round_trips():
    ir, g, x, w, y = _program()
    pt = y._pb_tensor
    assert pt.id == y.id and pt.info.shape() == [2, 3] and pt.info.dataType() == "FLOAT"
    assert pt.hasProducer() and pt.getProducer().opType() == "Call"
    assert x._pb_tensor.tensorType() == "Variable" and pt.tensorType() == "ActGrad"
    assert Tensor._from_pb_tensor(pt) is y
    assert popxl.Graph._from_pb(g._pb_graph) is g
    assert popxl.Ir._from_pb(ir._pb_ir) is ir
    gi = g._pb_graph.getInputTensor(1)
    assert gi.isGraphInput() and gi.getGraphInputIndex() == 1
    assert [o.opType() for o in gi.getConsumers()] == ["MatMul"]
    assert g._pb_graph.getInputIndex(gi.id) == 1
    assert ir._pb_ir.getGraph(g.id) == g._pb_graph and ir._pb_ir.hasGraph(g.id)


def test_graph_mutations_through_the_view():
    ir, g, *_ = _program()
    pg = g._pb_graph
    pg.setCanBeRecursivelyAutodiffed(False)
    assert not pg.canBeRecursivelyAutodiffed()
    out_id = pg.getOutputId(0)
    pg.removeOutput(out_id)
    assert g.outputs == ()
    pg.markAsOutput(out_id)
    assert [t.id for t in g.outputs] == [out_id]
    mm = pg.getOps()[0]
    assert mm.useFullyConnectedPass()
    mm.setUseFullyConnectedPass(False)
    assert not pg.getOps()[0].useFullyConnectedPass()


def test_op_created_hooks_get_op_views_and_can_be_removed():
    ir = popxl.Ir()
    seen, in_graph = [], []
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        ctx = popxl.context.get_current_context()
        h = ctx.register_op_created_hook(lambda op: seen.append(op.opType()))
        h2 = ir.main_graph.register_op_created_hook(lambda op: in_graph.append(op.id))
        y = x + 1.0
        g = ir.create_graph(lambda t: t * 2.0, x.spec)      # an op in another graph
        ctx.remove_op_created_hook(h)
        ir.main_graph.remove_op_created_hook(h2)
        y + 1.0
        with pytest.raises(ValueError, match="^Unknown op created hook"):
            ctx.remove_op_created_hook(h)
    assert seen == ["Add", "Mul"]
    assert in_graph == [y._pb_tensor.getProducer().id]
    assert g._pb_graph.getOps()[0].opType() == "Mul"


def test_in_sequence_records_topo_constraints():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        with popxl.in_sequence(True):
            a = x + 1.0
            b = x * 2.0
            with popxl.in_sequence(False):
                x - 1.0
            c = x / 2.0
        d = x + 3.0
    op_a, op_b, op_c, op_d = (t._pb_tensor.getProducer() for t in (a, b, c, d))
    tc = ir.main_graph._pb_graph.topoCons()
    assert tc.contains(op_a, op_b) and tc.contains(op_b, op_c)
    assert tc.getAfters(op_a) == [op_b]
    assert not tc.getBefores(op_d) and not tc.getAfters(op_c)       # outside the sequence
    with pytest.raises(NotImplementedError, match="creation order"):
        tc.insert(op_c, op_a)


def test_internal_ir_value_types():
    bwd = _ir.BwdGraphInfo("g_bwd", [_ir.ExpectedConnection("g/x", _ir.ExpectedConnectionType.Fwd)],
                           [])
    assert bwd.bwdGraphId == "g_bwd" and bwd.bwdGraphId.str() == "g_bwd"
    assert bwd.expectedInputs[0].fwdId == "g/x"
    assert _ir.ExecutionContext is popxl.ExecutionContext and _ir.TileSet is popxl.TileSet
    assert _ir.CollectiveOperator.Add.name == "Add"
    assert _ir.patterns.PatternsLevel.Default.name == "Default"
    assert isinstance(_ir.PrintTensorFmt(), _ir.PrintTensorFmt)


def test_grad_graph_info_from_pb_round_trip():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: ops.gelu(x), popxl.TensorSpec((2,), popxl.float32))
        info = popxl.transforms.autodiff(g)
    pb = info._pb_bwd_info
    assert pb.bwdGraphId == info.graph.id
    again = popxl.transforms.GradGraphInfo._from_pb(ir._pb_ir, g._pb_graph, pb)
    assert again.graph == info.graph and again.forward_graph == g
    assert [(e.fwd_tensor, e.connection_type) for e in again.expected_inputs] == \
        [(e.fwd_tensor, e.connection_type) for e in info.expected_inputs]
    ec = info.expected_inputs[0]
    assert popxl.transforms.ExpectedConnection._from_pb(g, ec._pb_ec).fwd_tensor == ec.fwd_tensor
    assert popxl.transforms.ExpectedConnectionType._from_pb(
        _ir.ExpectedConnectionType.FwdGrad) == popxl.transforms.ExpectedConnectionType.FwdGrad


def test_op_views_also_read_the_record_fields():
    ir, g, *_ = _program()
    mm = g._pb_graph.getOps()[0]
    assert mm.type == "MatMul" and mm.inputs == (f"{g.id}/x", f"{g.id}/w")
    assert mm.exec_ctx == "Normal" and isinstance(mm.attrs, dict)
    with pytest.raises(AttributeError):
        mm.no_such_field
