"""The compile check for the GPUs readers have (lab/targets.py): it compiles as a launch does and
fails naming part, kernel, configuration, target and bytes. CI runs the check itself
(`python -m lab.targets --quick`); these tests check that it can fail, and fail for the right reason."""

import re

from tests.helpers import fresh_python

# In a fresh process: lab.targets compiles for real (TRITON_INTERPRET=0), which must be set before
# triton loads. Part 2 with one tile list of a single 256 x 256 tile in 4 stages (about 384 KB of
# shared memory at D = 128 in bf16, more than any GPU has), checked on sm_89 alone; and part 1 as it
# is on every target.
CODE = r"""
import os, re
os.environ["TRITON_INTERPRET"] = "0"
from common import parts
from lab import targets
oversized = "TUNED = [triton.Config({'BLOCK_M': 256, 'BLOCK_N': 256}, num_warps=8, num_stages=4)]"
source = re.sub(r"^TUNED = \[.*?^\]", oversized, parts.path(2).read_text(), count=1, flags=re.S | re.M)
assert oversized in source
module = parts.load_source("part2_oversized", source)
one = dict(dtypes=("bf16",), causals=(True,))
todo = targets.jobs(2, module, False, targets=("sm_89",), dims=(128,), **one)
todo += targets.jobs(1, parts.load(1), False, dims=(64,), **one)
rows = targets.compile_all(todo, workers=2)
for line in targets.check(rows):
    print("PROBLEM", line)
for r in rows:
    print("ROW", r["part"], r["target"], r["config"], r["shared"], r["fits"])
"""


def test_an_oversized_configuration_fails_naming_the_target():
    done = fresh_python(CODE, timeout=900, TRITON_DEFAULT_FP_FUSION="1")
    assert done.returncode == 0, done.stderr[-3000:]
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1, done.stdout
    found = re.fullmatch(
        r"PROBLEM part 2 _attn_fwd \(bf16, D=128, causal=1\) 256x256 w8 s4 on sm_89: (\d+) bytes of shared memory, "
        r"101376 there",
        problems[0],
    )
    assert found and int(found[1]) > 101376, problems[0]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("ROW 1 ")]
    assert sorted(r[2] for r in rows) == ["sm_100", "sm_120", "sm_80", "sm_86", "sm_89", "sm_90"]
    assert all(int(r[-2]) > 0 and r[-1] == "1" for r in rows), rows  # part 1's 16 x 16 tiles fit everywhere
