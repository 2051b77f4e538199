"""MNIST in plain popxl, written like the PopXL user guide's "Application example: MNIST".

A `popxl.Module` Linear built into subgraphs with `ir.create_graph`, called with
`ops.call_with_info`; gradients from `popxl.transforms.autodiff` (once with all inputs, once with
`grads_required`), the loss from `ops.nll_loss_with_softmax_grad`, SGD with `ops.scaled_add_`.
Data: the offline MNIST copy packaged with popxl-dist (no download).

    python examples/mnist_popxl.py --epochs 1 --batch-size 8
"""
import argparse
from typing import Dict, List, Mapping

import numpy as np
from tqdm import tqdm

import popxl
import popxl.ops as ops
import popxl.transforms as transforms
from popxl_launch.data import batches, load_mnist

np.random.seed(42)


class Linear(popxl.Module):
    def __init__(self) -> None:
        self.W: popxl.Tensor = None
        self.b: popxl.Tensor = None

    def build(self, x: popxl.Tensor, out_features: int, bias: bool = True,
              gelu: bool = False) -> popxl.Tensor:
        self.W = popxl.graph_input((x.shape[-1], out_features), popxl.float32, "W")
        y = x @ self.W
        if bias:
            self.b = popxl.graph_input((out_features,), popxl.float32, "b")
            y = y + self.b
        if gelu:
            y = ops.gelu(y)
        return y


def create_network_fwd_graph(ir: popxl.Ir, x: popxl.Tensor):
    x = x.reshape((-1, 28 * 28))
    W0 = popxl.variable(np.random.normal(0, 0.02, (x.shape[-1], 32)).astype(np.float32), name="W0")
    b0 = popxl.variable(np.zeros(32, np.float32), name="b0")
    W1 = popxl.variable(np.random.normal(0, 0.02, (32, 10)).astype(np.float32), name="W1")
    b1 = popxl.variable(np.zeros(10, np.float32), name="b1")

    linear_0 = Linear()
    linear_graph_0 = ir.create_graph(linear_0, x, out_features=32, gelu=True)
    fwd_call_info_0 = ops.call_with_info(linear_graph_0, x,
                                         inputs_dict={linear_0.W: W0, linear_0.b: b0})
    x1 = fwd_call_info_0.outputs[0]

    linear_1 = Linear()
    linear_graph_1 = ir.create_graph(linear_1, x1, out_features=10)
    fwd_call_info_1 = ops.call_with_info(linear_graph_1, x1,
                                         inputs_dict={linear_1.W: W1, linear_1.b: b1})
    y = fwd_call_info_1.outputs[0]
    return (x1, y, [linear_0, linear_1], [linear_graph_0, linear_graph_1],
            [fwd_call_info_0, fwd_call_info_1], [W0, b0, W1, b1])


def calculate_grads(dy, x1, linears, linear_graphs, fwd_call_infos, variables):
    W0, b0, W1, b1 = variables
    # Layer 1: gradients of all inputs (x1, W1, b1).
    bwd_graph_info_1 = transforms.autodiff(linear_graphs[1])
    activations_1 = bwd_graph_info_1.inputs_dict(fwd_call_infos[1])
    grads_1_call_info = ops.call_with_info(bwd_graph_info_1.graph, dy, inputs_dict=activations_1)
    grads_1 = bwd_graph_info_1.fwd_parent_ins_to_grad_parent_outs(fwd_call_infos[1],
                                                                  grads_1_call_info)
    grad_x_1, grad_w_1, grad_b_1 = grads_1[x1], grads_1[W1], grads_1[b1]

    # Layer 0: only the weights, asked for with grads_required.
    bwd_graph_info_0 = transforms.autodiff(linear_graphs[0],
                                           grads_required=[linears[0].W, linears[0].b])
    activations_0 = bwd_graph_info_0.inputs_dict(fwd_call_infos[0])
    grad_w_0, grad_b_0 = ops.call(bwd_graph_info_0.graph, grad_x_1, inputs_dict=activations_0)
    return [grad_w_0, grad_b_0, grad_w_1, grad_b_1]


def build_train_ir(batch_size: int, lr: float):
    ir = popxl.Ir(replication=1)
    with ir.main_graph, popxl.in_sequence():
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        x = ops.host_load(img_stream, "x")
        labels = ops.host_load(label_stream, "labels")
        x1, y, linears, graphs, infos, variables = create_network_fwd_graph(ir, x)
        probs = ops.softmax(y, axis=-1)
        loss, dy = ops.nll_loss_with_softmax_grad(probs, labels)
        grads = calculate_grads(dy, x1, linears, graphs, infos, variables)
        for v, g in zip(variables, grads):
            ops.scaled_add_(v, g, b=-lr)
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)
    return ir, (img_stream, label_stream), variables, loss_stream


def build_test_ir(batch_size: int):
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        x = ops.host_load(img_stream, "x")
        _, y, _, _, _, variables = create_network_fwd_graph(ir, x)
        out_stream = popxl.d2h_stream(y.shape, y.dtype, "outputs")
        ops.host_store(out_stream, y)
    return ir, img_stream, variables, out_stream


def bars_off(progress: bool):
    """tqdm's `disable`: None shows the bars only on a terminal (a log file gets none)."""
    return None if progress else True


def train(batch_size: int = 8, epochs: int = 1, lr: float = 0.05, max_steps: int = 0,
          progress: bool = True) -> Dict[popxl.Tensor, np.ndarray]:
    images, labels = load_mnist("train")
    ir, (img_stream, label_stream), variables, loss_stream = build_train_ir(batch_size, lr)
    session = popxl.Session(ir, "ipu_hw")
    steps = 0
    with session:
        for epoch in range(1, epochs + 1):
            bar = tqdm(batches(images, labels, batch_size, seed=epoch),
                       total=len(images) // batch_size, disable=bars_off(progress),
                       desc=f"Epoch {epoch}/{epochs}")
            for data, lab in bar:
                loss = session.run({img_stream: data, label_stream: lab})[loss_stream]
                bar.set_postfix_str(f"loss {float(loss):0.4f}")
                steps += 1
                if max_steps and steps >= max_steps:
                    break
    return dict(zip(["W0", "b0", "W1", "b1"],
                    (a.copy() for a in session.get_tensors_data(variables).values())))


def test(weights: Mapping[str, np.ndarray], batch_size: int = 80, max_batches: int = 0,
         progress: bool = True) -> float:
    images, labels = load_mnist("test")
    ir, img_stream, variables, out_stream = build_test_ir(batch_size)
    session = popxl.Session(ir, "ipu_hw")
    session.write_variables_data({v: weights[v.name] for v in variables})
    correct = total = 0
    with session:
        for i, (data, lab) in enumerate(tqdm(batches(images, labels, batch_size, shuffle=False),
                                             total=len(images) // batch_size,
                                             disable=bars_off(progress))):
            out = session.run({img_stream: data})[out_stream]
            correct += int(np.sum(np.argmax(out, axis=-1) == lab))
            total += lab.shape[0]
            if max_batches and i + 1 >= max_batches:
                break
    return 100.0 * correct / total


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--test-batch-size", type=int, default=80)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args(argv)
    weights = train(args.batch_size, args.epochs, args.lr)
    print(f"Accuracy on test set: {test(weights, args.test_batch_size):0.2f}%")


if __name__ == "__main__":
    main()
