"""Shortened copies of the seed tutorials' MNIST programs (tutorial 1, tutorial 2, notebook),
written in the same style; only the torchvision loader is replaced by the offline IDX files."""
from functools import partial
from typing import Dict, Mapping, Optional, Union

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons

from mnist_idx import batches

TEST_BATCHES = 5


class Linear(addons.Module):
    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight",
            partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
            x.dtype,
        )
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


class Adam(addons.Module):
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
            "first_order", partial(np.zeros, weight.shape), first_order_dtype, by_ref=True)
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self.add_variable_input(
            "second_order", partial(np.zeros, weight.shape), popxl.float32, by_ref=True)
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input(
                "step", partial(np.zeros, ()), popxl.float32, by_ref=True)
        dw = ops.var_updates.adam_updater(
            first_order, second_order, weight=weight, weight_decay=weight_decay,
            time_step=step, beta1=beta1, beta2=beta2, epsilon=eps)
        ops.scaled_add_(weight, dw, b=-lr)


def optimiser_step(variables, grads: Dict[popxl.Tensor, popxl.Tensor],
                   optimiser: addons.Module, learning_rate: popxl.float32 = 1e-3):
    for name, var in variables.named_tensors.items():
        opt_facts, opt_graph = optimiser.create_graph(
            var, var.spec, lr=learning_rate, weight_decay=0.0, bias_correction=False)
        state = opt_facts.init()
        opt_graph.bind(state).call(var, grads[var])


def train_program(batch_size, device, learning_rate, use_adam=False, notebook=False):
    ir = popxl.Ir() if notebook else popxl.Ir(replication=1)
    if notebook:
        ir.replication_factor = 1
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        img_t = ops.host_load(img_stream)
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        labels = ops.host_load(label_stream, "labels")

        facts, fwd_graph = Net().create_graph(img_t)
        bwd_graph = addons.autodiff(fwd_graph)
        variables = facts.init()

        fwd_info = fwd_graph.bind(variables).call_with_info(img_t)
        x = fwd_info.outputs[0]
        loss, dx = addons.ops.cross_entropy_with_grad(x, labels)
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)

        activations = bwd_graph.grad_graph_info.inputs_dict(fwd_info)
        bwd_info = bwd_graph.call_with_info(dx, args=activations)
        grads_dict = bwd_graph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(
            fwd_info, bwd_info)
        if use_adam:
            optimiser = Adam(cache=True)
            optimiser_step(variables, grads_dict, optimiser, learning_rate)
        else:
            for t in variables.tensors:
                ops.scaled_add_(t, grads_dict[t], b=-learning_rate)

    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [img_stream, label_stream], variables, loss_stream


def test_program(test_batch_size, device):
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        in_stream = popxl.h2d_stream((test_batch_size, 28, 28), popxl.float32, "image")
        in_t = ops.host_load(in_stream)
        facts, graph = Net().create_graph(in_t)
        variables = facts.init()
        (outputs,) = graph.bind(variables).call(in_t)
        out_stream = popxl.d2h_stream(outputs.shape, outputs.dtype, "outputs")
        ops.host_store(out_stream, outputs)
    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [in_stream], variables, out_stream


test_program.__test__ = False  # a program builder from the tutorial, not a pytest test


def accuracy(predictions: np.ndarray, labels: np.ndarray):
    ind = np.argmax(predictions, axis=-1).flatten()
    labels = labels.flatten()
    return np.mean(ind == labels) * 100.0


def _train_and_test(learning_rate, steps, use_adam=False, notebook=False, collect=None):
    """(losses, test accuracy); `collect` (a list) also receives the trained weights and the
    test outputs."""
    np.random.seed(42)
    train_batch_size, test_batch_size, device = 8, 80, "ipu_hw"
    train_session, train_input_streams, train_variables, loss_stream = train_program(
        train_batch_size, device, learning_rate, use_adam, notebook)
    losses = []
    with train_session:
        for data, labels in batches(True, train_batch_size, steps):
            inputs: Mapping[popxl.HostToDeviceStream, np.ndarray] = dict(
                zip(train_input_streams, [data, labels]))
            losses.append(float(train_session.run(inputs)[loss_stream]))
    train_vars_to_data = train_session.get_tensors_data(train_variables.tensors)

    test_session, test_input_streams, test_variables, out_stream = test_program(
        test_batch_size, device)
    train_vars_to_test_vars = train_variables.to_mapping(test_variables)
    test_vars_to_data = {
        test_var: train_vars_to_data[train_var].copy()
        for train_var, test_var in train_vars_to_test_vars.items()
    }
    test_session.write_variables_data(test_vars_to_data)
    after = test_session.get_tensors_data(test_variables.tensors)
    for test_var, array in after.items():
        assert (array == test_vars_to_data[test_var]).all()

    sum_acc = 0.0
    with test_session:
        for data, labels in batches(False, test_batch_size, TEST_BATCHES):
            output = test_session.run(dict(zip(test_input_streams, [data, labels])))
            sum_acc += accuracy(output[out_stream], labels)
            if collect is not None:
                collect.append(output[out_stream])
    if collect is not None:
        collect.extend(train_vars_to_data[t] for t in train_variables.tensors)
    return losses, sum_acc / TEST_BATCHES


# (kind, learning rate, steps, minimum test accuracy %). Plain SGD from a 0.02-std init starts
# slowly (the loss stays near log(10) for ~100 steps), Adam does not. Chance is 10%.
RUNS = [("tutorial1", 0.05, 160, 30.0, 0.1), ("notebook", 0.05, 160, 30.0, 0.1),
        ("tutorial2_adam", 1e-3, 40, 45.0, 0.3)]


@pytest.mark.parametrize("kind, lr, steps, min_acc, min_drop", RUNS, ids=[r[0] for r in RUNS])
def test_mnist_training(kind, lr, steps, min_acc, min_drop):
    losses, acc = _train_and_test(lr, steps, use_adam=kind == "tutorial2_adam",
                                  notebook=kind == "notebook")
    assert np.isfinite(losses).all()
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < first - min_drop, (first, last)
    assert acc > min_acc, acc


@pytest.mark.parametrize("use_adam", [False, True], ids=["tutorial1", "tutorial2_adam"])
def test_seed_programs_give_the_same_bits_with_any_thread_count(monkeypatch, use_adam):
    """Training (batch 8: its weight updates split into element blocks) and testing (batch 80:
    its products split too) with POPXL_THREADS 1, 2, 4 and the default: bitwise the same
    losses, weights and test outputs."""
    from thread_counts import assert_same_bits_and_parallel, over_thread_counts

    def run():
        collected = []
        losses, acc = _train_and_test(1e-3 if use_adam else 0.05, 12, use_adam=use_adam,
                                      collect=collected)
        return losses, acc, collected

    assert_same_bits_and_parallel(over_thread_counts(monkeypatch, run))
