"""Exercises: one idea of a part taken out of its kernel, for you to put back, graded by the tests.

    make exercise PART=0                     # the part's exercises: name, idea, how long grading takes
    make exercise PART=0 NAME=rescale        # hand it out: workspace/part0/rescale/flash_attention.py
    make check PART=0 NAME=rescale           # grade your file: pass, or which case fails and by how much

(The same without make: python -m common.exercises --part 0 [--name rescale] [--check].)

A part's exercises are the patches in its exercises/ folder, <name>.diff: a unified diff on one of
the part's files (its headers name the file) that takes the idea out and leaves a hole marked
`# TODO(exercise): ...`. Lines of `# key: value` before the diff say what it is:

    # idea: the online softmax rescales the running sum and output when the maximum moves
    # hint: when m grows to m_new, what happens to l and O, which were summed against the old m?
    # grade: tests/test_exercises_part0.py -k rescale
    # time: 15 s

The handout is written under workspace/ (git ignores it), never over the part: the shipped file is
the solution, and the README checks and the suite go on testing it. Grading runs the tests named on
`grade:` (pytest arguments) with FLASH_ATTENTION_EXERCISE set to "<part>=<your file>": parts.load()
then returns your flash_attention.py in the part's place, and a grader of another file reads yours
through learner_source(). tests/test_exercises.py proves that every exercise fails as handed out
and passes with the solution put back. After editing a part's file, `python -m common.exercises
--part N --rebase HEAD` makes its exercises' patches again on the edited file.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, parts, steps

ENV = parts.EXERCISE  # "<part>=<path>": a learner's file graded in the part's place
WORKSPACE = ROOT / "workspace"
GRADE_TIMEOUT = 300  # seconds: the graders take 5-25 s on a laptop's CPU; a loop that never ends is stopped
FIELD = re.compile(r"# (\w+): (.*)")


@dataclass(frozen=True)
class Exercise:
    part: int
    name: str
    path: Path  # the patch
    idea: str
    hint: str
    grade: tuple  # pytest arguments
    time: str  # how long grading takes on a 2-core CPU, as the README says it

    @property
    def patch(self):
        """The diff without its `# key: value` lines."""
        return "".join(line for line in self.path.read_text().splitlines(keepends=True) if not FIELD.match(line))

    @property
    def target(self):
        """The part's file the exercise changes, relative to the part's folder ("flash_attention.py")."""
        (name,) = steps.split_patch(self.patch)  # one file per exercise
        head = re.search(r"^--- (\S+)", self.patch, re.M)[1]
        return Path(head).relative_to(parts.folder(self.part).name) if "/" in head else Path(name)

    def solution(self):
        """The shipped file: what the handout becomes with the idea put back."""
        return (parts.folder(self.part) / self.target).read_text()

    def handout(self):
        """The shipped file with the idea taken out."""
        return steps.apply_patch(self.solution(), self.patch)

    def workfile(self):
        """Where the handout is written for you: workspace/part<N>/<name>/<file>."""
        return WORKSPACE / f"part{self.part}" / self.name / self.target.name


def read(path, part):
    fields = dict(FIELD.match(line).groups() for line in path.read_text().splitlines() if FIELD.match(line))
    missing = {"idea", "hint", "grade", "time"} - set(fields)
    if missing:
        raise ValueError(f"{path}: no '# {sorted(missing)[0]}: ...' line")
    grade = tuple(re.findall(r'"[^"]*"|\S+', fields["grade"]))
    grade = tuple(a.strip('"') for a in grade)
    return Exercise(part, path.stem, path, fields["idea"], fields["hint"], grade, fields["time"])


def of(n):
    """Part n's exercises, in name order (none: an empty list)."""
    folder = parts.folder(n) / "exercises"
    return [read(p, n) for p in sorted(folder.glob("*.diff"))] if folder.is_dir() else []


def find(n, name):
    """Part n's exercise `name`; ValueError naming the ones there are otherwise."""
    for exercise in of(n):
        if exercise.name == name:
            return exercise
    names = ", ".join(e.name for e in of(n)) or "none"
    raise ValueError(f"part {n} has no exercise {name!r}; its exercises: {names}")


def every():
    """Every part's exercises, part by part."""
    return [e for n in parts.available() for e in of(n)]


# ------------------------------------------------------------------------------ what graders read
active = parts.exercise_file  # the learner's file being graded in part n's place, or None


def learner_source(n, name):
    """The text of part n's file `name` ("gluon_attention.py") as graded: the learner's where an
    exercise on that file is being graded, else the shipped one."""
    mine = active(n)
    if mine is not None and mine.name == Path(name).name:
        return mine.read_text()
    return (parts.folder(n) / name).read_text()


def learner_module(n, name):
    """Part n's module `name` ("gluon_attention.py") as graded: the learner's file imported under a
    name of its own where its exercise is being graded, else the part's own module."""
    import importlib

    mine = active(n)
    if mine is not None and mine.name == Path(name).name:
        return parts.load_source(f"part{n}_exercise_{Path(name).stem}", mine.read_text())
    return importlib.import_module(f"{parts.folder(n).name}.{Path(name).with_suffix('').as_posix().replace('/', '.')}")


def write(part, target, handout, name, idea, hint, grade, time):
    """For an exercise's author: part `part`'s file `target` ("flash_attention.py") as `handout`
    (the idea taken out) saved as the patch exercises/<name>.diff with its `# key: value` lines."""
    folder = parts.folder(part)
    solution = (folder / target).read_text()
    if handout == solution or "TODO(exercise)" not in handout:
        raise ValueError(f"{name}: a handout changes the file and marks its hole with TODO(exercise)")
    head = f"{folder.name}/{target}"
    patch = steps.patch_text(solution, handout, f"{head} (solution)", f"{head} (exercise: {name})")
    fields = "".join(f"# {k}: {v}\n" for k, v in dict(idea=idea, hint=hint, grade=grade, time=time).items())
    path = folder / "exercises" / f"{name}.diff"
    path.parent.mkdir(exist_ok=True)
    path.write_text(fields + patch)
    return read(path, part)


def rebase(n, rev):
    """After editing a part's files: each exercise's patch made again on today's file, the edit merged
    into its handout (git merge-file: the file at commit `rev` the base, today's file and the old
    handout the two sides). Returns the exercises rewritten; ValueError where the edit touches a hole."""
    rewritten = []
    for exercise in of(n):
        head = f"{parts.folder(n).name}/{exercise.target.as_posix()}"
        old = subprocess.run(["git", "show", f"{rev}:{head}"], cwd=ROOT, capture_output=True, text=True, check=True)
        if old.stdout == exercise.solution():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mine, base, theirs = (Path(tmp) / name for name in ("new", "base", "handout"))
            mine.write_text(exercise.solution())
            base.write_text(old.stdout)
            theirs.write_text(steps.apply_patch(old.stdout, exercise.patch))
            if subprocess.run(["git", "merge-file", "-q", str(mine), str(base), str(theirs)]).returncode:
                raise ValueError(f"{exercise.name}: the edit meets the exercise's hole; make its handout again")
            handout = mine.read_text()
        fields = dict(
            idea=exercise.idea,
            hint=exercise.hint,
            grade=" ".join(f'"{a}"' if " " in a else a for a in exercise.grade),
            time=exercise.time,
        )
        before = exercise.path.read_text()
        if write(n, exercise.target.as_posix(), handout, exercise.name, **fields).path.read_text() != before:
            rewritten.append(exercise)
    return rewritten


# ------------------------------------------------------------------------------ hand out and grade
def hand_out(exercise, force=False):
    """Write the handout to its workfile (not over work already there unless force). Returns the path."""
    path = exercise.workfile()
    if path.exists() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(exercise.handout())
    return path


def grade(exercise, file=None, first_failure=False, quiet=False):
    """Run the exercise's graders on `file` (default its workfile). Returns (passed, seconds, output)."""
    file = Path(file or exercise.workfile()).resolve()
    if not file.exists():
        raise FileNotFoundError(f"{file} does not exist: hand the exercise out first (make exercise PART=... NAME=...)")
    # Graded as on a CPU, a GPU or not: the graders of ideas that only cost time count operations
    # under Triton's interpreter (common/counting.py), which a compiled GPU run never goes through.
    env = dict(os.environ, **{ENV: f"{exercise.part}={file}", "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", "-rf", "-W", "ignore"]
    cmd += ["--part", str(exercise.part), *(["-x"] if first_failure else []), *exercise.grade]
    start = time.perf_counter()
    # the graders' temporary files go in a folder of their own, removed here: a run stopped for its
    # time cannot remove its own
    with tempfile.TemporaryDirectory(prefix="flash-attention-grade-") as scratch:
        try:
            out = subprocess.run(
                cmd, cwd=ROOT, env=dict(env, TMPDIR=scratch), capture_output=True, text=True, timeout=GRADE_TIMEOUT
            )
            code, text = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as e:  # what it printed so far (bytes, whatever text= said)
            code = None
            text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
            text += f"\n(the graders did not finish in {GRADE_TIMEOUT} s and were stopped: a loop that never ends?)"
    seconds = time.perf_counter() - start
    if code not in (0, 1, None):  # 2-5: pytest could not run the tests (an import error in the file, ...)
        text += f"\n(pytest exited with {code}: the tests did not run to the end)"
    if not quiet:
        print(summary(exercise, code == 0, seconds, text))
    return code == 0, seconds, text


def summary(exercise, passed, seconds, text):
    """What `make check` prints: pass, or the failing cases with their messages."""
    if passed:
        counted = re.search(r"(\d+) passed", text)
        return f"PASS  part {exercise.part}, {exercise.name}: {counted[1] if counted else 'all'} checks passed in {seconds:.0f} s."
    lines = [f"NOT YET  part {exercise.part}, {exercise.name} ({seconds:.0f} s). Failing:"]
    failed = [
        line.split(" ", 1)[1].split(" - ")[0] for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))
    ]
    said = [line[4:] for line in text.splitlines() if line.startswith("E   ")]  # --tb=line: one per failure
    for i, case in enumerate(failed[:10]):
        lines.append(f"  {case.split('::', 1)[-1]}")
        lines += [f"      {said[i]}"] if len(said) == len(failed) else []
    if len(failed) > 10:
        lines.append(f"  ... and {len(failed) - 10} more")
    if not failed:
        lines += ["  " + line for line in text.strip().splitlines()[-15:]]
    lines.append(f"Hint: {exercise.hint}")
    return "\n".join(lines)


def listing(n):
    lines = [f"Part {n}'s exercises (make exercise PART={n} NAME=<name> hands one out; make check grades it):"]
    for e in of(n):
        lines.append(f"  {e.name:<18} {e.idea} (graded in about {e.time})")
    return "\n".join(lines if of(n) else [f"part {n} has no exercises"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, required=True)
    ap.add_argument("--name", help="the exercise; without it, the part's exercises are listed")
    ap.add_argument("--check", action="store_true", help="grade the handout in workspace/")
    ap.add_argument("--force", action="store_true", help="hand out again over work already there")
    ap.add_argument("--rebase", metavar="REV", help="after editing the part's files: remake every patch from REV's")
    args = ap.parse_args(argv)
    try:
        parts.require([args.part])
        if args.rebase:
            print(f"rewrote {', '.join(e.name for e in rebase(args.part, args.rebase)) or 'nothing'}")
            return 0
        if not args.name:
            print(listing(args.part))
            return 0
        exercise = find(args.part, args.name)
        if args.check:
            return 0 if grade(exercise)[0] else 1
        existed = exercise.workfile().exists()
        path = hand_out(exercise, args.force)
        shown = path.relative_to(ROOT)
        if existed and not args.force:
            print(
                f"{shown} is already there (your work): kept. --force (make exercise ... FORCE=1) hands it out again."
            )
        else:
            print(f"Wrote {shown}: part {args.part}'s {exercise.target} with this idea taken out:")
        print(f"  {exercise.idea}")
        print(f"Fill in the lines marked TODO(exercise) there, then: make check PART={args.part} NAME={args.name}")
        print(
            f"(grading takes about {exercise.time}; the diff from the solution: diff -u {parts.folder(args.part).name}/{exercise.target} {shown})"
        )
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
