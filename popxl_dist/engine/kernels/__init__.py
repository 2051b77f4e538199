"""NumPy kernels, one module per op family. `load_all()` imports every module of this package so
its `@kernel` registrations take effect (a new family module needs no other edit)."""
import importlib
import pkgutil

__all__ = ["load_all"]

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_") and m.name != "registry":
            importlib.import_module(f"{__name__}.{m.name}")
    _loaded = True
