"""The ladders of steps (common/steps.py): patches that apply or say where they do not, names that
sort as numbers, two ladders in one folder, the last patch rewritten after an edit. The parts'
own ladders (part 3's, part 5's) are checked where their kernels are tested."""

import difflib

import pytest

from common import parts, steps


def test_patch_that_does_not_apply_is_an_error():
    patch = "--- a\n+++ b\n@@ -2,1 +2,1 @@\n-not this line\n+new\n"
    with pytest.raises(ValueError, match="does not apply at line 2"):
        steps.apply_patch("one\ntwo\nthree\n", patch)
    assert steps.apply_patch("one\ntwo\nthree\n", patch.replace("not this line", "two")) == "one\nnew\nthree\n"


def test_patches_with_lines_that_look_like_headers_apply():
    """Hunks end where their header's counts say, not at the first line that looks like a header:
    removed '-- x' lines (which print as '--- x'), added '++ y' ones, '@@' inside the text."""
    before = "keep\n-- x\nold\n@@ not a hunk\nkeep\n" * 3
    after = before.replace("old\n", "++ y\nnew\n").replace("-- x\n", "", 2)
    patch = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), "a", "b", n=1))
    assert steps.apply_patch(before, patch) == after


def _kernel(*extra):
    """A stand-in kernel file: twelve numbered lines, with extra lines inserted after line 6."""
    lines = [f"line {i}\n" for i in range(12)]
    return "".join(lines[:6] + list(extra) + lines[6:])


@pytest.fixture
def fake_part(tmp_path, monkeypatch):
    """A part 7 with two ladders in its steps/ folder: fwd (a first step that is a whole file, then
    ten patches, so fwd10 must sort after fwd9) ending at gluon_attention.py, and bwd (one file)."""
    folder = tmp_path / "part7_fake"
    (folder / "steps").mkdir(parents=True)
    monkeypatch.setattr(parts, "folders", lambda: {7: folder})
    texts = [_kernel()] + [_kernel(*(f"idea {k}\n" for k in range(1, i + 1))) for i in range(1, 11)]
    (folder / "steps" / "fwd1_first.py").write_text(texts[0])
    for i in range(1, 11):
        (folder / "steps" / f"fwd{i + 1}_idea_{i}.diff").write_text("")
    (folder / "gluon_attention.py").write_text(texts[-1])
    assert len(steps.write(7, "fwd", [""] + texts)) == 10  # the ten patches, from the sources
    (folder / "steps" / "bwd1_one_pass.py").write_text("backward\n")
    (folder / "gluon_backward.py").write_text("backward\n")
    return folder, texts


def test_ladders_sort_by_number_and_rebuild_their_file(fake_part):
    folder, texts = fake_part
    found = steps.ladders(folder)
    assert list(found) == ["fwd", "bwd"]  # in the order of TARGETS: the forward first
    assert [s.name for s in found["fwd"]] == [f"fwd{i}" for i in range(1, 12)]  # fwd10 after fwd9
    assert found["fwd"][4].label == "idea 4"
    assert steps.sources(7, "fwd") == [""] + texts  # a whole first file starts from nothing
    assert steps.sources(7, "bwd") == ["", "backward\n"]
    ladder, i = steps.find(7, "fwd10")
    assert ladder[i].idea == "idea_9"
    with pytest.raises(ValueError, match="no step 'fwd12'; its steps: fwd1, fwd2, .*, fwd11, bwd1"):
        steps.find(7, "fwd12")
    with pytest.raises(ValueError, match="no ladder 'x'"):
        steps.sources(7, "x")


def test_a_gap_in_the_numbers_is_an_error(fake_part):
    folder, _ = fake_part
    (folder / "steps" / "fwd5_idea_4.diff").rename(folder / "steps" / "fwd13_idea_4.diff")
    with pytest.raises(ValueError, match="not 1..11"):
        steps.ladders(folder)


def test_refresh_after_editing_the_target(fake_part):
    folder, texts = fake_part
    (folder / "gluon_attention.py").write_text(texts[-1] + "an edit\n")
    assert [s.name for s in steps.refresh(7, "fwd")] == ["fwd11"]
    assert steps.sources(7, "fwd")[-1] == texts[-1] + "an edit\n"
    assert steps.refresh(7, "fwd") == []  # nothing left to rewrite


def test_a_model_ladder_takes_the_lessons_files_to_the_shipped_ones(fake_part, monkeypatch):
    """After the lesson's ladders, a model ladder's steps patch several files (headers naming each):
    it starts from the lessons' last texts and the part before's flash_attention.py, and ends at the
    shipped files; refresh rewrites its last step after an edit, and the lesson's ladders, which no
    longer end at a shipped file, point there."""
    folder, texts = fake_part
    before = folder.parent / "part6_before"
    before.mkdir()
    (before / "flash_attention.py").write_text("routing\n" * 3)
    monkeypatch.setattr(parts, "folders", lambda: {6: before, 7: folder})
    lesson = steps.lesson(7)
    assert lesson == {
        "flash_attention.py": "routing\n" * 3,
        "gluon_attention.py": texts[-1],
        "gluon_backward.py": "backward\n",
    }
    (folder / "steps" / "model1_route.diff").write_text("")
    (folder / "steps" / "model2_both.diff").write_text("")
    one = dict(lesson, **{"flash_attention.py": "routing\nto gluon\n" * 3})
    two = dict(
        one,
        **{"gluon_attention.py": texts[-1] + "-- a line like a header\n", "gluon_backward.py": "backward, grouped\n"},
    )
    assert [s.name for s in steps.write(7, steps.MODEL, [lesson, one, two])] == ["model1", "model2"]
    patch = (folder / "steps" / "model2_both.diff").read_text()
    assert patch.startswith(
        "--- part7_fake/gluon_attention.py (step model1: route)\n+++ part7_fake/gluon_attention.py (step model2: both)"
    )
    assert list(steps.split_patch(patch)) == ["gluon_attention.py", "gluon_backward.py"]
    assert (folder / "steps" / "model1_route.diff").read_text().startswith("--- part6_before/flash_attention.py\n")
    assert steps.states(7) == [lesson, one, two]
    for name, text in two.items():
        (folder / name).write_text(text)
    (folder / "gluon_backward.py").write_text("backward, grouped, edited\n")
    assert [s.name for s in steps.refresh(7)] == ["model2"]  # the model ladder ends at the shipped files
    assert steps.states(7)[-1]["gluon_backward.py"] == "backward, grouped, edited\n"
    with pytest.raises(ValueError, match="ends where its model ladder starts"):
        steps.refresh(7, "fwd")
    with pytest.raises(ValueError, match="patches several files"):
        steps.sources(7, steps.MODEL)
