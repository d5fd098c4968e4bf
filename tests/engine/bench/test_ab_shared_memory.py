"""An A/B run's peak memory is one process's, both sides' together (issue 31 item 2): each table
marks it as shared instead of showing it as A's and B's own peaks."""

from __future__ import annotations

import pytest
from opscope.engine.cli.main import main
from opscope.engine.store import RunStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = ["--quick", "--repeat", "2", "--min-time", "0", "--warmup", "0", "--param", "seq_lens=32"]
SHARED = "A+B in one process"


def test_peak_memory_of_an_a_b_pair_is_marked_shared(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["--db", db, "bench", "attention", *TINY, "--name", "p", "--ab", "--param heads=2"]) == 0
    out = capsys.readouterr().out
    with RunStore.open(db) as store:
        a, b = store.get("p-a"), store.get("p-b")
    for run in (a, b):
        peaks = [m for m in run.metrics if m.name.endswith(".peak_mem_bytes")]
        assert peaks and all(m.params["memory"] == SHARED for m in peaks)
        assert run.settings["interleaved"]["peak_memory"].startswith("shared: A and B run in one process")
    notes = _table_notes(out)  # each side's summary table says so on the row
    shared = [name for name, note in notes if "shared by A and B (one process): not this side's own peak" in note]
    assert sorted(shared) == sorted(2 * [m.name for m in peaks])
    # the comparison row has no change to claim
    compare_rows = [ln for ln in out.splitlines() if f"[memory={SHARED}" in ln]
    tails = [ln.split(f"[memory={SHARED}")[1] for ln in compare_rows]
    assert len(compare_rows) == len(peaks) and not any(w in t for t in tails for w in ("p=", "~", "too small"))
    assert any("too small" in ln for ln in out.splitlines() if "[memory=" not in ln)  # other rows are compared
    assert (
        f"memory={SHARED}: A and B ran in one process, so each peak memory row is that process's peak, "
        f"both sides' models and buffers together: the same for A and B, not per side; run a side alone "
        f"(without --ab) for its own peak"
    ) in " ".join(out.split())


def _table_notes(out: str) -> list[tuple[str, str]]:
    """(metric, notes) of every row of the rich summary tables, wrapped cells joined."""
    rows: list[list[str]] = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) < 8:
            continue
        if cells[0]:
            rows.append([cells[0], cells[-1]])
        elif rows:
            rows[-1][1] += " " + cells[-1]
    return [(name, " ".join(note.split())) for name, note in rows]
