"""C++ custom op bindings without C++: which Python implementation a `cppimport` binding
resolves to, and the module object that stands in for the compiled binding.

Upstream, an op's Python wrapper imports a pybind11 module compiled from `<name>_binding.cpp`
and calls `<module>.<OpClass>.createOpInGraph(pb_graph, inputs, outputs, *attributes,
settings)`. Here the module is a `BindingModule` whose classes come from registrations
(`register`): a CustomOp subclass under the binding's module name and class name, optionally
only for given C++ sources (`sources_digest`), so that two bindings of one name that do
different things (an app's modified copy of a library op) resolve to different implementations.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .index_map import index_map

__all__ = ["register", "sources_digest", "BindingSource", "BindingModule",
           "UnknownBindingError", "binding_module", "registrations"]

CUSTOM_OPS_ENV = "POPXL_CUSTOM_OPS"
SOURCE_EXTENSIONS = (".cpp", ".c")


class UnknownBindingError(ImportError):
    """A C++ custom op binding (or one of its classes) has no registered implementation."""


# --- the C++ sources -----------------------------------------------------------------------------
_MODULE_RE = re.compile(r"PYBIND11_MODULE\s*\(\s*([A-Za-z_]\w*)\s*,")
_CLASS_RE = re.compile(r"\(\s*m\s*,\s*\"([A-Za-z_]\w*)\"")
_SOURCES_RE = re.compile(r"cfg\s*\[\s*['\"]sources['\"]\s*\]\s*=\s*\[([^\]]*)\]")
_INCLUDE_RE = re.compile(r"#\s*include\s*\"([^\"]+)\"")


def is_cppimport_source(path: str) -> bool:
    """Whether `path` opts in to cppimport (the word on its first line), as cppimport checks."""
    try:
        with open(path, "rb") as f:
            return b"cppimport" in f.readline()
    except OSError:
        return False


def _strip_comments(text: str) -> str:
    """C/C++ source without its comments (string and character literals kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _normalised(text: str) -> bytes:
    return "".join(_strip_comments(text).split()).encode()


@dataclass
class BindingSource:
    """What a `// cppimport` binding file declares: the module name (`PYBIND11_MODULE`), the
    classes it binds (`py::class_<...>(m, "Name")`) and the files it compiles with it."""

    path: str
    name: str
    classes: Tuple[str, ...]
    sources: Tuple[str, ...]
    _digest: Optional[str] = field(default=None, repr=False)

    @classmethod
    def read(cls, path: str) -> "BindingSource":
        path = os.path.abspath(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        code = _strip_comments(text)
        m = _MODULE_RE.search(code)
        name = m.group(1) if m else os.path.splitext(os.path.basename(path))[0]
        classes = tuple(dict.fromkeys(_CLASS_RE.findall(code)))
        srcs = _SOURCES_RE.search(text)
        sources = tuple(re.findall(r"['\"]([^'\"]+)['\"]", srcs.group(1))) if srcs else ()
        return cls(path, name, classes, sources)

    @property
    def digest(self) -> str:
        """`sources_digest` of the binding."""
        if self._digest is None:
            self._digest = sources_digest(self.path)
        return self._digest


def sources_digest(binding_path: str) -> str:
    """A fingerprint of a C++ binding: SHA-256 over the binding file, the files its cppimport
    configuration compiles with it (`cfg['sources']`) and the local headers they include
    (`#include "..."`), each without comments and whitespace. Pass it to `register(...,
    sources=...)` to bind an implementation to exactly these sources."""
    binding_path = os.path.abspath(binding_path)
    folder = os.path.dirname(binding_path)
    src = BindingSource.read(binding_path)
    files = [binding_path] + [os.path.join(folder, s) for s in src.sources]
    seen: Dict[str, bytes] = {}
    while files:
        p = os.path.normpath(files.pop(0))
        if p in seen or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        seen[p] = _normalised(text)
        base = os.path.dirname(p)
        files.extend(os.path.join(base, inc) for inc in _INCLUDE_RE.findall(text))
    h = hashlib.sha256()
    names = sorted(seen, key=lambda p: (p != binding_path, os.path.relpath(p, folder)))
    for p in names:
        h.update(os.path.relpath(p, folder).replace(os.sep, "/").encode() + b"\0")
        h.update(seen[p] + b"\0")
    return h.hexdigest()


# --- registrations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Registration:
    binding: str
    name: str
    op: Any                        # a CustomOp subclass, or a class with createOpInGraph
    sources: Optional[str]         # a sources_digest, or None for any sources
    builtin: bool = False

    def matches(self, src: BindingSource) -> bool:
        return self.binding == src.name and (self.sources is None or self.sources == src.digest)


_REGISTRY: List[Registration] = []
_LOCK = threading.RLock()
_env_loaded = False


def register(op: Any = None, *, binding: str, name: Optional[str] = None,
             sources: Optional[str] = None):
    """Bind a CustomOp subclass to a C++ binding: the class `name` (default `op.op_type + "Op"`)
    of the pybind11 module `binding` (the `PYBIND11_MODULE` name, which is also the `.cpp` file's
    name), so that `binding.<name>.createOpInGraph(graph, inputs, outputs, *attributes,
    settings)` builds `op`. With `sources` (a `sources_digest`) it applies to those C++ sources
    only. The most recent matching registration wins (yours over the built-in ones).

    Usable as a decorator (`@register(binding="my_op_binding")`); returns `op`."""
    from .op import CustomOp

    def deco(op_cls):
        if not (isinstance(op_cls, type) and issubclass(op_cls, CustomOp)):
            raise TypeError(f"register: expected a popxl.custom_ops.CustomOp subclass, got "
                            f"{op_cls!r}")
        op_cls._check_class()
        _add(Registration(_name_arg(binding, "binding"),
                          _name_arg(name or f"{op_cls.op_type}Op", "name"), op_cls,
                          _digest_arg(sources)))
        return op_cls

    return deco if op is None else deco(op)


def _register_builtin(binding: str, name: str, op: Any, sources: Optional[str]) -> None:
    """A popxl-dist implementation of a known Graphcore binding (looked at after the user's)."""
    _add(Registration(binding, name, op, sources, builtin=True))


def _add(reg: Registration) -> None:
    with _LOCK:
        if reg.builtin:
            _REGISTRY.insert(0, reg)
        else:
            _REGISTRY.append(reg)


def _name_arg(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(f"register: {what} must be a Python identifier (the name the C++ "
                         f"binding defines), got {value!r}")
    return value


def _digest_arg(value: Any) -> Optional[str]:
    if value is not None and not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value)):
        raise ValueError(f"register: sources must be a sources_digest() (64 hex digits) or None, "
                         f"got {value!r}")
    return value


def registrations() -> List[Registration]:
    """Every registration, in lookup order (most recent user registration first)."""
    _load_env_modules()
    with _LOCK:
        return list(reversed(_REGISTRY))


def _load_env_modules() -> None:
    """Import the modules named in POPXL_CUSTOM_OPS (comma separated): they register ops."""
    global _env_loaded
    if _env_loaded:
        return
    _env_loaded = True
    from .known import BUILTINS

    for binding, name, op, sources in BUILTINS:
        _register_builtin(binding, name, op, sources)

    for mod in filter(None, (m.strip() for m in os.environ.get(CUSTOM_OPS_ENV, "").split(","))):
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ImportError(f"{CUSTOM_OPS_ENV} names the module {mod!r}, which could not be "
                              f"imported: {e}") from e


def _resolve(src: BindingSource) -> Dict[str, Registration]:
    """class name -> the registration that implements it, for this binding's sources."""
    found: Dict[str, Registration] = {}
    for reg in registrations():
        if reg.name not in found and reg.matches(src):
            found[reg.name] = reg
    return found


def _how_to_register(src: BindingSource, cls_name: Optional[str] = None) -> str:
    names = [cls_name] if cls_name else list(src.classes) or ["<OpClass>"]
    lines = "\n".join(f"    popxl.custom_ops.register(My{n}, binding={src.name!r}, name={n!r})"
                      for n in names)
    return (f"popxl-dist compiles no C++: define each op's shape inference, NumPy kernel and "
            f"gradient as a popxl.custom_ops.CustomOp subclass and register it before the "
            f"binding is imported (or name the module that registers it in {CUSTOM_OPS_ENV}):\n"
            f"{lines}\n(see docs/custom-ops.md)")


def _unknown_message(src: BindingSource) -> str:
    same_name = [r for r in registrations() if r.binding == src.name]
    note = ""
    if same_name:
        note = (f" Implementations are registered for a binding of this name, but for other C++ "
                f"sources (digests {sorted({r.sources[:12] for r in same_name if r.sources})}); "
                f"this file's sources_digest is {src.digest}.")
    classes = ", ".join(src.classes) or "none found"
    return (f"C++ custom op binding '{src.name}' ({src.path}; classes: {classes}) has no "
            f"implementation for the emulator.{note}\n{_how_to_register(src)}")


# --- the stand-in module -------------------------------------------------------------------------
class BindingModule(types.ModuleType):
    """The emulator's stand-in for a compiled binding: its op classes are the registered
    implementations (looked up when first used, so later registrations count)."""

    def __init__(self, fullname: str, src: BindingSource) -> None:
        super().__init__(fullname, f"popxl-dist stand-in for the C++ binding {src.path}")
        self.__file__ = src.path
        self._popxl_binding = src
        self._popxl_classes: Dict[str, Any] = {}

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr.startswith("_popxl"):
            raise AttributeError(attr)
        cached = self.__dict__["_popxl_classes"].get(attr)
        if cached is not None:
            return cached
        src = self.__dict__["_popxl_binding"]
        reg = _resolve(src).get(attr)
        if reg is None:
            if attr in src.classes:
                raise UnknownBindingError(
                    f"C++ custom op binding '{src.name}' ({src.path}): class {attr} has no "
                    f"implementation for the emulator.\n{_how_to_register(src, attr)}")
            raise AttributeError(f"C++ binding '{src.name}' ({src.path}) has no class "
                                 f"{attr!r} (it binds: {', '.join(src.classes) or 'none'})")
        bound = binding_class(reg.op, attr, src.name)
        self.__dict__["_popxl_classes"][attr] = bound
        return bound

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(_resolve(self._popxl_binding)))


def binding_module(fullname: str, path: str) -> BindingModule:
    """The stand-in module of the binding at `path`; UnknownBindingError if nothing implements
    it."""
    src = BindingSource.read(path)
    if not _resolve(src):
        raise UnknownBindingError(_unknown_message(src), name=fullname, path=src.path)
    return BindingModule(fullname, src)


def binding_class(op: Any, name: str, binding: str) -> Any:
    """The object an app reaches as `<binding>.<name>`: `op` itself when it already has a
    `createOpInGraph` (built-in bindings), else a class around a CustomOp subclass."""
    from .op import CustomOp

    if not (isinstance(op, type) and issubclass(op, CustomOp)):
        return op

    def createOpInGraph(graph, inputs, outputs, *args, **kwargs):
        return create_op_in_graph(op, graph, inputs, outputs, args, kwargs,
                                  f"{binding}.{name}")

    return type(name, (), {
        "__doc__": f"Binding class {binding}.{name}: builds custom op {op._describe()}.",
        "__module__": binding,
        "createOpInGraph": staticmethod(createOpInGraph),
        "custom_op": op,
    })


def create_op_in_graph(op: Any, graph: Any, inputs: Any, outputs: Any, args: Sequence[Any],
                       kwargs: Dict[str, Any], where: str):
    """`createOpInGraph(graph, {index: tensor id}, {index: new tensor id}, *attributes,
    settings)` for a CustomOp subclass: builds the op in `graph` and returns its `_ir.Op` view
    (`op.outTensor(i)`). As upstream, the caller runs the op-created hooks
    (`ctx._op_created(op)`)."""
    from .._pb_shim import op_view
    from ..graph import Graph

    g = getattr(graph, "_graph", graph)
    if not isinstance(g, Graph):
        raise TypeError(f"{where}.createOpInGraph: graph must be a graph's _pb_graph, got "
                        f"{type(graph).__name__}")
    names = tuple(op.attributes)
    args = list(args)
    settings = kwargs.pop("settings", None)
    if settings is None and len(args) == len(names) + 1:
        settings = args.pop()
    attrs = dict(zip(names, args))
    unknown = [k for k in kwargs if k not in names or k in attrs]
    attrs.update((k, v) for k, v in kwargs.items() if k not in unknown)
    if len(args) > len(names) or unknown or len(attrs) != len(names):
        raise TypeError(f"{where}.createOpInGraph takes (graph, inputs, outputs, "
                        f"{', '.join(names + ('settings',))}), got {len(args)} attribute "
                        f"value(s) and keywords {sorted(kwargs)}")
    in_ids = index_map(inputs, f"{where}.createOpInGraph: inputs")
    out_ids = index_map(outputs, f"{where}.createOpInGraph: outputs")
    if len(out_ids) != op.num_outputs:
        raise ValueError(f"{where}.createOpInGraph: {len(out_ids)} output ids given, the op "
                         f"has {op.num_outputs} outputs")
    tensors = []
    for i, tid in enumerate(in_ids):
        if tid not in g._data.tensors:
            raise ValueError(f"{where}.createOpInGraph: input {i} '{tid}' is not a tensor of "
                             f"graph '{g.id}'")
        tensors.append(g._tensor(tid))
    name = settings.get("name") if isinstance(settings, dict) else None
    outs = op._append(g, tensors, attrs, name or f"{op.op_type}Op", out_ids=out_ids,
                      notify=False)
    return op_view(g, g._data.producer[outs[0].id])
