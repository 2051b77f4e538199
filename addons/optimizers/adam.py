"""`AdamOptimizerStep`: an in-place AdamW update of one variable, as a Module."""
from __future__ import annotations

from functools import partial
from typing import Optional, Union

import numpy as np

import popxl
from popxl import ops

from ..module import Module

__all__ = ["AdamOptimizerStep"]

Scalar = Union[float, popxl.Tensor]


class AdamOptimizerStep(Module):
    """One Adam(W) step on `var` with gradient `grad`; the state lives in by-ref variables
    `first_order`, `second_order` and (with bias correction) `step`."""

    @popxl.in_sequence()
    def build(self, var: popxl.TensorByRef, grad: popxl.Tensor,
              replica_grouping: Optional[popxl.ReplicaGrouping] = None, *, lr: Scalar,
              beta1: Scalar = 0.9, beta2: Scalar = 0.999, eps: Scalar = 1e-5,
              weight_decay: Scalar = 1e-2, first_order_dtype: popxl.dtype = popxl.float16,
              bias_correction: bool = True, loss_scaling: Scalar = 1,
              global_norm: Optional[popxl.Tensor] = None,
              global_norm_max: Optional[Scalar] = None):
        shape = var.meta_shape or var.shape
        sharded = bool(var.meta_shape)
        # The fewest shards of var's length covering meta_shape: it gives the same (possibly
        # zero-padded) shard length whatever shard count the variable itself used.
        shard_over = int(-(-np.prod(var.meta_shape) // np.prod(var.shape))) if sharded else 1

        def state(name: str, dtype: popxl.dtype, shp) -> popxl.Tensor:
            if sharded and shp:
                return self.add_replica_sharded_variable_input(
                    name, partial(np.zeros, shp), dtype, by_ref=True,
                    replica_grouping=replica_grouping, shard_over=shard_over)
            return self.add_variable_input(name, partial(np.zeros, shp), dtype, by_ref=True,
                                           replica_grouping=replica_grouping)

        scale_is_tensor = isinstance(loss_scaling, popxl.Tensor)
        clip = global_norm is not None and global_norm_max is not None
        if scale_is_tensor or loss_scaling != 1 or clip:
            grad = ops.cast(grad, popxl.float32)
            if scale_is_tensor:
                grad = grad / ops.cast(loss_scaling, popxl.float32)
            elif loss_scaling != 1:
                grad = grad * (1.0 / loss_scaling)
            if clip:
                gmax = global_norm_max
                if not isinstance(gmax, popxl.Tensor):
                    gmax = popxl.constant(gmax, popxl.float32)
                grad = grad * (gmax / ops.maximum(ops.cast(global_norm, popxl.float32), gmax))

        first_order = state("first_order", first_order_dtype, shape)
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = state("second_order", popxl.float32, shape)
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input("step", partial(np.zeros, ()), popxl.float32,
                                           by_ref=True, replica_grouping=replica_grouping)
        updater = ops.var_updates.adam_updater(first_order, second_order, weight=var,
                                               weight_decay=weight_decay, time_step=step,
                                               beta1=beta1, beta2=beta2, epsilon=eps)
        ops.scaled_add_(var, updater, b=-lr)
