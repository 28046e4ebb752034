"""Results: where they live, who wrote them, and how they are written, read and shown.

Every measurement (the benchmark, a part's sweep, the autotune cost) writes rows to a CSV in
results/<gpu>/, and every row carries its provenance: the GPU, torch and Triton versions, the
commit, the date and the command. The report reads those files back here, typed, and renders
them as markdown tables whose provenance line names all of that.
"""

import csv
import datetime
import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from common import PROVENANCE, ROOT, runtime

RESULTS = ROOT / "results"
NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")

# The columns that say which attention shape a timing row is, in the order the timing CSVs use.
SHAPE_FIELDS = ["B", "H", "N", "D", "dtype", "causal"]
PANELS = [(64, 0), (64, 1), (128, 0), (128, 1)]  # (D, causal): the benchmark's four groups, in the tables' order


def results_dir(gpu=None):
    """results/<gpu>/ for the GPU named (e.g. "h200"); by default this machine's GPU, or
    $RESULTS_DIR when it is set (to write somewhere else without touching the committed files)."""
    if gpu is None and (chosen := os.environ.get("RESULTS_DIR")):
        return Path(chosen)
    return RESULTS / (gpu or runtime.gpu_slug())


def shown(path):
    """A path for a message: relative to the repository root when it is inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def commit():
    """The short commit of the checkout ($GIT_COMMIT wins: a copy without .git can still say; a full
    hash there is shortened as git's --short would, so every row names its commit the same way)."""
    if given := os.environ.get("GIT_COMMIT"):
        return given[:7] if re.fullmatch(r"[0-9a-f]{40}", given) else given
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return git.stdout.strip() or "unknown"


def provenance():
    """What every written row carries: this machine's GPU and versions, the commit, the date (UTC)
    and the command line that is running, as typed (`python -m lab.bench --part 1`)."""
    return dict(
        gpu=runtime.gpu_name(),
        torch=torch.__version__,
        triton=runtime.TRITON_VERSION,
        commit=commit(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=shlex.join(["python", *sys.orig_argv[1:]]),
    )


def _read_text(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, rows, fields, key=None, sort=None, drop=None, replaces=None):
    """Write rows (dicts) to path with the columns `fields` (a column a row lacks left empty); returns path.
    With `key` (column names) the file is merged: an old row stays, as the text it was, unless a new row has its
    key or drop(old row) is true. A new row that replaces(row) is false of (no measurement on this machine) takes
    nothing out: it is written only where no row of its key is left. `sort` orders all rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if key is not None and path.exists():
        of = lambda r: tuple(str(r.get(c, "")) for c in key)  # noqa: E731
        new = {of(r) for r in rows if replaces is None or replaces(r)}
        old = [r for r in _read_text(path) if of(r) not in new and not (drop and drop(r))]
        left = {of(r) for r in old}  # a row that replaces has its key in `new`: never in `left`
        rows = old + [r for r in rows if of(r) not in left]
    if sort is not None:
        rows.sort(key=sort)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def why(e):
    """An exception in one line for a CSV cell: its type and the first line of its message (which may be empty)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:120]}" if lines else type(e).__name__


def failed_check(row):
    """A row whose check did not pass (FAIL, or an error that stopped the measurement). Rows that
    say why they are not checked (an ablation that computes something else on purpose, a baseline
    that the benchmark checks) are not failures."""
    return not str(row.get("check", "")).startswith(("ok", "not checked", "checked by"))


def write_as_measured(filename, fields, run, failed=failed_check, key=None, replaces=None):
    """The end of every GPU study: run(save) measures, calling save(rows) after each shape (so a run
    cut short keeps what it measured); the rows are written once more at the end to
    results/<gpu>/filename (merged by `key` if given, `replaces` as write_csv takes it). Returns the
    exit status: 1 if any row failed."""
    path = results_dir() / filename
    save = functools.partial(write_csv, path, fields=fields, key=key, replaces=replaces)
    rows = run(save)
    save(rows)
    print(f"wrote {len(rows)} rows to {shown(path)}")
    return 1 if any(failed(r) for r in rows) else 0


def _typed(column, cell):
    if not cell:  # empty, or missing from a short row
        return None
    if column in PROVENANCE or not NUMBER.fullmatch(cell):  # a commit like 1234567 or Triton 3.10 stays text
        return cell
    return float(cell) if any(c in cell for c in ".eE") else int(cell)


def read_csv(path):
    """The rows of a results CSV, typed: numbers become int or float, empty cells None, the rest
    (and the provenance columns, always) stays text. FileNotFoundError if it was never written."""
    return [{column: _typed(column, cell) for column, cell in row.items()} for row in _read_text(path)]


def yes_no(causal):
    return "yes" if causal else "no"


def markdown_table(header, rows, align=None):
    """A markdown table; `align` has a letter per column, "l" or "r" (right, for numbers); default all left."""
    rule = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    return "\n".join("| " + " | ".join(map(str, line)) + " |" for line in [header, rule, *rows])


def provenance_line(rows, command):
    """The line above a table naming the GPU, versions, commits and dates (the day) of its rows, and the
    command that regenerates it."""
    each = {
        c: ", ".join(sorted({str(r[c])[: 10 if c == "date" else None] for r in rows if r.get(c)})) for c in PROVENANCE
    }
    return (
        f"_{each['gpu']}; torch {each['torch']}; Triton {each['triton']}; commit {each['commit']}; {each['date']}. "
        f"Regenerate: `{command}`._"
    )


def study_line(path, command):
    """A study no README shows, as one line of its log: the provenance of the CSV's rows (GPU, versions,
    commits, dates; `command` writes them) and how many there are, without a table."""
    rows = read_csv(path)
    return (
        f"{provenance_line(rows, command)} `{path.name}` holds its {len(rows)} rows (not tabled: no README shows them)."
    )


def table_block(rows, command, caption, header, body, align=None):
    """A table as the READMEs show it: the rows' provenance line (`command` regenerates them), a caption, the table."""
    caption = [caption, ""] if caption else []
    return "\n".join([provenance_line(rows, command), "", *caption, markdown_table(header, body, align)])
