"""`Module`: build a graph with named variable inputs; nest, outline and differentiate it."""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import popxl
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from .graph import GraphWithNamedArgs
from .graph_cache import GraphCache
from .named_tensors import NamedTensors
from .variable_factory import (NamedVariableFactories, VariableFactory,
                               add_replica_sharded_variable_input, add_variable_input)

__all__ = ["Module", "NameScopeMeta", "create_grad_graph_info"]

# Modules whose `create_graph` is running (innermost last): calling one of them is its build.
_BUILD_STACK: List["Module"] = []


class NameScopeMeta(type):
    """Wraps every class's `build` so that it runs inside `popxl.name_scope(self._name_scope)`
    when that attribute is set (it is set on sub-modules by `Module.__setattr__`)."""

    def __new__(mcs, name, bases, dct):
        build = dct.get("build")
        if build is not None and not getattr(build, "_name_scoped", False):
            @functools.wraps(build)
            def scoped_build(self, *args, **kwargs):
                scope = self.__dict__.get("_name_scope")
                if scope and not self.__dict__.get("_in_scope"):
                    object.__setattr__(self, "_in_scope", True)
                    try:
                        with popxl.name_scope(scope):
                            return build(self, *args, **kwargs)
                    finally:
                        object.__setattr__(self, "_in_scope", False)
                return build(self, *args, **kwargs)

            scoped_build._name_scoped = True
            dct["build"] = scoped_build
        return super().__new__(mcs, name, bases, dct)


class _Aux:
    """`module.aux`: values saved in `build` for `build_grad` (tensors become grad inputs)."""

    def __init__(self, module: "Module", store: Optional[Dict[str, Any]] = None):
        self._module = module
        self._store: Dict[str, Any] = dict(store or {})

    def __setitem__(self, key: str, value: Any) -> None:
        self._store[key] = value

    def __getitem__(self, key: str) -> Any:
        state = self._module.__dict__.get("_grad_state")
        if state is None:
            raise Exception("You can only get items within the `build_graph` method which must "
                            "be called via `create_grad_graph` or `autodiff`.")
        store = state["aux_store"]
        if key not in store:
            raise KeyError(f"aux has no item '{key}'. Available: {list(store)}")
        value = store[key]
        if not isinstance(value, popxl.Tensor):
            return value
        inputs = state["aux_inputs"]
        if key not in inputs:
            inputs[key] = (popxl.graph_input(value.shape, value.dtype, f"aux_{key}",
                                             meta_shape=value.meta_shape or None), value)
        return inputs[key][0]

    def __contains__(self, key: str) -> bool:
        return key in self._store

    def __repr__(self) -> str:
        return f"_Aux({self._store!r})"

    def copy(self) -> Dict[str, Any]:
        return dict(self._store)


class _VarGrads:
    """`module.var_grad[name] = t`: the gradient of a named variable inside `build_grad`."""

    def __init__(self, module: "Module"):
        self._module = module

    def __setitem__(self, name: str, t: popxl.Tensor) -> None:
        state = self._module.__dict__.get("_grad_state")
        if state is None:
            raise Exception("You can only use` var_grad` within the `build_graph` method which "
                            "must be called via `create_grad_graph` or `autodiff`.")
        if not isinstance(t, popxl.Tensor):
            raise TypeError(f"Not a tensor: {t!r}")
        args: NamedTensors = state["args"]
        if name not in args or not isinstance(args.get(name), popxl.Tensor):
            raise KeyError(f"Not a variable: {name}. Possible inputs: {args.keys_flat()}")
        var = args.get(name)
        if t.shape != var.shape or tuple(t.meta_shape or ()) != tuple(var.meta_shape or ()):
            raise ValueError(f"Shape or meta-shape of Tensor does not match variable. Tensor: "
                             f"{t.shape} {t.meta_shape}. Variable: {var.shape} {var.meta_shape}")
        state["var_grads"][var] = t

    def __getitem__(self, name: str) -> popxl.Tensor:
        state = self._module.__dict__.get("_grad_state")
        if state is None:
            raise Exception("You can only use` var_grad` within the `build_graph` method which "
                            "must be called via `create_grad_graph` or `autodiff`.")
        return state["var_grads"][state["args"].get(name)]

    def __contains__(self, name: str) -> bool:
        """Whether a gradient has been set for the variable `name` (as upstream)."""
        state = self._module.__dict__.get("_grad_state")
        if state is None:
            raise Exception("You can only use` var_grad` within the `build_graph` method which "
                            "must be called via `create_grad_graph` or `autodiff`.")
        args: NamedTensors = state["args"]
        return name in args and args.get(name) in state["var_grads"]


def _has_build_grad(module: Any) -> bool:
    """Whether the module (or class) implements `build_grad`."""
    cls = module if isinstance(module, type) else type(module)
    return getattr(cls, "build_grad", None) is not Module.build_grad


def create_grad_graph_info(ir: popxl.Ir, fwd_graph: popxl.Graph, grad_graph: popxl.Graph,
                           grad_input_to_fwd_output: Mapping[popxl.Tensor, popxl.Tensor],
                           grad_output_to_fwd_input: Mapping[popxl.Tensor, popxl.Tensor],
                           fwd_tensors: Mapping[popxl.Tensor, popxl.Tensor]) -> GradGraphInfo:
    """A GradGraphInfo for a hand-written gradient graph.

    Args:
        grad_input_to_fwd_output: {grad input: fwd output it is the gradient of} (FwdGrad).
        grad_output_to_fwd_input: {grad output: fwd input it is the gradient of}.
        fwd_tensors: {grad input: fwd tensor it receives as is} (Fwd, e.g. stitched aux).
    """
    ins = []
    for gi in grad_graph.inputs:
        if gi in grad_input_to_fwd_output:
            ins.append(ExpectedConnection(grad_input_to_fwd_output[gi],
                                          ExpectedConnectionType.FwdGrad))
        elif gi in fwd_tensors:
            ins.append(ExpectedConnection(fwd_tensors[gi], ExpectedConnectionType.Fwd))
        else:
            raise ValueError(f"create_grad_graph_info: gradient graph input '{gi.id}' is in "
                             f"neither `grad_input_to_fwd_output` nor `fwd_tensors`")
    outs = [ExpectedConnection(grad_output_to_fwd_input[go], ExpectedConnectionType.FwdGrad)
            for go in grad_graph.outputs]
    return GradGraphInfo(grad_graph, fwd_graph, ins, outs)


def _tensor_args(fn: Callable, args: tuple, kwargs: dict) -> List[popxl.Tensor]:
    """Tensor arguments of a build call, in the order they become graph inputs."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        values: Iterable = bound.arguments.values()
    except (TypeError, ValueError):
        values = list(args) + list(kwargs.values())
    out = []
    for v in values:
        vs = v if isinstance(v, (list, tuple)) else (v.values() if isinstance(v, dict) else [v])
        out.extend(t for t in vs if isinstance(t, popxl.Tensor))
    return out


class Module(popxl.Module, metaclass=NameScopeMeta):
    """Base class of layers and models built into graphs with named variable inputs.

    Args:
        cache: reuse the graph when `create_graph` is called again with equal argument specs
            (not allowed with `build_grad`). A `GraphCache` object is only tested for truth.
        grad_inlining_error: what calling a module with `build_grad` inline does:
            "error", "warning" or "none".

    Example:
        >>> facts, graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        >>> variables = facts.init()
        >>> y, = graph.bind(variables).call(x)
    """

    _name_scope: Optional[str] = None

    def __init__(self, cache: Union[bool, GraphCache] = False,
                 grad_inlining_error: str = "error"):
        if grad_inlining_error not in ("error", "warning", "none"):
            raise ValueError(f"grad_inlining_error should be one of 'error', 'warning', 'none'. "
                             f"Not: {grad_inlining_error}")
        if cache and _has_build_grad(self):
            raise ValueError("You cannot use graph caching if you have implemented `build_grad`.")
        self._variable_factories = NamedVariableFactories()
        self._named_inputs = NamedTensors()
        self._graph_cache = GraphCache() if cache else None
        self._args_cache = {}
        self.grad_inlining_error = grad_inlining_error
        self.aux = _Aux(self)
        self.var_grad = _VarGrads(self)
        self.called_graphs_grad_info = {}
        self._sub_grad_infos = []

    # --- sub-modules -------------------------------------------------------------------
    def __setattr__(self, key: str, value: Any) -> None:
        if isinstance(value, Module):
            if "_variable_factories" not in self.__dict__:
                raise AttributeError(f"{type(self).__name__}: call super().__init__() before "
                                     f"assigning the sub-module '{key}'")
            value.set_name_scope(key)
            self._variable_factories.insert(key, value._variable_factories, overwrite=True)
            self._named_inputs.insert(key, value._named_inputs, overwrite=True)
            self._sub_grad_infos.append(value)
        object.__setattr__(self, key, value)

    def _all_called_graphs_grad_info(self) -> Dict:
        out: Dict = {}
        for sub in self._sub_grad_infos:
            out.update(sub._all_called_graphs_grad_info())
        out.update(self.called_graphs_grad_info)
        return out

    @property
    def implements_grad_graph(self) -> bool:
        """Whether this module has a hand-written gradient (`build_grad` is overridden)."""
        return _has_build_grad(self)

    def set_name_scope(self, name: str) -> None:
        """Build this module's ops inside `popxl.name_scope(name)` (set for sub-modules)."""
        self.__dict__["_name_scope"] = name

    @classmethod
    def from_list(cls, sub_modules: Iterable["Module"]) -> "Module":
        """A plain Module with the sub-modules as attributes "0", "1", ..."""
        m = Module()
        subs = list(sub_modules)
        for i, sub in enumerate(subs):
            setattr(m, str(i), sub)
        m.__dict__["_sub_modules"] = subs
        return m

    @classmethod
    def from_variable_factories(cls, inputs: Iterable[VariableFactory]) -> "Module":
        """A Module with input "i" per factory (in the current graph), attribute i its tensor."""
        m = Module()
        for i, vf in enumerate(inputs):
            t = m.add_variable_factory(vf, str(i))
            object.__setattr__(m, str(i), t)
        return m

    def get(self, key: int) -> "Module":
        return self[key]

    def __getitem__(self, item: int) -> "Module":
        subs = self.__dict__.get("_sub_modules")
        if subs is None:
            return getattr(self, str(item))
        return subs[item]

    def __iter__(self) -> Iterator["Module"]:
        subs = self.__dict__.get("_sub_modules")
        if subs is None:
            raise AttributeError(f"{type(self).__name__} is not a list of modules: build it "
                                 f"with Module.from_list to iterate over it")
        return iter(subs)

    def __len__(self) -> int:
        """popxl-dist extension: the number of modules of a `Module.from_list` module."""
        subs = self.__dict__.get("_sub_modules")
        if subs is None:
            raise AttributeError(f"{type(self).__name__} is not a list of modules")
        return len(subs)

    def __bool__(self) -> bool:
        """Always true, as upstream (which has no `__len__`): `if self.norm:` tests presence."""
        return True

    # --- calling -----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _has_build_grad(self) and not (_BUILD_STACK and _BUILD_STACK[-1] is self):
            msg = (f"{type(self).__name__}: `build_grad` has been implemented but the module is "
                   f"being called directly, so it is inlined and `build_grad` will not be used. "
                   f"Use `self.call_module` instead.")
            if self.grad_inlining_error == "error":
                raise Exception(msg)
            if self.grad_inlining_error == "warning":
                warnings.warn(msg, UserWarning)
        return self.build(*args, **kwargs)

    # --- graphs ------------------------------------------------------------------------
    def create_graph(self, *args: Any, **kwargs: Any
                     ) -> Tuple[NamedVariableFactories, GraphWithNamedArgs]:
        """Build the module into a graph: tensor arguments become the first graph inputs,
        `add_variable_input` calls append named inputs in call order.

        Returns:
            (factories of the named inputs, the graph with its named args).
        """
        d = self.__dict__
        d["aux"] = _Aux(self)
        _BUILD_STACK.append(self)
        try:
            if self._graph_cache is not None:
                graph = self._graph_cache.create_graph(self, *args, **kwargs)
                if graph not in self._args_cache:
                    self._args_cache[graph] = (self._variable_factories.copy(),
                                               self._named_inputs.copy(), self.aux.copy())
                facts, named, aux = self._args_cache[graph]
            else:
                graph = popxl.gir().create_graph(self, *args, **kwargs)
                facts, named, aux = (self._variable_factories, self._named_inputs,
                                     self.aux.copy())
            if _has_build_grad(self):
                graph._pb_graph.setCanBeRecursivelyAutodiffed(False)
            result = (facts.copy(),
                      GraphWithNamedArgs(graph, named.copy(), from_module=self, aux=aux,
                                         called_graphs_grad_info=self._all_called_graphs_grad_info()))
        finally:
            _BUILD_STACK.pop()
            self._reset()
        return result

    def _reset(self) -> None:
        self._variable_factories._clear()
        self._named_inputs._clear()

    # --- named inputs ------------------------------------------------------------------
    def add_variable_input(self, name: str, data_iter, dtype: Optional[popxl.dtype] = None,
                           by_ref: bool = False,
                           replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                           overwrite: bool = False) -> popxl.Tensor:
        """A named graph input of the graph being built, with the factory of its variable.

        Args:
            name: key (dotted names create nested trees).
            data_iter: callable or iterable of host data (see `VariableFactory`).
        """
        self._check_key(name, overwrite)
        tensor, vf = add_variable_input(name, data_iter, dtype, by_ref, replica_grouping)
        self._variable_factories.insert(name, vf, overwrite)
        self._named_inputs.insert(name, tensor, overwrite)
        return tensor

    def add_replica_sharded_variable_input(self, name: str, data_iter,
                                           dtype: Optional[popxl.dtype] = None,
                                           by_ref: bool = False,
                                           replica_grouping: Optional[popxl.ReplicaGrouping] = None,
                                           shard_over: Optional[int] = None) -> popxl.Tensor:
        """Like `add_variable_input` with a flat replica-sharded input (`meta_shape` = full)."""
        self._check_key(name, False)
        tensor, vf = add_replica_sharded_variable_input(name, data_iter, dtype, by_ref,
                                                        replica_grouping, shard_over)
        self._variable_factories.insert(name, vf)
        self._named_inputs.insert(name, tensor)
        return tensor

    def _check_key(self, name: str, overwrite: bool) -> None:
        if not overwrite and name in self._named_inputs:
            raise ValueError(f"'{name}' already exists")

    def add_variable_factory(self, variable_f: VariableFactory,
                             name: Optional[str] = None) -> popxl.Tensor:
        """Register an existing factory under `name` and return its new graph input."""
        name = name if name is not None else variable_f.name
        self._check_key(name, False)
        tensor = variable_f.create_input()
        self._variable_factories.insert(name, variable_f)
        self._named_inputs.insert(name, tensor)
        return tensor

    def add_variable_inputs(self, name: Union[str, int], variable_f: NamedVariableFactories,
                            overwrite: bool = False) -> NamedTensors:
        """Fresh graph inputs for every factory of `variable_f`, registered under `name`.

        The outlining idiom: `facts, g = Linear(n).create_graph(x)` then
        `g.bind(self.add_variable_inputs("fc2", facts)).call(x)`.
        """
        if isinstance(name, int):
            if name < 0:
                raise ValueError(f"add_variable_inputs: name cannot be a negative int, got {name}")
            name = str(name)
        named = {}
        for key, f in variable_f.to_dict().items():
            named[key] = popxl.graph_input(f.shape, f.dtype, f"{name}.{key}", by_ref=f.by_ref,
                                           meta_shape=f.meta_shape or None)
        nt = NamedTensors.from_dict(named)
        self._variable_factories.insert(name, variable_f.copy(), overwrite)
        self._named_inputs.insert(name, nt.copy(), overwrite)
        return nt

    # --- outlined calls ----------------------------------------------------------------
    def call_module(self, module: "Module", name: Optional[str] = None, autodiff: str = "auto",
                    grads_provided: Optional[Callable] = None,
                    grads_required: Optional[Callable] = None) -> Callable:
        """A callable that outlines `module` (own graph, named inputs under `name`), optionally
        builds its gradient graph now, and calls it; returns the module's outputs."""
        if autodiff not in ("auto", "build_grad", "autodiff", "none"):
            raise ValueError(f"autodiff should be one of 'auto', 'build_grad', 'autodiff', "
                             f"'none'. Not: {autodiff}")

        def _call(*args: Any, **kwargs: Any) -> Tuple[popxl.Tensor, ...]:
            facts, graph = module.create_graph(*args, **kwargs)
            n_out = len(graph.graph.outputs)
            named = self.add_variable_inputs(name or type(module).__name__, facts)
            self.called_graphs_grad_info.update(graph.called_graphs_grad_info)
            wants = autodiff in ("build_grad", "autodiff") or (
                autodiff == "auto" and _has_build_grad(module))
            if wants:
                gp = grads_provided(graph) if grads_provided else None
                gr = grads_required(graph) if grads_required else None
                grad = graph.autodiff(gp, gr, method="auto" if autodiff == "auto" else autodiff)
                self.called_graphs_grad_info[graph.graph] = grad.grad_graph_info
            outs = graph.bind(named).call(*_tensor_args(module.build, args, kwargs))
            return tuple(outs[:n_out])

        return _call

    # --- hand-written gradients --------------------------------------------------------
    def build_grad(self, *args: Any, **kwargs: Any):
        """Override to give the module a hand-written gradient (see `create_grad_graph`)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement build_grad")

    def create_grad_graph(self, fwd_graph: GraphWithNamedArgs,
                          grads_provided: Optional[Iterable[popxl.Tensor]] = None,
                          grads_required: Optional[Iterable[popxl.Tensor]] = None
                          ) -> GraphWithNamedArgs:
        """The gradient graph of `fwd_graph` built by `build_grad`.

        `build_grad(*grads)` receives the gradients of `grads_provided` (default all forward
        outputs) and returns the gradients of the non-variable `grads_required` (default all
        forward inputs) in order; variable gradients are set with `self.var_grad[name] = t`
        and appended. Tensors read from `self.aux` become `Fwd` inputs.
        """
        fwd = fwd_graph.graph
        provided = list(fwd.outputs) if grads_provided is None else list(grads_provided)
        required = list(fwd.inputs) if grads_required is None else list(grads_required)
        for t in provided:
            if t not in fwd.outputs:
                raise ValueError(f"A Tensor specified in `grads_provided` is not a output of "
                                 f"`fwd_graph`: {t}")
        for t in required:
            if t not in fwd.inputs:
                raise ValueError(f"A Tensor specified in `grads_required` is not a input of "
                                 f"`fwd_graph`: {t}")
        sig = inspect.signature(self.build_grad)
        if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in sig.parameters.values()):
            raise TypeError(f"{type(self).__name__}.build_grad: the method signature must only "
                            f"have a fixed number of positional parameters as inputs. {sig}")
        try:        # as upstream, which builds the graph of build_grad from grads_provided
            sig.bind(*provided)
        except TypeError as e:
            raise ValueError(f"The arguments, `args` and `kwargs`, do not match the signature of "
                             f"the function `fn`. ({type(self).__name__}.build_grad{sig} with "
                             f"{len(provided)} gradient(s) provided: {e})") from e
        var_tensors = set(fwd_graph.args.values_flat())
        non_var = [t for t in required if t not in var_tensors]
        var_req = [t for t in required if t in var_tensors]
        state = {"aux_store": dict(fwd_graph._aux), "aux_inputs": {}, "var_grads": {},
                 "args": fwd_graph.args}
        outputs: List[popxl.Tensor] = []

        def grad_fn(*grads):
            self.__dict__["_grad_state"] = state
            try:
                out = self.build_grad(*grads)
            finally:
                self.__dict__["_grad_state"] = None
            if out is None:
                outs = []
            elif isinstance(out, popxl.Tensor):
                outs = [out]
            else:
                outs = list(out)
            if len(outs) > len(non_var):
                raise ValueError(f"Too many outputs in the grad graph. Expected "
                                 f"{len(non_var)} (the non-variable `grads_required`), got "
                                 f"{len(outs)}")
            if len(outs) < len(non_var):
                raise ValueError(f"Not all forward graph inputs have been specified as outputs "
                                 f"in the grad graph. Expected {len(non_var)}, got {len(outs)}")
            missing = [t for t in var_req if t not in state["var_grads"]]
            if missing:
                raise ValueError(f"Not all variable gradients have been specified in "
                                 f"self.var_grad. Missing: {missing}")
            outs += [state["var_grads"][t] for t in var_req]
            for i, (o, t) in enumerate(zip(outs, non_var + var_req)):
                if o.shape != t.shape or tuple(o.meta_shape or ()) != tuple(t.meta_shape or ()):
                    raise ValueError(f"Shape or meta-shape of output Tensor at position {i} does "
                                     f"not match the `grad_required` at position {i}. "
                                     f"{o.shape} vs {t.shape}")
            outputs.extend(outs)
            return outs

        n = len(provided)
        params = [inspect.Parameter(f"grad_{i}", inspect.Parameter.POSITIONAL_ONLY)
                  for i in range(n)]
        grad_fn.__signature__ = inspect.Signature(params)
        grad_fn.__qualname__ = f"{type(self).__name__}_grad"
        grad_graph = popxl.gir().create_graph(grad_fn, *[t.spec for t in provided])
        # As upstream, every aux tensor becomes a forward output (inputs too), in aux order;
        # those build_grad read are the gradient graph's Fwd inputs (stitched activations).
        with fwd:
            for t in fwd_graph._aux.values():
                if isinstance(t, popxl.Tensor) and t not in fwd.outputs:
                    popxl.graph_output(t)
        g_ins = grad_graph.inputs
        grad_map = {g_ins[i]: provided[i] for i in range(n)}
        fwd_map = dict(state["aux_inputs"].values())
        out_map = dict(zip(grad_graph.outputs, non_var + var_req))
        info = create_grad_graph_info(popxl.gir(), fwd, grad_graph, grad_map, out_map, fwd_map)
        return GraphWithNamedArgs.from_grad_graph(info)
