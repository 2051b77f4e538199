#!/usr/bin/env python3
"""How much of upstream's Python surface (popxl, popxl_addons) this project provides.

Reads the inventory `tests/data/upstream_surface.md` (a copy of the shared reference: every name
upstream defines or re-exports, one line each, with parameter names and defaults), resolves each
name at its upstream path in the installed packages, and compares signatures.

    python tools/upstream_surface.py [--surface PATH] [--missing] [--write-expected]

Prints per package "names: have X of Y (Z%)" (definitions: module-level names, class members,
dunders, instance attributes; upstream's own inventory counts these) and "re-export paths: have
A of B", then, with `--missing`, every missing name; always every signature mismatch (parameter
names, kinds, defaults). Exits 0. `--write-expected` rewrites `tests/data/upstream_surface_expected.txt`,
the list of names that resolve with matching signatures, which `tests/tools/test_upstream_surface.py`
checks so the surface cannot regress.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["Entry", "parse_surface", "check_entry", "Result", "summarise", "read_expected",
           "REPO", "DEFAULT_SURFACE", "DEFAULT_EXPECTED", "DELIBERATE"]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SURFACE = REPO / "tests" / "data" / "upstream_surface.md"
DEFAULT_EXPECTED = REPO / "tests" / "data" / "upstream_surface_expected.txt"
PACKAGES = ("popxl", "popxl_addons")

# Public names whose signature differs from upstream's on purpose (documented at the name).
DELIBERATE = {
    "popxl_addons.named_buffers": "extra `shard_over`: upstream's version always raises "
                                  "TypeError (it calls replica_sharded_spec with one argument)",
    "popxl_addons.remote.named_buffers": "see popxl_addons.named_buffers",
}

_SECTION = re.compile(r"^## (?P<module>[\w.]+)\s")
_ENTRY = re.compile(r"^- `(?P<text>.*?)`(?P<note>\s.*)?$")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the inventory."""

    path: str                      # full dotted upstream path
    module: str                    # the section's module (where the path starts resolving)
    kind: str                      # "assign", "callable", "class", "property", "attribute",
    #                                "reexport"
    signature: Optional[str]       # parameter list as upstream writes it, or None
    target: Optional[str] = None   # re-exports: the defining path (or "module X")
    tags: Tuple[str, ...] = ()     # bracketed tags: class, classmethod, staticmethod, ...
    note: str = ""                 # the trailing note ("__init__ raises", "private", ...)

    @property
    def package(self) -> str:
        return self.path.split(".")[0]

    @property
    def attr_chain(self) -> List[str]:
        return self.path[len(self.module) + 1:].split(".")

    @property
    def is_definition(self) -> bool:
        return self.kind != "reexport"

    @property
    def is_member(self) -> bool:
        return len(self.attr_chain) > 1

    @property
    def category(self) -> str:
        """Upstream's counting category: module-level, class member, dunder, instance attribute
        or reexport path."""
        if self.kind == "reexport":
            return "reexport path"
        name = self.attr_chain[-1]
        if self.kind == "attribute":
            return "instance attribute"
        if self.is_member and name.startswith("__") and name.endswith("__"):
            return "dunder"
        return "class member" if self.is_member else "module-level"

    @property
    def is_public(self) -> bool:
        return not any(p.startswith("_") and not p.startswith("__") for p in self.attr_chain)


def _split_call(text: str) -> Tuple[str, Optional[str], str]:
    """`a.b(x, y=(1, 2)) rest` -> ("a.b", "x, y=(1, 2)", " rest")."""
    m = re.match(r"[\w.]+", text)
    path = m.group(0)
    rest = text[m.end():]
    if not rest.startswith("("):
        return path, None, rest
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            return path, rest[1:i], rest[i + 1:]
    raise ValueError(f"unbalanced parentheses in inventory entry: {text!r}")


def _parse_entry(text: str, module: str, note: str) -> Entry:
    path, sig, rest = _split_call(text)
    if " -> " in rest or rest.startswith(" -> "):
        target = rest.split(" -> ", 1)[1].strip()
        return Entry(path, module, "reexport", sig, target, (), note)
    tags: Tuple[str, ...] = ()
    rest = rest.strip()
    if rest.startswith("="):
        value = rest[1:].strip()
        tag_m = re.search(r"\s\[([^\]]*)\]$", value)
        tags = tuple(t.strip() for t in tag_m.group(1).split(",")) if tag_m else ()
        return Entry(path, module, "assign", None, None, tags, note)
    if rest.startswith("["):
        tags = tuple(t.strip() for t in rest[1:rest.rindex("]")].split(","))
    if any(t.startswith("class") and t != "classmethod" and t != "classattr" for t in tags):
        kind = "class"
    elif any(t.startswith("property") for t in tags):
        kind = "property"
    elif any(t.startswith("instance attribute") for t in tags):
        kind = "attribute"
    elif sig is not None:
        kind = "callable"
    else:
        kind = "assign"
    return Entry(path, module, kind, sig, None, tags, note)


def parse_surface(text: str) -> List[Entry]:
    """Every entry of the inventory, deduplicated, in file order."""
    out: Dict[str, Entry] = {}
    module = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            module = m.group("module")
            continue
        m = _ENTRY.match(line)
        if m and module is not None:
            e = _parse_entry(m.group("text"), module, (m.group("note") or "").strip())
            out.setdefault(e.path, e)
    return list(out.values())


# --- resolving -----------------------------------------------------------------------------
_MISSING = object()


def _import(module: str):
    try:
        return importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a missing or broken module is just "missing"
        return _MISSING


def _resolve(module: str, chain: List[str]) -> Tuple[Any, Any]:
    """(owner, object) at `module`.chain, or (_MISSING, _MISSING)."""
    owner = _import(module)
    if owner is _MISSING:
        return _MISSING, _MISSING
    obj = owner
    for name in chain:
        owner = obj
        if isinstance(obj, type):
            obj = _class_lookup(obj, name)
        else:
            obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            return owner, _MISSING
    return owner, obj


def _own_mro(cls: type) -> List[type]:
    return [c for c in cls.__mro__ if c not in (object, type)]


def _class_lookup(cls: type, name: str) -> Any:
    """A member as stored in the class (static lookup: properties stay properties)."""
    for c in cls.__mro__:
        if name in vars(c):
            if c in (object, type) and name.startswith("__"):
                return _MISSING          # dunders inherited from object do not count
            return vars(c)[name]
    return _MISSING


def _instance_attribute_present(cls: type, name: str) -> bool:
    """Set on `self` somewhere in the class hierarchy, or a slot / dataclass field / class-level
    member (property, annotation) of that name."""
    if _class_lookup(cls, name) is not _MISSING:
        return True
    # assigned on an instance in the class's code (`self.x = ...`, or `g.x = ...` in a factory)
    pattern = re.compile(rf"\b[A-Za-z_]\w*\.{re.escape(name)}\b[^=\n(<>!]*=[^=]")
    for c in _own_mro(cls):
        if name in getattr(c, "__slots__", ()) or name in getattr(c, "__annotations__", {}):
            return True
        if name in getattr(c, "__dataclass_fields__", {}):
            return True
        try:
            src = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        if pattern.search(src):
            return True
    return False


def _same_object(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, types.ModuleType) and isinstance(b, types.ModuleType):
        return a.__name__ == b.__name__
    return False


def _resolve_path(path: str) -> Any:
    """Resolve a full dotted path by importing the longest module prefix."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if _import(mod) is not _MISSING:
            return _resolve(mod, parts[i:])[1]
    return _MISSING


# --- signatures ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Param:
    name: str
    kind: str                      # "pos", "*", "kw", "**"
    default: Optional[str]         # source text, or None


def _upstream_params(sig: str) -> List[_Param]:
    fn = ast.parse(f"def f({sig}): pass").body[0]
    a = fn.args
    out: List[_Param] = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(pos, defaults):
        out.append(_Param(arg.arg, "pos", None if d is None else ast.unparse(d)))
    if a.vararg:
        out.append(_Param(a.vararg.arg, "*", None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append(_Param(arg.arg, "kw", None if d is None else ast.unparse(d)))
    if a.kwarg:
        out.append(_Param(a.kwarg.arg, "**", None))
    return out


_KINDS = {inspect.Parameter.POSITIONAL_ONLY: "pos", inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
          inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.KEYWORD_ONLY: "kw",
          inspect.Parameter.VAR_KEYWORD: "**"}


def _our_signature(entry: Entry, owner: Any, obj: Any) -> Optional[inspect.Signature]:
    """The signature as a caller sees it (self/cls dropped)."""
    drop_first = False
    if isinstance(obj, staticmethod):
        # `__new__` is an implicit staticmethod whose first parameter is still the class.
        obj, drop_first = obj.__func__, entry.attr_chain[-1] == "__new__"
    elif isinstance(obj, classmethod):
        obj, drop_first = obj.__func__, True
    elif isinstance(owner, type) and not isinstance(obj, type):
        drop_first = True           # plain methods, including C slot wrappers of builtins
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if drop_first and params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                    inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return sig.replace(parameters=params)


def _eval_default(src: str, namespace: Dict[str, Any]) -> Any:
    try:
        return ast.literal_eval(src)
    except (ValueError, SyntaxError):
        pass
    try:
        return eval(src, dict(namespace))  # noqa: S307 - trusted inventory text
    except Exception:  # noqa: BLE001
        return _MISSING


def _default_namespace(obj: Any) -> Dict[str, Any]:
    ns: Dict[str, Any] = {}
    import numpy as np

    import popxl

    ns.update(vars(popxl))
    ns.update({"popxl": popxl, "np": np, "dtypes": popxl.dtypes})
    fn = inspect.unwrap(getattr(obj, "__func__", obj))
    ns.update(getattr(fn, "__globals__", {}))
    if isinstance(obj, type):
        ns.update(vars(sys.modules.get(obj.__module__, types.ModuleType("x"))))
    return ns


def _defaults_equal(ours: Any, theirs: Any) -> bool:
    if ours is theirs:
        return True
    num = (int, float)
    if isinstance(ours, bool) != isinstance(theirs, bool):
        return False
    if isinstance(ours, num) and isinstance(theirs, num):
        return ours == theirs
    if type(ours) is not type(theirs) and not (isinstance(ours, (list, tuple))
                                               and isinstance(theirs, (list, tuple))):
        return False
    try:
        return bool(ours == theirs)
    except Exception:  # noqa: BLE001
        return False


def compare_signature(entry: Entry, owner: Any, obj: Any) -> Optional[str]:
    """None when the parameters match upstream's names, kinds and defaults; else a description."""
    ours = _our_signature(entry, owner, obj)
    if ours is None:
        return "signature cannot be inspected"
    theirs = _upstream_params(entry.signature)
    if [(p.name, p.kind) for p in theirs] == [("args", "*"), ("kwargs", "**")]:
        return None      # upstream forwards everything (e.g. to Module.__init__): any match
    mine = [(_p.name, _KINDS[_p.kind], _p.default) for _p in ours.parameters.values()]
    names_theirs = [(p.name, p.kind) for p in theirs]
    names_mine = [(n, k) for n, k, _ in mine]
    if names_theirs != names_mine:
        return (f"parameters ({_fmt(names_theirs)}) upstream, ({_fmt(names_mine)}) here")
    ns = _default_namespace(obj)
    for p, (_, _, d) in zip(theirs, mine):
        has_mine = d is not inspect.Parameter.empty
        if (p.default is None) != (not has_mine):
            return (f"parameter '{p.name}': upstream default "
                    f"{p.default if p.default is not None else '(required)'}, here "
                    f"{repr(d) if has_mine else '(required)'}")
        if p.default is not None:
            want = _eval_default(p.default, ns)
            if want is not _MISSING and not _defaults_equal(d, want):
                return f"parameter '{p.name}': upstream default {p.default}, here {d!r}"
    return None


def _fmt(params: Iterable[Tuple[str, str]]) -> str:
    pre = {"pos": "", "*": "*", "kw": "", "**": "**"}
    return ", ".join(pre[k] + n for n, k in params)


# --- checking ------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    entry: Entry
    present: bool
    mismatch: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Present, with upstream's signature."""
        return self.present and self.mismatch is None

    @property
    def allowed(self) -> bool:
        """Present with a signature difference that is accepted: a private name, or a public
        one listed in DELIBERATE."""
        return (self.present and self.mismatch is not None
                and (not self.entry.is_public or self.entry.path in DELIBERATE))


def _checks_signature(entry: Entry) -> bool:
    if entry.signature is None or entry.kind in ("property", "attribute", "assign"):
        return False
    if entry.kind == "class":
        return "__init__ raises" not in entry.note
    return True


def check_entry(entry: Entry) -> Result:
    """Does the entry resolve at its upstream path, and does its signature match?"""
    if entry.kind in ("attribute", "property") or "field" in entry.tags:
        # A property upstream may be a plain attribute here (and the reverse): callers read
        # both the same way. A dataclass field without a default is no class attribute
        # (upstream's neither): it is on every instance.
        owner, cls = _resolve(entry.module, entry.attr_chain[:-1])
        present = isinstance(cls, type) and _instance_attribute_present(cls, entry.attr_chain[-1])
        return Result(entry, present)
    owner, obj = _resolve(entry.module, entry.attr_chain)
    if obj is _MISSING:
        return Result(entry, False)
    if entry.kind == "reexport":
        target = entry.target
        if target.startswith("module "):
            return Result(entry, isinstance(obj, types.ModuleType)
                          and obj.__name__ == target.split()[1])
        present = _same_object(obj, _resolve_path(target))
    else:
        present = True
    mismatch = None
    if present and _checks_signature(entry):
        mismatch = compare_signature(entry, owner, obj)
    return Result(entry, present, mismatch)


def summarise(results: List[Result]) -> Dict[str, Dict[str, Tuple[int, int]]]:
    """{package: {"names": (have, total), "reexports": (have, total)}}."""
    out: Dict[str, Dict[str, Tuple[int, int]]] = {}
    for pkg in PACKAGES:
        rs = [r for r in results if r.entry.package == pkg]
        defs = [r for r in rs if r.entry.is_definition]
        rex = [r for r in rs if not r.entry.is_definition]
        out[pkg] = {"names": (sum(r.present for r in defs), len(defs)),
                    "reexports": (sum(r.present for r in rex), len(rex))}
    return out


def read_expected(text: str) -> Dict[str, str]:
    """{path: "=" or "~"} from an expectation file's text."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            mark, path = line.split(maxsplit=1)
            out[path] = mark
    return out


def _pct(have: int, total: int) -> str:
    return f"{100.0 * have / total:.1f}%" if total else "n/a"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surface", type=Path, default=DEFAULT_SURFACE,
                    help="the inventory (default: the repo copy under tests/data)")
    ap.add_argument("--missing", action="store_true", help="list every missing name")
    ap.add_argument("--write-expected", action="store_true",
                    help=f"rewrite {DEFAULT_EXPECTED.relative_to(REPO)}")
    args = ap.parse_args(argv)
    for pkg in PACKAGES:
        if _import(pkg) is _MISSING:
            print(f"error: cannot import {pkg}: install the project first "
                  f"(pip install -e .)", file=sys.stderr)
            return 2
    entries = parse_surface(args.surface.read_text())
    results = [check_entry(e) for e in entries]
    for pkg, counts in summarise(results).items():
        h, t = counts["names"]
        rh, rt = counts["reexports"]
        print(f"{pkg}: names: have {h} of {t} ({_pct(h, t)}); "
              f"re-export paths: have {rh} of {rt} ({_pct(rh, rt)})")
    mism = [r for r in results if r.present and r.mismatch and not r.allowed]
    print(f"\nsignature mismatches (public names): {len(mism)}")
    for r in mism:
        print(f"  {r.entry.path}: {r.mismatch}")
    allowed = [r for r in results if r.allowed]
    print(f"\naccepted differences (private names, or deliberate): {len(allowed)}")
    for r in allowed:
        why = DELIBERATE.get(r.entry.path, "private")
        print(f"  {r.entry.path}: {r.mismatch} [{why}]")
    missing = [r for r in results if not r.present]
    if args.missing:
        print(f"\nmissing: {len(missing)}")
        for r in missing:
            print(f"  {r.entry.path}" + (f"  [{r.entry.note}]" if r.entry.note else ""))
    if args.write_expected:
        lines = sorted([f"= {r.entry.path}" for r in results if r.ok]
                       + [f"~ {r.entry.path}" for r in results if r.allowed])
        DEFAULT_EXPECTED.write_text(
            "# Upstream names (tests/data/upstream_surface.md) this project provides.\n"
            "# '=': resolves with upstream's signature; '~': resolves, signature differs on\n"
            "# purpose (private, or tools/upstream_surface.py DELIBERATE).\n"
            "# Regenerate with `python tools/upstream_surface.py --write-expected`;\n"
            "# tests/tools/test_upstream_surface.py fails if any of these regresses.\n"
            + "\n".join(lines) + "\n")
        print(f"\nwrote {len(lines)} names to {DEFAULT_EXPECTED.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
