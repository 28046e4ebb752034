"""A part as the attention of a Hugging Face transformers model.

    from common import hf

    name = hf.register(5)                      # "fa_part5"
    model = hf.llama(hidden_size=512, ...)     # or any transformers model built your way
    model.set_attn_implementation(name)        # every attention layer now runs part 5

transformers looks an attention implementation up by name twice: in AttentionInterface for the
function each attention layer calls, and in AttentionMaskInterface for the function that builds the
mask the model hands that layer. register() puts one entry in each, under one name.

The attention function takes what a model passes: q, k and v as (batch, heads, seq, D), possibly
fewer key/value heads than query heads (grouped-query attention: part 5's kernels read each
group's key/value head themselves, GROUPED_HEADS; for the other parts each key/value head is
repeated for its group of query heads, as transformers' repeat_kv does, and autograd adds the
group's gradients back), the scale, the causal flag (the `is_causal` keyword if the model gives one,
otherwise the module's `is_causal`), and the dropout probability. It returns what
transformers' SDPA attention returns: the output as (batch, seq, heads, D), contiguous, and None
for the attention weights, which are never formed. In eager mode it calls the part's
FlashAttention.apply; while torch.compile traces it, the part's `flash_attention` (the
torch.library op of common/library.py, which the compiler treats as one opaque call).

The mask function returns None (no mask) when the model's mask is the plain causal one, or no mask
at all, with no padding: the attention's causal flag says all of it, as with transformers' own
flash-attention integration. It runs outside torch.compile's graph (torch.compiler.disable): while
tracing, transformers cannot read position_ids, so it always wraps the causal mask in its
packed-sequence test; run eagerly, this function reads the test's result (one check per forward,
not per layer) and returns None only when every row is one sequence.

What a part does not compute is refused with `Unsupported` (a ValueError) naming it and the way
out, never answered wrongly: an attention mask (padding, packed sequences, a custom 4-D mask),
dropout > 0, a sliding window, soft-capping, attention sinks, a scale other than 1/sqrt(D), and
causal attention of several queries continuing a key/value cache (chunked prefill: transformers
aligns that mask bottom-right, parts 0-4 top-left, as SDPA's is_causal) except with part 5, run
eagerly (BOTTOM_RIGHT: its FlashAttention.apply(q, k, v, True, True)). Everything else about the
inputs (dtype, D, devices) is checked by the part itself, as FlashAttention.apply checks it.

Generation works: model.generate() first runs the prompt (N_q = N_k, causal as in training), then
one query per step against every key in the cache. Aligned bottom-right, as transformers means it,
that one query is the last position and sees every key: full attention, which the parts compute
as it is (is_causal=False), with no kernel change.

This is the one module of the project that imports transformers, and only when one of its functions
is called: nothing else needs it installed (`pip install -e ".[model]"` brings it).
"""

import importlib.util
import inspect
import math

import torch

import common.runtime  # noqa: F401  (before transformers, which imports triton: see common/runtime.py)
from common import parts

WAY_OUT = (
    "use batches without padding (rows of one length; documents may be packed end to end into full rows, "
    "with position_ids left consecutive and attention crossing their boundaries), or attn_implementation='sdpa'"
)
CHUNKED = (
    "queries continuing a cache, as in chunked prefill or a cache larger than its contents, need the diagonal "
    "aligned bottom-right: part 5 aligns it so, eagerly and against every key before the queries (a dynamic "
    "cache); the other parts align it top-left, as SDPA's is_causal"
)
WAY_OUT_CACHE = (
    "generate with a dynamic cache (transformers' default: one new query per step is supported, several with "
    "part 5 run eagerly), prefill the prompt in one call, or use attn_implementation='sdpa'"
)
# Keywords a model may pass to an attention function that change what attention computes; None means "off".
REFUSED_KEYWORDS = {
    "sliding_window": "a sliding window",
    "softcap": "soft-capping of the scores (softcap)",
    "s_aux": "attention sinks (s_aux)",
    "position_bias": "a position bias added to the scores",
    "cu_seq_lens_q": "variable-length packed sequences (cu_seq_lens_q)",
    "cu_seq_lens_k": "variable-length packed sequences (cu_seq_lens_k)",
}
# transformers' mask pieces (masking_utils), by qualified name: what they add to a causal mask.
_PACKED = "packed_sequence_mask_function.<locals>.inner_mask"
_NEUTRAL = {
    "and_masks.<locals>.and_mask",  # combines the pieces below it
    "remap_positions_for_packed_sequence.<locals>.inner_mask",  # position_ids as indices: the same when consecutive
}
_DEVIATIONS = {  # qualified-name fragment -> what it is, for the error
    "sliding_window": "a sliding window",
    "chunked": "chunked attention",
    "padding_mask_function": "padding",
    "blockwise_overlay": "block-wise attention (block_sequence_ids)",
    "or_masks": "a mask combined with another (or_mask_function)",
}

_registered = {}  # name -> part number: what register() put into transformers' two interfaces


class Unsupported(ValueError):
    """A model asked a part's attention for something it does not compute."""


def available():
    """Whether transformers is installed (the `model` extra)."""
    return importlib.util.find_spec("transformers") is not None


def _refuse(name, what, way_out=WAY_OUT):
    raise Unsupported(f"{name}: {what} is not supported (the parts compute plain causal or full attention); {way_out}")


def attention_function(part, name):
    """The function transformers calls in each attention layer, running part `part`."""
    module = parts.load(part)
    grouped = getattr(module, "GROUPED_HEADS", False)  # its kernels read each group's key/value head
    bottom_right = hasattr(module, "BOTTOM_RIGHT")  # its FlashAttention takes bottom_right (part 5)

    def attention(m, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if attention_mask is not None:
            _refuse(name, f"an attention mask (a {tuple(attention_mask.shape)} tensor: padding or a custom mask)")
        if dropout:
            _refuse(
                name,
                f"attention dropout ({dropout})",
                "set the config's attention_dropout to 0, or use attn_implementation='sdpa'",
            )
        for keyword, what in REFUSED_KEYWORDS.items():
            given = kwargs.get(keyword)
            if given is not None:
                shown = f"a {tuple(given.shape)} tensor" if isinstance(given, torch.Tensor) else repr(given)
                _refuse(name, f"{what}: {keyword}={shown}")
        d = query.shape[-1]
        if scaling is not None and not math.isclose(scaling, d**-0.5, rel_tol=1e-6):
            _refuse(
                name,
                f"scaling={scaling} (the parts scale the scores by 1/sqrt(D) = {d**-0.5:.6g})",
                "use attn_implementation='sdpa'",
            )
        causal = bool(is_causal if is_causal is not None else getattr(m, "is_causal", True))
        n_q, n_k = query.shape[-2], key.shape[-2]
        if causal and n_q == 1:  # a decoding step: the one query, last in line, sees every key
            causal = False
        continued = causal and n_q != n_k  # queries continuing a cache: the diagonal bottom-right
        if continued and not (bottom_right and n_q < n_k and not torch.compiler.is_compiling()):
            _refuse(name, f"causal attention with {n_q} query and {n_k} key positions ({CHUNKED})", WAY_OUT_CACHE)
        heads, kv_heads = query.shape[1], key.shape[1]
        if heads != kv_heads:  # grouped-query attention
            if heads % kv_heads:
                raise ValueError(f"{name}: {heads} query heads cannot share {kv_heads} key/value heads evenly")
            if not grouped:  # transformers' repeat_kv, for a part whose kernels take one per query head
                key, value = (repeat_kv(t, heads // kv_heads) for t in (key, value))
        if torch.compiler.is_compiling():
            out = module.flash_attention(query, key, value, causal)
        elif continued:
            out = module.FlashAttention.apply(query, key, value, True, True)
        else:
            out = module.FlashAttention.apply(query, key, value, causal)
        return out.transpose(1, 2).contiguous(), None

    attention.__qualname__ = attention.__name__ = f"{name}_attention"
    return attention


def repeat_kv(t, n_rep):
    """(batch, kv_heads, seq, D) -> (batch, kv_heads * n_rep, seq, D), head h reading key/value head h // n_rep."""
    b, h, n, d = t.shape
    return t[:, :, None].expand(b, h, n_rep, n, d).reshape(b, h * n_rep, n, d)


def _pieces(fn, depth=0):
    """fn and the functions kept in its closures, recursively: transformers builds a mask function by
    wrapping the pieces it combines (and_masks, or_masks, the packed-sequence remap) in closures."""
    found = [fn]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if inspect.isfunction(v) and depth < 8:
                found += _pieces(v, depth + 1)
    return found


def _deviation(mask_function):
    """(what the model's mask adds to plain causal or full attention, or None; whether it is causal)."""
    from transformers import masking_utils

    if mask_function is None or mask_function is masking_utils.causal_mask_function:  # None: transformers' default
        return None, True
    pieces = _pieces(mask_function)
    base = [p for p in pieces if p in (masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function)]
    for p in pieces:
        qualname = p.__qualname__
        if p in base or qualname in _NEUTRAL:
            continue
        if qualname == _PACKED:  # transformers' test for several sequences in a row: read its answer
            # (batch, seq): each token's sequence number in its row, 0 everywhere for one sequence a row
            packed = next(c.cell_contents for c in p.__closure__ if isinstance(c.cell_contents, torch.Tensor))
            if bool((packed[:, -1] == 0).all()):
                continue
            return "packed sequences (position_ids that start again inside a row)", True
        what = next((w for fragment, w in _DEVIATIONS.items() if fragment in qualname), None)
        return what or f"a custom mask function ({qualname})", True
    if len(set(base)) != 1:
        return f"a custom mask function ({mask_function.__qualname__})", True
    return None, base[0] is masking_utils.causal_mask_function


def mask_function(name, bottom_right=False):
    """The function transformers calls for the mask of a model using `name`: None, or Unsupported.
    bottom_right: the part aligns a causal diagonal bottom-right, so queries continuing a cache of
    every key before them (transformers' dynamic cache) need no mask either."""

    @torch.compiler.disable  # runs eagerly, on real tensors, also inside a compiled model (module docstring)
    def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None, **_):
        what, causal = _deviation(mask_function)
        if what is not None:
            _refuse(name, what)
        q_offset, kv_offset = int(q_offset), int(kv_offset)
        continued = kv_offset == 0 and kv_length == q_offset + q_length  # the queries last, every key so far
        decoding = q_length == 1 and continued  # one query: it sees every key
        if causal and not (decoding or bottom_right and continued) and (q_length != kv_length or q_offset or kv_offset):
            what = f"{q_length} queries at offset {q_offset}, {kv_length} keys at offset {kv_offset}"
            _refuse(name, f"a causal mask with a key/value cache ({what}: {CHUNKED})", WAY_OUT_CACHE)
        if attention_mask is not None:
            padded = attention_mask.dim() != 2 or attention_mask.shape[-1] != kv_length
            if padded or not bool(attention_mask.all()):  # an all-ones mask (what a tokenizer gives) is no mask
                _refuse(name, "padding (an attention_mask with zeros)")
        return None

    mask.__qualname__ = mask.__name__ = f"{name}_mask"
    return mask


def register(part, name=None):
    """Register part `part` with transformers as the attention implementation `name` (default
    "fa_part<N>"), its attention function and its mask function, and return the name. Registering
    the same name again replaces it; a name transformers already uses for its own is refused."""
    parts.require([part])
    name = name or f"fa_part{part}"
    _register(name, attention_function(part, name), mask_function(name, hasattr(parts.load(part), "BOTTOM_RIGHT")))
    _registered[name] = part
    return name


def register_sdpa(name="sdpa_unmasked", attention=None):
    """transformers' own SDPA attention (or `attention`, a function with its signature) under this
    module's mask function: the mask a part gets (none for a plain causal model without padding)
    instead of transformers' own, which under torch.compile is always materialised as a (batch, 1,
    N, N) tensor (while tracing, transformers cannot rule out packed sequences) and keeps SDPA off
    its mask-less kernels. Eager, the two are the same. What this mask function refuses, use
    attn_implementation='sdpa' for."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _register(name, attention or sdpa_attention_forward, mask_function(name))
    _registered[name] = None
    return name


def _register(name, attention, mask):
    from transformers import AttentionInterface, AttentionMaskInterface

    if name not in _registered and (name == "eager" or name in AttentionInterface._global_mapping):
        raise ValueError(f"{name!r} is one of transformers' attention implementations; choose another name")
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def registered(name):
    """(attention function, mask function) registered under `name`, as transformers will call them."""
    from transformers import AttentionInterface, AttentionMaskInterface

    return AttentionInterface()[name], AttentionMaskInterface()[name]


def llama(attn_implementation="sdpa", seed=0, **config):
    """A LlamaForCausalLM built from LlamaConfig(**config), its weights initialised at random from
    `seed` (torch's global generator is left as it was; nothing is downloaded), in float32 on the
    CPU, attending with `attn_implementation`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**config))
    model.set_attn_implementation(attn_implementation)
    return model
