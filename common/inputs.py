"""Seeded inputs and the shape matrix every check uses.

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

    def lead():
        return (rng.randint(1, 3),) if rng.random() < 0.5 else (rng.randint(1, 2), rng.randint(1, 3))

    return [Shape(lead(), rng.randint(1, max_n), rng.randint(1, max_n), rng.choice(ds)) for _ in range(count)]


def make_inputs(shape, dtype, device, seed=0, scale=1.0):
    """Seeded (q, k, v, do): q (..., N_q, D), k and v (..., N_k, D), do like q; q and k times scale."""
    gen = torch.Generator(device=device).manual_seed(seed)
    drawn = ((shape.q_shape, scale), (shape.kv_shape, scale), (shape.kv_shape, 1.0), (shape.q_shape, 1.0))
    return tuple((torch.randn(s, generator=gen, device=device, dtype=torch.float32) * m).to(dtype) for s, m in drawn)
