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
    # data at construction time: variables and constants have it, op outputs do not
    assert x._pb_tensor.hasTensorData() and w._pb_tensor.hasTensorData()
    assert not pt.hasTensorData() and not gi.hasTensorData()
    assert pt.info.data_type_lcase() == "float"
    assert y.id in ir._pb_ir.getMainGraph() and "no such id" not in ir._pb_ir.getMainGraph()


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


# --- upstream's lowering, as programs inspect it -------------------------------------------
def _ops_built_by(fn):
    """The op views of the graph `fn(x, w)` builds (x (2, 4), w (4, 4), both float32)."""
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(fn, popxl.TensorSpec((2, 4), popxl.float32),
                            popxl.TensorSpec((4, 4), popxl.float32))
    return g._pb_graph.getOps()


# builder -> (upstream's `opType()`, upstream's `_ir.op` class, `op.opid` string)
LOWERINGS = [
    (lambda x, w: x - 1.0, "Sub", "SubtractOp", "ai.onnx.Sub:7"),
    (lambda x, w: ops.sub(x, x), "Sub", "SubtractOp", "ai.onnx.Sub:7"),
    (lambda x, w: -x, "Neg", "NegateOp", "ai.onnx.Neg:6"),
    (lambda x, w: x + x, "Add", "AddOp", "ai.onnx.Add:6"),
    (lambda x, w: ops.layer_norm(x, w[0], w[1]), "GroupNormalization", "GroupNormOp",
     "ai.graphcore.GroupNormalization:1"),
    (lambda x, w: ops.group_norm(x, w[0], w[1], 2), "GroupNormalization", "GroupNormOp",
     "ai.graphcore.GroupNormalization:1"),
    (lambda x, w: ops.isinf(x), "IsInf", "IsInf", "ai.onnx.IsInf:10"),
    (lambda x, w: ops.isnan(x), "IsNaN", "IsNaN", "ai.onnx.IsNaN:9"),
    (lambda x, w: ops.sum(x, 0), "ReduceSum", "ReduceSumOp", "ai.onnx.ReduceSum:1"),
    (lambda x, w: ops.split(x, 2, 1)[0], "Split", "SplitOp", "ai.onnx.Split:2"),
    (lambda x, w: ops.interpolate(ops.reshape(x, (1, 1, 2, 4)), (1, 1, 2, 2)), "Resize",
     "ResizeOp", "ai.graphcore.Resize:1"),
    (lambda x, w: ops.onehot(ops.cast(x[0], popxl.int32), popxl.constant(4),
                             popxl.constant(np.float32([0, 1])), 0), "OneHot", "OnehotOp",
     "ai.onnx.OneHot:9"),
    (lambda x, w: ops.var_updates.adamax_updater(x, x, time_step=popxl.constant(np.float32(1))),
     "AdamUpdater", "AdamUpdaterOp", "ai.graphcore.AdamUpdater:1"),
    (lambda x, w: ops.var_updates.lamb_updater(x, x, time_step=popxl.constant(np.float32(1)),
                                               beta1=0.9, beta2=0.99),
     "AdamUpdater", "AdamUpdaterOp", "ai.graphcore.AdamUpdater:1"),
]


@pytest.mark.parametrize("build,op_type,cls,opid", LOWERINGS)
def test_op_views_report_upstreams_lowering(build, op_type, cls, opid):
    views = [v for v in _ops_built_by(build) if v.opType() == op_type]
    assert views, [v.opType() for v in _ops_built_by(build)]
    v = views[-1]
    assert isinstance(v, getattr(_ir.op, cls)) and type(v).__name__ == cls
    assert str(v.opid) == opid and v.str() == f"{v.id} ({opid})"


def test_graph_inspection_of_an_attention_layer_counts_upstreams_classes():
    """The pattern of Graphcore's applications' graph tests: count op classes in a layer."""
    from popxl_addons.testing_utils import ops_of_type

    def attention(x, w):
        q = x @ w
        k = x @ w
        scores = (q @ k.T) * 0.5
        mask = 1.0 - ops.reshape(x[0], (1, 4))[:, :2]      # (1, 2)
        probs = ops.softmax(scores - mask * 100.0, -1)
        return ops.layer_norm(probs @ x + x, w[0], w[1])
    graph_ops = _ops_built_by(attention)
    assert ops_of_type(graph_ops, _ir.op.MatMulOp) == 4
    assert ops_of_type(graph_ops, _ir.op.SubtractOp) == 2
    assert ops_of_type(graph_ops, _ir.op.GroupNormOp) == 1
    assert ops_of_type(graph_ops, _ir.op.SoftmaxOp) == 1
    assert ops_of_type(graph_ops, "Sub") == 2


def test_print_schedule_uses_upstreams_op_types():
    """`GraphWithNamedArgs.print_schedule` prints `opType()` (so the seeds' `AdamUpdater`,
    `Neg`, `Accumulate` lines keep their names), and AdaMax / LAMB updaters print as upstream's
    one AdamUpdater op."""
    import popxl_addons as addons
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(
            lambda m, v: ops.var_updates.adamax_updater(m, v, time_step=popxl.constant(
                np.float32(1))) - m,
            popxl.TensorSpec((2,), popxl.float32), popxl.TensorSpec((2,), popxl.float32))
    text = addons.GraphWithNamedArgs(g).print_schedule()
    assert "AdamUpdater." in text and "AdaMax" not in text and "Sub." in text


def test_modifies_index():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32), name="a")
        b = popxl.variable(np.ones(2, np.float32), name="b")
        ops.add_(a, b)
        c = a + b
        g = ir.create_graph(lambda t: ops.var_updates.accumulate_(t, t), popxl.TensorSpec(
            (2,), popxl.float32, ))
        info = ops.call_with_info(g, a)
        info.set_parent_input_modified(a)
    add_inplace, add, call = ir.main_graph._pb_graph.getOps()
    assert add_inplace.modifiesIndex(0) and not add_inplace.modifiesIndex(1)
    assert not add.modifiesIndex(0) and not add.modifiesIndex(1)
    assert call.modifiesIndex(0)
    del c


def test_tensor_and_data_types_are_popart_enums():
    ir, g, x, w, y = _program()
    info = y._pb_tensor.info
    assert info.dataType() is _ir.DataType.FLOAT and info.dataType() == "FLOAT"
    assert x._pb_tensor.tensorType() is _ir.TensorType.Variable
    assert y._pb_tensor.tensorType() == _ir.TensorType.ActGrad == "ActGrad"
    import popart
    assert popart.DataType is _ir.DataType and popart.DataType.FLOAT8_143.name == "FLOAT8_143"


def test_set_patterns_and_apply_pre_alias_patterns():
    """`ir._pb_ir.setPatterns(Patterns(level))` then `applyPreAliasPatterns(graph)`, as
    popxl_addons does: at Default, OpToIdentity turns identical-input all-reduces into
    identities; at Minimal it does not."""
    from popxl_addons.ops.replicated_all_reduce_TP import replicated_all_reduce_identical_inputs
    for level, replaced in ((_ir.patterns.PatternsLevel.Minimal, False),
                            (_ir.patterns.PatternsLevel.Default, True)):
        ir = popxl.Ir(replication=2)
        with ir.main_graph:
            g = ir.create_graph(replicated_all_reduce_identical_inputs,
                                popxl.TensorSpec((2,), popxl.float32))
        ir._pb_ir.setPatterns(_ir.patterns.Patterns(level))
        assert ir._pb_ir.getPatterns().level is level
        for pg in ir._pb_ir.getAllGraphs():
            ir._pb_ir.applyPreAliasPatterns(pg)
            ir._pb_ir.applyInplacePattern(pg)
        types = [op.opType() for op in g._pb_graph.getOps()]
        assert (types == ["Identity"]) == replaced, types
    with pytest.raises(TypeError, match="Patterns"):
        ir._pb_ir.setPatterns("default")


def test_internal_ir_names_programs_import():
    from popart._internal.ir import (AccumulationType, DataType, NumInputs,  # noqa: F401
                                     OperatorIdentifier, OptionalFloat, ReplicaGrouping,
                                     Settings, TensorType)
    opid = OperatorIdentifier("ai.graphcore", "MyOp", 1, NumInputs(1, 2), 1)
    assert str(opid) == "ai.graphcore.MyOp:1" and opid.numInputs.max == 2
    assert opid == OperatorIdentifier("ai.graphcore", "MyOp", 1)
    assert not OptionalFloat().has_value() and OptionalFloat(0.5).value() == 0.5
    assert _ir.op.BranchInfo("g", {1: 0}, {0: 0}).inputIndicesMap == {1: 0}
    assert isinstance(_ir.op.SerialiseSettings(), _ir.op.SerialiseSettings)
    ir, g, *_ = _program()
    assert isinstance(g._pb_graph.getOps()[0].settings, Settings)


def test_log_ir_logs_every_graph_on_popart_s_ir_logger_at_debug(capfd):
    import popart

    ir, g, x, w, y = _program()
    capfd.readouterr()
    ir._pb_ir.logIr()
    assert capfd.readouterr().err == ""                   # WARN by default: nothing
    popart.getLogger().setLevel("DEBUG")
    try:
        ir._pb_ir.logIr()
    finally:
        popart.getLogger().setLevel("WARN")
    err = capfd.readouterr().err
    assert "popart:ir" in err and "Logging the IR:" in err and "End IR" in err
    assert f"Graph '{g.id}': MatMul." in err and "Gelu." in err and "Graph '': Call." in err


def test_op_views_answer_upstreams_op_queries():
    """isOptimizerOp, getFactor / getAxis of the accumulate ops, getSettings, and
    PbTensor.isAliased (in-place and view ops alias their input 0; copies do not)."""
    ir = popxl.Ir()
    g = ir.main_graph
    with g:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        f = popxl.variable(np.float32(2), name="f")
        ops.var_updates.accumulator_scale_(a, 0.125)
        ops.var_updates.accumulator_scale_(a, f)
        idx = popxl.variable(np.array([0, 1], np.int32), name="idx")
        ops.var_updates.sparse_accumulate_(a, popxl.variable(np.ones((2, 2), np.float32)), idx,
                                           axis=1, f=0.5)
        with popxl.io_tiles():
            s = a + 1.0
        b = popxl.variable(np.ones((2, 3), np.float32), name="b")
        ops.reshape_(b, (3, 2))
        c = popxl.variable(np.ones((2, 3), np.float32), name="c")
        ops.reshape(c, (6,))
    scale0, scale1, sparse, add = g._pb_graph.getOps()[:4]
    assert scale0.isOptimizerOp() and sparse.isOptimizerOp() and not add.isOptimizerOp()
    assert (scale0.getFactor().val(), scale0.getFactor().isConst()) == (0.125, True)
    assert (scale1.getFactor().val(), scale1.getFactor().isConst()) == (0.0, False)
    assert sparse.getFactor().val() == 0.5 and sparse.getAxis() == 1
    assert add.getSettings().tileSet == _ir.TileSet.IO and s.tile_set == "io"
    with pytest.raises(AttributeError, match="has no factor"):
        add.getFactor()
    assert a._pb_tensor.isAliased() and b._pb_tensor.isAliased()
    assert not c._pb_tensor.isAliased() and not f._pb_tensor.isAliased()


def test_call_site_info_op_is_upstreams_op_view():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        w = popxl.variable(np.ones(2, np.float32), name="w")

        def by_ref(x: popxl.TensorByRef, y):
            ops.var_updates.accumulate_(x, y)

        g = ir.create_graph(by_ref, v, w)
        info = ops.call_with_info(g, v, w)
    assert isinstance(info._op, _ir.op.CallOp) and info._op.opType() == "Call"
    assert info._op.modifiesIndex(0) and not info._op.modifiesIndex(1)
    assert info.called_graph is g and info.graph_to_parent(g.inputs[0]) is v
    with ir.main_graph:
        loop = ops.repeat_with_info(g, 3, v, w)
    # upstream's LoopOp inputs start with the trip count and the condition
    assert [loop._op.modifiesIndex(i) for i in range(4)] == [False, False, True, False]
