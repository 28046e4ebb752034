"""What counts as correct: the tolerance rule, and the comparison of a part's outputs with the
float64 reference under it.

Used by the tests and by the benchmark (which checks every shape before it times it).
"""

import functools
import math
from dataclasses import dataclass

import torch

from common.reference import attention_reference, expand_groups, reference_with_grads

# ---------------------------------------------------------------------------------------------
# The rule is FlashAttention's own test criterion:
#
#     max|ours - ref64|  <=  FACTOR * max|torch_same_dtype - ref64|  +  FLOOR_EPS[dtype] * eps * max(max|ref64|, 1)
#
# ref64 is the materialised attention in float64 (common/reference.py). torch_same_dtype is the
# same materialised attention computed by PyTorch in the input dtype: it measures how much error
# that dtype forces on *any* implementation for these very inputs, so the bound tightens and
# loosens with the data instead of being one magic number. L is the exception: every implementation
# keeps it in float32, so its baseline is the float32 logsumexp of the dtype-rounded inputs.
# float32 means IEEE float32 products here: the Triton parts ask tl.dot for them (its default on a
# GPU would be TF32, see part 1).
FACTOR = 2.0  # FlashAttention's tests allow twice PyTorch's error: different summation order
# and different (usually fewer) roundings, never a different algorithm.

# The floor covers the cases where the baseline is exact by luck. With a single visible key,
# softmax is the constant 1, PyTorch's own backward returns dQ = dK = 0 exactly, while the
# FlashAttention backward computes dP - D with D = rowsum(dO * O): two equal sums rounded
# differently, so a few eps of noise. The floor is in units of machine epsilon of the dtype,
# times a scale: the largest reference value, and for the gradients the largest of dQ, dK and
# dV (they come out of one chain of sums, so a gradient that is exactly zero is measured on the
# scale of its siblings), and never less than 1, the size of a unit-normal input:
FLOOR_EPS = {
    # float32: 32 eps ~ 4e-6. The cancellation above sums D = 16..128 products, each rounded; a
    # few thousand terms summed in a different order also lose a few ulps. Also the floor for L
    # in every dtype: L is float32 everywhere, m_i + log(l_i) with exp/log in float32 (the GPU's
    # fast approximations are good to a couple of ulps).
    torch.float32: 32.0,
    # float16 / bfloat16: the result is rounded to the dtype once at the end (half an ulp) and P is
    # rounded to the dtype before P @ V (another half ulp per term, averaging out): 2 eps.
    torch.float16: 2.0,
    torch.bfloat16: 2.0,
}


# Gradients get one more floor term. The backward recomputes S and takes P = exp(S - L), with L
# from the forward: an absolute error in S is a relative error in P. S is a float32 sum of D
# products in every dtype, known to a few float32 eps times |S|, and the forward (a Triton kernel)
# and the backward (PyTorch) sum in different orders, so their S differ by that much, which the
# self-consistent autograd baseline never sees. The term grows with the largest |S| of the inputs
# and matters only in float32 with large scores (|S| ~ 100: ~4e-4 relative).
def allowed_error(dtype, baseline_err, ref_scale, score_max=0.0):
    floor = (
        FLOOR_EPS[dtype] * torch.finfo(dtype).eps
        + FLOOR_EPS[torch.float32] * torch.finfo(torch.float32).eps * score_max
    )
    return FACTOR * baseline_err + floor * max(ref_scale, 1.0)


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
        return f"{self.name} {self.err:.1e}<={self.allowed:.1e} {'ok' if self.ok else 'FAIL'}"


class Report(list):
    """The comparisons of one check: ok when there is at least one and every one passed."""

    @property
    def ok(self):
        return len(self) > 0 and all(c.ok for c in self)

    def __str__(self):
        return "  ".join(map(str, self))


def _max_abs(x):
    return x.abs().max().item() if x.numel() else 0.0


def compare(name, out, ref, base, dtype, ref_scale, score_max=0.0):
    """One tensor: out and base against ref (float64), bound from base's own error."""
    out, ref, base = (t.to(torch.float64) for t in (out, ref, base))
    finite = bool(torch.isfinite(out).all())
    base_err = _max_abs(base - ref)
    if not math.isfinite(base_err):
        raise AssertionError(
            f"{name}: the {dtype} baseline itself overflowed on these inputs; out of range for the check"
        )
    err = _max_abs(out - ref) if finite else float("inf")
    return Comparison(name, err, allowed_error(dtype, base_err, ref_scale, score_max), finite)


def run_part(module, q, k, v, do, is_causal, grads=True, bottom_right=False):
    """Run a part. O and L come from its `flash_forward(Q, K, V, is_causal) -> (O, L)`; with grads,
    O comes from `FlashAttention.apply` (what a user gets) and dQ, dK, dV from autograd through it.
    bottom_right (part 5): the diagonal aligned bottom-right, FlashAttention.apply's fifth argument."""
    extra = (True,) if bottom_right else ()
    with torch.no_grad():  # the part's forward takes bottom-right as is_causal=module.BOTTOM_RIGHT
        o, lse = module.flash_forward(q, k, v, module.BOTTOM_RIGHT if bottom_right else is_causal)
    out = {"O": o, "L": lse}
    if grads:
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = module.FlashAttention.apply(*leaves, is_causal, *extra)
        out["O"] = o.detach()
        out["dQ"], out["dK"], out["dV"] = torch.autograd.grad(o, leaves, do)
    return out


def check_outputs(out, q, k, v, do, is_causal, bottom_right=False):
    """Compare outputs with the reference: `out` holds O and L (L may be left out only for an
    implementation that does not expose it, such as SDPA) and, for a backward check, dQ, dK, dV.

    O and the gradients are bounded by PyTorch's materialised attention in the input dtype. L is
    float32 in every implementation, so its baseline is the float32 logsumexp of the scores of the
    (dtype-rounded) inputs, with a float32 floor.
    """
    dtype = q.dtype
    grads = "dQ" in out
    names = ("O", "L", "dQ", "dK", "dV") if grads else ("O", "L")
    if not {"O"} <= set(out) <= set(names) or (grads and not {"dK", "dV"} <= set(out)):
        raise AssertionError(f"outputs to check must be O, L and optionally dQ, dK, dV together; got {sorted(out)}")
    reference = functools.partial(reference_with_grads, do=do) if grads else attention_reference
    reference = functools.partial(reference, is_causal=is_causal, bottom_right=bottom_right)
    ref, base = (dict(zip(names, reference(q, k, v, **kw))) for kw in ({}, {"dtype": dtype}))
    base["L"] = attention_reference(q, k, v, is_causal, dtype=torch.float32, bottom_right=bottom_right)[1]
    scale = {name: _max_abs(ref[name]) for name in ref}
    score_max = 0.0
    if grads:  # see FLOOR_EPS and allowed_error above
        scale["dQ"] = scale["dK"] = scale["dV"] = max(scale["dQ"], scale["dK"], scale["dV"])
        k_heads = expand_groups(q, k)  # grouped heads: one key head per query head
        score_max = _max_abs(q.double() @ k_heads.double().transpose(-2, -1)) * q.shape[-1] ** -0.5
    report = Report()
    for name in (n for n in names if n in out):
        if out[name].shape != ref[name].shape:
            raise AssertionError(f"{name} has shape {tuple(out[name].shape)}, expected {tuple(ref[name].shape)}")
        bound_dtype = torch.float32 if name == "L" else dtype
        s_max = score_max if name.startswith("d") else 0.0
        report.append(compare(name, out[name], ref[name], base[name], bound_dtype, scale[name], s_max))
    return report


def check_part(module, q, k, v, do, is_causal, grads=True, bottom_right=False):
    """Run a part on (q, k, v) and check O, L (and dQ, dK, dV). Returns a Report."""
    out = run_part(module, q, k, v, do, is_causal, grads=grads, bottom_right=bottom_right)
    if out["O"].dtype != q.dtype:
        raise AssertionError(f"O has dtype {out['O'].dtype}, expected {q.dtype}")
    return check_outputs(out, q, k, v, do, is_causal, bottom_right=bottom_right)


def check_slices(out, q, k, v, causal, do=None):
    """Compare outputs (O, L, dQ, dK, dV, as check_outputs takes them) with the float64 reference on
    the first and the last (batch, head) slice: a float64 reference for all B*H heads would not fit
    at full size. Heads are independent, so a slice of the outputs is the output of the slice.
    Returns, per tensor, the worse of the two slices' comparisons."""
    first, last = (
        check_outputs({name: t[s] for name, t in out.items()}, q[s], k[s], v[s], None if do is None else do[s], causal)
        for s in ((slice(1), slice(1)), (slice(-1, None), slice(-1, None)))
    )
    return Report(max(pair, key=lambda c: (not c.ok, c.err / c.allowed)) for pair in zip(first, last))


def verdict(report):
    """A check's result for a CSV cell: "ok O=1.2e-03 L=..." or "FAIL O=... ", one error per tensor."""
    return ("ok " if report.ok else "FAIL ") + " ".join(f"{c.name}={c.err:.1e}" for c in report)
