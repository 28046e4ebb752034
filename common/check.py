"""Compare a part's outputs with the float64 reference under the rule in common/inputs.py.

Used by the tests and by the benchmark (which checks every shape before it times it).
"""

from dataclasses import dataclass

import torch

from common.inputs import allowed_error
from common.reference import attention_reference, reference_with_grads


@dataclass
class Comparison:
    name: str
    err: float
    allowed: float
    finite: bool

    @property
    def ok(self):
        return self.finite and self.err <= self.allowed

    def __str__(self):
        mark = "ok" if self.ok else "FAIL"
        return f"{self.name} {self.err:.1e}<={self.allowed:.1e} {mark}"


class Report(list):
    @property
    def ok(self):
        return len(self) > 0 and all(c.ok for c in self)

    def __str__(self):
        return "  ".join(str(c) for c in self)


def _max_abs(x):
    return x.abs().max().item() if x.numel() else 0.0


def compare(name, out, ref, base, dtype, ref_scale, score_max=0.0):
    """One tensor: out and base against ref (float64), bound from base's own error."""
    out, ref, base = (t.to(torch.float64) for t in (out, ref, base))
    finite = bool(torch.isfinite(out).all())
    err = _max_abs(out - ref) if finite else float("inf")
    base_err = _max_abs(base - ref)
    if not torch.isfinite(torch.tensor(base_err)):
        raise AssertionError(
            f"{name}: the {dtype} baseline itself overflowed on these inputs; they are out of range for the check"
        )
    return Comparison(name, err, allowed_error(dtype, base_err, ref_scale, score_max), finite)


def saved_lse(o, q):
    """Find L among the tensors the forward saved: float32, shape q.shape[:-1]."""
    want = tuple(q.shape[:-1])
    found = [t for t in o.grad_fn.saved_tensors if tuple(t.shape) == want and t.dtype == torch.float32]
    if len(found) != 1:
        raise AssertionError(f"expected one saved float32 tensor of shape {want} (L), found {len(found)}")
    return found[0]


def run_part(module, q, k, v, do, is_causal, grads=True):
    """Run a part's FlashAttention forward (and backward). Returns a dict of outputs."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = module.FlashAttention.apply(*leaves, is_causal)
    out = {"O": o.detach(), "L": saved_lse(o, leaves[0]).detach()}
    if grads:
        out["dQ"], out["dK"], out["dV"] = torch.autograd.grad(o, leaves, do)
    return out


def check_outputs(out, q, k, v, do, is_causal):
    """Compare outputs with the reference: `out` holds O and L (L may be left out only for an
    implementation that does not expose it, such as SDPA) and, for a backward check, dQ, dK, dV.

    O and the gradients are bounded by PyTorch's materialised attention in the input dtype. L is
    float32 in every implementation, so its baseline is the float32 logsumexp of the scores of the
    (dtype-rounded) inputs, with a float32 floor.
    """
    dtype = q.dtype
    grads = "dQ" in out
    names = ("O", "L", "dQ", "dK", "dV") if grads else ("O", "L")
    unknown = set(out) - set(names)
    if "O" not in out or unknown or (grads and not {"dK", "dV"} <= set(out)):
        raise AssertionError(f"outputs to check must be O, L and optionally dQ, dK, dV together; got {sorted(out)}")
    if grads:
        ref = dict(zip(names, reference_with_grads(q, k, v, do, is_causal)))
        base = dict(zip(names, reference_with_grads(q, k, v, do, is_causal, dtype=dtype)))
    else:
        ref = dict(zip(names, attention_reference(q, k, v, is_causal)))
        base = dict(zip(names, attention_reference(q, k, v, is_causal, dtype=dtype)))
    base["L"] = attention_reference(q, k, v, is_causal, dtype=torch.float32)[1]
    scale = {name: _max_abs(ref[name]) for name in ref}
    score_max = 0.0
    if grads:  # see FLOOR_EPS and allowed_error in common/inputs.py
        scale["dQ"] = scale["dK"] = scale["dV"] = max(scale["dQ"], scale["dK"], scale["dV"])
        score_max = _max_abs(q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5
    report = Report()
    for name in (n for n in names if n in out):
        if out[name].shape != ref[name].shape:
            raise AssertionError(f"{name} has shape {tuple(out[name].shape)}, expected {tuple(ref[name].shape)}")
        bound_dtype = torch.float32 if name == "L" else dtype
        s_max = score_max if name.startswith("d") else 0.0
        report.append(compare(name, out[name], ref[name], base[name], bound_dtype, scale[name], s_max))
    return report


def check_part(module, q, k, v, do, is_causal, grads=True):
    """Run a part on (q, k, v) and check O, L (and dQ, dK, dV). Returns a Report."""
    out = run_part(module, q, k, v, do, is_causal, grads=grads)
    if out["O"].dtype != q.dtype:
        raise AssertionError(f"O has dtype {out['O'].dtype}, expected {q.dtype}")
    return check_outputs(out, q, k, v, do, is_causal)
