"""The git state a run records: the commit, and whether tracked files differed from it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lmprof.capture import environment

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_commit_and_dirty_state_of_a_checkout(tmp_path):
    assert environment.git_commit(tmp_path) is None and environment.git_dirty(tmp_path) is None
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    commit = environment.git_commit(tmp_path)
    assert commit is not None and len(commit) == 40
    assert environment.git_dirty(tmp_path) is False
    (tmp_path / "new.py").write_text("")  # untracked files are not the code that ran
    assert environment.git_dirty(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert environment.git_dirty(tmp_path) is True
    assert environment.git_commit(tmp_path) == commit
