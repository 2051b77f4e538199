"""Every op type a builder can create has a kernel, and a grad rule or an explicit no-grad mark."""
import popxl  # noqa: F401  (imports every builder module)
import popxl.ops  # noqa: F401
from popxl.engine.kernels import load_all
from popxl.engine.kernels.registry import CONTROL_FLOW_TYPES, KERNELS
from popxl.transforms.grad_registry import GRAD_RULES, NO_GRAD, THROWS
from popxl.transforms.grad_registry import load_all as load_grads


def test_every_kernel_has_a_gradient_decision():
    load_all()
    load_grads()
    undecided = sorted(t for t in KERNELS
                       if t not in GRAD_RULES and t not in NO_GRAD and t not in THROWS
                       and not t.endswith("Grad") and not KERNELS[t].modifies)
    assert undecided == [], f"op types without grad rule or no_grad/throws mark: {undecided}"
    for t in ("Call",):
        assert t in GRAD_RULES
    assert CONTROL_FLOW_TYPES >= {"Call", "Loop", "If"}


def test_every_grad_rule_op_type_has_a_kernel():
    load_all()
    load_grads()
    missing = sorted(t for t in GRAD_RULES if t not in KERNELS and t not in CONTROL_FLOW_TYPES)
    assert missing == [], missing
