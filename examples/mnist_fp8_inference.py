"""MNIST inference with float8 weights and `ops.matmul_pow2scaled`, checked against NumPy.

1. Train the user guide's MLP (784 -> 32 gelu -> 10) in float32 with popxl, briefly
   (`mnist_popxl.train`).
2. Cast its weights on the host to float8_143 with
   `popxl.fp8_utils.host_pow2scale_cast_to_fp8`, each with its own log2 scale (chosen by
   `host_fp8_mse_scale`, or by the largest magnitude with `--weight-scale amax`).
3. Run inference on the device: activations are cast to float8 with
   `ops.pow2scale_cast_to_fp8` at the scale `popxl_addons.fp8_amax_scale` picks at run time,
   multiplied with `ops.matmul_pow2scaled` (float16 out), bias and gelu in float16.
4. Compare with the same float8 computation written in NumPy, and with float32 accuracy.

    python examples/mnist_fp8_inference.py --train-steps 400 --test-batches 20
"""
import argparse
from typing import Dict, List, Mapping, Tuple

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons
from mnist_popxl import test as test_float32
from mnist_popxl import train
from popxl.fp8_utils import (host_fp8_mse_scale, host_pow2scale_cast_from_fp8,
                             host_pow2scale_cast_to_fp8)
from popxl_launch.data import batches, load_mnist

F8 = popxl.float8_143
F16 = np.float16


def weight_scale(w: np.ndarray, metric: str) -> int:
    """The host log2 scale of a weight for float8_143."""
    if metric == "mse":
        return host_fp8_mse_scale(w, F8)[1]          # (estimated error, scale)
    return int(np.clip(np.floor(np.log2(240.0 / np.abs(w).max())), -31, 31))


def fp8_weights(weights: Mapping[str, np.ndarray], metric: str) -> Dict[str, Tuple]:
    """{name: (float8 data, log2 scale)} of W0 and W1; biases stay (float16)."""
    out = {}
    for name in ("W0", "W1"):
        s = weight_scale(weights[name], metric)
        out[name] = (host_pow2scale_cast_to_fp8(weights[name], F8, s), s)
    return out


def fp8_linear(x: popxl.Tensor, w8: popxl.Tensor, w_scale: int, b: popxl.Tensor) -> popxl.Tensor:
    """x @ W + b with x cast to float8 at its amax scale and W already float8 at `w_scale`."""
    sx = addons.fp8_amax_scale(x, F8)
    x8 = ops.pow2scale_cast_to_fp8(x, sx, F8)
    undo = ops.negate(sx + popxl.constant(np.int32(w_scale), popxl.int32, "w_scale"))
    return ops.matmul_pow2scaled(x8, w8, undo) + b


def build_fp8_ir(weights: Mapping[str, np.ndarray], batch_size: int, metric: str):
    w8 = fp8_weights(weights, metric)
    ir = popxl.Ir()
    with ir.main_graph:
        img = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        x = ops.cast(ops.host_load(img, "x").reshape((batch_size, 28 * 28)), popxl.float16)
        W0 = popxl.variable(w8["W0"][0], F8, "W0")          # float8 data from the host cast
        W1 = popxl.variable(w8["W1"][0], F8, "W1")
        b0 = popxl.variable(weights["b0"], popxl.float16, "b0")
        b1 = popxl.variable(weights["b1"], popxl.float16, "b1")
        h = ops.gelu(fp8_linear(x, W0, w8["W0"][1], b0))
        y = fp8_linear(h, W1, w8["W1"][1], b1)
        out = popxl.d2h_stream(y.shape, y.dtype, "logits")
        ops.host_store(out, y)
    return ir, img, out, w8


# --- the NumPy reference of the same float8 computation --------------------------------------
def _amax_scale(x: np.ndarray) -> int:
    return int(np.clip(np.floor(np.log2(240.0 / np.abs(x.astype(np.float64)).max())), -31, 31))


def _gelu16(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return (0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715)
                                                                     * x ** 3)))).astype(F16)


def _linear_ref(x16: np.ndarray, w8: np.ndarray, w_scale: int, b16: np.ndarray) -> np.ndarray:
    sx = _amax_scale(x16)
    x8 = host_pow2scale_cast_from_fp8(host_pow2scale_cast_to_fp8(x16, F8, sx), popxl.float32)
    w = host_pow2scale_cast_from_fp8(w8, popxl.float32)
    y = (np.ldexp(x8 @ w, -(sx + w_scale))).astype(F16)
    return (y.astype(np.float32) + b16.astype(np.float32)).astype(F16)


def numpy_reference(images: np.ndarray, w8: Mapping[str, Tuple],
                    weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """float16 logits of one batch computed with NumPy."""
    x = images.reshape(images.shape[0], -1).astype(F16)
    h = _gelu16(_linear_ref(x, *w8["W0"], weights["b0"].astype(F16)))
    return _linear_ref(h, *w8["W1"], weights["b1"].astype(F16))


def evaluate(weights: Mapping[str, np.ndarray], batch_size: int = 100, max_batches: int = 0,
             metric: str = "mse") -> Dict[str, float]:
    """float8 accuracy, agreement with the NumPy reference, and the largest logit difference."""
    images, labels = load_mnist("test")
    ir, img, out, w8 = build_fp8_ir(weights, batch_size, metric)
    correct = agree = total = 0
    max_diff = 0.0
    with popxl.Session(ir, "ipu_hw") as sess:
        for i, (data, lab) in enumerate(batches(images, labels, batch_size, shuffle=False)):
            logits = sess.run({img: data})[out]
            ref = numpy_reference(data, w8, weights)
            max_diff = max(max_diff, float(np.abs(logits.astype(np.float32)
                                                  - ref.astype(np.float32)).max()))
            pred = np.argmax(logits, axis=-1)
            correct += int(np.sum(pred == lab))
            agree += int(np.sum(pred == np.argmax(ref, axis=-1)))
            total += lab.shape[0]
            if max_batches and i + 1 >= max_batches:
                break
    return {"accuracy": 100.0 * correct / total, "agreement": 100.0 * agree / total,
            "max_logit_diff": max_diff, "images": total,
            "weight_scales": {k: v[1] for k, v in w8.items()}}


def main(argv: List[str] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-steps", type=int, default=600, help="float32 SGD steps (batch 8)")
    p.add_argument("--test-batches", type=int, default=0, help="0: the whole test set")
    p.add_argument("--batch-size", type=int, default=100, help="inference batch size")
    p.add_argument("--weight-scale", choices=("mse", "amax"), default="mse")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    np.random.seed(42)
    weights = train(batch_size=8, epochs=1, lr=0.05, max_steps=args.train_steps,
                    progress=not args.no_progress)
    acc32 = test_float32(weights, args.batch_size, args.test_batches, progress=False)
    res = evaluate(weights, args.batch_size, args.test_batches, args.weight_scale)
    res["accuracy_float32"] = acc32
    print(f"float8 weight scales (log2): {res['weight_scales']}")
    print(f"Accuracy on test set, float32: {acc32:0.2f}%")
    print(f"Accuracy on test set, float8:  {res['accuracy']:0.2f}%")
    print(f"float8 vs NumPy reference: predictions agree on {res['agreement']:0.2f}% of "
          f"{res['images']} images, largest logit difference {res['max_logit_diff']:.3g}")
    return res


if __name__ == "__main__":
    main()
