"""`cppimport` without a compiler: imports of C++ bindings resolve to the emulator's
implementations.

Upstream, a custom op's wrapper does `import cppimport.import_hook` and then imports its
binding (`from . import my_op_binding`), which compiles `my_op_binding.cpp` against the Poplar
SDK. `install()` (run by `import popxl`) puts a finder first on `sys.meta_path` that

* serves a binding whose `.cpp` / `.c` file opts in to cppimport (`cppimport` on its first line)
  as a `BindingModule` (or fails with `UnknownBindingError`), once `cppimport.import_hook` has
  been imported, as cppimport itself does;
* when the real cppimport package is installed, lets it load but points its `imp`,
  `imp_from_filepath`, `build`, `build_filepath` and `build_all` at the emulator, and keeps this
  finder ahead of cppimport's own hook (which inserts itself first when imported);
* when it is not installed, serves a small stand-in `cppimport` package with those names.

Only the standard library is imported here: this runs while `popxl` itself is imported.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Callable, Optional

__all__ = ["install", "find_binding_source", "imp", "imp_from_filepath"]

_EXTENSIONS = (".cpp", ".c")
STANDIN_VERSION = "popxl-dist stand-in"


def _is_opt_in(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return b"cppimport" in f.readline()
    except OSError:
        return False


def find_binding_source(fullname: str, path=None) -> Optional[str]:
    """The opted-in `.cpp` / `.c` file of module `fullname`, in the parent package's `path`
    (or on sys.path for a top-level module), else None."""
    leaf = fullname.rpartition(".")[2]
    for folder in (sys.path if path is None else path):
        if not isinstance(folder, str):
            continue
        for ext in _EXTENSIONS:
            candidate = os.path.join(folder or os.getcwd(), leaf + ext)
            if os.path.isfile(candidate) and _is_opt_in(candidate):
                return os.path.abspath(candidate)
    return None


def _find_on_sys_path(fullname: str, opt_in: bool) -> Optional[str]:
    """cppimport's own search: `a/b/c.cpp` under any sys.path folder."""
    rel = fullname.replace(".", os.sep)
    for folder in sys.path:
        for ext in _EXTENSIONS:
            candidate = os.path.join(folder or os.getcwd(), rel + ext)
            if os.path.isfile(candidate) and (not opt_in or _is_opt_in(candidate)):
                return os.path.abspath(candidate)
    return None


def _bindings():
    """The registrations' module of `popxl`, the package programs import (also when this code
    runs from a second copy of the package imported under another name)."""
    try:
        return importlib.import_module("popxl.custom_ops.bindings")
    except ImportError:
        from . import bindings
        return bindings


# --- cppimport's API, served by the emulator -------------------------------------------------
def imp_from_filepath(filepath: str, fullname: Optional[str] = None):
    """The binding module of the C++ file `filepath` (cppimport's `imp_from_filepath`): the
    emulator's registered implementation, nothing compiled."""
    b = _bindings()
    filepath = os.path.abspath(filepath)
    fullname = fullname or os.path.splitext(os.path.basename(filepath))[0]
    existing = sys.modules.get(fullname)
    if isinstance(existing, b.BindingModule) and existing.__file__ == filepath:
        return existing
    module = b.binding_module(fullname, filepath)
    sys.modules[fullname] = module
    return module


def imp(fullname: str, opt_in: bool = False):
    """cppimport's `imp`: find `fullname`'s C++ file on sys.path and return its binding."""
    path = _find_on_sys_path(fullname, opt_in)
    if path is None:
        raise ImportError(f"Couldn't find a file matching the module name: {fullname}  "
                          f"(opt_in = {opt_in})")
    return imp_from_filepath(path, fullname)


def build(fullname: str) -> str:
    """cppimport's `build`: nothing to compile; checks the binding resolves, returns its path."""
    return imp(fullname).__file__


def build_filepath(filepath: str, fullname: Optional[str] = None) -> str:
    return imp_from_filepath(filepath, fullname).__file__


def build_all(root_directory: str) -> None:
    """cppimport's `build_all`: every opted-in C++ file under `root_directory` must resolve."""
    for folder, _, files in os.walk(root_directory):
        for name in files:
            path = os.path.join(folder, name)
            if (not name.startswith(".") and os.path.splitext(name)[1] in _EXTENSIONS
                    and _is_opt_in(path)):
                build_filepath(path)


_API = {"imp": imp, "imp_from_filepath": imp_from_filepath, "build": build,
        "build_filepath": build_filepath, "build_all": build_all, "cppimport": imp}


def _patch_cppimport(module: types.ModuleType) -> None:
    """Point a (real or stand-in) cppimport module's entry points at the emulator."""
    if getattr(module, "_popxl_patched", False):
        return
    for name, fn in _API.items():
        setattr(module, name, fn)
    module._popxl_patched = True


def _standin_cppimport(module: types.ModuleType) -> None:
    module.__doc__ = ("popxl-dist's stand-in for cppimport (not installed): imports of C++ "
                      "bindings resolve to the emulator's registered implementations.")
    module.__version__ = STANDIN_VERSION
    module.settings = dict(force_rebuild=False, file_exts=list(_EXTENSIONS), rtld_flags=0,
                           use_filelock=False, lock_suffix=".lock", lock_timeout=600,
                           remove_strict_prototypes=True, release_mode=False)

    def force_rebuild(to: bool = True) -> None:
        module.settings["force_rebuild"] = to

    def set_rtld_flags(flags) -> None:
        module.settings["rtld_flags"] = flags

    module.force_rebuild = force_rebuild
    module.set_rtld_flags = set_rtld_flags
    module.turn_off_strict_prototypes = lambda: None
    _patch_cppimport(module)


# --- the finder ----------------------------------------------------------------------------------
class _CallbackLoader(importlib.abc.Loader):
    """Runs `make(module)` to fill a new module (stand-ins)."""

    def __init__(self, make: Callable[[types.ModuleType], None]) -> None:
        self._make = make

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        self._make(module)


class _AfterExecLoader(importlib.abc.Loader):
    """Another loader, then `after(module)`."""

    def __init__(self, loader, after: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _BindingLoader(importlib.abc.Loader):
    def __init__(self, path: str) -> None:
        self.path = path

    def create_module(self, spec):
        b = _bindings()
        existing = sys.modules.get(spec.name)
        if isinstance(existing, b.BindingModule) and existing.__file__ == self.path:
            return existing
        return b.binding_module(spec.name, self.path)

    def exec_module(self, module) -> None:
        pass


def _is_cppimport_hook(finder: Any) -> bool:
    return type(finder).__module__ == "cppimport.import_hook"


def _is_ours(finder: Any) -> bool:
    """A finder of this module (also from another copy of it, if popxl is imported twice)."""
    return getattr(finder, "_popxl_cppimport_finder", False) is True


class CppimportFinder(importlib.abc.MetaPathFinder):
    """The emulator's meta path finder for cppimport and its bindings (one, first on
    sys.meta_path)."""

    _popxl_cppimport_finder = True

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname == "cppimport" or fullname.startswith("cppimport."):
            return self._cppimport_spec(fullname, path, target)
        if "cppimport.import_hook" not in sys.modules:
            return None
        source = find_binding_source(fullname, path)
        if source is None:
            return None
        return importlib.util.spec_from_loader(fullname, _BindingLoader(source), origin=source,
                                               is_package=False)

    def _elsewhere(self, fullname: str, path, target):
        """The spec the rest of sys.meta_path finds (cppimport's own hook aside); None also
        when a finder says the module is not available (raises ImportError)."""
        for finder in list(sys.meta_path):
            if _is_ours(finder) or _is_cppimport_hook(finder):
                continue
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(fullname, path, target) if find is not None else None
            except ImportError:
                return None
            if spec is not None:
                return spec
        return None

    def _cppimport_spec(self, fullname: str, path, target):
        parent = sys.modules.get("cppimport")
        standin = parent is not None and getattr(parent, "__version__", "") == STANDIN_VERSION
        if fullname == "cppimport":
            spec = self._elsewhere(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterExecLoader(spec.loader, _patch_cppimport)
                return spec
            return importlib.machinery.ModuleSpec("cppimport", _CallbackLoader(_standin_cppimport),
                                                  is_package=True)
        if fullname == "cppimport.import_hook":
            if standin:
                return importlib.machinery.ModuleSpec(
                    fullname, _CallbackLoader(lambda m: setattr(
                        m, "__doc__", "popxl-dist stand-in: C++ bindings resolve to the "
                        "emulator's implementations")))
            spec = self._elsewhere(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterExecLoader(spec.loader, lambda m: _move_to_front(self))
            return spec
        return None


_FINDER: Optional[CppimportFinder] = None


def _move_to_front(finder: CppimportFinder) -> None:
    """`finder` first on sys.meta_path, and no other finder of ours (from another copy of this
    module) anywhere on it."""
    if sys.meta_path and sys.meta_path[0] is finder and \
            not any(_is_ours(f) for f in sys.meta_path[1:]):
        return
    sys.meta_path[:] = [f for f in sys.meta_path if not _is_ours(f)]
    sys.meta_path.insert(0, finder)


def install() -> CppimportFinder:
    """Put the finder first on sys.meta_path (once) and patch an already imported cppimport.

    If popxl is imported twice (its folder under a second name), one finder stays, and whichever
    it is serves the registrations of `popxl`, the package programs use."""
    global _FINDER
    if _FINDER is None:
        existing = [f for f in sys.meta_path if _is_ours(f)]
        _FINDER = existing[0] if existing else CppimportFinder()
    _move_to_front(_FINDER)
    real = sys.modules.get("cppimport")
    if real is not None:
        _patch_cppimport(real)
    return _FINDER
