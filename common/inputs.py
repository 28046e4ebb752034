"""Seeded inputs, the shape matrix, and the tolerance rule every check uses.

Inputs are fresh standard-normal data from a seeded generator, never zeros: zeros hide
unwritten outputs and wrong indexing. The shapes are chosen to break the kernels' weak spots:
lengths that are not a multiple of any tile size, N_q != N_k, N = 1, the smallest D, 3-D and 4-D.
"""

import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    lead: tuple  # (B,) for 3-D inputs (batch, seq, D); (B, H) for 4-D (batch, heads, seq, D)
    n_q: int
    n_k: int
    d: int

    @property
    def q_shape(self):
        return (*self.lead, self.n_q, self.d)

    @property
    def kv_shape(self):
        return (*self.lead, self.n_k, self.d)

    def __str__(self):
        return f"{'x'.join(map(str, self.lead))}-q{self.n_q}-k{self.n_k}-d{self.d}"


# Small enough for the Triton interpreter on a CPU (each case well under a second or two).
CORE_SHAPES = [
    Shape((2,), 64, 64, 64),  # every length a multiple of 16, 32 and 64: the friendly case
    Shape((2, 2), 48, 48, 16),  # smallest D, 4-D
    Shape((2, 3), 100, 100, 32),  # ragged: 100 = 6*16 + 4, batch*heads > 1
    Shape((3,), 37, 53, 128),  # ragged on both axes, N_q < N_k, largest D
    Shape((2,), 80, 33, 64),  # N_q > N_k, ragged keys: the last key tile is mostly padding
    Shape((1, 2), 1, 50, 32),  # a single query
    Shape((2,), 40, 1, 16),  # a single key
    Shape((3,), 1, 1, 32),  # a single query and a single key
    Shape((1, 2), 130, 200, 64),  # several key tiles of every tile size used, so the running max
    # really moves between tiles (with 64-row tiles, most shapes above fit in one key tile)
]

# Full-size shapes: GPU only (the interpreter would take minutes each).
FULL_SHAPES = [
    Shape((2, 8), 1024, 1024, 64),
    Shape((1, 4), 2048, 2048, 128),
    Shape((2, 4), 1000, 1531, 64),  # ragged, N_q != N_k
    Shape((4, 2), 777, 777, 16),
    Shape((1, 2), 4096, 4096, 128),
]

# Scale for the large-magnitude stress inputs: q and k ~ N(0, 5^2) make S = q.k/sqrt(D) ~ N(0, 25^2),
# so the largest |S| in a few thousand scores is about 100. exp(100) overflows float32 (max exp
# argument ~88.7), so a softmax that forgot to subtract the running max returns inf/NaN.
STRESS_SCALE = 5.0


def random_shapes(count, seed, max_n, ds=(16, 32, 64, 128)):
    """A seeded sweep of random shapes (3-D and 4-D, any N in [1, max_n], any supported D)."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        lead = (rng.randint(1, 3),) if rng.random() < 0.5 else (rng.randint(1, 2), rng.randint(1, 3))
        shapes.append(Shape(lead, rng.randint(1, max_n), rng.randint(1, max_n), rng.choice(ds)))
    return shapes


def make_inputs(shape, dtype, device, seed=0, scale=1.0):
    """Seeded (q, k, v, do): q (..., N_q, D), k and v (..., N_k, D), do like q."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(s, mult=1.0):
        return (torch.randn(s, generator=gen, device=device, dtype=torch.float32) * mult).to(dtype)

    q = randn(shape.q_shape, scale)
    k = randn(shape.kv_shape, scale)
    v = randn(shape.kv_shape)
    do = randn(shape.q_shape)
    return q, k, v, do


# ---------------------------------------------------------------------------------------------
# Tolerances. The rule is FlashAttention's own test criterion:
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
