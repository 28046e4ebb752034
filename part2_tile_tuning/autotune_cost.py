"""What @triton.autotune costs: the first call of a new shape class against the steady state.

    python -m part2_tile_tuning.autotune_cost

Two fresh Python processes run one after the other with one new, empty Triton cache directory.
In the first ("cold cache") nothing is compiled yet: the first call compiles every configuration
that survives the pruning, times each one, and only then runs. The second ("warm disk cache")
finds those compiled kernels on disk. Writes results/<gpu>/part2_autotune.csv.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from common import ROOT, parts, results, runtime, triton_tools
from common.inputs import Shape, make_inputs
from common.timing import time_ms

FIELDS = ["scenario", "seconds", "configs", "chosen", "B", "H", "N", "D", *results.PROVENANCE]
B, H, D = 4, 8, 64


def child(n_first, n_second):
    """Runs inside the fresh process: time first calls and the steady state, print JSON."""
    from part2_tile_tuning import flash_attention as fa

    rows = []

    def first_call(n, label):
        q, k, v, _ = make_inputs(Shape((B, H), n, n, D), torch.bfloat16, runtime.DEVICE, seed=n)
        torch.cuda.synchronize()
        start = time.perf_counter()

        def call():
            fa.flash_attention(q, k, v)
            torch.cuda.synchronize()

        tried = triton_tools.timed_configs(fa._attn_fwd, call)
        seconds = time.perf_counter() - start
        rows.append(dict(scenario=label, seconds=seconds, configs=tried, chosen=parts.forward_config(fa), N=n))
        return q, k, v

    q, k, v = first_call(n_first, f"first call, N={n_first}")
    steady = time_ms(lambda: fa.flash_attention(q, k, v)) / 1e3
    rows.append(
        dict(
            scenario=f"steady state, N={n_first} (median)",
            seconds=steady,
            configs=0,
            chosen=parts.forward_config(fa),
            N=n_first,
        )
    )
    first_call(n_second, f"first call, N={n_second}: new N bucket, kernels already compiled")
    print("RESULTS " + json.dumps(rows))


def run_child(cache_dir, label_prefix, n_first, n_second):
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, PYTHONUNBUFFERED="1")
    code = f"from part2_tile_tuning.autotune_cost import child; child({n_first}, {n_second})"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"autotune child failed:\n{out.stdout}\n{out.stderr}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULTS "))
    rows = json.loads(line[len("RESULTS ") :])
    for r in rows:
        r["scenario"] = f"{label_prefix}: {r['scenario']}"
    rows.append(
        dict(
            scenario=f"{label_prefix}: whole process (Python, torch and CUDA start included)",
            seconds=time.perf_counter() - start,
            configs=0,
            chosen="",
            N=n_first,
        )
    )
    return rows


def main():
    if not runtime.HAS_GPU or runtime.INTERPRET:
        print("Autotuning times configurations on a GPU; without one there is nothing to measure.")
        return 0
    with tempfile.TemporaryDirectory() as cache:
        rows = run_child(cache, "cold cache", 4096, 8192)
        rows += run_child(cache, "warm disk cache", 4096, 8192)
    meta = dict(B=B, H=H, D=D, **results.provenance())
    path = results.write_csv(
        results.results_dir() / "part2_autotune.csv",
        [{**meta, **r, "seconds": f"{r['seconds']:.6g}"} for r in rows],
        FIELDS,
    )
    print(f"wrote {results.shown(path)}")
    for r in rows:
        print(f"{r['seconds']:10.4f} s  {r['scenario']}  {r['chosen']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
