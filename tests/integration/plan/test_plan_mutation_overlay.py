"""apply_mutation on a real overlayfs mount: changes land in the upper layer only."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from rollstack.errors import MutationFailed
from rollstack.plan.mutation import apply_mutation

pytestmark = pytest.mark.integration

DIFF = """\
diff --git a/pkg/mod.py b/pkg/mod.py
index 1111111..2222222 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,3 +1,3 @@
 def f(x):
-    return x + 1
+    return x - 1

diff --git a/pkg/old.py b/pkg/old.py
deleted file mode 100644
index 3333333..0000000
--- a/pkg/old.py
+++ /dev/null
@@ -1 +0,0 @@
-OLD = True
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100755
index 0000000..4444444
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1 @@
+NEW = True
"""


@pytest.fixture
def overlay(tmp_path: Path):
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (upper, work, merged):
        d.mkdir()
    (lower / "srv/app/pkg").mkdir(parents=True)
    (lower / "srv/app/pkg/mod.py").write_text("def f(x):\n    return x + 1\n\n")
    (lower / "srv/app/pkg/old.py").write_text("OLD = True\n")
    (lower / "srv/app/pkg/other.py").write_text("untouched\n")
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        yield lower, upper, merged
    finally:
        subprocess.run(["umount", str(merged)], check=False)


def test_mutation_writes_only_the_upper_layer(overlay):
    lower, upper, merged = overlay
    result = apply_mutation(merged, DIFF, workdir="/srv/app")
    assert result.files_changed == 3
    assert (merged / "srv/app/pkg/mod.py").read_text() == "def f(x):\n    return x - 1\n\n"
    assert not (merged / "srv/app/pkg/old.py").exists()
    assert os.stat(merged / "srv/app/pkg/new.py").st_mode & 0o111
    # the lower layer is untouched; the upper holds the new files and a whiteout for the deletion
    assert (lower / "srv/app/pkg/old.py").exists() and "x + 1" in (lower / "srv/app/pkg/mod.py").read_text()
    wh = os.lstat(upper / "srv/app/pkg/old.py")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0
    assert not (upper / "srv/app/pkg/other.py").exists()


def test_failed_mutation_leaves_upper_empty(overlay):
    lower, upper, merged = overlay
    stale = DIFF.replace("-    return x + 1", "-    return x * 2")  # made against another version
    with pytest.raises(MutationFailed, match="pkg/mod.py: hunk #1"):
        apply_mutation(merged, stale, workdir="/srv/app")
    assert list(upper.iterdir()) == []
