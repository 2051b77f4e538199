"""`popxl.ops`: op builders. Every non-underscore module here is an op family; its `__all__`
names are exported from `popxl.ops` (so a new family needs no edit here). The namespace modules
`collectives`, `var_updates`, `random_seed` and `utils` are reached as attributes
(`ops.var_updates.x`). Upstream's one-module-per-op paths (`popxl.ops.gather.tied_gather`) are
registered by `_layout.install`."""
import importlib as _importlib
import pkgutil as _pkgutil

_NAMESPACES = {"collectives", "var_updates", "random_seed", "utils"}
__all__ = []

for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("_"):
        continue
    _mod = _importlib.import_module(f"{__name__}.{_m.name}")
    if _m.name in _NAMESPACES:
        globals()[_m.name] = _mod
        continue
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)

from . import _layout as _upstream_layout  # noqa: E402

_upstream_layout.install(_importlib.import_module(__name__))
