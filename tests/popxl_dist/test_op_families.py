"""The three op trees line up: every op type's builder (`popxl/ops/<family>.py`, `_<family>.py` when
popxl.ops has no public builder for it), kernel (`popxl/engine/kernels/<family>.py`) and grad rule
(`popxl/transforms/grads/<family>.py`) live in modules of the same family name (docs/development.md: Layout).

Builders are found statically: a module builds op type T when the string "T" occurs in it
(`add_op("Gelu", ...)`, `binary_op("Div", ...)`, `grad_op("GeluGrad", ...)`, tables of op types).
Composite builders may use other families' op types (log2 builds a Div), so the check is that the
kernel's family is among the modules that build T. A grad op type whose name is made at run time
(`f"{op.type}Grad"`) counts as built where its forward op type is.
"""
import ast
import pathlib

import popxl
import popxl.ops  # noqa: F401  (imports every builder module)
from popxl.engine.kernels import load_all as load_kernels
from popxl.engine.kernels.registry import CONTROL_FLOW_TYPES, KERNELS
from popxl.transforms.grad_registry import GRAD_RULES, REGISTERED_IN
from popxl.transforms.grad_registry import load_all as load_grads

PKG = pathlib.Path(popxl.__file__).parent
OPS, KERNEL_DIR, GRADS = PKG / "ops", PKG / "engine" / "kernels", PKG / "transforms" / "grads"
GRADS_PKG = "popxl.transforms.grads."

# Builder modules that are no family of their own, and why.
OPS_NOT_FAMILIES = {
    "call": "control flow (Call, Loop, If): the compiler runs them, no kernel module",
    "indexing": "Tensor.__getitem__, composed of the shape and elementwise builders",
    "random_seed": "upstream's module popxl.ops.random_seed: builds ModifyRandomSeed, family random",
    "utils": "upstream's argument helpers, no ops",
}
BUILDER_FAMILY_ALIAS = {"random_seed": "random"}
# Op types without a builder in popxl/ops or a grad rule emitting them, and why.
NO_BUILDER = {
    "AddRhsInplace": "made by decompose_sum and the popart shim only (an Add writing input 1)",
}


def _modules(folder: pathlib.Path):
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def _family(module: str) -> str:
    return module.lstrip("_")


def _built_op_types(path: pathlib.Path) -> set:
    """The string constants in `path`."""
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def _builders():
    """op type -> families of the popxl/ops and grads modules that build it."""
    ops_b, grads_b = {}, {}
    for folder, table in ((OPS, ops_b), (GRADS, grads_b)):
        for path in folder.glob("*.py"):
            if path.stem in ("__init__", "_builder", "_layout", "_common", "_internal"):
                continue
            fam = BUILDER_FAMILY_ALIAS.get(path.stem, _family(path.stem))
            for t in _built_op_types(path):
                table.setdefault(t, set()).add(fam)
    return ops_b, grads_b


def _kernel_family(op_type: str) -> str:
    return _family(KERNELS[op_type].factory.__module__.rsplit(".", 1)[1])


def test_the_three_trees_have_the_same_families():
    kernels = {m for m in _modules(KERNEL_DIR) if not m.startswith("_") and m != "registry"}
    grads = {m for m in _modules(GRADS) if not m.startswith("_")}
    ops = {_family(m) for m in _modules(OPS) if m not in ("_builder", "_layout", "_internal")}
    assert grads == kernels | {"call"}, (grads ^ (kernels | {"call"}))
    assert ops - set(OPS_NOT_FAMILIES) == kernels, (ops - set(OPS_NOT_FAMILIES)) ^ kernels


def test_every_op_type_has_kernel_grad_rule_and_builder_in_one_family():
    load_kernels()
    load_grads()
    ops_b, grads_b = _builders()
    wrong = []
    for t in sorted(set(KERNELS) | set(REGISTERED_IN)):
        if t in CONTROL_FLOW_TYPES:
            fam = "call"
        elif t in KERNELS:
            fam = _kernel_family(t)
        else:
            wrong.append(f"{t}: a grad rule in {REGISTERED_IN[t]} but no kernel")
            continue
        where = REGISTERED_IN.get(t)
        if where is not None and _family(where.rsplit(".", 1)[1]) != fam:
            wrong.append(f"{t}: kernel family {fam}, grad rule in {where}")
        builders = ops_b.get(t, set()) | grads_b.get(t, set())
        if not builders and t.endswith("Grad"):
            builders = ops_b.get(t[:-len("Grad")], set())
        if not builders:
            if t not in NO_BUILDER and t not in CONTROL_FLOW_TYPES:
                wrong.append(f"{t}: no builder in popxl/ops or grad rule emitting it")
        elif fam not in builders:
            wrong.append(f"{t}: kernel family {fam}, built in {sorted(builders)}")
    assert wrong == [], "\n".join(wrong)


def test_grad_rules_sit_in_their_registering_modules():
    """A rule function defined elsewhere (a shared helper) still counts for the module that
    registered it: REGISTERED_IN records that module, not the function's."""
    load_grads()
    assert all(m.startswith(GRADS_PKG) and not m.rsplit(".", 1)[1].startswith("_")
               for m in REGISTERED_IN.values())
    assert set(GRAD_RULES) <= set(REGISTERED_IN)



def test_the_docs_list_every_family():
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "development.md").read_text()
    layout = docs[docs.index("\n## Layout\n"):]
    table = layout[layout.index("```\nfamily "):]
    table = table[4:table.index("```", 4)]
    listed = {line.split()[0] for line in table.splitlines()[1:] if line and not line[0].isspace()}
    grads = {m for m in _modules(GRADS) if not m.startswith("_")}
    assert listed == grads, listed ^ grads
