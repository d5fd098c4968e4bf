"""The per-user kernel cache's upkeep: every source change, torch upgrade or new Python leaves its
builds behind (a variant's directory, about 1 MB, and the torch half's object beside it). After a
build, the older entries of the same variant (and of the same torch half) are removed, newest by
last use kept: two environments sharing the cache (two torch versions, two Pythons) keep theirs.

An entry is ``<prefix><16 hex digits>`` (build.module_name, build.half_unit) with an flock file
``<entry>.flock`` beside it; an entry whose lock another process holds (building it now) is left.
A library that a running process has mapped may be removed: the process keeps its mapping."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import string
from pathlib import Path

log = logging.getLogger(__name__)

KEEP = 3  # entries kept per variant: the one just used and the two used before it
KEY_DIGITS = 16  # an entry is <prefix><KEY_DIGITS hex digits>


def split(name: str) -> tuple[str, str] | None:
    """(prefix, key) of a cache entry's name, None for anything else."""
    prefix, key = name[:-KEY_DIGITS], name[-KEY_DIGITS:]
    if len(name) <= KEY_DIGITS or not prefix.endswith("_") or set(key) - set(string.hexdigits):
        return None
    return prefix, key


def of_prefix(name: str, prefix: str) -> bool:
    """Whether ``name`` is an entry of ``prefix``: its key right after it (avx2's prefix is also the
    start of avx2_vnni's, whose names are not avx2's entries)."""
    parts = split(name)
    return parts is not None and parts[0] == prefix


def mark_used(entry: Path) -> None:
    """Record a use of ``entry`` (its mtime): pruning keeps the most recently used."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def prune(root: Path, names: list[str], keep: int = KEEP) -> list[Path]:
    """Remove the entries of ``root`` that share a prefix with one of ``names`` beyond the ``keep``
    most recently used (the named ones always kept); the removed paths. Never raises: a cache that
    cannot be tidied still serves."""
    removed: list[Path] = []
    for name in names:
        parts = split(name)
        if parts is None:
            continue
        try:
            removed += _prune_one(root, name, parts[0], keep)
        except OSError as e:
            log.debug("kernel cache: pruning %s* failed: %s", root / parts[0], e)
    if removed:
        log.info("kernel cache: removed %d old build(s) from %s", len(removed), root)
    return removed


def _prune_one(root: Path, name: str, prefix: str, keep: int) -> list[Path]:
    siblings = [p for p in root.glob(f"{prefix}*") if p.is_dir() and of_prefix(p.name, prefix)]
    siblings.sort(key=lambda p: (p.name != name, -p.stat().st_mtime))
    removed = []
    for old in siblings[max(keep, 1) :]:
        if _remove_unlocked(old):
            removed.append(old)
    return removed


def _remove_unlocked(entry: Path) -> bool:
    lock = entry.with_name(f"{entry.name}.flock")
    with open(lock, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another process is building it now
        shutil.rmtree(entry, ignore_errors=True)
        lock.unlink(missing_ok=True)
    return not entry.exists()
