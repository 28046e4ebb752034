"""The results files and the report, on synthetic CSVs with known numbers: the typed reader and the
merging writer, what each plot draws from which rows, the tables, the README blocks, and the
mistakes that must stop the report before it changes anything."""

import json
import re
import types

import pytest

from common import ROOT, bench, report, results
from common.timing import attention_flops
from tests.helpers import META, study_row

BASE = {"part1": 40, "part2": 300, "sdpa_flash": 280, "sdpa_cudnn": 450}


def _tf(impl, d, c, n):
    """The TFLOP/s the synthetic rows are made to run at: each (impl, D, causal, N) its own number."""
    return BASE[impl] + d + c + n / 1024


def _ms(n, d, c, tflops, mode="fwd"):
    return attention_flops(4, 8, n, n, d, c, mode) / (tflops * 1e9)


def _bench_csv(folder):
    rows = []
    for impl in BASE:
        for d, c in report.PANELS:
            for n in (1024, 4096):
                part = int(impl[4:]) if impl.startswith("part") else ""
                rows.append(
                    study_row(
                        impl=impl,
                        part=part,
                        N=n,
                        D=d,
                        causal=c,
                        mode="fwd",
                        ms=_ms(n, d, c, _tf(impl, d, c, n)),
                        graph_ms=_ms(n, d, c, 2 * BASE[impl]),
                        backend="64x64 w4 s2" if part == 2 else "",
                        check="ok",
                    )
                )
    # Rows that must not be drawn or tabulated as forward numbers: another mode, and a failed check.
    rows.append(dict(rows[0], impl="part2", part=2, mode="fwd+bwd", ms=1e-6))
    rows.append(dict(rows[0], impl="sdpa_math", part="", N=4096, ms="", check="FAIL O=1"))
    results.write_csv(folder / "bench.csv", rows, bench.FIELDS)
    return results.read_csv(folder / "bench.csv")


def _panel(fig, d, c):
    return fig.axes[report.PANELS.index((d, c))]


# ------------------------------------------------------------------------------------ results.py
def test_read_csv_types_cells_and_keeps_provenance_text(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("N,ms,check,commit,triton,backend\n4096,0.0530,ok O=1.0e-03,1234567,3.10,\n")
    assert results.read_csv(path) == [
        dict(N=4096, ms=0.053, check="ok O=1.0e-03", commit="1234567", triton="3.10", backend=None)
    ]


def test_write_csv_replaces_rows_with_the_same_key_and_keeps_the_rest_as_written(tmp_path):
    path = tmp_path / "bench.csv"
    fields, key = ["impl", "N", "ms"], ("impl", "N")
    results.write_csv(path, [dict(impl="a", N=1, ms="0.0530"), dict(impl="b", N=1, ms="2")], fields, key=key)
    results.write_csv(
        path,
        [dict(impl="b", N=1, ms="3"), dict(impl="b", N=2, ms="4")],
        fields,
        key=key,
        sort=lambda r: (r["impl"], int(r["N"])),
    )
    assert path.read_text().splitlines() == ["impl,N,ms", "a,1,0.0530", "b,1,3", "b,2,4"]


def test_markdown_table():
    table = results.markdown_table(["what", "n"], [["a", 1], ["b", 22]], "lr")
    assert table == "| what | n |\n| --- | ---: |\n| a | 1 |\n| b | 22 |"


# ------------------------------------------------------------------------------------ plots
def test_tflops_plot_draws_each_line_from_its_own_rows(tmp_path):
    fig = report.tflops_figure(_bench_csv(tmp_path))
    for d, c in report.PANELS:
        lines = {line.get_label(): line for line in _panel(fig, d, c).lines}
        # sdpa_math failed its check: it has no time and no line.
        assert set(lines) == {"part 1", "part 2", "SDPA flash (FA2)", "SDPA cuDNN"}
        for impl, label in (("part2", "part 2"), ("sdpa_cudnn", "SDPA cuDNN")):
            x, y = lines[label].get_data()
            assert list(x) == [1024, 4096]
            assert list(y) == pytest.approx([_tf(impl, d, c, 1024), _tf(impl, d, c, 4096)])
        assert lines["part 2"].get_linestyle() == "-" and lines["SDPA cuDNN"].get_linestyle() == "--"


def test_vs_sdpa_plot_divides_each_part_by_the_backend_it_names(tmp_path):
    fig = report.vs_sdpa_figure(_bench_csv(tmp_path))
    lines = {line.get_label(): line for line in _panel(fig, 128, 1).lines if not line.get_label().startswith("_")}
    assert set(lines) == {f"part {p} / SDPA {b}" for p in (1, 2) for b in ("flash (FA2)", "cuDNN")}
    x, y = lines["part 2 / SDPA cuDNN"].get_data()
    # D=128, causal, N=4096: part 2 runs at 300+128+1+4 = 433 TFLOP/s, cuDNN at 450+133 = 583.
    assert list(x) == [1024, 4096] and y[1] == pytest.approx(100 * 433 / 583)


# ------------------------------------------------------------------------------------ tables
def test_bench_tables(tmp_path):
    _bench_csv(tmp_path)
    table = report.table_part(tmp_path, 2)
    assert table.startswith("_Test GPU; torch 2.x; Triton 3.x; commit abc1234; 2026-01-01. Regenerate:")
    # D=64, non-causal, N=4096: part 1 = 108, part 2 = 368, flash = 348, cuDNN = 518; the autotuner's choice last.
    assert "| 64 | no | 4096 | 108 | **368** | 348 | 518 | 106% | 71% | 64x64 w4 s2 |" in report.table_part(tmp_path, 2)
    # CUDA-graph rows run at twice the base: part 2 600, flash 560.
    assert "| 64 | no | 4096 | 368 | 600 | 348 | 560 | 107% |" in report.table_graph(tmp_path, 2)
    # Only N >= 2048; causal time / non-causal time = (1/2 the FLOPs / 109) / (all of them / 108).
    causal = report.table_causal_time(tmp_path, 1).splitlines()
    assert [line for line in causal if line.startswith("| 64 |")] == [
        f"| 64 | 4096 | {_ms(4096, 64, 0, 108):.3f} | {_ms(4096, 64, 1, 109):.3f} | 0.50 | 0.50 |"
    ]


# ------------------------------------------------------------------------------------ README blocks
def test_fill_rebuilds_blocks_and_says_when_a_csv_is_missing(tmp_path):
    text = "a\n<!-- results:demo -->\nold\n<!-- /results:demo -->\nb\n<!-- results:overview -->\nold\n<!-- /results:overview -->\n"
    new = report.fill(
        text, {"demo": lambda g: f"from {g.name}", "overview": lambda g: report.table_part(g, 2)}, tmp_path
    )
    assert new == (
        f"a\n<!-- results:demo -->\nfrom {tmp_path.name}\n<!-- /results:demo -->\nb\n<!-- results:overview -->\n"
        "_No results yet (bench.csv missing): run the command that writes it._\n<!-- /results:overview -->\n"
    )


def test_committed_readmes_are_reproduced_from_the_committed_results():
    tables = report.all_tables(report.part_reports())
    for path in report.readmes():
        assert report.fill(path.read_text(), tables, ROOT / "results" / "h200") == path.read_text(), path


def _readme_with(tmp_path, monkeypatch, marker):
    """A README in tmp_path with one block, and results/fake/ holding a bench.csv: what main reads."""
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- results:{marker} -->\nold\n<!-- /results:{marker} -->\n")
    monkeypatch.setattr(report, "readmes", lambda: [readme])
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    (tmp_path / "results" / "fake").mkdir(parents=True)
    _bench_csv(tmp_path / "results" / "fake")
    return readme


def test_report_fills_readmes_and_draws(tmp_path, monkeypatch):
    readme = _readme_with(tmp_path, monkeypatch, "part2")
    assert report.main(["--gpu", "fake"]) == 0
    assert "| 128 | yes | 4096 | 173 | **433** | 413 | 583 | 105% | 74% | 64x64 w4 s2 |" in readme.read_text()
    assert (tmp_path / "results" / "fake" / "bench_tflops.png").exists()


@pytest.mark.parametrize("mistake", ["missing folder", "unknown marker"])
def test_a_mistake_stops_the_report_before_it_changes_anything(tmp_path, monkeypatch, capsys, mistake):
    readme = _readme_with(tmp_path, monkeypatch, "part2" if mistake == "missing folder" else "prat2")
    gpu = "a100" if mistake == "missing folder" else "fake"
    assert report.main(["--gpu", gpu]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("results/a100/" in err and "fake" in err) if mistake == "missing folder" else "prat2" in err
    marker = "part2" if mistake == "missing folder" else "prat2"
    assert readme.read_text() == f"<!-- results:{marker} -->\nold\n<!-- /results:{marker} -->\n"
    assert not list((tmp_path / "results" / "fake").glob("*.png"))


def test_a_table_name_taken_twice_is_an_error():
    mine = types.SimpleNamespace(__name__="part8_x.report", TABLES={"part8-sweep": str})
    with pytest.raises(ValueError, match="'part2' of part9_y.report is taken by common.report"):
        report.all_tables([types.SimpleNamespace(__name__="part9_y.report", TABLES={"part2": str})])
    with pytest.raises(ValueError, match="'part8-sweep' of part9_y.report is taken by part8_x.report"):
        report.all_tables([mine, types.SimpleNamespace(__name__="part9_y.report", TABLES={"part8-sweep": str})])


def test_common_imports_no_particular_part():
    """Parts are found by folder pattern (common/parts.py); nothing in common/ imports one by name."""
    loads = r"^\s*(?:from|import)\s+part\d|import_module\(f?[\"']part\d|parts\.(?:load|folder|path)\(\d"
    for path in (ROOT / "common").glob("*.py"):
        found = re.findall(loads, path.read_text(), re.M)
        assert not found, f"{path.name} loads a part by name: {found}"


# ------------------------------------------------------------------------------------ part 2's report
def _sweep_report():
    from common import sweep_report

    return sweep_report


def _sweep_rows(part, groups, fail_tile=None):
    """Part 2's plan at H200 limits, every survivor 'ok' at bm*bn/100 + warps + stages/10 TFLOP/s
    (so a tile is at its best with its most warps and stages that fit), fail_tile failing its check."""
    from common.sweep import plan
    from part2_tile_tuning.sweep import Forward

    rows = []
    for d, c in groups:
        for r in plan(Forward(), d, c, 227 * 1024):
            if r["status"] == "todo":
                ok = (r["BLOCK_M"], r["BLOCK_N"]) != fail_tile
                tf = r["BLOCK_M"] * r["BLOCK_N"] / 100 + r["num_warps"] + r["num_stages"] / 10
                r.update(status="ok" if ok else "failed check: O", tflops=tf if ok else None)
            rows.append(dict(r, B=4, H=8, N=4096, dtype="bf16", **META))
    return rows


@pytest.mark.only_parts(2)
def test_heatmap_shows_each_tiles_best_and_why_the_others_are_empty(part):
    rep = _sweep_report()
    rows = _sweep_rows(part, [(64, 0)], fail_tile=(32, 32))
    ax = rep.heatmaps_figure(rows, "title").axes[0]
    grid = ax.images[0].get_array()
    blocks = [16, 32, 64, 128, 256]
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    # 64 x 128 at D=64: 16 KB + stages * 32 KB fits 227 KB up to 5 stages; 64*(64+128)/(32*2) = 192
    # registers fit with 2 warps: every configuration survives, the best is 8 warps, 5 stages.
    i, j = blocks.index(64), blocks.index(128)
    assert grid[i, j] == pytest.approx(64 * 128 / 100 + 8 + 0.5) and texts[(i, j)] == "90\nw8 s5"
    # 256 x 256 at D=64: 256*(64+256)/(32*8) = 320 registers even with 8 warps: all pruned.
    i = blocks.index(256)
    assert grid.mask[i, i] and texts[(i, i)] == "budget"
    i = blocks.index(32)
    assert grid.mask[i, i] and texts[(i, i)] == "fail"


@pytest.mark.only_parts(2)
def test_stages_table_follows_each_groups_winner(part, tmp_path):
    rep = _sweep_report()
    rows = _sweep_rows(part, [(64, 0), (64, 1), (128, 0)])
    for r in rows:
        if r["status"] == "ok":
            r.update(smem_compiled=r["smem_est"], regs=128)
    results.write_csv(tmp_path / "part2_sweep.csv", rows, list(rows[0]))
    device = dict(
        multi_processor_count=132,
        regs_per_multiprocessor=65536,
        shared_memory_per_multiprocessor=233472,
        max_threads_per_multi_processor=2048,
    )
    (tmp_path / "part2_device.json").write_text(json.dumps(device))
    lines = [
        line
        for line in rep.table_sweep_stages(tmp_path, "part2", "part2_tile_tuning.sweep").splitlines()
        if re.match(r"\| \d", line)
    ]
    # The largest tile that fits wins. D=64: 256 x 128 with 8 warps: 256*(64+128)/256 = 192 registers;
    # Q takes 256*64*2 = 32 KB, K and V 2*128*64*2 = 32 KB a stage, so even 5 stages (192 KB) fit.
    # The causal group's winner is the same tile and warps, so it adds no row. D=128: 256 x 128 needs
    # 256*(128+128)/256 = 256 registers, pruned; 128 x 256 takes 32 KB + 128 KB a stage: one stage
    # fits, two do not.
    assert [line.split(" | ")[:3] for line in lines] == [
        ["| 64", "no", "256 x 128, 8 warps"],
        ["| 128", "no", "128 x 256, 8 warps"],
    ]
    # 1 stage: 327.68 + 8 + 0.1 TFLOP/s. Programs per SM: 8 warps of 128 registers allow 65536 / (8 * 4096)
    # = 2; D=64 at 64 KB (+1 KB reserved) 3 by shared memory, so 2; D=128 at 160 KB only 1.
    assert lines[0].split(" | ")[3] == "336 (64 KB, 2)"
    assert lines[1].split(" | ")[3:] == ["336 (160 KB, 1)", *["pruned (shared memory)"] * 3, "pruned (shared memory) |"]


@pytest.mark.only_parts(2)
def test_sweep_waves_count_the_programs_the_grid_launches(part, tmp_path):
    """Waves = programs / (programs per SM x SMs), with one program per BLOCK_M rows by default and
    per BLOCK_N rows for a kernel that holds a key tile (the backward's dK/dV)."""
    rep = _sweep_report()
    rows = [r for r in _sweep_rows(part, [(64, 0)]) if r["status"] == "ok"]
    for r in rows:
        r.update(smem_compiled=r["smem_est"], regs=128)
    results.write_csv(tmp_path / "x_sweep.csv", rows, list(rows[0]))
    device = dict(
        multi_processor_count=132,
        regs_per_multiprocessor=65536,
        shared_memory_per_multiprocessor=233472,
        max_threads_per_multi_processor=2048,
    )
    (tmp_path / "x_device.json").write_text(json.dumps(device))
    for block in ("BLOCK_M", "BLOCK_N"):
        table = rep.table_sweep(tmp_path, "x", "x", grid_block=block)
        for line in (line for line in table.splitlines() if re.match(r"\| \d", line)):
            cells = [c.strip() for c in line.strip("|").split("|")]
            bm, bn = (int(x) for x in cells[3].split(" x "))
            r = next(r for r in rows if (r["BLOCK_M"], r["BLOCK_N"]) == (bm, bn))
            programs = r["B"] * r["H"] * -(-r["N"] // (bm if block == "BLOCK_M" else bn))
            assert float(cells[10]) == pytest.approx(programs / (int(cells[9]) * 132), abs=0.05)


def test_write_as_measured_saves_each_shape_and_reports_failures(tmp_path, monkeypatch, capsys):
    """The studies' shared ending: rows saved as they come (a run cut short keeps them), written at
    the end, and a non-zero exit status when a row failed its check."""
    from common import results

    monkeypatch.setenv("RESULTS_DIR", str(tmp_path))
    seen = []

    def run(save):
        rows = [dict(x=1, check="ok O=1e-3")]
        save(rows)
        seen.append(len(results.read_csv(tmp_path / "study.csv")))
        return rows + [dict(x=2, check="FAIL O=1")]

    assert results.write_as_measured("study.csv", ["x", "check"], run) == 1
    assert seen == [1] and [r["x"] for r in results.read_csv(tmp_path / "study.csv")] == [1, 2]
    assert "wrote 2 rows" in capsys.readouterr().out
    assert results.write_as_measured("study.csv", ["x", "check"], lambda save: [dict(x=3, check="ok")]) == 0
    unchecked = [
        dict(x=4, check="not checked: computes something else on purpose"),
        dict(x=5, check="checked by the benchmark"),
    ]
    assert results.write_as_measured("study.csv", ["x", "check"], lambda save: unchecked) == 0
    for check in ("error: out of memory", ""):  # an error, or no check at all
        assert results.write_as_measured("study.csv", ["x", "check"], lambda save, c=check: [dict(x=6, check=c)]) == 1


def test_provenance_line_names_every_commit_and_day():
    from common import results

    rows = [
        dict(gpu="G", torch="2", triton="3", commit=c, date=d)
        for c, d in [("b", "2026-12-01T07:00:00Z"), ("a", "2026-11-30T20:00:00Z"), ("a", "2026-11-30T21:00:00Z")]
    ]
    line = results.provenance_line(rows, "make report")
    assert line == "_G; torch 2; Triton 3; commit a, b; 2026-11-30, 2026-12-01. Regenerate: `make report`._"


def test_a_full_hash_given_for_the_commit_is_shortened(monkeypatch):
    from common import results

    monkeypatch.setenv("GIT_COMMIT", "11eddd900b98851b55d8f2179e50fdb3811d5f78")
    assert results.commit() == "11eddd9"
    monkeypatch.setenv("GIT_COMMIT", "9344cce-dirty")  # anything else, as given
    assert results.commit() == "9344cce-dirty"


# ------------------------------------------------------------------------------------ code in the READMEs
SOURCE = '''"""A module."""

import functools


def helper():
    return 1


@functools.cache
@other
def kernel(a, b):
    """What kernel does.

    Two lines of it."""

    # the bounds
    lo = 0
    if a:
        hi = b
    else:
        hi = a
    total = combine(
        lo,
        hi,
    )
    return total


class Outer:
    def inner(self):
        """Doc."""
        if self:
            return 2
        return 3
'''


def _source(tmp_path, text=SOURCE):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "mod.py").write_text(text)


def test_code_excerpt_is_the_function_as_in_its_file_without_its_docstring(tmp_path):
    _source(tmp_path)
    assert report.code_excerpt("pkg/mod.py:kernel", tmp_path).splitlines() == [
        "@functools.cache",
        "@other",
        "def kernel(a, b):",
        "    # the bounds",
        "    lo = 0",
        "    if a:",
        "        hi = b",
        "    else:",
        "        hi = a",
        "    total = combine(",
        "        lo,",
        "        hi,",
        "    )",
        "    return total",
    ]
    # A method, dedented; a def whose body is its docstring alone keeps it.
    assert report.code_excerpt("pkg/mod.py:Outer.inner", tmp_path) == (
        "def inner(self):\n    if self:\n        return 2\n    return 3"
    )
    _source(tmp_path, 'def f():\n    """Only this."""\n')
    assert report.code_excerpt("pkg/mod.py:f", tmp_path) == 'def f():\n    """Only this."""'


def test_code_excerpt_finds_a_def_under_a_module_level_if(tmp_path):
    """A kernel defined inside `if HAVE_GLUON:` (or a try block) counts as top level; a name defined
    in both branches is two definitions, which is an error, not a guess."""
    _source(
        tmp_path, "try:\n    import x\nexcept ImportError:\n    x = None\nif x:\n\n    def k(a):\n        return a\n"
    )
    assert report.code_excerpt("pkg/mod.py:k", tmp_path) == "def k(a):\n    return a"
    _source(tmp_path, "if X:\n    def k():\n        return 1\nelse:\n    def k():\n        return 2\n")
    with pytest.raises(report.CodeError, match="k is defined 2 times"):
        report.code_excerpt("pkg/mod.py:k", tmp_path)


def test_code_excerpt_of_a_part_runs_from_anchor_to_anchor_and_takes_whole_statements(tmp_path):
    _source(tmp_path)
    # "if a:" opens an if: from there; "lo," is inside a call spread over four lines: to its end.
    assert report.code_excerpt("pkg/mod.py:kernel:from=if a:,to=lo,", tmp_path).splitlines() == [
        "if a:",
        "    hi = b",
        "else:",
        "    hi = a",
        "total = combine(",
        "    lo,",
        "    hi,",
        ")",
    ]
    # to=... opening an if takes its block, else included; the part is dedented.
    assert report.code_excerpt("pkg/mod.py:kernel:from=# the bounds,to=if a:", tmp_path) == (
        "# the bounds\nlo = 0\nif a:\n    hi = b\nelse:\n    hi = a"
    )
    # from= alone runs to the function's end; to= alone starts at its first decorator (docstring kept).
    assert report.code_excerpt("pkg/mod.py:kernel:from=return total", tmp_path) == "return total"
    assert report.code_excerpt("pkg/mod.py:Outer.inner:to=Doc", tmp_path) == 'def inner(self):\n    """Doc."""'
    # The to text is looked for from the from line on: "hi = " is twice in kernel, once from "else:".
    assert report.code_excerpt("pkg/mod.py:kernel:from=else:,to=hi = ", tmp_path) == "else:\n    hi = a"


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("pkg/mod.py:kernel_v2", "pkg/mod.py: no function or class kernel_v2 at its top level"),
        ("pkg/mod.py:Outer.outer", "pkg/mod.py: no function or class outer in Outer"),
        ("pkg/other.py:kernel", "there is no file pkg/other.py"),
        ("pkg/mod.py:kernel:from=hi = ", "the from text 'hi = ' is on 2 lines of kernel (lines 20, 22)"),
        ("pkg/mod.py:kernel:from=lo = 0,to=hi", "the to text 'hi' is on 3 lines of kernel from line 18 on"),
        ("pkg/mod.py:kernel:from=while", "the from text 'while' is on no line of kernel"),
        ("pkg/mod.py:kernel:start=lo", "expected from=TEXT,to=TEXT"),
    ],
)
def test_code_excerpt_says_what_it_could_not_find(tmp_path, spec, problem):
    _source(tmp_path)
    with pytest.raises(report.CodeError) as e:
        report.code_excerpt(spec, tmp_path)
    assert problem in str(e.value)


def test_fill_puts_the_code_between_the_markers_and_is_stable(tmp_path):
    _source(tmp_path)
    marker = "pkg/mod.py:kernel:from=return total"
    text = f"# Title\n\n<!-- code:{marker} -->\nold\n<!-- /code:{marker} -->\n\nMore prose.\n"
    new = report.fill(text, {}, tmp_path, root=tmp_path)
    assert (
        new
        == f"# Title\n\n<!-- code:{marker} -->\n```python\nreturn total\n```\n<!-- /code:{marker} -->\n\nMore prose.\n"
    )
    assert report.fill(new, {}, tmp_path, root=tmp_path) == new
    # A marker written inline in prose is not a block; an opening line without its closing one is an error.
    prose = "Blocks look like `<!-- code:PATH:NAME -->`.\n"
    assert report.fill(prose, {}, tmp_path, root=tmp_path) == prose
    with pytest.raises(report.CodeError, match="no closing <!-- /code:pkg/mod.py:helper -->"):
        report.fill_code("<!-- code:pkg/mod.py:helper -->\n", tmp_path)


def _readme_with_code(tmp_path, monkeypatch, marker):
    readme = _readme_with(tmp_path, monkeypatch, "part2")
    readme.write_text(readme.read_text() + f"\n<!-- code:{marker} -->\n<!-- /code:{marker} -->\n")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    _source(tmp_path)
    return readme


@pytest.mark.parametrize(
    "marker, missing",
    [
        ("pkg/mod.py:kernel_v2", "no function or class kernel_v2"),  # the function was renamed
        ("pkg/mod.py:kernel:from=hi = ", "the from text 'hi = ' is on 2 lines"),  # an anchor found twice
    ],
)
def test_missing_code_stops_the_report_before_it_changes_anything(tmp_path, monkeypatch, capsys, marker, missing):
    readme = _readme_with_code(tmp_path, monkeypatch, marker)
    before = readme.read_text()
    assert report.main(["--gpu", "fake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(readme) in err[0] and f"<!-- code:{marker} -->" in err[0] and missing in err[0]
    assert readme.read_text() == before
    assert not list((tmp_path / "results" / "fake").glob("*.png"))
    assert not list((tmp_path / "results" / "fake").glob("*_log.md"))


def test_report_fills_code_blocks(tmp_path, monkeypatch):
    readme = _readme_with_code(tmp_path, monkeypatch, "pkg/mod.py:helper")
    assert report.main(["--gpu", "fake"]) == 0
    assert "<!-- code:pkg/mod.py:helper -->\n```python\ndef helper():\n    return 1\n```\n" in readme.read_text()


# ------------------------------------------------------------------------------------ the progression
PROGRESSION_TF = {  # (impl, mode, N) -> TFLOP/s at D = 128, causal; part 3 is not in the CSV at all
    ("part0", "fwd", 1024): 0.05,
    ("part0", "fwd", 2048): 0.1,
    ("part0", "fwd+bwd", 2048): 0.08,
    ("part1", "fwd", 4096): 50,
    ("part1", "fwd+bwd", 4096): 0.4,
    ("part2", "fwd", 4096): 250,  # no forward + backward row
    ("part4", "fwd", 4096): 450,
    ("part4", "fwd+bwd", 4096): 360,
    ("part4", "fwd", 8192): 1,  # another N, and below another shape and mode: not the progression's
    ("part4", "bwd", 4096): 2,
    ("part5", "fwd", 4096): 525,
    ("part5", "fwd+bwd", 4096): 380,
    ("sdpa_cudnn", "fwd", 2048): 400,
    ("sdpa_cudnn", "fwd+bwd", 2048): 200,
    ("sdpa_cudnn", "fwd", 4096): 500,
    ("sdpa_cudnn", "fwd+bwd", 4096): 400,
    ("sdpa_flash", "fwd", 4096): 300,
}


def _progression_csv(folder):
    rows = []
    for (impl, mode, n), tf in PROGRESSION_TF.items():
        part = int(impl[4:]) if impl.startswith("part") else ""
        row = dict(impl=impl, part=part, B=4, H=8, N=n, D=128, dtype="bf16", causal=1, mode=mode, check="ok", **META)
        rows.append(dict(row, ms=_ms(n, 128, 1, tf, mode)))
    rows.append(dict(rows[-1], impl="part4", part=4, D=64, ms=_ms(4096, 64, 1, 3)))
    results.write_csv(folder / "bench.csv", rows, bench.FIELDS)
    return results.read_csv(folder / "bench.csv")


def test_progression_table_has_one_row_per_part_at_one_shape(tmp_path):
    _progression_csv(tmp_path)
    table = report.table_progression(tmp_path)
    assert table.startswith("_Test GPU; torch 2.x; Triton 3.x; commit abc1234;")
    loop, own = "the tiled PyTorch loop (`common/backward.py`)", "its own kernels"
    body = [line for line in table.splitlines() if line.startswith("|")][2:]  # below the header and its rule
    assert body == [
        # part 0 at its longest N, beside cuDNN's there; under 1%, one significant figure (0.1 / 400 = 0.025%).
        f"| [part 0](part0_pytorch_reference/README.md) (N = 2048) | 0.1 | 0.03% | 0.08 | 0.04% | {loop} |",
        f"| [part 1](part1_triton_baseline/README.md) | 50 | 10% | 0.4 | 0.1% | {loop} |",
        f"| [part 2](part2_tile_tuning/README.md) | 250 | 50% | — | — | {loop} |",
        f"| [part 3](part3_inner_loop/README.md) | — | — | — | — | {loop} |",
        f"| [part 4](part4_backward/README.md) | 450 | 90% | 360 | 90% | {own} |",
        f"| [part 5](part5_profiling/README.md) | 525 | 105% | 380 | 95% | {own} |",
        "| SDPA cuDNN | 500 | 100% | 400 | 100% | cuDNN's |",
    ]
    assert "Part 0 was timed only up to N = 2048: its row is at N = 2048" in table
    assert (
        "—: not in bench.csv at this shape (part 2 forward + backward, part 3 forward, part 3 forward + backward)"
        in table
    )


def test_summary_table_puts_a_part_beside_the_one_before_and_cudnn(tmp_path):
    _progression_csv(tmp_path)
    table = report.table_summary(tmp_path, part=5, n=4096, modes=("fwd", "fwd+bwd"))
    header, _, *body = [line for line in table.splitlines() if line.startswith("|")]
    assert header == (
        "| D | causal | forward: part 4 | **part 5** | cuDNN | part 5 / cuDNN "
        "| forward + backward: part 4 | **part 5** | cuDNN | part 5 / cuDNN |"
    )
    assert body[3] == "| 128 | yes | 450 | **525** | 500 | 105% | 360 | **380** | 400 | 95% |"
    assert body[2] == "| 128 | no | — | **—** | — | — | — | **—** | — | — |"  # not timed: said, not dropped
    assert body[1].startswith("| 64 | yes | 3.0 | **—** |")  # part 4's D = 64 row, part 5 not timed there


def test_summary_table_drops_the_part_before_where_it_was_never_timed_that_long(tmp_path):
    _progression_csv(tmp_path)
    table = report.table_summary(tmp_path, part=1, n=4096, modes=("fwd",))
    header, _, *body = [line for line in table.splitlines() if line.startswith("|")]
    assert header == "| D | causal | forward: **part 1** | cuDNN | part 1 / cuDNN |"  # part 0 stops at N = 2048
    assert body[3] == "| 128 | yes | **50** | 500 | 10% |"
    assert "backward counts" not in table  # the forward alone


def test_a_share_under_one_percent_keeps_one_significant_figure():
    assert [report.percent(a, 100) for a in (0.013, 0.5, 0.99, 1, 42.4)] == ["0.01%", "0.5%", "1%", "1%", "42%"]
    assert report.percent(None, 100) == report.percent(1, 0) == "—"


def test_progression_chart_draws_the_same_numbers(tmp_path):
    ax = report.progression_figure(_progression_csv(tmp_path)).axes[0]
    fwd, both = ax.containers
    assert [p.get_height() for p in fwd] == pytest.approx([0.1, 50, 250, 0, 450, 525, 500])
    assert [p.get_height() for p in both] == pytest.approx([0.08, 0.4, 0, 0, 360, 380, 400])
    assert [t.get_text() for t in ax.texts].count("—") == 3  # part 3 twice, part 2's forward + backward
    assert any(t.get_text().startswith("0.1\n(N=2048)") for t in ax.texts)
    assert [p.get_hatch() for p in both] == ["//"] * 4 + [None] * 3  # the PyTorch backward of parts 0-3
    assert fwd[0].get_facecolor() != fwd[-1].get_facecolor()  # SDPA cuDNN in a colour of its own
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "SDPA cuDNN"


def test_progression_from_an_empty_csv_is_dashes(tmp_path):
    results.write_csv(tmp_path / "bench.csv", [], bench.FIELDS)
    assert "| [part 1](part1_triton_baseline/README.md) | — | — | — | — |" in report.table_progression(tmp_path)


# ------------------------------------------------------------------------------------ cross-part plots
def test_each_implementation_has_its_own_colour_and_style(tmp_path):
    fig = report.tflops_figure(_bench_csv(tmp_path))
    lines = [line for line in fig.axes[0].lines]
    styles = [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines]
    assert len({s[0] for s in styles}) == len(lines)  # four implementations, four colours
    impls = ["part1", "part2", "sdpa_flash", "sdpa_cudnn", *report.OTHER_STYLES, *(f"part{n}" for n in range(6))]
    assert len({(s["color"], str(s["linestyle"])) for s in map(report.impl_style, set(impls))}) == len(set(impls))
    # On the vs-SDPA plot one part's two lines share its colour.
    vs = {line.get_label(): line.get_color() for line in report.vs_sdpa_figure(_bench_csv(tmp_path)).axes[0].lines}
    assert vs["part 2 / SDPA flash (FA2)"] == vs["part 2 / SDPA cuDNN"] != vs["part 1 / SDPA cuDNN"]


def test_forward_and_backward_plot_draws_the_fwd_bwd_rows(tmp_path):
    rows = _progression_csv(tmp_path)
    fig = report.tflops_figure(rows, mode="fwd+bwd")
    lines = {line.get_label(): line for line in _panel(fig, 128, 1).lines}
    assert set(lines) == {"part 0 (PyTorch backward)", "part 1 (PyTorch backward)", "part 4", "part 5", "SDPA cuDNN"}
    x, y = lines["SDPA cuDNN"].get_data()
    assert list(x) == [2048, 4096] and list(y) == pytest.approx([200, 400])
    assert not _panel(fig, 64, 0).lines


def test_report_draws_the_progression_and_both_modes_and_is_idempotent(tmp_path, monkeypatch, capsys):
    readme = _readme_with(tmp_path, monkeypatch, "progression")
    folder = tmp_path / "results" / "fake"
    _progression_csv(folder)
    assert report.main(["--gpu", "fake"]) == 0
    assert "| [part 4](part4_backward/README.md) | 450 | 90% | 360 | 90% | its own kernels |" in readme.read_text()
    for name in ("bench_tflops.png", "bench_fwd_bwd.png", "bench_vs_sdpa.png", "progression.png"):
        assert (folder / name).exists()
    first = {p.name: p.read_bytes() for p in folder.iterdir()}
    capsys.readouterr()
    assert report.main(["--gpu", "fake"]) == 0
    assert "updated" not in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == first


# ------------------------------------------------------------------------------------ the results logs
def test_a_results_log_has_each_tables_heading_sentence_and_table(tmp_path):
    from common import parts

    _bench_csv(tmp_path)
    own = types.SimpleNamespace(
        __name__="part2_tile_tuning.report",
        TABLES={"part2-demo": lambda g: "| demo |\n| --- |\n| 7 |", "part2-extra": lambda g: "extra table"},
        LOG=[("The demo", "What the demo measured.", "part2-demo")],
    )
    tables = report.all_tables([own])
    log = report.part_log(2, parts.folder(2), report.log_entries(2, own), tables, tmp_path)
    assert [line for line in log.splitlines() if line.startswith("#")] == [
        "# Part 2 (tile tuning): results log",
        "## The forward against the part before and SDPA",
        "## do_bench against CUDA-graph replay",
        "## What the causal mask costs",
        "## The demo",
        "## part2-extra",  # in TABLES, not in LOG: last, under its marker name
    ]
    assert "[part2_tile_tuning/README.md](" in log
    demo = log.split("## The demo\n\n")[1]
    assert demo.startswith("What the demo measured.\n\n| demo |\n| --- |\n| 7 |")
    forward = log.split("## The forward against the part before and SDPA\n\n")[1].split("\n## ")[0]
    assert "_Test GPU; torch 2.x; Triton 3.x; commit abc1234;" in forward  # the table's provenance line
    assert "| 64 | no | 4096 | 108 | **368** | 348 | 518 | 106% | 71% | 64x64 w4 s2 |" in forward
    # A LOG entry naming a common table places it; a part without a report module gets the common ones.
    placed = types.SimpleNamespace(__name__="x", TABLES={}, LOG=[("Mine", "Mine.", "part2-graph")])
    assert [e[2] for e in report.log_entries(2, placed)] == ["part2", "part2-causal", "part2-graph"]
    assert [e[2] for e in report.log_entries(1)] == ["part1", "part1-graph", "part1-causal"]


def test_report_writes_a_log_for_every_part(tmp_path, monkeypatch):
    from common import parts

    _readme_with(tmp_path, monkeypatch, "part2")
    assert report.main(["--gpu", "fake"]) == 0
    for n in parts.folders():
        log = (tmp_path / "results" / "fake" / f"part{n}_log.md").read_text()
        # Every part's log holds its forward against the part before (part 4 places it after its own tables).
        assert log.startswith(f"# Part {n} (") and f"| **part {n}** | SDPA flash |" in log
    part1 = (tmp_path / "results" / "fake" / "part1_log.md").read_text()
    assert "| 64 | no | 4096 | — | **108** | 348 | 518 | 31% | 21% |" in part1


def test_a_log_entry_without_a_table_stops_the_report(tmp_path, monkeypatch, capsys):
    readme = _readme_with(tmp_path, monkeypatch, "part2")
    bad = types.SimpleNamespace(__name__="part2_tile_tuning.report", TABLES={}, LOG=[("H", "S.", "part2-nothing")])
    monkeypatch.setattr(report, "part_reports", lambda: [bad])
    assert report.main(["--gpu", "fake"]) == 2
    assert "part2-nothing" in capsys.readouterr().err
    assert "old" in readme.read_text() and not list((tmp_path / "results" / "fake").glob("*_log.md"))


def test_committed_logs_are_reproduced_from_the_committed_results():
    from common import parts

    gpu_dir = ROOT / "results" / "h200"
    reports = report.part_reports()
    tables, by_part = report.all_tables(reports), {report.part_of(m): m for m in reports}
    for n, folder in parts.folders().items():
        made = report.part_log(n, folder, report.log_entries(n, by_part.get(n)), tables, gpu_dir)
        assert report.log_path(gpu_dir, n).read_text() == made, n


def test_interleaved_runs_table_takes_medians_per_label_and_the_graph_ratio_apart():
    """Part 2's before/after tables (the autotuner's timer, the first-call check): each run's
    TFLOP/s in run order under each label, the ratio of the medians (last label over first) by
    do_bench and by graph replay, '—' where a label has no graph time, every configuration chosen."""
    from part2_tile_tuning.report import _interleaved_runs

    def row(label, run, tflops, graph, backend="128x64 w4 s3"):
        return study_row(
            part=4,
            mode="fwd+bwd",
            D=64,
            causal=1,
            commit=label,
            run=run,
            tflops=tflops,
            graph_tflops=graph,
            backend=backend,
        )

    rows = [
        row("old", 2, 300.0, 320.0),
        row("old", 1, 240.0, 318.0),
        row("old", 3, 310.0, 322.0, backend="128x128 w4 s3"),
        row("new", 1, 330.0, 330.0),
        row("new", 2, 320.0, 330.0),
        row("new", 3, 150.0, 330.0),
    ]
    [[part, mode, d, causal, old, new, ratio, graph_ratio, chose]] = _interleaved_runs(rows, "commit", ["old", "new"])
    assert (part, mode, d, causal) == (4, "fwd+bwd", 64, "yes")
    assert (old, new) == ("240, 300, 310", "330, 320, 150")  # by run, not by the file's order
    assert ratio == f"{320 / 300:.2f}" and graph_ratio == f"{330 / 320:.2f}"
    assert chose == "128x128 w4 s3 / 128x64 w4 s3"
    no_graph = [dict(r, graph_tflops=None) for r in rows]
    assert _interleaved_runs(no_graph, "commit", ["old", "new"])[0][7] == "—"
