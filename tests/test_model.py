"""A part inside a real model: a small Llama from Hugging Face transformers attending through
common/hf.py, forward and backward, against the same model with transformers' SDPA attention; what
the parts do not compute is refused with a clear error; the helper under torch.compile takes the
torch.library op. transformers is reached only through common/hf.py."""

import copy
import re

import pytest
import torch

from common import ROOT, hf, library, parts
from common.check import check_outputs
from tests.helpers import DEVICE, TINY_LLAMA, fresh_python, needs_gpu

pytestmark = pytest.mark.skipif(not hf.available(), reason="needs transformers (pip install -e '.[model]')")

TINY = TINY_LLAMA
# On the GPU: D = 64 (the size part 5's Gluon kernels take), a length that is no multiple of any tile.
SMALL = dict(TINY, vocab_size=512, hidden_size=256, intermediate_size=512, max_position_embeddings=512)
B, N, N_GPU = 2, 24, 300
UNSUPPORTED = hf.Unsupported


def token_ids(n, vocab, device=DEVICE, b=B, seed=1):
    return torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(seed)).to(device)


def forward_backward(model, ids, **kwargs):
    """Logits, and every parameter's gradient of the mean cross-entropy, by name."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False, **kwargs)
    out.loss.backward()
    # a compiled model's parameters are its original's, named "_orig_mod.<name>"
    grads = {name.removeprefix("_orig_mod."): p.grad.detach().clone() for name, p in model.named_parameters()}
    return out.logits.detach(), grads


def largest_relative_error(a, b):
    """max |a - b| over max |b|: the error in units of the tensor's own scale."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def worst_error(got, ref):
    """(logits error, the worst parameter gradient's error and its name), each against its own scale."""
    (logits, grads), (ref_logits, ref_grads) = got, ref
    name = max(grads, key=lambda n: largest_relative_error(grads[n], ref_grads[n]))
    return largest_relative_error(logits, ref_logits), largest_relative_error(grads[name], ref_grads[name]), name


@pytest.fixture
def apply_calls(monkeypatch):
    """A list that gets one entry per call of any part's FlashAttention.apply (spied, still run)."""
    calls = []

    def spy(part):
        module = parts.load(part)
        original = module.FlashAttention.apply

        def counted(*args):
            calls.append(part)
            return original(*args)

        monkeypatch.setattr(module.FlashAttention, "apply", counted)
        return calls

    return spy


def op_calls(monkeypatch, part):
    """A list that gets "fwd"/"bwd" per run of part's torch.library ops (the path torch.compile takes)."""
    namespace = library.namespace(parts.load(part).__name__)
    forward, backward = library._IMPLS[namespace]
    calls = []

    def counted_forward(*args):
        calls.append("fwd")
        return forward(*args)

    def counted_backward(*args):
        calls.append("bwd")
        return backward(*args)

    monkeypatch.setitem(library._IMPLS, namespace, (counted_forward, counted_backward))
    return calls


def tiny_llama(attn_implementation="sdpa", **config):
    """The tiny Llama in float32 on this machine's device (the CPU tests run on a GPU too)."""
    return hf.llama(attn_implementation=attn_implementation, **dict(TINY, **config)).to(DEVICE)


# ------------------------------------------------------------------------- float32, any device
# Tolerance, float32: the part and SDPA compute the same sums in
# another order, so logits and gradients differ by float32 rounding, a few ulps (eps = 1.2e-7) of
# each tensor's largest value; measured: 1.5e-7 of the logits' scale, 5e-7 of the worst gradient's.
# 1e-5 of each tensor's scale (about 80 ulps) leaves room for that and nothing else: a wrong
# key/value head per query head, or a lost causal mask, moves the logits by about 0.7 of their scale
# (test_the_comparison_sees_a_wrong_head_mapping checks that the comparison catches one).
TOLERANCE = 1e-5


@pytest.mark.only_parts(0, 1)
def test_llama_matches_sdpa(part, apply_calls):
    """Logits and every parameter's gradient through the part match transformers' SDPA attention,
    and the part's FlashAttention.apply really ran, once per layer."""
    name = hf.register(part)
    assert name == f"fa_part{part}"
    reference = tiny_llama()
    model = copy.deepcopy(reference)
    model.set_attn_implementation(name)
    assert model.config._attn_implementation == name
    ids = token_ids(N, TINY["vocab_size"])
    calls = apply_calls(part)
    got = forward_backward(model, ids)
    assert calls == [part] * TINY["num_hidden_layers"]
    logits, grad, which = worst_error(got, forward_backward(reference, ids))
    assert logits <= TOLERANCE, f"logits differ by {logits:.1e} of their scale"
    assert grad <= TOLERANCE, f"{which}'s gradient differs by {grad:.1e} of its scale"
    assert len(got[1]) == len(list(model.parameters())) and all(g.abs().max() > 0 for g in got[1].values())


def test_the_comparison_sees_a_wrong_head_mapping(monkeypatch):
    """The check above can fail for the right reason: key/value heads tiled (query head h reading
    key/value head h % 2) instead of grouped (h // 2, transformers' repeat_kv) is caught."""
    name = hf.register(0)
    monkeypatch.setattr(hf, "repeat_kv", lambda t, n_rep: t.repeat(1, n_rep, 1, 1))
    reference = tiny_llama()
    model = copy.deepcopy(reference)
    model.set_attn_implementation(name)
    ids = token_ids(N, TINY["vocab_size"])
    logits, grad, _ = worst_error(forward_backward(model, ids), forward_backward(reference, ids))
    assert logits > 100 * TOLERANCE and grad > 100 * TOLERANCE


@pytest.mark.only_parts(0, 1, 5)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_function_called_directly(part, causal, monkeypatch):
    """The registered function as transformers calls it: (batch, heads, seq, D) in, grouped-query
    K/V, the module's is_causal (or the is_causal keyword, which wins); out (batch, seq, heads, D),
    contiguous, and None for the weights. Against SDPA with enable_gqa, forward and backward. Part
    5 takes the grouped K and V as they are (GROUPED_HEADS): nothing repeats them for it."""
    if part == 5:
        monkeypatch.setattr(hf, "repeat_kv", lambda *a: pytest.fail("part 5's K and V were repeated"))
    attention, _ = hf.registered(hf.register(part))
    module = torch.nn.Module()
    module.is_causal = not causal  # the keyword below overrides it
    g = torch.Generator(device=DEVICE).manual_seed(2)
    q = torch.randn(2, 4, 40, 32, generator=g, device=DEVICE).requires_grad_()
    k, v = (torch.randn(2, 2, 40, 32, generator=g, device=DEVICE).requires_grad_() for _ in range(2))
    out, weights = attention(module, q, k, v, None, dropout=0.0, scaling=32**-0.5, is_causal=causal)
    assert weights is None and out.shape == (2, 40, 4, 32) and out.is_contiguous()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert largest_relative_error(out, expected.transpose(1, 2)) <= TOLERANCE
    do = torch.randn(out.shape, generator=g, device=DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), do)
    expected_grads = torch.autograd.grad(expected.transpose(1, 2), (q, k, v), do)
    for name, a, b in zip("qkv", grads, expected_grads):
        assert largest_relative_error(a, b) <= TOLERANCE, f"d{name}"
    module.is_causal = causal  # no keyword: the module's flag
    out_module, _ = attention(module, q, k, v, None)
    assert torch.equal(out_module, out)


@pytest.mark.only_parts(1)
def test_an_all_ones_mask_is_no_mask(part):
    """What a tokenizer gives for rows without padding (attention_mask of ones) is accepted: the
    same logits as no mask at all."""
    model = tiny_llama(hf.register(part))
    ids = token_ids(N, TINY["vocab_size"])
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        ones = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    assert torch.equal(plain, ones)


@pytest.fixture
def tiny(part):
    """A tiny Llama attending through the part, and its token ids."""
    return tiny_llama(hf.register(part)), token_ids(N, TINY["vocab_size"])


def test_padding_is_refused(tiny):
    model, ids = tiny
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding in the first row
    with pytest.raises(UNSUPPORTED, match=r"padding .*not supported.*without padding.*attn_implementation='sdpa'"):
        model(input_ids=ids, attention_mask=mask, use_cache=False)


def test_a_custom_mask_is_refused(tiny):
    model, ids = tiny
    mask = torch.zeros(
        B, 1, N, N, device=DEVICE
    )  # an additive 4-D mask: transformers hands it to the attention as it is
    with pytest.raises(UNSUPPORTED, match=r"an attention mask \(a \(2, 1, 24, 24\) tensor.*attn_implementation='sdpa'"):
        model(input_ids=ids, attention_mask=mask, use_cache=False)


def test_packed_sequences_are_refused(tiny):
    """position_ids that start again inside a row: transformers would keep the documents apart."""
    model, ids = tiny
    positions = torch.cat([torch.arange(10), torch.arange(N - 10)]).expand(B, N).to(DEVICE)
    with pytest.raises(UNSUPPORTED, match="packed sequences"):
        model(input_ids=ids, position_ids=positions, use_cache=False)
    consecutive = torch.arange(3, 3 + N, device=DEVICE).expand(B, N)
    model(input_ids=ids, position_ids=consecutive, use_cache=False)  # fine


def test_dropout_is_refused_in_training(part):
    model = tiny_llama(hf.register(part), attention_dropout=0.1)
    ids = token_ids(N, TINY["vocab_size"])
    model.eval()  # no dropout at inference: runs
    model(input_ids=ids, use_cache=False)
    model.train()
    with pytest.raises(UNSUPPORTED, match=r"attention dropout \(0.1\).*attention_dropout to 0"):
        model(input_ids=ids, labels=ids, use_cache=False)


@pytest.mark.parametrize(
    "keywords, message",
    [
        (dict(sliding_window=8), "a sliding window: sliding_window=8"),
        (dict(softcap=30.0), r"soft-capping of the scores \(softcap\)"),
        (dict(s_aux=torch.zeros(4)), r"attention sinks"),
        (dict(scaling=0.5), r"scaling=0.5 \(the parts scale the scores by 1/sqrt\(D\) = 0.25\)"),
        (dict(is_causal=True, n_q=30), "causal attention with 30 query and 24 key positions.*in one call"),
    ],
    ids=["sliding-window", "softcap", "sinks", "scaling", "causal-nq-ne-nk"],
)
def test_what_a_model_cannot_easily_ask_is_refused_when_called_directly(part, keywords, message):
    attention, _ = hf.registered(hf.register(part))
    keywords = dict(keywords)
    q = torch.randn(1, 4, keywords.pop("n_q", N), 16, device=DEVICE)
    k = v = torch.randn(1, 4, N, 16, device=DEVICE)
    with pytest.raises(UNSUPPORTED, match=message):
        attention(torch.nn.Module(), q, k, v, None, **keywords)


def test_scaling_is_accepted_within_rounding(part):
    """1/sqrt(D) however a model computes it (head_dim**-0.5, 1/math.sqrt, in float32) runs."""
    attention, _ = hf.registered(hf.register(part))
    q = k = v = torch.randn(1, 2, 8, 16, device=DEVICE)
    scale = torch.tensor(1 / 16**0.5, dtype=torch.float32).item()
    out, _ = attention(torch.nn.Module(), q, k, v, None, scaling=scale * (1 + 1e-7), is_causal=False)
    assert out.shape == (1, 8, 2, 16)


def test_the_mask_function_takes_decoding_and_refuses_a_continued_cache(part):
    """One new query after the cache (a decoding step) needs no mask; several queries continuing a
    cache need the diagonal bottom-right, which part 5 aligns (BOTTOM_RIGHT); a cache larger than
    its contents (a static cache) is refused by every part."""
    _, mask = hf.registered(hf.register(part))
    assert mask(batch_size=1, q_length=1, kv_length=9, q_offset=8, kv_offset=0) is None
    assert mask(batch_size=1, q_length=9, kv_length=9) is None
    refused = [(1, 64, 8)]
    if hasattr(parts.load(part), "BOTTOM_RIGHT"):
        assert mask(batch_size=1, q_length=4, kv_length=12, q_offset=8, kv_offset=0) is None
    else:
        refused.append((4, 12, 8))
    for q_length, kv_length, q_offset in refused:
        with pytest.raises(UNSUPPORTED, match="a causal mask with a key/value cache.*dynamic cache"):
            mask(batch_size=1, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=0)


PROMPT, NEW_TOKENS = 13, 6


def generate(model, ids):
    """Greedy generation: (the tokens, the logits of every step)."""
    greedy = dict(do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, **greedy)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.only_parts(0, 1)
def test_generate_matches_sdpa(part, monkeypatch):
    """model.generate() through the part: the prompt once (causal, N_q = N_k), then one query per step
    against the cache, which the part computes as full attention. Float32: SDPA's greedy tokens
    exactly, and every step's logits within TOLERANCE of its scale."""
    name = hf.register(part)
    reference = tiny_llama()
    model = copy.deepcopy(reference)
    model.set_attn_implementation(name)
    module, shapes = parts.load(part), []
    original = module.FlashAttention.apply

    def spy(q, k, v, causal):
        shapes.append((q.shape[-2], k.shape[-2], causal))
        return original(q, k, v, causal)

    monkeypatch.setattr(module.FlashAttention, "apply", spy)
    ids = token_ids(PROMPT, TINY["vocab_size"])
    with torch.no_grad():
        tokens, logits = generate(model, ids)
        ref_tokens, ref_logits = generate(reference, ids)
    assert tokens.tolist() == ref_tokens.tolist()
    assert largest_relative_error(logits, ref_logits) <= TOLERANCE
    layers = TINY["num_hidden_layers"]
    steps = [(PROMPT, PROMPT, True)] + [(1, PROMPT + i, False) for i in range(1, NEW_TOKENS)]
    assert shapes == [s for s in steps for _ in range(layers)]


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")  # transformers 5.2x renames it `cache`
def test_a_continued_cache_is_refused_or_aligned_bottom_right(part, tiny):
    """Queries continuing a cache (chunked prefill): parts 0-4 refuse them with the way out, not
    answered top-left; part 5 aligns the diagonal bottom-right and gets SDPA's logits (float32)."""
    model, ids = tiny
    with torch.no_grad():
        cache = model(input_ids=ids[:, :8], use_cache=True).past_key_values
        if not hasattr(parts.load(part), "BOTTOM_RIGHT"):
            with pytest.raises(UNSUPPORTED, match="key/value cache.*prefill the prompt in one call"):
                model(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True)
            return
        got = model(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True).logits
        reference = tiny_llama()
        reference.load_state_dict(model.state_dict())
        ref_cache = reference(input_ids=ids[:, :8], use_cache=True).past_key_values
        expected = reference(input_ids=ids[:, 8:], past_key_values=ref_cache, use_cache=True).logits
        whole = reference(input_ids=ids, use_cache=False).logits[:, 8:]  # the same positions in one call
    assert got.shape == expected.shape and ids.shape[1] - 8 > 1  # several queries continue the cache
    assert largest_relative_error(got, expected) <= TOLERANCE
    assert largest_relative_error(expected, whole) <= TOLERANCE


def test_names_transformers_uses_are_refused():
    with pytest.raises(ValueError, match="one of transformers' attention implementations"):
        hf.register(0, name="sdpa")
    assert hf.register(0, name="my_attention") == "my_attention"


@pytest.mark.only_parts(1)
def test_compiled_llama_takes_the_op(part, apply_calls, monkeypatch):
    """torch.compile(model) through the helper: while tracing it calls flash_attention, the
    torch.library op, so the compiled model runs the part's forward and backward through the op
    (never FlashAttention.apply), with the eager model's answer. aot_eager runs the traced graph
    with eager kernels: quick on a CPU, and what Inductor would see. The mask function runs outside
    the graph, so packed sequences are still refused."""
    torch._dynamo.reset()
    name = hf.register(part)
    reference = tiny_llama()
    model = copy.deepcopy(reference)
    model.set_attn_implementation(name)
    compiled = torch.compile(model, backend="aot_eager")
    ids = token_ids(N, TINY["vocab_size"])
    applies, ops = apply_calls(part), op_calls(monkeypatch, part)
    got = forward_backward(compiled, ids)
    layers = TINY["num_hidden_layers"]
    assert applies == [] and sorted(ops) == ["bwd"] * layers + ["fwd"] * layers
    logits, grad, which = worst_error(got, forward_backward(reference, ids))
    assert logits <= TOLERANCE and grad <= TOLERANCE, (logits, grad, which)
    positions = torch.cat([torch.arange(10), torch.arange(N - 10)]).expand(B, N).to(DEVICE)
    with pytest.raises(UNSUPPORTED, match="packed sequences"):
        compiled(input_ids=ids, position_ids=positions, use_cache=False)
    torch._dynamo.reset()


def test_only_the_helper_imports_transformers():
    """transformers is an optional extra: one module imports it, so nothing else needs it."""
    pattern = re.compile(r"^\s*(import transformers|from transformers\b)", re.M)
    importers = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if not path.relative_to(ROOT).parts[0].startswith(".") and pattern.search(path.read_text())
    )
    assert importers == ["common/hf.py"]


# --------------------------------------------------------------------------------------- the GPU
# bf16 against float32: the part's bf16 model and SDPA's are each compared with SDPA in float32 on
# the same (bf16-rounded) weights. Both round to bf16 (8 bits of mantissa) at every layer, so the
# yardstick is SDPA's own bf16 error: the part may be at most twice as far from float32, plus 1% of
# a tensor's scale for a gradient SDPA happens to get unusually close.


def bf16_and_reference(config, name):
    """(the model in bf16 attending with `name`, the same weights in float32 with SDPA), on the GPU."""
    model = hf.llama(attn_implementation=name, **config).to(DEVICE, torch.bfloat16)
    reference = copy.deepcopy(model).float()
    reference.set_attn_implementation("sdpa")
    return model, reference


def assert_no_worse_than_sdpa(got, config, ids, what):
    sdpa, reference = bf16_and_reference(config, "sdpa")
    ref = forward_backward(reference, ids)
    ours, theirs = worst_error(got, ref), worst_error(forward_backward(sdpa, ids), ref)
    assert ours[0] <= 2 * theirs[0] + 0.01, f"{what}: logits {ours[0]:.2e} from float32, SDPA bf16's {theirs[0]:.2e}"
    assert ours[1] <= 2 * theirs[1] + 0.01, (
        f"{what}: {ours[2]}'s gradient {ours[1]:.2e}, SDPA bf16's worst {theirs[1]:.2e}"
    )


@pytest.mark.gpu
@needs_gpu
@pytest.mark.since_part(1)
def test_llama_bf16_on_gpu(part, apply_calls):
    model, _ = bf16_and_reference(SMALL, hf.register(part))
    ids = token_ids(N_GPU, SMALL["vocab_size"], DEVICE)
    calls = apply_calls(part)
    got = forward_backward(model, ids)
    assert calls == [part] * SMALL["num_hidden_layers"]
    assert_no_worse_than_sdpa(got, SMALL, ids, f"part {part}, eager")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.since_part(1)
def test_generate_bf16_on_gpu(part):
    """generate() in bf16: every step's logits, computed against the cache, measured against float32
    SDPA's logits for the same tokens (one forward over the whole sequence, no cache), no further
    from them than SDPA's bf16 logits, by the yardstick above."""
    model, reference = bf16_and_reference(SMALL, hf.register(part))
    sdpa, _ = bf16_and_reference(SMALL, "sdpa")
    ids = token_ids(N_GPU, SMALL["vocab_size"], DEVICE)
    with torch.no_grad():
        tokens, logits = generate(model, ids)
        steps = slice(N_GPU - 1, N_GPU - 1 + NEW_TOKENS)
        ref, theirs = (m(input_ids=tokens, use_cache=False).logits[:, steps].transpose(0, 1) for m in (reference, sdpa))
    assert tokens.shape == (B, N_GPU + NEW_TOKENS)
    ours, theirs = largest_relative_error(logits, ref), largest_relative_error(theirs, ref)
    assert ours <= 2 * theirs + 0.01, f"part {part}: logits {ours:.2e} from float32, SDPA bf16's {theirs:.2e}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.since_part(1)
def test_compiled_llama_on_gpu(part, apply_calls, monkeypatch):
    """torch.compile(model) (Inductor) through the helper: the op path, the eager model's accuracy."""
    torch._dynamo.reset()
    model, _ = bf16_and_reference(SMALL, hf.register(part))
    ids = token_ids(N_GPU, SMALL["vocab_size"], DEVICE)
    applies, ops = apply_calls(part), op_calls(monkeypatch, part)
    got = forward_backward(torch.compile(model), ids)
    layers = SMALL["num_hidden_layers"]
    assert applies == [] and sorted(ops) == ["bwd"] * layers + ["fwd"] * layers
    assert_no_worse_than_sdpa(got, SMALL, ids, f"part {part}, torch.compile")
    torch._dynamo.reset()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.since_part(1)
def test_cuda_graphs_llama_on_gpu(part):
    """torch.compile(model, mode="reduce-overhead"): Inductor's graph captured as CUDA graphs and
    replayed (the training benchmark's third mode). Three steps, the first two the graphs' warm-up
    and capture, the third a replay: no allocation of the part's may outlive a step (a buffer kept
    across launches fails the capture, "not tracked as outputs"), and the replay is as accurate as
    the eager model."""
    torch._dynamo.reset()
    model, _ = bf16_and_reference(SMALL, hf.register(part))
    ids = token_ids(N_GPU, SMALL["vocab_size"], DEVICE)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        got = forward_backward(compiled, ids)
    assert_no_worse_than_sdpa(got, SMALL, ids, f"part {part}, CUDA graphs")
    torch._dynamo.reset()


# The op named as the way, not the file or module that holds it (flash_attention.py, part1_x.flash_attention).
NAMES_THE_OP = re.compile(r"(?<![\w./])flash_attention(?![\w.])")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.since_part(1)
def test_apply_under_compile_runs_or_names_the_op(part):
    """FlashAttention.apply inside a torch.compile'd function (fullgraph=False): either it runs and
    its O, dQ, dK and dV pass the project's correctness rule against the float64 reference (common/
    check.py, as every part's own tests), or it fails with an error that names the flash_attention op
    as the way to compile. Nothing else: not a crash deep in the compiler, not a wrong answer. Not
    bit for bit with eager: where Dynamo traces into the part, Inductor recompiles its PyTorch code
    (the tiled backward of parts 0-3) with roundings of its own (seen on the H200: dQ differs)."""
    module = parts.load(part)
    torch._dynamo.reset()

    def attend(q, k, v):
        return module.FlashAttention.apply(q, k, v, True) * 2  # something for Inductor to fuse around

    g = torch.Generator(device=DEVICE).manual_seed(3)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=g, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn(q.shape, generator=g, device=DEVICE, dtype=torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    try:
        out = torch.compile(attend, fullgraph=False)(*leaves)
        out.backward(do)
    except Exception as e:  # the other accepted outcome: a clear refusal naming the op
        assert NAMES_THE_OP.search(str(e)), f"fails without naming the flash_attention op: {type(e).__name__}: {e}"
        return
    finally:
        torch._dynamo.reset()
    # out = 2 O, so O = out / 2 and the gradients are those of O against 2 dO (all exact in bf16)
    grads = dict(zip(("dQ", "dK", "dV"), (t.grad for t in leaves)))
    report = check_outputs(dict(O=out.detach() / 2, **grads), q, k, v, 2 * do, True)
    assert report.ok, f"compiled FlashAttention.apply: {report}"


def test_the_readme_model_snippet_runs_as_written():
    """The top README's "Use it in a model" code, run as written in a fresh process from the repository
    root: it generates 8 tokens after a 12-token prompt."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use it in a model") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)[1]
    done = fresh_python(code, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = re.search(r"tensor\(\[\[([\d,\s]+)\]\]", done.stdout)  # on a GPU: then device=...
    assert printed and len(printed[1].split(",")) == 12 + 8, done.stdout


@pytest.mark.skipif(DEVICE.type == "cuda", reason="only without a GPU must the interpreter be switched on first")
def test_transformers_imported_first_is_named_in_the_error():
    """transformers loads triton as a model class is imported; without a GPU that is too late for the
    interpreter, and the error says which import to move."""
    code = "from transformers import LlamaForCausalLM\nfrom common import hf"
    done = fresh_python(code)
    assert done.returncode != 0
    assert "transformers, imported first, loaded triton" in done.stderr
    assert "Import common.hf (or the part) before transformers" in done.stderr
