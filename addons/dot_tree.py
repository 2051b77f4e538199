"""`DotTree`: an ordered tree of named leaves addressed by dotted keys (`fc1.weight`)."""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, Generic, Iterable, List, Tuple, TypeVar, Union

from .utils import OrderedDict

__all__ = ["DotTree", "to_mapping", "sanitise"]

L = TypeVar("L")                       # leaf type
K = TypeVar("K")
V = TypeVar("V")
CLS = TypeVar("CLS", bound="DotTree")
LEAF = L
Key = Union[str, int]


def sanitise(name: str) -> str:
    """`name` turned into a valid Python identifier (invalid characters become `_`)."""
    s = re.sub(r"\W", "_", str(name))
    if not s or s[0].isdigit():
        s = "_" + s
    return s


def _check_part(part: str, key: str) -> None:
    if not (part.isidentifier() or part.isdigit()):
        raise ValueError(f"'{key}' is not a valid python identifier")


def _norm_key(key: Key) -> str:
    if isinstance(key, bool):
        raise TypeError(f"DotTree keys must be str or int, got {key!r}")
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"Numerical key cannot be negative: {key}")
        return str(key)
    if not isinstance(key, str):
        raise TypeError(f"DotTree keys must be str or int, got {type(key).__name__}")
    return key


class DotTree(Generic[LEAF]):
    """An ordered tree of leaves. Nested trees are created from dotted keys.

    Example:
        >>> t = NamedTensors.from_dict({"fc1.weight": w, "fc1.bias": b})
        >>> t.fc1.weight is w
        True
    """

    def __init__(self, **kwargs: Any):
        self._map: Dict[str, Any] = {}
        for k, v in kwargs.items():
            self.insert(k, v)

    # --- insertion ---------------------------------------------------------------------
    def insert(self, key: Key, value: Union[LEAF, "DotTree"], overwrite: bool = False) -> None:
        """Insert a leaf or a sub-tree under `key` (dotted keys create nested trees).

        Raises `ValueError("'<key>' already exists")` unless `overwrite`; a failing insert leaves
        the tree unchanged.
        """
        key = _norm_key(key)
        parts = key.split(".")
        for part in parts:
            _check_part(part, key)
        # Check first so that a failure changes nothing, then insert in place (in place keeps
        # sub-trees shared with sub-modules).
        self._check_insert(parts, key, value, overwrite)
        self._insert(parts, key, value, overwrite)

    def _check_insert(self, parts: List[str], key: str, value: Any, overwrite: bool) -> None:
        """Raise what `_insert` would raise, without changing anything."""
        node: DotTree = self
        for i, head in enumerate(parts):
            last = i == len(parts) - 1
            if head not in node._map:
                return                            # new sub-trees below: nothing to clash with
            old = node._map[head]
            if not last:
                if not isinstance(old, DotTree):
                    raise ValueError(f"'{key}' already exists: '{head}' is a leaf")
                node = old
                continue
            if not overwrite and not (isinstance(old, DotTree) and isinstance(value, DotTree)
                                      and old.len_flat() == 0):
                raise ValueError(f"'{key}' already exists")

    def _insert(self, parts: List[str], key: str, value: Any, overwrite: bool) -> None:
        head = parts[0]
        if len(parts) > 1:
            sub = self._map.get(head)
            if sub is None:
                sub = type(self)()
                self._map[head] = sub
            elif not isinstance(sub, DotTree):
                raise ValueError(f"'{key}' already exists: '{head}' is a leaf")
            sub._insert(parts[1:], key, value, overwrite)
            return
        if head in self._map and not overwrite:
            old = self._map[head]
            # An empty sub-tree left by a previous build (see Module._reset) may be refilled.
            if not (isinstance(old, DotTree) and isinstance(value, DotTree)
                    and old.len_flat() == 0):
                raise ValueError(f"'{key}' already exists")
        self._map[head] = value

    def update(self, values: "DotTree", overwrite: bool = False) -> None:
        """Insert every top-level entry of a copy of `values`."""
        for k, v in values.copy()._map.items():
            self.insert(k, v, overwrite)

    # --- lookup ------------------------------------------------------------------------
    def _resolve_part(self, part: Key) -> str:
        """The map key of one path part; numeric parts (ints, or digit strings) must exist,
        negative ones counting back from the largest numeric key (upstream's KeyErrors)."""
        if isinstance(part, int) and not isinstance(part, bool):
            existing = list(self._map)
            if part < 0:
                nums = [int(k) for k in self._map if k.isdigit()]
                top = max(nums) if nums else -1
                pos = top + 1 + part
                if pos < 0:
                    raise KeyError(f"Negative numerical key does not exist: {part}. Max numerical "
                                   f"key: {top}. Available keys: {existing}")
                if str(pos) not in self._map:
                    raise KeyError(f"Negative numerical key does not exist: {part}. Equivalent "
                                   f"positive key: {pos}. Available keys: {existing}")
                return str(pos)
            if str(part) not in self._map:
                raise KeyError(f"Numerical key does not exist: {part}. Available keys: "
                               f"{existing}")
            return str(part)
        return part

    def get(self, key: Key) -> Union[LEAF, "DotTree"]:
        """The leaf or sub-tree at `key` (dotted paths; ints index numeric keys, negative ints
        count from the largest numeric key)."""
        parts: List[Key] = [key] if isinstance(key, int) else str(key).split(".")
        node: Any = self
        for i, p in enumerate(parts):
            if not isinstance(node, DotTree):
                raise KeyError(f"Key exists ({parts[i - 1]}) but is not a sub-DotTree of type "
                               f"{type(self)} and therefore you cannot access the sub-key: "
                               f"{parts[i:]}.")
            if isinstance(p, str) and p.lstrip("-").isdigit():
                p = int(p)
            name = node._resolve_part(p)
            if name not in node._map:
                raise KeyError(f"Key does not exist: {key}. Available keys: {list(node._map)}")
            node = node._map[name]
        return node

    def __getitem__(self, key: Key) -> Union[LEAF, "DotTree"]:
        return self.get(key)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or "_map" not in self.__dict__:
            raise AttributeError(key)
        try:
            return self.get(key)
        except KeyError:
            keys = "\n".join(self._map)
            raise AttributeError(f"No attribute '{key}'. Available Keys:\n{keys}") from None

    def __contains__(self, key: Key) -> bool:
        try:
            self.get(key)
            return True
        except (KeyError, ValueError):
            return False

    def pop(self, key: Key) -> Union[LEAF, "DotTree"]:
        """Remove and return the entry at `key` (dotted paths allowed)."""
        key_s = _norm_key(key) if isinstance(key, int) else key
        parent_path, _, last = key_s.rpartition(".")
        parent = self.get(parent_path) if parent_path else self
        if not isinstance(parent, DotTree):
            raise KeyError(f"Key does not exist: {key}")
        last = parent._resolve_part(int(last)) if last.isdigit() else last
        if last not in parent._map:
            raise KeyError(f"Key does not exist: {key}. Available keys: {list(parent._map)}")
        return parent._map.pop(last)

    # --- structure ---------------------------------------------------------------------
    def copy(self) -> "DotTree":
        """A copy of the structure (sub-trees copied recursively, leaves shared)."""
        new = type(self)()
        new._map = {k: (v.copy() if isinstance(v, DotTree) else v) for k, v in self._map.items()}
        return new

    def filter_keys(self, keys: Iterable[Key]) -> "DotTree":
        """A new tree holding only `keys` (dotted keys allowed)."""
        keys = [str(k) for k in keys]
        if len(set(keys)) != len(keys):
            raise ValueError(f"`keys` cannot contain duplicate values. (filter_keys: {keys})")
        new = type(self)()
        for k in keys:
            v = self.get(k)
            new.insert(k, v.copy() if isinstance(v, DotTree) else v)
        return new

    def keys(self):
        return self._map.keys()

    def values(self):
        return self._map.values()

    def items(self):
        return self._map.items()

    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        """Always true, as upstream's (which has no `__len__`): an emptied tree is still there."""
        return True

    def len(self) -> int:  # noqa: A003 - upstream's method name
        """The number of top-level entries (leaves and sub-trees)."""
        return len(self._map)

    def _flat_items(self, prefix: str = "") -> Iterable[Tuple[str, Any]]:
        for k, v in self._map.items():
            if isinstance(v, DotTree):
                yield from v._flat_items(f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    def keys_flat(self) -> List[str]:
        return [k for k, _ in self._flat_items()]

    def values_flat(self) -> List[LEAF]:
        return [v for _, v in self._flat_items()]

    def len_flat(self) -> int:
        return sum(1 for _ in self._flat_items())

    def to_dict(self) -> OrderedDict:
        """The flattened tree `{"a.b.c": leaf}` in insertion order."""
        return OrderedDict(self._flat_items())

    @classmethod
    def from_dict(cls, d: Dict[Key, Any]) -> "DotTree":
        tree = cls()
        for k, v in d.items():
            tree.insert(k, v)
        return tree

    def unpack(self) -> Tuple[Tuple[str, ...], Tuple[LEAF, ...]]:
        """`(keys, values)` sorted by flat key."""
        items = sorted(self._flat_items(), key=lambda kv: kv[0])
        if not items:
            return [], []
        keys, values = zip(*items)
        return keys, values

    @classmethod
    def pack(cls, keys: Iterable[Key], values: Iterable[Any]) -> "DotTree":
        return cls.from_dict(dict(zip(keys, values)))

    def map(self, fn: Callable[[LEAF], Any]) -> "DotTree":
        """Same keys, leaves replaced by `fn(leaf)`."""
        new = type(self)()
        new._map = {k: (v.map(fn) if isinstance(v, DotTree) else fn(v))
                    for k, v in self._map.items()}
        return new

    def to_mapping(self, values: "DotTree") -> Dict[Any, Any]:
        """`{self_leaf: values_leaf}` for the flat keys present in both trees."""
        return to_mapping(self, values)

    def _clear(self) -> None:
        """Remove all leaves recursively, keeping (now empty) sub-trees."""
        for k, v in list(self._map.items()):
            if isinstance(v, DotTree):
                v._clear()
            else:
                del self._map[k]

    def __repr__(self) -> str:
        # The tutorials' format: a plain dict of flat keys (see tests/addons/test_dot_tree.py).
        return repr(dict(self._flat_items()))

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)


def to_mapping(key: DotTree, value: DotTree) -> Dict[Any, Any]:
    """`{key_leaf: value_leaf}` for the flat keys common to the trees `key` and `value` (others
    are dropped)."""
    vd = value.to_dict()
    return {v: vd[k] for k, v in key.to_dict().items() if k in vd}
