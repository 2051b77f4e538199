"""Tutorial 2's one-step Adam demo (module written exactly as in the seed) and AdamOptimizerStep."""
from functools import partial
from typing import Union

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.optimizers.adam import AdamOptimizerStep


class Adam(addons.Module):
    # We need to specify `in_sequence` because many operations are in-place
    # and their order shouldn't be changed
    @popxl.in_sequence()
    def build(
        self,
        weight: popxl.TensorByRef,
        grad: popxl.Tensor,
        *,
        lr: Union[float, popxl.Tensor],
        beta1: Union[float, popxl.Tensor] = 0.9,
        beta2: Union[float, popxl.Tensor] = 0.999,
        eps: Union[float, popxl.Tensor] = 1e-5,
        weight_decay: Union[float, popxl.Tensor] = 0.0,
        first_order_dtype: popxl.dtype = popxl.float16,
        bias_correction: bool = True,
    ):
        first_order = self.add_variable_input(
            "first_order",
            partial(np.zeros, weight.shape),
            first_order_dtype,
            by_ref=True,
        )
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self.add_variable_input(
            "second_order", partial(np.zeros, weight.shape), popxl.float32, by_ref=True
        )
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input(
                "step", partial(np.zeros, ()), popxl.float32, by_ref=True
            )
        dw = ops.var_updates.adam_updater(
            first_order,
            second_order,
            weight=weight,
            weight_decay=weight_decay,
            time_step=step,
            beta1=beta1,
            beta2=beta2,
            epsilon=eps,
        )
        ops.scaled_add_(weight, dw, b=-lr)


FLOAT_LR_SCHEDULE = """\
Graph : Adam_subgraph(0)
  (%1, %2, first_order=%3, second_order=%4, step=%5) -> () {
    Accumulate.100 (%3 [(2, 2) float16], %2 [(2, 2) float32]) -> (%6 [(2, 2) float16])
    Accumulate.101 (%4 [(2, 2) float32], %2 [(2, 2) float32]) -> (%7 [(2, 2) float32])
    AdamUpdater.102 (%3 [(2, 2) float16], %4 [(2, 2) float32], %5 [() float32]) -> (%8 [(2, 2) float16])
    ScaledAddLhsInplace.103 (%1 [(2, 2) float32], %8 [(2, 2) float16]) -> (%9 [(2, 2) float32])
  }"""

TENSOR_LR_SCHEDULE = """\
Graph : Adam_subgraph(1)
  (%1, %2, %3, first_order=%4, second_order=%5, step=%6) -> () {
    Accumulate.104 (%4 [(2, 2) float16], %2 [(2, 2) float32]) -> (%7 [(2, 2) float16])
    Accumulate.105 (%5 [(2, 2) float32], %2 [(2, 2) float32]) -> (%8 [(2, 2) float32])
    AdamUpdater.106 (%4 [(2, 2) float16], %5 [(2, 2) float32], %6 [() float32]) -> (%9 [(2, 2) float16])
    Neg.107 (%3 [() float32]) -> (%10 [() float32])
    ScaledAddLhsInplace.108 (%1 [(2, 2) float32], %9 [(2, 2) float16], %10 [() float32]) -> (%11 [(2, 2) float32])
  }"""

AFTER_STATE = """\
Tensor[first_order popxl.dtypes.float16 (2, 2)]
 [[0.009995 0.009995]
 [0.009995 0.009995]]
Tensor[second_order popxl.dtypes.float32 (2, 2)]
 [[9.9998715e-06 9.9998715e-06]
 [9.9998715e-06 9.9998715e-06]]
Tensor[step popxl.dtypes.float32 ()]
 1.0"""


def test_seed_adam_demo(capsys):
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        var = popxl.variable(np.ones((2, 2)), popxl.float32)
        grad = popxl.variable(np.full((2, 2), 0.1), popxl.float32)
        adam_facts, adam = Adam(cache=True).create_graph(var, var.spec, lr=1e-3)
        adam_facts_lr, adam_lr = Adam().create_graph(
            var, var.spec, lr=popxl.TensorSpec((), popxl.float32))
        assert adam.print_schedule() == FLOAT_LR_SCHEDULE
        assert adam_lr.print_schedule() == TENSOR_LR_SCHEDULE
        adam_state = adam_facts.init()
        adam_state_lr = adam_facts_lr.init()
        adam.bind(adam_state).call(var, grad)
        adam_lr.bind(adam_state_lr).call(var, grad, popxl.constant(1e-3))
    ir.num_host_transfers = 1
    session = popxl.Session(ir, "ipu_hw")
    before = session.get_tensors_data(adam_state.tensors)
    assert all((d == 0).all() for d in before.values())
    with session:
        session.run()
    state = session.get_tensors_data(adam_state.tensors)
    for name, data in state.items():
        print(name, "\n", state[name])
    printed = "\n".join(line.rstrip() for line in capsys.readouterr().out.splitlines())
    assert printed == AFTER_STATE
    # two Adam steps of lr 1e-3 on a weight of 1 with a constant grad: each moves it by ~lr
    np.testing.assert_allclose(session.get_tensor_data(var), 1 - 2e-3, atol=1e-5)


def _numpy_adamw(w, g, steps, lr, b1, b2, eps, wd):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t in range(1, steps + 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mc, vc = m / (1 - b1 ** t), v / (1 - b2 ** t)
        w = w - lr * (mc / (np.sqrt(vc) + eps) + wd * w)
    return w


def test_adam_optimizer_step_matches_numpy():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 4)).astype(np.float32)
    g0 = rng.normal(size=(3, 4)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(w0, popxl.float32)
        g = popxl.variable(g0, popxl.float32)
        facts, graph = AdamOptimizerStep().create_graph(
            w, g.spec, lr=0.1, weight_decay=0.01, first_order_dtype=popxl.float32)
        assert set(facts.to_dict()) == {"first_order", "second_order", "step"}
        bound = graph.bind(facts.init())
        bound.call(w, g)
        bound.call(w, g)
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        got = s.get_tensor_data(w)
    want = _numpy_adamw(w0.astype(np.float64), g0, 2, 0.1, 0.9, 0.999, 1e-5, 0.01)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_adam_loss_scaling_divides_the_grad():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2,), np.float32))
        g = popxl.variable(np.full((2,), 8.0, np.float32))
        facts, graph = AdamOptimizerStep().create_graph(
            w, g.spec, lr=1.0, weight_decay=0.0, first_order_dtype=popxl.float32,
            loss_scaling=8, bias_correction=False)
        assert "step" not in facts
        state = facts.init()
        graph.bind(state).call(w, g)
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        m = s.get_tensor_data(state.first_order)
    np.testing.assert_allclose(m, 0.1, rtol=1e-6)   # (1 - 0.9) * 8 / 8
