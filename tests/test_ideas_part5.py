"""Part 5's ideas, one test each: what grades its exercises (make exercise PART=5). In the suite they
test the shipped files; `make check PART=5 NAME=x` runs them on the learner's file instead.

Gluon has no interpreter, so the forward's ideas are graded by what the compiler makes of the learner's
gluon_attention.py: Triton's compiler and ptxas compile it for sm_90 on any machine (a fresh process,
the compiler on: tools/ladder.py's compiled_facts does the same for every step), once, at D = 64
without a mask (three softmax warpgroups, ping-pong turns, a ring of four). The tests read two of its
forms: the PTX (wgmma.wait_group 1: a product left in flight) and the TTGIR, where every barrier and
buffer an operation touches can be followed back to the ring it belongs to (q, k or v; its buffers,
ready or free barriers), so each partition's operations read as a program: waits, products in
flight, exponentials, releases, expects and TMA copies. The ring's phase rule is graded by its model,
tools/ring.py, run under many interleavings."""

import functools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common import ROOT, exercises, runtime

pytestmark = pytest.mark.only_parts(5)

FORWARD = "gluon_attention.py"
D, CAUSAL = 64, False  # CONFIGS[64]: WARPGROUPS = 3, STAGES = 4, PINGPONG on
COMPILE = """
import json, sys
from common import exercises
from part5_profiling.tools.ladder import compile_gluon
module = exercises.learner_module(5, sys.argv[1])
kernel = compile_gluon(module, "fwd", int(sys.argv[2]), sys.argv[3] == "1")
with open(sys.argv[4], "w") as f:
    json.dump(dict(ptx=kernel.asm["ptx"], ttgir=kernel.asm["ttgir"]), f)
"""


@functools.cache
def compiled(d=D, causal=CAUSAL):
    """{"ptx", "ttgir"} of the forward as graded (the learner's file while its exercise is graded),
    compiled for sm_90 in a fresh process with Triton's compiler on (on a CPU, this one runs the interpreter)."""
    assert runtime.TRITON_VERSION != "none", "part 5 needs Triton"  # imported after common.runtime
    pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0")
    with tempfile.TemporaryDirectory(prefix="part5-compiled-") as folder:
        out_file = Path(folder) / "forward.json"
        cmd = [sys.executable, "-c", COMPILE, FORWARD, str(d), str(int(causal)), str(out_file)]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{FORWARD} does not compile for sm_90: {compile_error(out.stderr)}"
        return json.loads(out_file.read_text())


def compile_error(stderr):
    """The compiler's complaint, first line first: the innermost error (a NameError, say), then where
    in the kernel (the first CompilationError's excerpt), else the end of what it printed."""
    lines = [x for x in stderr.splitlines() if x.strip() and "nanobind" not in x and not x.startswith(" - ")]
    first = next((i for i, x in enumerate(lines) if "CompilationError: at" in x), None)
    if first is None:
        return "\n".join(lines[-20:])
    block = lines[first : first + 16]
    cause = next((x for x in block[1:] if re.match(r"\w+(Error|Exception)\b", x)), block[0].split(": ", 1)[-1])
    return f"{cause}\n" + "\n".join(block)


# ------------------------------------------------------------------------------ the TTGIR as programs
RINGS = ("q", "k", "v")  # Ring.alloc's order in _attn_fwd_gluon: Q, K, V (then the turns' barriers)
ROLES = ("buffers", "ready", "free")
NAME = r"%[\w.#-]+"


@dataclass
class Op:
    kind: str  # wait, arrive, expect, copy, dot, dot_wait, exp2
    ring: str = ""  # the barrier's (wait, arrive, expect) or the destination's (copy) ring
    role: str = ""  # ready or free (a barrier), buffers (a copy's destination)
    reads: frozenset = frozenset()  # dot: the rings whose buffers it reads
    pending: int = 0  # dot_wait: products left in flight
    is_async: bool = False  # dot
    nbytes: int = 0  # expect: bytes announced; copy: bytes it brings
    barrier: tuple = ()  # copy: the (ring, role) of the barrier it completes
    line: str = ""


@dataclass
class Partition:
    name: str  # "warpgroup 0", "warpgroup 1", ..., "loader"
    ops: list = field(default_factory=list)


def memdesc_bytes(text):
    """Bytes of a !ttg.memdesc<1x1x128x64xbf16, ...>."""
    m = re.search(r"memdesc<([\dx]+)x(bf16|f16|f32)", text)
    dims = [int(x) for x in m[1].split("x")]
    size = 1
    for x in dims:
        size *= x
    return size * {"bf16": 2, "f16": 2, "f32": 4}[m[2]]


def partitions(ttgir):
    """The forward's partitions (warp_specialize's default region is warpgroup 0), each with the
    operations on rings that it makes, in program order (a loop's body once, as written)."""
    lines = ttgir.splitlines()
    at = next(i for i, x in enumerate(lines) if "ttg.warp_specialize(" in x)
    allocs = [m[1] for x in lines[:at] if (m := re.match(rf"\s*({NAME}) = ttg\.local_alloc\b", x))]
    roots = {name: (RINGS[i // 3], ROLES[i % 3]) if i < 9 else ("turns", "bars") for i, name in enumerate(allocs)}
    captured = re.findall(NAME, re.search(r"ttg\.warp_specialize\(([^)]*)\)", lines[at])[1])
    top = {m[1]: m[2] for x in lines[:at] if (m := re.match(rf"\s*({NAME}) = ttg\.memdesc_\w+ ({NAME})", x))}
    heads = [i for i, x in enumerate(lines) if re.match(r"\s*partition\d+\(", x)]
    end = next(i for i in range(heads[-1], len(lines)) if re.match(r"\s*\} : \(", lines[i]))
    regions = [("warpgroup 0", lines[at + 1 : heads[0]], {})]
    for n, (start, stop) in enumerate(zip(heads, [*heads[1:], end])):
        args = re.findall(rf"({NAME}):", lines[start])
        name = "loader" if "num_warps(1)" in lines[start] else f"warpgroup {n + 1}"
        regions.append((name, lines[start + 1 : stop], dict(zip(args, captured))))
    return [Partition(name, list(ring_ops(body, args, top, roots))) for name, body, args in regions]


def ring_ops(body, args, top, roots):
    local = {m[1]: m[2] for x in body if (m := re.match(rf"\s*({NAME}) = ttg\.memdesc_\w+ ({NAME})", x))}

    def root(name):
        for _ in range(20):
            name = local.get(name) or args.get(name) or top.get(name) or name
            if name in roots:
                return roots[name]
        return ("", "")

    for line in body:
        s = line.strip()
        if m := re.match(rf"ttng\.wait_barrier ({NAME}),", s):
            yield Op("wait", *root(m[1]), line=s)
        elif m := re.match(rf"ttng\.arrive_barrier ({NAME}),", s):
            yield Op("arrive", *root(m[1]), line=s)
        elif m := re.match(rf"ttng\.barrier_expect ({NAME}), (\d+)", s):
            yield Op("expect", *root(m[1]), nbytes=int(m[2]), line=s)
        elif m := re.match(rf"ttng\.async_tma_copy_global_to_local {NAME}\[[^\]]*\] ({NAME}), ({NAME}),", s):
            nbytes = memdesc_bytes(s.rsplit("->", 1)[1])
            yield Op("copy", *root(m[1]), barrier=root(m[2]), nbytes=nbytes, line=s)
        elif m := re.match(rf"{NAME}(:\d+)? = ttng\.warp_group_dot ({NAME}), ({NAME}),", s):
            reads = frozenset(r for r, role in (root(m[2]), root(m[3])) if role == "buffers")
            yield Op("dot", reads=reads, is_async="isAsync = true" in s, line=s)
        elif m := re.search(r"= ttng\.warp_group_dot_wait .*\{pendings = (\d+)", s):
            yield Op("dot_wait", pending=int(m[1]), line=s)
        elif "= math.exp2 " in s:
            yield Op("exp2", line=s)


def softmax_partitions(found):
    return [p for p in found if p.name != "loader"]


def in_flight(ops):
    """Walk a partition's operations keeping the products in flight (wgmma groups, oldest first; a
    wait for n leaves the newest n running). Yields (op, the reads of each product in flight then)."""
    flight = []
    for op in ops:
        if op.kind == "dot":
            flight = [*flight, op.reads] if op.is_async else []  # a synchronous product waits for all
        elif op.kind == "dot_wait":
            flight = flight[len(flight) - op.pending :] if op.pending else []
        yield op, list(flight)


def assert_released_only_when_read(partition):
    """No buffer is freed while a product in flight still reads it: a running wgmma reads its operand
    from shared memory, and the loader would copy the next tile over it."""
    for op, flight in in_flight(partition.ops):
        if op.kind == "arrive" and op.role == "free" and any(op.ring in reads for reads in flight):
            tile = {"k": "K_j", "v": "V_{j-1}", "q": "Q"}[op.ring]
            raise AssertionError(
                f"{partition.name} releases {tile} ({op.ring}.release) while a product that reads it is still "
                f"in flight ({len(flight)} wgmma group(s) running): wait for that product first"
            )


# ------------------------------------------------------------------------------ products in flight
def test_products_in_flight_overlap_the_softmax_with_p_v(part):
    """fwd3: each step issues S_j = Q K_j^T and then P_{j-1} V_{j-1}, waits for S_j alone (wgmma
    groups finish in order: wait_group 1 in the binary) and computes P_j's exponentials while P V
    still runs; no buffer is released while a product reads it."""
    binary = compiled()
    found = softmax_partitions(partitions(binary["ttgir"]))
    left = len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", binary["ptx"]))
    for p in found:
        exps = [(op, flight) for op, flight in in_flight(p.ops) if op.kind == "exp2"]
        early = [flight for _, flight in exps if any("k" in reads for reads in flight)]
        assert not early, (
            f"{p.name} computes exponentials while the S_j = Q K_j^T product is still in flight: S_j is issued "
            f"first, so a wait that leaves one group running (warpgroup_mma_wait(1, ...)) finishes it"
        )
        overlapped = sum(any("v" in reads for reads in flight) for _, flight in exps)
        assert overlapped, (
            f"{p.name} never computes exponentials while a P V product runs ({len(exps)} exp2 in its code, each "
            f"with no product in flight; wgmma.wait_group 1 appears {left} times in the binary): issue S_j and "
            f"P_{{j-1}} V_{{j-1}} together, wait for S_j alone, and wait for P V after the softmax"
        )
        assert_released_only_when_read(p)
    assert left >= len(found), f"wgmma.wait_group 1 appears {left} times in the binary, fewer than the warpgroups"


# ------------------------------------------------------------------------------ the ring's release
def test_release_frees_each_buffer_once_no_product_reads_it(part):
    """Each K and V buffer a warpgroup waits for it releases once (the loader waits on free for every
    warpgroup's arrival), never while a product still reads it, and K_j at once: not after the
    softmax's exponentials, which need S_j, not K_j (the loader could be copying K_{j+STAGES}). V_{j-1}
    is read until the wait for P V, and little runs between that and the step's end: checked for
    safety only."""
    for p in softmax_partitions(partitions(compiled()["ttgir"])):
        for ring, tile in (("k", "K"), ("v", "V")):
            waits = sum(op.kind == "wait" and (op.ring, op.role) == (ring, "ready") for op in p.ops)
            frees = sum(op.kind == "arrive" and (op.ring, op.role) == (ring, "free") for op in p.ops)
            assert waits == frees, (
                f"{p.name} waits for a {tile} tile at {waits} places and releases one at {frees}: the loader "
                f"waits on {ring}.free for every warpgroup, so each tile waited for is released once"
            )
        assert_released_only_when_read(p)
        held = set()  # rings whose tile is waited for, no longer read, not yet released
        for op, flight in in_flight(p.ops):
            read = set().union(*flight) if flight else set()
            if op.kind == "wait" and op.role == "ready" and op.ring == "k":
                held.add("k")
            elif op.kind == "arrive" and op.role == "free":
                held.discard(op.ring)
            elif op.kind == "exp2" and "k" in held and "k" not in read:
                raise AssertionError(
                    f"{p.name} holds K_j through the softmax's exponentials: S_j, the only product that reads "
                    f"K_j, is done before them, so release K_j right after the wait that finishes S_j"
                )


# ------------------------------------------------------------------------------ the loader warp
def test_loader_fills_the_k_and_v_rings(part):
    """fwd2: the loader warp (a partition of one warp) brings each key tile into the K and V rings:
    it waits until the buffer is free, expects the tile's bytes on the ring's ready barrier, and a TMA
    copy into the ring's buffer completes that barrier; the ring position moves on each tile."""
    found = partitions(compiled()["ttgir"])
    loader = next((p for p in found if p.name == "loader"), None)
    assert loader is not None, "the forward has no loader partition of one warp (gl.warp_specialize)"
    for ring, tile in (("q", "Q"), ("k", "K_j"), ("v", "V_j")):
        copies = [op for op in loader.ops if op.kind == "copy" and op.ring == ring]
        assert copies, f"the loader copies nothing into the {ring} ring: no TMA copy brings {tile} into its buffers"
        state, expected, landed = "", 0, 0
        for op in loader.ops:
            if op.ring != ring and not (op.kind == "copy" and op.barrier[0] == ring):
                continue
            if op.kind == "wait" and op.role == "free":
                state, expected, landed = "free", 0, 0
            elif op.kind == "expect":
                assert op.role == "ready", f"the loader expects bytes on {ring}.{op.role}, not {ring}.ready"
                assert state == "free", (
                    f"the loader expects {tile}'s bytes on {ring}.ready before waiting for its buffer to be free "
                    f"({ring}.free): the warpgroups may still read the tile there (Ring.fill waits first)"
                )
                state, expected = "expecting", op.nbytes
            elif op.kind == "copy":
                assert op.ring == ring and op.barrier == (ring, "ready"), (
                    f"a TMA copy into the {op.ring} ring completes {op.barrier[0]}.{op.barrier[1]}: {tile}'s copy "
                    f"must complete {ring}.ready, the barrier the warpgroups wait on for it"
                )
                assert state == "expecting", (
                    f"the loader copies {tile} into the {ring} ring without waiting for the buffer to be free and "
                    f"expecting its bytes first (Ring.fill)"
                )
                landed += op.nbytes
        assert expected == landed, (
            f"the loader expects {expected} bytes on {ring}.ready but its copies of {tile} bring {landed}: the "
            f"barrier's phase completes when the bytes expected have landed"
        )
    body = loop_around(compiled()["ttgir"], "k")
    assert body is not None and "iter_args(" in body, (
        "the loader's loop over key tiles does not move the ring position on: c counts key tiles (c = c.next() "
        "after each), or every tile goes into the same buffer and phase"
    )


def loop_around(ttgir, ring):
    """The header of the scf.for that directly holds the loader's TMA copy into `ring`'s buffers."""
    loader = partitions(ttgir)[-1]
    copy = next(op.line for op in loader.ops if op.kind == "copy" and op.ring == ring)
    lines = ttgir.splitlines()
    at = max(i for i, x in enumerate(lines) if x.strip() == copy)
    indent = len(lines[at]) - len(lines[at].lstrip())
    for x in reversed(lines[:at]):
        if len(x) - len(x.lstrip()) < indent and x.strip() and not x.strip().startswith("}"):
            return x if "scf.for" in x else None
    return None


# ------------------------------------------------------------------------------ the ring's phase rule
def test_ring_parity_keeps_the_ring_safe_under_any_interleaving(part):
    """tools/ring.py's rule (the kernel's: hopper.Counter and Ring): under many interleavings the ring
    never deadlocks, the loader never overwrites a tile some warpgroup has not read, no warpgroup reads
    a stale tile, and each reads every tile in order; with nobody else running first, the loader
    fills every slot of the ring before a warpgroup reads one (the ring is used, not one slot)."""
    ring = exercises.learner_module(5, "tools/ring.py")
    rng = random.Random(0)
    for stages in (1, 2, 3, 4):
        for consumers in (1, 2, 3):
            for n_tiles in (1, 2, 5, 9):
                for turn, pick in enumerate([None] + [rng.choice] * 12):
                    case = f"STAGES = {stages}, {consumers} warpgroup(s), {n_tiles} key tiles"
                    case += ", the loader first" if pick is None else f", random interleaving {turn}"
                    events, errors = ring.run(n_tiles, stages, consumers, pick=pick)
                    assert not errors, f"{case}: {errors[0]}"
                    done = [e for e in events if not e["blocked"]]
                    copied = [e["tile"] for e in done if e["who"] == "loader"]
                    assert copied == list(range(n_tiles)), f"{case}: the loader copied tiles {copied}"
                    for w in range(consumers):
                        reads = [e["tile"] for e in done if e["who"] == f"warpgroup {w}"]
                        assert reads == list(range(n_tiles)), f"{case}: warpgroup {w} read tiles {reads}"
                    if pick is None:
                        ahead = next((i for i, e in enumerate(done) if e["who"] != "loader"), len(done))
                        want = min(stages, n_tiles)
                        assert ahead == want, (
                            f"{case}: the loader copies {ahead} tile(s) before a warpgroup reads one; a ring of "
                            f"{stages} slots lets it copy {want} (every slot is free at the start)"
                        )
