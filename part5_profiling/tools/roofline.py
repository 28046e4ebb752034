"""The roofline: every profiled kernel pass against the ceilings measured on the same GPU.

    python -m part5_profiling.tools.roofline     # any machine: draws results/<gpu>/part5_roofline.png

Reads results/<gpu>/part5_ceilings.csv (ceilings.py) and part5_profile.csv (profile.py). A point is
one pass (forward or backward) of one target at one shape: its performance is the pass's FLOPs (as
the benchmark counts them) over its kernels' GPU time; its arithmetic intensity is those FLOPs over
the bytes it moved to and from DRAM. Bytes are measured (ncu's DRAM counters, summed over the
pass's kernels) where the profile has them, and otherwise modelled as the compulsory traffic: every
input read once and every output written once. The model is a lower bound on bytes, so a modelled
point sits at or right of where a measured one would.
"""

import argparse
import sys
from pathlib import Path

from lab import results
from lab.impls import impl_label
from lab.results import read_csv
from lab.timing import attention_flops

B, H, N = 4, 8, 4096
BF16, F32 = 2, 4
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}  # ncu's units (powers of 1000)


def compulsory_bytes(pass_, d):
    """Bytes a pass must move at least (bf16 tensors, float32 L and D), B=4, H=8, N=4096.
    Forward: read Q, K, V; write O and L. Backward: read Q, K, V, O, dO, L; write dQ, dK, dV (and D,
    written and read once)."""
    t = B * H * N * d * BF16  # one (B, H, N, D) bf16 tensor
    rows = B * H * N * F32  # one (B, H, N) float32 vector
    return 4 * t + rows if pass_ == "fwd" else 8 * t + 3 * rows


def dram_bytes(row):
    """An ncu DRAM row's bytes (its value in its unit), or None if the value or the unit is not understood."""
    try:
        value = float(str(row["value"]).replace(",", ""))
    except ValueError:
        return None
    scale = BYTE_UNITS.get(row["unit"] or "byte")
    return None if scale is None else value * scale


def points(profile_rows):
    """One point per (target, pass, D, causal): TFLOP/s, FLOPs per byte, and whether bytes were measured."""
    groups = {}
    for r in profile_rows:
        groups.setdefault((r["target"], r["pass"], r["D"], r["causal"]), []).append(r)
    out = []
    for (target, pass_, d, causal), rows in sorted(groups.items()):
        total = next(
            (
                r
                for r in rows
                if r["method"] == "cupti" and r["kernel"] == "(all kernels)" and r["metric"] == "time per call"
            ),
            None,
        )
        if total is None:
            continue
        seconds = float(total["value"]) * 1e-6
        flops = attention_flops(B, H, N, N, d, causal, pass_)
        dram = [
            dram_bytes(r)
            for r in rows
            if r["method"] == "ncu"
            and r["metric"] in ("DRAM bytes read", "DRAM bytes written")
            and r["value"] not in ("", None)
        ]
        measured = bool(dram) and None not in dram  # each value in its own unit: ncu scales them one by one
        nbytes = sum(dram) if measured else compulsory_bytes(pass_, d)
        out.append(
            dict(
                target=target,
                pass_=pass_,
                D=d,
                causal=causal,
                tflops=flops / seconds * 1e-12,
                intensity=flops / nbytes,
                measured=measured,
            )
        )
    return out


def ceilings(ceiling_rows):
    """(peak TFLOP/s, peak TB/s) measured: the best matrix product and the copy."""
    flops = max(float(r["value"]) for r in ceiling_rows if r["ceiling"] == "bf16 matmul" and r["method"] != "datasheet")
    bw = max(
        float(r["value"]) for r in ceiling_rows if r["ceiling"] == "memory bandwidth" and r["method"] != "datasheet"
    )
    return flops, bw


def figure(ceiling_rows, profile_rows):
    from matplotlib.figure import Figure

    peak, bw = ceilings(ceiling_rows)
    pts = points(profile_rows)
    fig = Figure(figsize=(10, 6.5))
    ax = fig.subplots()
    lo = min([p["intensity"] for p in pts] + [peak / bw]) / 3
    hi = max([p["intensity"] for p in pts] + [2 * peak / bw]) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, bw * x) for x in xs], "k-", lw=2, label=f"measured roof: {peak:.0f} TFLOP/s, {bw:.2f} TB/s")
    for r in ceiling_rows:
        if r["method"] == "datasheet" and r["ceiling"] == "bf16 matmul":
            ax.axhline(float(r["value"]), color="gray", ls=":", label=f"datasheet {float(r['value']):.0f} TFLOP/s")
    markers = {"fwd": "o", "bwd": "s"}
    for i, target in enumerate(dict.fromkeys(p["target"] for p in pts)):
        color = f"C{i % 10}"
        for j, p in enumerate(q for q in pts if q["target"] == target):
            ax.scatter(
                p["intensity"],
                p["tflops"],
                marker=markers[p["pass_"]],
                edgecolors=color,
                facecolors=color if p["measured"] else "none",
                label=None if j else impl_label(target),
            )
            shape = f"{p['D']}{' c' if p['causal'] else ''}"  # each point named by its D, c: causal
            ax.annotate(shape, (p["intensity"], p["tflops"]), xytext=(4, 2), textcoords="offset points", fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left")
    gpu = ceiling_rows[0]["gpu"]
    fig.suptitle(
        f"Roofline, B=4, H=8, N=4096, bf16 — {gpu}. Circles: forward, squares: backward;\n"
        "hollow: bytes modelled, filled: measured; each point labelled by its D (c: causal)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def draw(gpu_dir):
    """Draw part5_roofline.png if both CSVs exist; returns the path, or None."""
    ceiling_csv, profile_csv = gpu_dir / "part5_ceilings.csv", gpu_dir / "part5_profile.csv"
    if not (ceiling_csv.exists() and profile_csv.exists()):
        return None
    path = gpu_dir / "part5_roofline.png"
    figure(read_csv(ceiling_csv), read_csv(profile_csv)).savefig(path, dpi=110)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h200", help="results/<gpu>/ to read (default h200)")
    args = ap.parse_args(argv)
    gpu_dir = results.results_dir(args.gpu)
    path = draw(Path(gpu_dir))
    if path is None:
        print(
            f"needs part5_ceilings.csv and part5_profile.csv in {results.shown(gpu_dir)}: run ceilings.py and "
            "profile.py on a GPU first",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {results.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
