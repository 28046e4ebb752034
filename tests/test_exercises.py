"""The exercises (common/exercises.py, make exercise / make check): each fails as handed out and
passes with the solution put back, is named in its part's README, and has a hole to fill."""

import re
import tempfile

import pytest

from common import exercises, parts


def pytest_generate_tests(metafunc):
    if "exercise" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--part") or parts.available()
        found = [e for n in chosen for e in exercises.of(n)]
        metafunc.parametrize("exercise", found, ids=[f"part{e.part}-{e.name}" for e in found])


def test_every_part_has_its_exercises(request):
    """At least two exercises for each of parts 0-4 and three for part 5."""
    counts = {n: len(exercises.of(n)) for n in request.config.getoption("--part") or parts.available()}
    assert all(counts[n] >= (3 if n == 5 else 2) for n in counts), counts


def test_an_exercise_is_a_hole_with_its_idea(exercise):
    handout = exercise.handout()
    assert "TODO(exercise)" in handout and handout != exercise.solution()
    assert exercise.grade and exercise.idea and exercise.hint
    assert re.fullmatch(r"\d+ s", exercise.time), f"{exercise.name}: time is '{exercise.time}', say it as '20 s'"


def test_the_readme_names_the_exercise(exercise):
    readme = (parts.folder(exercise.part) / "README.md").read_text()
    command = f"make exercise PART={exercise.part} NAME={exercise.name}"
    assert command in readme, f"part {exercise.part}'s README does not show `{command}`"


def test_it_fails_as_handed_out_and_passes_with_the_solution(exercise, tmp_path):
    handout = tmp_path / "handout" / exercise.target.name
    solution = tmp_path / "solution" / exercise.target.name
    for path, text in ((handout, exercise.handout()), (solution, exercise.solution())):
        path.parent.mkdir()
        path.write_text(text)
    passed, _, out = exercises.grade(exercise, handout, first_failure=True, quiet=True)
    assert not passed, f"the handout of {exercise.name} passes its graders:\n{out[-2000:]}"
    assert re.search(r"\b1 failed\b", out), f"the handout should fail a grader, not break pytest:\n{out[-2000:]}"
    passed, _, out = exercises.grade(exercise, solution, quiet=True)
    assert passed, f"the solution of {exercise.name} fails its graders:\n{out[-3000:]}"


def test_handing_out_keeps_work_and_grading_names_the_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(exercises, "WORKSPACE", tmp_path)
    exercise = exercises.find(0, "rescale")
    path = exercises.hand_out(exercise)
    assert path == tmp_path / "part0" / "rescale" / "flash_attention.py" and "TODO(exercise)" in path.read_text()
    path.write_text("# my work\n")
    assert exercises.hand_out(exercise).read_text() == "# my work\n"  # kept
    assert "TODO(exercise)" in exercises.hand_out(exercise, force=True).read_text()
    passed, _, _ = exercises.grade(exercise)
    shown = capsys.readouterr().out
    assert not passed and "NOT YET" in shown and "test_rescale" in shown and "FAIL" in shown and "Hint:" in shown


def test_a_handout_that_never_ends_is_stopped(tmp_path, monkeypatch, capsys):
    """A learner's loop that never ends: the graders are stopped after GRADE_TIMEOUT and `make check` says so."""
    monkeypatch.setattr(exercises, "GRADE_TIMEOUT", 20)
    (tmp_path / "tmp").mkdir()  # this process's and its children's temporary folder
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    exercise = exercises.find(0, "rescale")
    path = tmp_path / exercise.target.name
    path.write_text(exercise.solution() + "\nwhile True:\n    pass\n")  # hangs at import
    passed, seconds, _ = exercises.grade(exercise, path)
    shown = capsys.readouterr().out
    assert not passed and seconds < 60 and "did not finish in 20 s" in shown and "NOT YET" in shown
    assert not list((tmp_path / "tmp").iterdir()), "the stopped graders left temporary files behind"


def test_unknown_names_are_refused(capsys):
    assert exercises.main(["--part", "0", "--name", "nope"]) == 2
    assert "rescale" in capsys.readouterr().err


def test_rebase_on_the_files_of_this_commit_changes_nothing():
    """A patch is rewritten only where its file changed since the commit named: against HEAD, with
    part 0's kernel as committed, nothing is."""
    import subprocess

    from common import ROOT

    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(parts.path(0))], cwd=ROOT).returncode
    if changed:
        pytest.skip("part 0's kernel differs from HEAD's here")
    assert exercises.rebase(0, "HEAD") == []
