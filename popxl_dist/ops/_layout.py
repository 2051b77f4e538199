"""Upstream's module layout of `popxl.ops`, over this package's op families.

Upstream keeps one module per op (`popxl.ops.add`, `popxl.ops.gather`, ...) and sub-packages for
`collectives` and `var_updates`; programs import from them (`from popxl.ops.gather import
tied_gather`, `from popxl.ops.collectives.collectives import CommGroup`). Here ops are grouped by
family, so `install()` registers each upstream module path in `sys.modules`: a real module of
that name (e.g. `popxl.ops.call`) gets the names it lacks, any other path becomes a module object
holding the objects defined in the families. As upstream, `popxl.ops.add` stays the function and
`import popxl.ops.add` / `from popxl.ops.add import add_` reach the module.

A name in `UPSTREAM_MODULES` that no family defines yet is skipped (so ops added later by other
families appear at their upstream path without edits here).
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Dict, Iterable, List, Tuple

__all__ = ["UPSTREAM_MODULES", "install"]

# upstream module (relative to popxl.ops) -> the names upstream defines in it
UPSTREAM_MODULES: Dict[str, Tuple[str, ...]] = {
    "abs": ("abs",),
    "add": ("add", "add_"),
    "argminmax": ("argmax", "argmin"),
    "batch_norm": ("batch_norm_inference",),
    "call": ("CallSiteInfo", "call", "call_with_info", "_prep_and_validate_inputs"),
    "cast": ("cast", "pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8"),
    "ceil": ("ceil",),
    "clip": ("clip", "clamp"),
    "code_copy": ("CODE_LOCATION", "TO_IR_ENUM_MAP", "remote_code_load", "code_copy"),
    "collectives.all_reduce": ("all_reduce", "all_reduce_identical_inputs",
                               "all_reduce_identical_grad_inputs"),
    "collectives.collectives": ("CommGroup", "CommGroupType", "OP_MAP", "CollectiveOps",
                                "to_collective_op", "_rearrange_input", "_rearrange_output"),
    "collectives.replicated_all_gather": ("replicated_all_gather",),
    "collectives.replicated_all_reduce": ("replicated_all_reduce", "replicated_all_reduce_"),
    "collectives.replicated_reduce_scatter": ("replicated_reduce_scatter",
                                              "replica_sharded_slice", "replicated_slice"),
    "concat": ("concat", "concat_"),
    "conditional": ("ConditionalSiteInfo", "conditional", "conditional_with_info"),
    "conv": ("PadType", "multi_conv_options", "conv", "conv_pow2scaled", "conv_transpose",
             "conv_transpose_pow2scaled"),
    "cos": ("cos",),
    "cumsum": ("cumsum",),
    "detach": ("detach", "detach_"),
    "div": ("div",),
    "dropout": ("dropout",),
    "dynamic_slice": ("dynamic_slice",),
    "dynamic_update": ("dynamic_update", "dynamic_update_"),
    "equal": ("equal",),
    "exp": ("exp", "exp_"),
    "floor": ("floor",),
    "fmod": ("fmod",),
    "gather": ("groupedgather", "gather", "tied_gather"),
    "gelu": ("gelu", "gelu_"),
    "geluerf": ("geluerf", "geluerf_"),
    "greater": ("greater",),
    "group_norm": ("group_norm", "layer_norm"),
    "histogram": ("histogram", "check_increment"),
    "host_load": ("host_load",),
    "host_store": ("host_store",),
    "identity": ("identity", "rename"),
    "increment_mod": ("increment_mod", "increment_mod_"),
    "init": ("init",),
    "interpolate": ("InterpolateType", "InterpolateNearestType",
                    "InterpolateCoordinateTransformationType", "interpolate"),
    "io_tile_copy": ("io_tile_copy",),
    "ipu_copy": ("ipu_copy",),
    "isfinite": ("isfinite",),
    "isinf": ("isinf",),
    "isnan": ("isnan",),
    "l1": ("l1",),
    "l2": ("l2",),
    "lamb": ("lamb_square",),
    "log": ("log", "log2"),
    "logical_and": ("logical_and",),
    "logical_not": ("logical_not",),
    "logical_or": ("logical_or",),
    "logsum": ("logsum",),
    "logsumexp": ("logsumexp",),
    "matmul": ("matmul", "matmul_pow2scaled"),
    "max": ("max", "maximum"),
    "mean": ("mean",),
    "median": ("median",),
    "min": ("min",),
    "mul": ("mul",),
    "negate": ("negate",),
    "negative_log_likelihood": ("REDUCTION_MAP", "REDUCTION_TYPE", "nll_loss",
                                "nll_loss_with_softmax_grad"),
    "onehot": ("onehot",),
    "pool": ("receptive_attributes", "average_pool", "max_pool"),
    "pow": ("pow",),
    "print_tensor": ("PrintTensorFmt", "FloatFormat", "FLOAT_FORMAT_MAP", "print_tensor"),
    "prod": ("prod",),
    "random": ("random_uniform", "random_normal"),
    "random_seed": ("create_random_seed", "split_random_seed"),
    "relu": ("relu", "relu_"),
    "remote_load": ("remote_load", "remote_load_", "multiply_tuple"),
    "remote_store": ("remote_store",),
    "repeat": ("repeat", "repeat_with_info"),
    "reshape": ("reshape_handle_negative_axis", "reshape", "reshape_", "flatten", "flatten_"),
    "roialign": ("roi_align",),
    "scaled_add": ("scaled_add", "scaled_add_"),
    "scatter": ("scatter",),
    "scatter_reduce": ("ScatterReductionType", "reduction_dict", "grouped_scatter_reduce",
                       "scatter_reduce"),
    "shaped_dropout": ("shaped_dropout",),
    "sign": ("sign",),
    "sin": ("sin",),
    "slice": ("INT_MIN", "INT_MAX", "slice", "slice_", "process_args"),
    "softmax": ("softmax",),
    "split": ("split",),
    "sqrt": ("sqrt",),
    "squeeze": ("squeeze",),
    "sub": ("sub",),
    "subsample": ("subsample",),
    "sum": ("sum",),
    "sumsquare": ("sumsquare",),
    "swish": ("swish", "swish_"),
    "tanh": ("tanh",),
    "topk": ("topk",),
    "transpose": ("transpose", "transpose_"),
    "utils": ("cast_if_needed", "check_in_graph", "check_tensor_ipu_and_tile_set",
              "handle_negative_axis", "convert_optional_float", "convert_optional_int",
              "convert_optional_dtype", "convert_optional_int64_list"),
    "var_updates.accumulate": ("accumulate_", "accumulate_square_", "accumulate_mean_",
                               "accumulate_moving_average_", "accumulate_moving_average_square_",
                               "accumulator_scale_", "accumulator_zero_", "sparse_accumulate_"),
    "var_updates.adam_updater": ("weight_decay_is_required", "create_adamupdater",
                                 "adam_updater", "lamb_updater", "adamax_updater"),
    "var_updates.adam_var_update": ("adam_var_update",),
    "var_updates.copy_var_update": ("copy_var_update_",),
    "var_updates.utils": ("handle_optimizer_value",),
    "where": ("where",),
}

_MISSING = object()


def _sources(ops: types.ModuleType, rel: str) -> List[types.ModuleType]:
    """Where to look for a name of upstream module `rel`: its parent namespace (e.g.
    `popxl.ops.collectives`), `popxl.ops`, then every op family module."""
    first = []
    if "." in rel:
        parent = getattr(ops, rel.rsplit(".", 1)[0], None)
        if isinstance(parent, types.ModuleType):
            first.append(parent)
    families = [m for name, m in sorted(sys.modules.items())
                if name.startswith(ops.__name__ + ".") and name.count(".") == 2
                and getattr(m, "__file__", None)]
    return first + [ops] + families


def _lookup(name: str, sources: Iterable[types.ModuleType]):
    for mod in sources:
        v = getattr(mod, name, _MISSING)
        if v is not _MISSING and not (isinstance(v, types.ModuleType) and name != v.__name__):
            return v
    return _MISSING


def _module_for(fullname: str) -> types.ModuleType:
    if fullname in sys.modules:
        return sys.modules[fullname]
    parent, _, child = fullname.rpartition(".")
    if hasattr(sys.modules[parent], "__path__"):       # a package: a real submodule wins
        try:
            return importlib.import_module(fullname)
        except ModuleNotFoundError as e:
            if e.name != fullname:
                raise
    mod = types.ModuleType(fullname, f"Upstream module path `{fullname}`: the names upstream "
                                     f"defines in it (see popxl.ops._layout).")
    mod.__all__ = []
    sys.modules[fullname] = mod
    return mod


def install(ops: types.ModuleType) -> None:
    """Register every upstream `popxl.ops.*` module path (see the module docstring)."""
    for rel, names in UPSTREAM_MODULES.items():
        sources = _sources(ops, rel)
        mod = _module_for(f"{ops.__name__}.{rel}")
        for name in names:
            if hasattr(mod, name):
                continue
            v = _lookup(name, sources)
            if v is not _MISSING:
                setattr(mod, name, v)
                if getattr(mod, "__file__", None) is None:     # our module object
                    mod.__all__.append(name)
