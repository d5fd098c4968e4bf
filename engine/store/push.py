"""Copy runs from one store to another (`opscope runs push --to URL`, the Runs panel's "Copy to store").

A team shares one store (a PostgreSQL URL, or an SQLite file on a share); each person benchmarks into
their local store and pushes the runs worth keeping. A run keeps its name, status, times, tags,
metrics, telemetry and markers. Names are unique per store, so a run whose name the target already
holds is skipped (pushing twice is harmless); a run still being written is skipped too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from opscope.engine.core.errors import ConfigError, RunNotFoundError

log = logging.getLogger(__name__)


@dataclass
class PushReport:
    target: str  # display URL (no password)
    pushed: list[tuple[str, int, int]] = field(default_factory=list)  # (name, source id, target id)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)

    def lines(self) -> list[str]:
        out = [f"pushed run {name!r} (#{src} here) as #{dst} in {self.target}" for name, src, dst in self.pushed]
        out += [f"skipped run {name!r}: {why}" for name, why in self.skipped]
        return out

    def summary(self) -> str:
        text = f"{len(self.pushed)} run(s) copied to {self.target}"
        return text + (f", {len(self.skipped)} skipped" if self.skipped else "")


def push_runs(source, refs, target) -> PushReport:
    """Copy the runs ``refs`` (ids or names; empty = every finished run) of the open store ``source``
    into the open store ``target``."""
    if source.url == target.url:
        raise ConfigError(
            f"the target store {target.display_url} is the store the runs come from; name another one with --to"
        )
    ids = [source.resolve(r) for r in refs] if refs else [i.id for i in reversed(source.list())]
    report = PushReport(target.display_url)
    for run_id in dict.fromkeys(ids):
        stored = source.load(run_id)
        name = stored.info.name
        if stored.info.status == "running":
            report.skipped.append((name, "still running; push it once it has finished"))
        elif _has_run(target, name):
            report.skipped.append((name, f"{target.display_url} already has a run of that name"))
        else:
            report.pushed.append((name, run_id, target.import_run(stored)))
    log.info("%s", report.summary())
    return report


def _has_run(store, name: str) -> bool:
    try:
        store.resolve(name)
    except RunNotFoundError:
        return False
    return True
