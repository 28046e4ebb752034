"""Seeded inputs: a Shape, and (q, k, v, do) drawn for it.

Inputs are fresh standard-normal data from a seeded generator, never zeros: zeros hide
unwritten outputs and wrong indexing. The tests' shape matrix is in tests/helpers.py.
"""

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


# Scale for the large-magnitude stress inputs: q and k ~ N(0, 5^2) make S = q.k/sqrt(D) ~ N(0, 25^2),
# so the largest |S| in a few thousand scores is about 100. exp(100) overflows float32 (max exp
# argument ~88.7), so a softmax that forgot to subtract the running max returns inf/NaN.
STRESS_SCALE = 5.0


def make_inputs(shape, dtype, device, seed=0, scale=1.0):
    """Seeded (q, k, v, do): q (..., N_q, D), k and v (..., N_k, D), do like q; q and k times scale."""
    gen = torch.Generator(device=device).manual_seed(seed)
    drawn = ((shape.q_shape, scale), (shape.kv_shape, scale), (shape.kv_shape, 1.0), (shape.q_shape, 1.0))
    return tuple((torch.randn(s, generator=gen, device=device, dtype=torch.float32) * m).to(dtype) for s, m in drawn)
