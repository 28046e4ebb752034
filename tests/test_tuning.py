"""Part 2's tuning machinery on the CPU: the sweep's budget verdicts on hand-picked configurations,
its poison-check-time step on real (interpreted) launches, the occupancy model, the autotuner's
pruning and shape classes, and the Triton adapter."""

import itertools

import pytest
import torch

from common import launch, parts, triton_tools
from lab import compiler
from tests.helpers import DEVICE

H200_SMEM = 227 * 1024  # 232448 bytes per program (opt-in)
ADA_SMEM = 99 * 1024  # 101376


@pytest.mark.only_parts(2)
def test_budget_arithmetic(part):
    fa = parts.load(part)
    # Q tile 128x64 bf16 = 16 KB once; K and V tiles 64x64 bf16 = 8 KB each, two buffers of each.
    assert fa.smem_bytes(128, 64, 64, 2, 2) == 16 * 1024 + 2 * 2 * 8 * 1024


# (limit, D, BLOCK_M, BLOCK_N, warps, stages, verdict). Shared memory is Q once plus `stages` buffers of
# K and V, bf16: BLOCK_M*D*2 + stages*2*BLOCK_N*D*2. Registers: BLOCK_M*(D + BLOCK_N) / (32*warps).
VERDICTS = [
    # 8 KB + 2*16 KB = 40 KB; 64*128/128 = 64 registers.
    (H200_SMEM, 64, 64, 64, 4, 2, "todo"),
    # 32 KB + 3*64 KB = 224 KB = 229376 bytes, just under 232448; 128*256/256 = 128 registers.
    (H200_SMEM, 128, 128, 128, 8, 3, "todo"),
    # One stage more: 288 KB.
    (H200_SMEM, 128, 128, 128, 8, 4, "pruned: shared memory"),
    # 96 KB fits; 128*256/128 = 256 registers, one more than a thread can address.
    (H200_SMEM, 128, 128, 128, 4, 1, "pruned: registers"),
    # 256*192/128 = 384 registers with 4 warps; with 8, 192.
    (H200_SMEM, 128, 256, 64, 4, 1, "pruned: registers"),
    (H200_SMEM, 128, 256, 64, 8, 1, "todo"),
    # Both over: 64 KB + 2*128 KB = 320 KB and 256*384/64 = 1536 registers. Shared memory is named.
    (H200_SMEM, 128, 256, 256, 2, 2, "pruned: shared memory"),
    # Ada: 32 KB + 2*32 KB = 96 KB = 98304 bytes fits 101376; a third stage (128 KB) does not.
    (ADA_SMEM, 128, 128, 64, 4, 2, "todo"),
    (ADA_SMEM, 128, 128, 64, 4, 3, "pruned: shared memory"),
]


@pytest.mark.only_parts(2)
@pytest.mark.parametrize("limit, d, block_m, block_n, warps, stages, verdict", VERDICTS)
def test_sweep_plan_verdicts(part, limit, d, block_m, block_n, warps, stages, verdict):
    from lab.sweep import plan
    from part2_tile_tuning.tools.sweep import Forward

    rows = plan(Forward(), d, False, limit)
    assert len(rows) == 5 * 5 * 3 * 5  # BLOCK_M, BLOCK_N, warps, stages
    by_config = {(r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"]): r for r in rows}
    assert by_config[(block_m, block_n, warps, stages)]["status"] == verdict


@pytest.mark.only_parts(2)
def test_sweep_measure_poisons_checks_then_times(part):
    """Two configurations on one set of outputs: the second one's launch skips its last query tile.
    Only because the outputs are poisoned with NaN before each launch does it fail, instead of
    passing on the numbers the first one left behind."""
    from lab.sweep import measure
    from part2_tile_tuning.tools.sweep import Forward

    class Small(Forward):
        B, H, N, dtype = 1, 2, 64, torch.float32

        def grid(self, t, config):
            tiles, sequences = super().grid(t, config)
            return (tiles - 1 if config["BLOCK_M"] == 16 else tiles, sequences)

    def config(block_m):
        return dict(D=32, causal=0, BLOCK_M=block_m, BLOCK_N=16, num_warps=4, num_stages=1, status="compiled")

    rows = [config(16), config(32)]  # measured largest tile first: 32, then 16
    timed = []
    measure(Small(), rows, 32, False, deadline=float("inf"), timer=lambda fn: timed.append(fn) or 0.5)
    assert rows[1]["status"] == "ok" and rows[1]["ms"] == "0.5000"
    assert rows[0]["status"].startswith("failed check: O inf") and "ms" not in rows[0]
    assert len(timed) == 1

    late = [config(32)]
    measure(Small(), late, 32, False, deadline=0.0)
    assert late[0]["status"] == "not measured: time limit"


H200_DEVICE = dict(
    regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472, max_threads_per_multi_processor=2048
)


@pytest.mark.only_parts(2)
@pytest.mark.parametrize(
    "warps, regs, smem, programs",
    [
        # Registers are allocated per warp in units of 256: 156*32 = 4992 -> 5120; 65536 / (4*5120) = 3.2.
        # Shared memory: 233472 / (72 KB + 1 KB reserved) = 3.1. Both allow 3 (the H200's 64x128 w4 s2).
        (4, 156, 72 * 1024, 3),
        # 255*32 = 8160 -> 8192 a warp: 65536 / 32768 = 2, although shared memory would allow 5.
        (4, 255, 40 * 1024, 2),
        # 16*32 = 512 a warp: registers allow 16, shared memory 32, threads 2048 / (32*8) = 8.
        (8, 16, 6 * 1024, 8),
        # Everything small: 64 by registers, 114 by shared memory, 32 by threads; and 32 at most.
        (2, 16, 1024, 32),
        # 224 KB + 1 KB: one program per SM.
        (4, 64, 224 * 1024, 1),
    ],
)
def test_programs_per_sm(part, warps, regs, smem, programs):
    from lab.sweep_report import programs_per_sm

    assert programs_per_sm(dict(num_warps=warps, regs=regs, smem_compiled=smem), H200_DEVICE) == programs


@pytest.mark.only_parts(2)
def test_the_prune_follows_dtype_and_asks_the_compiler(part, monkeypatch):
    """A float32 call gets its tile. A 16-bit call keeps the configurations whose binary the
    compiler sizes within this GPU's shared memory (on Hopper, smem_bytes to within 2 KB), and the
    smallest when none fits; without a GPU nothing compiles, and every one is kept."""
    fa = parts.load(part)
    import triton  # after the part: without a GPU, common.runtime must switch on the interpreter first

    big = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3)
    small = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
    q = torch.randn(2, 256, 128, device=DEVICE, dtype=torch.bfloat16)
    args = dict(Q=q, K=q, V=q, O=torch.empty_like(q), L=torch.empty(2, 256, device=DEVICE), N_QUERIES=256)
    args.update(N_KEYS=256, N_BUCKET=256, scale=128**-0.5)
    meta = dict(D=128, IS_CAUSAL=False, DOT_PRECISION="tf32")
    tile = fa.FLOAT32[128]
    assert fa.fits_in_smem([big, small, tile], {**args, "Q": q.float()}, **meta) == [tile]
    if not torch.cuda.is_available():
        assert fa.fits_in_smem([big, small], args, **meta) == [big, small]
        return
    sizes = triton_tools.shared_sizes(fa._attn_fwd, [big, small], list(args.values()), meta)
    assert 0 < sizes[small] < sizes[big] < float("inf")
    if torch.cuda.get_device_capability()[0] == 9:  # TMA loads: Q and num_stages buffers of K and V
        assert abs(sizes[big] - fa.smem_bytes(128, 128, 128, 2, 3)) <= 2048, sizes
    for limit, kept in ((sizes[big], [big, small]), (sizes[big] - 1, [small]), (1024, [small])):
        monkeypatch.setattr(launch, "smem_limit", lambda limit=limit: limit)
        assert fa.fits_in_smem([big, small], args, **meta) == kept, limit


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times configurations on a GPU")
@pytest.mark.only_parts(4)
def test_a_large_first_call_is_tuned_on_a_few_sequences(part, monkeypatch):
    """launch.tune: past TUNE_SCORES scores, a new shape class's autotuner times its configurations
    on the leading sequences alone (N_SEQS cut), then the real launch runs them all, correctly."""
    fa = parts.load(part)
    from common.reference import attention_reference

    monkeypatch.setattr(launch, "TUNE_SCORES", 300 * 300 * 2)  # two sequences' worth
    seen = {}
    for kernel in (fa._attn_fwd, fa._attn_bwd_dkdv, fa._attn_bwd_dq):
        monkeypatch.setattr(kernel, "cache", {})  # a new key, whatever ran before in this process
        jit, at = kernel.fn, triton_tools.arg_names(kernel).index("N_SEQS")
        seen[kernel] = []

        def spy(*args, _run=jit.run, _seen=seen[kernel], _at=at, **kwargs):
            if not kwargs.get("warmup"):  # compiling (JITFunction.warmup comes here too) runs nothing
                _seen.append(args[_at])
            return _run(*args, **kwargs)

        monkeypatch.setattr(jit, "run", spy)
    monkeypatch.setattr(launch, "_tuned", set())
    q, k, v = (torch.randn(2, 4, 300, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = fa.FlashAttention.apply(q, k, v, True)
    o.backward(torch.ones_like(o))
    for kernel, n_seqs in seen.items():
        assert n_seqs and set(n_seqs[:-1]) == {2} and n_seqs[-1] == 8, (kernel.fn.__name__, n_seqs)
    ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), True)
    torch.testing.assert_close(o.detach().double(), ref, atol=2e-2, rtol=0)


@pytest.mark.since_part(2)
def test_float32_gets_its_own_tile_and_16_bit_never_does(part):
    """The float32 tiles (IEEE products, no tensor cores): a float32 call gets the one for its head
    dim and nothing to time; a 16-bit call never gets one (on the GPU list; the interpreter's list
    has one configuration for everything)."""
    fa = parts.load(part)
    every = fa.TUNED + list(fa.FLOAT32.values())
    bf16, fp32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.float32)
    for d in (16, 32, 64, 128):
        assert fa.fits_in_smem(every, {"Q": fp32}, D=d) == [fa.FLOAT32[128 if d > 64 else 64]]
        assert not set(map(str, fa.fits_in_smem(every, {"Q": bf16}, D=d))) & set(map(str, fa.FLOAT32.values()))
    # each float32 tile fits a float32 call of its head dims in an Ada GPU's 99 KB, not only Hopper's
    for d, config in fa.FLOAT32.items():
        need = fa.smem_bytes(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], d, 4, config.num_stages)
        assert need <= 99 * 1024, f"D={d}: {need} bytes would not fit an Ada GPU"
    if hasattr(fa, "BWD_DKDV_FLOAT32"):  # the backward's kernels, from part 4 on
        for streamed, held, float32, tuned in (
            ("BLOCK_M", "BLOCK_N", fa.BWD_DKDV_FLOAT32, fa.BWD_DKDV),
            ("BLOCK_N", "BLOCK_M", fa.BWD_DQ_FLOAT32, fa.BWD_DQ),
        ):
            prune = fa.bwd_fits_in_smem(streamed)
            every = tuned + list(float32.values())
            for d, causal in itertools.product((16, 32, 64, 128), (False, True)):
                tile = float32[128 if d > 64 else 64, causal]
                assert prune(every, {"Q": fp32}, D=d, IS_CAUSAL=causal) == [tile]
                kept = prune(every, {"Q": bf16}, D=d, IS_CAUSAL=causal)
                assert kept and all(c is not t for c in kept for t in float32.values())
                rows = (tile.kwargs[held], tile.kwargs[streamed])
                assert fa.bwd_smem_bytes(*rows, max(d, 64), 4, tile.num_stages) <= 99 * 1024


def test_n_bucket():
    assert launch.n_bucket(1, 1) == 256
    assert launch.n_bucket(100, 3000) == 4096
    assert launch.n_bucket(4096, 4096) == 4096
    assert launch.n_bucket(4097, 16) == 8192


@pytest.mark.only_parts(1, 2)
def test_shape_class_reads_the_autotune_key(part):
    """common/launch.py compiles a shape class's configurations once: its class is the kernel, the
    device, the dtypes, the constexprs and, for an autotuned kernel, its key arguments' values
    (part 2's N_BUCKET; part 1's kernel is not autotuned, so its lengths never matter)."""
    fa = parts.load(part)
    q = torch.empty(2, 8, 16, device=DEVICE)
    lse = torch.empty(2, 8, device=DEVICE)
    meta = dict(D=16, IS_CAUSAL=False, DOT_PRECISION="ieee")
    tuned = triton_tools.autotune_keys(fa._attn_fwd)

    def key(n, bucket, **changed):
        tail = (n, n, bucket, 0.25) if tuned else (n, n, 0.25)
        return launch.shape_class(fa._attn_fwd, (q, q, q, q, lse, *tail), {**meta, **changed})

    assert key(8, 256) == key(300, 256)  # N_QUERIES and N_KEYS are not specialized on
    assert (key(8, 256) != key(8, 512)) == bool(tuned)
    assert key(8, 256) != key(8, 256, IS_CAUSAL=True) and key(8, 256) != key(8, 256, D=32)
    assert tuned == (("D", "IS_CAUSAL", "N_BUCKET") if part == 2 else ())


@pytest.mark.only_parts(2)
def test_triton_tools_read_the_autotuner(part):
    fa = parts.load(part)
    import triton

    tuner = fa._attn_fwd
    assert triton_tools.jit_function(tuner) is tuner.fn and not isinstance(tuner.fn, triton.runtime.Autotuner)
    q = torch.randn(1, 2, 300, 16, device=DEVICE)

    def call():
        fa.FlashAttention.apply(q, q, q, True)

    first = compiler.timed_configs([tuner], call)
    assert first <= len(fa.CONFIGS) and triton_tools.chosen(tuner) in fa.CONFIGS
    assert compiler.timed_configs([tuner], call) == 0  # a shape class seen before is not timed again
