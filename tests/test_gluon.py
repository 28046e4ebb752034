"""Part 5's Gluon kernels (part5_profiling/gluon_attention.py, gluon_backward.py): where they run,
that they compile for Hopper on any machine, and, on a Hopper GPU, the cases their schedules add to
the rest of the suite (which already runs them: every bf16/fp16 call at D = 64 or 128 there goes to
them), and the backward in every program order."""

import pytest
import torch

from common import parts
from common.check import check_outputs, check_part, run_part
from common.inputs import STRESS_SCALE, Shape, make_inputs
from tests.helpers import DEVICE, HOPPER, INTERPRET, assert_report_ok, deterministic_algorithms, needs_hopper

pytestmark = pytest.mark.only_parts(5)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_routing_by_what_ran(part, is_causal):
    """What each call ran, read back after running it: the Gluon forward and backward take the bf16
    and fp16 calls at D = 64 and 128 on a Hopper GPU; part 4's tl kernels take every other call
    (float32, D = 16 and 32, other GPUs, the interpreter), and the backward under deterministic
    algorithms."""
    part5 = parts.load(part)
    dtypes = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)
    for dtype in dtypes:
        for d in (16, 32, 64, 128):
            q, k, v, do = make_inputs(Shape((1, 2), 40, 70, d), dtype, DEVICE, seed=d)
            gluon = HOPPER and dtype != torch.float32 and d in (64, 128)
            o, lse = part5.flash_forward(q, k, v, is_causal)
            assert parts.forward_config(part5).startswith("gluon") == gluon, (
                f"{dtype} D={d}: {parts.forward_config(part5)}"
            )
            part5.flash_backward(q, k, v, o, lse, do, is_causal)
            assert part5.backward_label() == ("gluon" if gluon else "tl"), f"{dtype} D={d}"
            with deterministic_algorithms():
                part5.flash_backward(q, k, v, o, lse, do, is_causal)
                assert part5.backward_label() == "tl", f"{dtype} D={d}, deterministic"


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("capability", [(8, 9), (10, 0), (12, 0)], ids=["sm_89", "sm_100", "sm_120"])
def test_other_gpus_take_part_4s_kernels(part, capability, monkeypatch):
    """On another GPU (its capability mocked on the H200), Blackwell included, the calls the Gluon
    kernels take on Hopper go to part 4's Triton kernels, and are right."""
    part5 = parts.load(part)
    monkeypatch.setattr(part5.gluon_attention, "capability", lambda device: capability)
    monkeypatch.setattr(part5, "_plans", {})  # routes worked out on the real capability
    monkeypatch.setattr(part5, "_bwd_plans", {})
    q, k, v, do = make_inputs(Shape((2, 3), 300, 300, 64), torch.bfloat16, DEVICE, seed=5)
    assert not part5.gluon_attention.supported(q)
    assert_report_ok(check_part(part5, q, k, v, do, True), f"capability {capability}")
    assert not parts.forward_config(part5).startswith("gluon") and part5.backward_label() == "tl"


# More query tiles than programs (persistent: each program takes several, in alternating order),
# ragged lengths, N_q != N_k, one program's tiles from different sequences.
MANY_TILES = [Shape((8, 40), 200, 333, 64), Shape((4, 20), 1000, 1000, 128), Shape((3, 50), 700, 129, 128)]


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", MANY_TILES, ids=str)
def test_gluon_with_more_tiles_than_programs(part, shape, dtype, is_causal):
    part5 = parts.load(part)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=shape.n_q)
    assert part5.gluon_attention.supported(q)
    assert_report_ok(check_part(part5, q, k, v, do, is_causal, grads=False), f"{shape} {dtype}")
    assert parts.forward_config(part5).startswith("gluon"), "the call should have run the Gluon kernel"


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 4000])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_causal_order_in_groups_changes_no_bit(part, d, n):
    """The causal order with the sequences in groups (3 + 3 + 1 of 7, one each, all at once) runs the same
    tiles as the order by query tile alone: the same O and L to the bit, tail tiles and all. N = 4000: more
    tiles than programs, so several rounds, and programs with no tile in the last."""
    part5 = parts.load(part)
    q, k, v, _ = make_inputs(Shape((1, 7), n, n, d), torch.bfloat16, DEVICE, seed=d)
    q, k, v = (t.reshape(7, n, d).contiguous() for t in (q, k, v))
    outs = []
    for group in (7, 3, 1):
        o, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:-1], float("nan"), device=q.device)
        part5.gluon_attention.launch(q, k, v, o, lse, True, group=group)
        outs.append((o, lse))
    (o7, l7), *rest = outs
    assert not o7.isnan().any() and not l7.isnan().any()
    for o, lse in rest:
        assert torch.equal(o, o7) and torch.equal(lse, l7)


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", MANY_TILES, ids=str)
def test_gluon_pingpong_changes_no_bit(part, shape, is_causal):
    """The warpgroups taking turns at the tensor cores (PINGPONG) reorder only when each issues its
    products: every warpgroup's arithmetic is its own, so O and L are the same bits as with the
    warpgroups free, for each number of warpgroups the head dim fits, ragged and multi-round grids too."""
    part5 = parts.load(part)
    ga = part5.gluon_attention
    registers = {c["WARPGROUPS"]: c["REGISTERS"] for c in ga.CONFIGS.values()}  # per extra warpgroup
    q, k, v, _ = make_inputs(shape, torch.bfloat16, DEVICE, seed=shape.n_k)
    q, k, v = (t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous() for t in (q, k, v))
    d = q.shape[-1]
    for warpgroups in (2, 3) if d == 64 else (2,):
        outs = []
        for pingpong in (False, True):
            config = dict(ga.CONFIGS[d], WARPGROUPS=warpgroups, REGISTERS=registers[warpgroups], PINGPONG=pingpong)
            o, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:-1], float("nan"), device=q.device)
            ga.launch(q, k, v, o, lse, is_causal, config)
            outs.append((o, lse))
        (o0, l0), (o1, l1) = outs
        assert not o0.isnan().any() and not l0.isnan().any(), f"{warpgroups} warpgroups"
        assert torch.equal(o0, o1) and torch.equal(l0, l1), f"{warpgroups} warpgroups"


def test_causal_order_groups():
    from part5_profiling import gluon_attention

    assert gluon_attention.group_size(32, 4096, 128, True) == 1  # D = 128 from 4096 queries: sequence-major
    assert gluon_attention.group_size(32, 2048, 128, True) == 32  # shorter: every sequence side by side
    assert gluon_attention.group_size(32, 16384, 64, True) == 32  # D = 64: every sequence
    assert gluon_attention.group_size(32, 16384, 128, False) == 32  # no mask: the order has no groups


def test_short_and_causal_calls_take_two_warpgroups(monkeypatch):
    """model5: at D = 64, 128-row tiles up to 1024 queries without the mask and 4096 with it; 192 past
    those, and D = 128 always its own; the choice is part of the launch's key (another binary)."""
    from part5_profiling import flash_attention as fa
    from part5_profiling import gluon_attention as ga

    warpgroups = lambda d, n, causal: ga.config_for(d, n, causal)["WARPGROUPS"]  # noqa: E731
    assert [warpgroups(64, n, False) for n in (1, 1024, 1025, 4096)] == [2, 2, 3, 3]
    assert [warpgroups(64, n, True) for n in (1024, 4096, 4097, 16384)] == [2, 2, 3, 3]
    assert {warpgroups(128, n, c) for n in (64, 1024, 16384) for c in (False, True)} == {2}
    monkeypatch.setattr(ga, "properties", lambda device: type("H200", (), {"multi_processor_count": 132}))
    q, k = torch.empty(4, 8, 1024, 64), torch.empty(4, 8, 4096, 64)
    short, long = fa._plan(q, q, False, True), fa._plan(k, k, False, True)
    assert short[5] == "gluon 2x64x128 s4" and long[5] == "gluon 3x64x128 s4" and short[1] != long[1]


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("change", ["kv_stage", "O_BY_TMA", "PACK_LATE"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", MANY_TILES, ids=str)
def test_gluon_schedule_changes_change_no_bit(part, shape, is_causal, change):
    """Changes to hand-offs, stores and when P is packed give the shipped forward's O and L to the bit:
    K_j and V_{j-1} in one ring stage (tools/variants/kv_stage.diff), and O by TMA or from registers, P
    packed at its product or when made (CONFIGS' O_BY_TMA and PACK_LATE, each flipped); ragged,
    multi-round grids and every warpgroup count and turn-taking the head dim ships."""
    from common import steps

    ga = parts.load(part).gluon_attention
    other = steps.load_variant(5, change) if change.islower() else ga
    q, k, v, _ = make_inputs(shape, torch.bfloat16, DEVICE, seed=shape.n_q)
    q, k, v = (t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous() for t in (q, k, v))
    d = q.shape[-1]
    for config in {str(c): c for c in (ga.CONFIGS[d], ga.config_for(d, q.shape[1], is_causal))}.values():
        changed = config if change.islower() else dict(config, **{change: not config[change]})
        outs = []
        for module, meta in ((ga, config), (other, changed)):
            o, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:-1], float("nan"), device=q.device)
            module.launch(q, k, v, o, lse, is_causal, meta)
            outs.append((o, lse))
        (o0, l0), (o1, l1) = outs
        assert not o0.isnan().any() and not l0.isnan().any(), config
        assert torch.equal(o0, o1) and torch.equal(l0, l1), config


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gluon_large_scores(part, is_causal):
    """S of order 100: exp overflows without the running max."""
    part5 = parts.load(part)
    q, k, v, do = make_inputs(Shape((2, 4), 1500, 1500, 128), torch.bfloat16, DEVICE, seed=7, scale=STRESS_SCALE)
    assert_report_ok(check_part(part5, q, k, v, do, is_causal, grads=False), "large scores")


@needs_hopper
@pytest.mark.gpu
def test_float32_keeps_the_tl_forward(part):
    part5 = parts.load(part)
    q, k, v, do = make_inputs(Shape((2, 3), 300, 300, 64), torch.float32, DEVICE, seed=5)
    assert_report_ok(check_part(part5, q, k, v, do, True, grads=False), "float32")
    assert not parts.forward_config(part5).startswith("gluon"), (
        "float32 should run _attn_fwd (Gluon takes 16-bit inputs)"
    )


def test_gluon_backward_launch_around_the_kernel(part):
    """gluon_backward.launch on any machine, its main kernel replaced by a stand-in that records its
    call: _bwd_prepare writes D_i = rowsum(dO * O) and L * log2(e), zero past N_q up to a whole query
    tile, and zeroes the float32 dQ; the main launcher gets the key part 5's Launch caches by and one
    program per 128 keys and sequence; _dq_convert writes scale * dQ in the inputs' dtype, in row
    order: its bit arithmetic agrees with from_fragment_order's reshapes (FRAGMENT_ORDER)."""
    gb = parts.load(part).gluon_backward
    n_seqs, n_q, n_k, d = 3, 70, 200, 64
    g = torch.Generator().manual_seed(0)
    q, o, do = (torch.randn(n_seqs, n_q, d, generator=g).half().to(DEVICE) for _ in range(3))
    k, v = (torch.randn(n_seqs, n_k, d, generator=g).half().to(DEVICE) for _ in range(2))
    lse = torch.randn(n_seqs, n_q, generator=g).to(DEVICE)
    seen = {}

    def main(key, grid, *args, **constexprs):
        l2, delta, dq32 = args[4], args[5], args[8]
        seen.update(
            key=key,
            programs=grid({}),
            group=args[12],
            l2=l2.clone(),
            delta=delta.clone(),
            dq32=dq32.clone(),
            meta=constexprs,
        )
        dq32.copy_(torch.linspace(-1, 1, dq32.numel(), device=dq32.device).view_as(dq32))

    launchers = (gb._triton_path(gb._bwd_prepare), main, gb._triton_path(gb._dq_convert))
    dq, _, _ = gb.launch(q, k, v, o, do, lse, True, launchers=launchers)
    assert seen["key"] == (q.device, q.dtype, d, True, int(gb.default_order(True, n_q)))
    assert gb.default_order(True, n_q) == gb.SEQUENCE_MINOR and gb.default_order(True, gb.GROUPED_FROM) == gb.GROUPED
    assert seen["group"] == gb.group_size(n_seqs, n_q, d) == n_seqs  # three short sequences: one group
    mib = 2**20  # Q, dO and float32 dQ: 4 MiB a sequence at N = 4096, D = 128; 16 MiB at 16384
    assert [gb.group_size(32, n, 128, 30 * mib) for n in (512, 4096, 16384)] == [32, 7, 1]
    assert seen["programs"] == 2 * n_seqs and seen["meta"]["IS_CAUSAL"] and seen["meta"]["D"] == d
    assert torch.equal(seen["dq32"], torch.zeros_like(seen["dq32"]))
    padded = -(-n_q // gb.BLOCK_M) * gb.BLOCK_M
    delta, l2 = seen["delta"].view(n_seqs, padded), seen["l2"].view(n_seqs, padded)
    torch.testing.assert_close(delta[:, :n_q], (do.float() * o.float()).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l2[:, :n_q], lse * 1.4426950408889634, rtol=1e-6, atol=0)
    assert not delta[:, n_q:].any() and not l2[:, n_q:].any()
    padded_sum = torch.linspace(-1, 1, seen["dq32"].numel(), device=dq.device).view_as(seen["dq32"])
    assert seen["dq32"].shape == (n_seqs, padded, d)  # whole query tiles, in fragment order
    assert torch.equal(dq, (gb.from_fragment_order(padded_sum, n_q) * d**-0.5).half())


@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_sums_grouped_heads_in_one_launch(part, d):
    """Grouped heads (8 query heads on 2 key/value heads), on any machine, the main kernel replaced
    by a stand-in that writes dK and dV per query head: _group_sum returns each key/value head's sum
    over its four query heads, added in float32 in head order and rounded once (the same bits as
    that sum in torch), in K's and V's layouts (a model's transposed heads), ragged N_k included."""
    gb = parts.load(part).gluon_backward
    b, h, h_kv, n_q, n_k = 2, 8, 2, 70, 100
    g = torch.Generator().manual_seed(d)
    heads = lambda n, hh: torch.randn(b, n, hh, d, generator=g).half().to(DEVICE).transpose(1, 2)  # noqa: E731
    q, o, do, k, v = heads(n_q, h), heads(n_q, h), heads(n_q, h), heads(n_k, h_kv), heads(n_k, h_kv)
    lse = torch.randn(b, h, n_q, generator=g).to(DEVICE)
    per_query_head = [torch.randn(b, h, n_k, d, generator=g).half().to(DEVICE) for _ in range(2)]

    def main(key, grid, *args, **constexprs):
        args[6].copy_(per_query_head[0])  # dK and dV of every query head
        args[7].copy_(per_query_head[1])

    launchers = (gb._triton_path(gb._bwd_prepare), main, gb._triton_path(gb._dq_convert))
    _, dk, dv = gb.launch(q, k, v, o, do, lse, True, launchers=launchers)
    for got, made, like in ((dk, per_query_head[0], k), (dv, per_query_head[1], v)):
        groups = made.float().view(b, h_kv, h // h_kv, n_k, d).unbind(2)
        want = groups[0]
        for x in groups[1:]:
            want = want + x
        assert got.shape == like.shape and got.stride() == like.stride()
        assert torch.equal(got, want.half())


# Ragged lengths, N_q != N_k both ways, one key tile, one query, more key tiles than SMs.
BWD_SHAPES = [
    Shape((2, 3), 777, 513, 128),
    Shape((2, 2), 100, 300, 128),
    Shape((1, 3), 1000, 64, 128),
    Shape((3, 2), 1, 1, 128),
    Shape((4, 40), 300, 700, 128),
]


def _gluon_grads(part5, q, k, v, do, is_causal, order=None, l2_budget=None):
    """O and L from part 5's forward, dQ, dK, dV from the Gluon backward (gluon_backward.launch),
    its programs in `order` (the module's default_order by default), GROUPED's groups fitted
    in l2_budget bytes (the module's L2_BUDGET by default)."""
    o, lse = part5.flash_forward(q, k, v, is_causal)
    seqs = [t.reshape(-1, *t.shape[-2:]).contiguous() for t in (q, k, v, o, do)]
    lse_seqs = lse.reshape(seqs[0].shape[:-1]).contiguous()
    budget = part5.gluon_backward.L2_BUDGET if l2_budget is None else l2_budget
    dq, dk, dv = part5.gluon_backward.launch(*seqs, lse_seqs, is_causal, order=order, l2_budget=budget)
    return {"O": o, "L": lse, "dQ": dq.view(q.shape), "dK": dk.view(k.shape), "dV": dv.view(v.shape)}


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=str)
def test_gluon_backward(part, shape, dtype):
    """The Gluon backward at D = 128, non-causal, against the float64 reference; dK and dV the same
    bits on a second call (each program owns its keys), dQ within tolerance again (its float32 sum
    is added by TMA in whatever order the programs arrive)."""
    part5 = parts.load(part)
    q, k, v, do = make_inputs(shape, dtype, DEVICE, seed=shape.n_q + shape.n_k)
    first = _gluon_grads(part5, q, k, v, do, False)
    assert_report_ok(check_outputs(first, q, k, v, do, False), f"{shape} {dtype}")
    second = _gluon_grads(part5, q, k, v, do, False)
    assert torch.equal(first["dK"], second["dK"]) and torch.equal(first["dV"], second["dV"])
    assert_report_ok(check_outputs(second, q, k, v, do, False), f"{shape} {dtype}, second call")


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_routing(part, d, is_causal):
    """The kernel at D = 64 and 128, causal and not, on ragged and N_q != N_k shapes; and
    flash_backward runs it for every one of them."""
    part5 = parts.load(part)
    for i, shape in enumerate([Shape((2, 3), 777, 513, d), Shape((2, 2), 200, 450, d), Shape((1, 2), 450, 200, d)]):
        q, k, v, do = make_inputs(shape, torch.bfloat16, DEVICE, seed=20 + i)
        out = _gluon_grads(part5, q, k, v, do, is_causal)
        assert_report_ok(check_outputs(out, q, k, v, do, is_causal), f"{shape} causal={is_causal}")
        part5.flash_backward(q, k, v, out["O"], out["L"], do, is_causal)
        assert part5.backward_label() == "gluon"


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("order", ["SEQUENCE_MINOR", "SEQUENCE_MAJOR", "GROUPED"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_orders(part, d, is_causal, order):
    """The programs in every order compute the same gradients: ragged lengths, N_q != N_k both ways, more key blocks than query tiles and the reverse;
    GROUPED with a budget of four sequences, so six make a full group and a smaller last one."""
    part5 = parts.load(part)
    for i, shape in enumerate([Shape((2, 3), 777, 513, d), Shape((2, 2), 200, 450, d), Shape((3, 2), 1, 1, d)]):
        q, k, v, do = make_inputs(shape, torch.bfloat16, DEVICE, seed=40 + i)
        budget = 4 * shape.n_q * d * 8  # group_size: four sequences
        out = _gluon_grads(part5, q, k, v, do, is_causal, getattr(part5.gluon_backward, order), budget)
        assert_report_ok(check_outputs(out, q, k, v, do, is_causal), f"{shape} causal={is_causal} {order}")


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["model", "fused_qkv", "decode"])
def test_gluon_reads_heads_where_they_lie(part, layout):
    """A model's heads, (B, N, H, D) in memory seen as (B, H, N, D), with grouped K and V: the Gluon
    kernels read them in place, and O and dQ come back in Q's layout, dK and dV in K's and V's.
    Slices of one fused QKV projection (not dense: their gradients come back contiguous), and one
    query continuing a cache (strides of dimensions of size 1 unused). All against float64."""
    part5 = parts.load(part)
    b, n, h, d = 2, 300, 8, 128
    h_kv = h if layout == "fused_qkv" else 2
    g = torch.Generator(device=DEVICE).manual_seed(3)
    normal = lambda *shape: torch.randn(*shape, generator=g, device=DEVICE, dtype=torch.bfloat16)  # noqa: E731
    if layout == "fused_qkv":
        q, k, v = normal(b, n, 3, h, d).unbind(2)
    else:
        q, k, v = normal(b, 1 if layout == "decode" else n, h, d), normal(b, n, h_kv, d), normal(b, n, h_kv, d)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    do = normal(*q.shape[:1], q.shape[2], h, d).transpose(1, 2)
    is_causal = layout != "decode"
    out = run_part(part5, q, k, v, do, is_causal)
    assert_report_ok(check_outputs(out, q, k, v, do, is_causal), layout)
    assert parts.forward_config(part5).startswith("gluon") and part5.backward_label() == "gluon"
    if layout == "model":
        assert out["O"].stride() == q.stride() and out["dQ"].stride() == q.stride()
        assert out["dK"].stride() == k.stride() and out["dV"].stride() == v.stride()
    else:
        assert out["O"].shape == q.shape and out["dK"].shape == k.shape


def test_heads_reads_in_place_or_copies():
    """gluon_attention.heads on any machine: a model's transposed heads and a fused projection's slices
    are read in place; an expanded (stride 0), misaligned or column-strided tensor is copied; the
    strides given always describe t's elements, in whole 16 bytes; size-1 dimensions get valid ones."""
    from part5_profiling import gluon_attention as ga

    def read(t4, strides):  # the elements the kernels would read through (batch, head, row) strides
        return t4.as_strided(t4.shape, (*strides, 1))

    base = torch.randn(2, 5, 3, 3, 64, dtype=torch.bfloat16)
    model = base[:, :, 0].transpose(1, 2)  # (B, H, N, D), (B, N, 3, H, D) in memory: not dense
    cases = {
        "model": (base[:, :, 0].contiguous().transpose(1, 2), True),
        "fused": (model, True),
        "decode": (torch.randn(2, 1, 3, 64, dtype=torch.bfloat16).transpose(1, 2), True),
        "3-D": (torch.randn(6, 5, 64, dtype=torch.bfloat16), True),
        "expanded": (torch.randn(2, 1, 5, 64, dtype=torch.bfloat16).expand(2, 3, 5, 64), False),
        "misaligned": (torch.randn(2 * 3 * 5 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 5, 64), False),
        "columns": (torch.randn(2, 3, 64, 5, dtype=torch.bfloat16).transpose(-1, -2), False),
    }
    for name, (t, in_place) in cases.items():
        t4, strides = ga.heads(t)
        assert (t4.data_ptr() == t.data_ptr()) == in_place, name
        assert all(s > 0 and s % 8 == 0 for s in strides) and t4.data_ptr() % 16 == 0, name
        assert torch.equal(read(t4, strides).reshape(t.shape), t), name
    assert ga.stride_key(("k",), (64, 2**31 - 1)) == ("k",)  # 32-bit integers: the same binary
    assert ga.stride_key(("k",), (64, 2**31)) == ("k", "64-bit strides")
