"""The schedule that hands test files to `make test`'s workers (tests/support/file_schedule.py)
names files by path: one renamed or removed would silently fall back to xdist's order."""

from pathlib import Path

from file_schedule import SECONDS, TREE_GROUP

ROOT = Path(__file__).resolve().parents[1]


def test_the_schedule_names_only_test_files_that_exist():
    assert [f for f in (*SECONDS, *TREE_GROUP) if not (ROOT / f).is_file()] == []
