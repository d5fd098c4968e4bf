"""The Runs panel's store switch and "Copy to store", and the headless `opscope runs push`, on real
SQLite files and the real PostgreSQL server of the session (tests/conftest.py `pg_server`)."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from opscope.engine.core.results import Metric, RunResult, TelemetrySeries
from opscope.engine.store import RunStore

pytestmark = [pytest.mark.gui]


def _fill(url: str, *names: str) -> None:
    with RunStore.open(url) as store:
        for i, name in enumerate(names):
            store.save(
                RunResult(
                    kind="llm",
                    name=name,
                    tags=["mine"],
                    settings={"model": "m.gguf", "device": "cpu"},
                    metrics=[Metric(name="decode", unit="tok/s", samples=[10.0 + i, 11.0 + i, 12.0])],
                    telemetry=[TelemetrySeries("host.cpu_pct", "%", [1, 2], [5.0, 6.0])],
                )
            )


@pytest.fixture
def panel(qtbot, tmp_path):
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel
    from opscope.app.ui import settings
    from opscope.app.ui.notify import NotificationArea, Notifier
    from PySide6.QtWidgets import QMainWindow

    settings.use_directory(str(tmp_path / "settings"))
    _fill(str(tmp_path / "local.sqlite"), "local-a", "local-b")
    host = QMainWindow()
    notifier = Notifier(host)
    host.notifications = NotificationArea(notifier, host)
    panel = RunsPanel(RunsModel(str(tmp_path / "local.sqlite"), parent=host), notifier)
    host.setCentralWidget(panel)
    host.resize(1400, 900)
    qtbot.addWidget(host)
    host.show()
    qtbot.waitExposed(host)
    panel.refresh()
    yield panel, host
    panel.shutdown()


def _names(panel) -> list[str]:
    return sorted(panel.table.item(r, 1).text() for r in range(panel.table.rowCount()))


def test_open_another_sqlite_store_shows_its_runs(panel, tmp_path):
    panel, _host = panel
    assert "local.sqlite" in panel.store_label.text() and _names(panel) == ["local-a", "local-b"]
    other = tmp_path / "team.sqlite"
    _fill(str(other), "team-run")
    seen = []
    panel.storeChanged.connect(seen.append)
    assert panel.open_store(str(other))
    assert panel.store_label.isVisible() and "team.sqlite" in panel.store_label.text()
    assert _names(panel) == ["team-run"]
    assert seen and seen[0].endswith("team.sqlite")


def test_a_store_that_cannot_open_keeps_the_old_one_and_says_why(panel, tmp_path):
    panel, host = panel
    assert not panel.open_store("postgresql+psycopg://nobody@127.0.0.1:1/none")
    card = host.notifications.latest
    assert card is not None and card.isVisible()
    assert "Could not open the run store postgresql+psycopg://nobody@127.0.0.1:1/none" in card.text.text()
    assert "Connection refused" in card.text.text() and "Still showing sqlite:///" in card.text.text()
    assert "local.sqlite" in panel.store_label.text() and _names(panel) == ["local-a", "local-b"]


def test_copy_selected_runs_to_a_second_sqlite_store(panel, tmp_path):
    panel, host = panel
    panel.select_ids([panel.model.store.resolve("local-b")])
    target = tmp_path / "team.sqlite"
    report = panel.push_selected(str(target))
    assert report.summary() == f"1 run(s) copied to sqlite:///{target}"
    assert panel.count.text() == report.summary()
    assert host.notifications.latest.isVisible() and report.summary() in host.notifications.latest.text.text()
    with RunStore.open(str(target)) as team:
        runs = team.list()
        assert [r.name for r in runs] == ["local-b"]
        copied = team.load("local-b")
    with RunStore.open(str(tmp_path / "local.sqlite")) as local:
        original = local.load("local-b")
    assert copied.result.metrics[0].samples == original.result.metrics[0].samples
    assert copied.result.telemetry[0].values == [5.0, 6.0] and copied.info.tags == ("mine",)
    assert copied.info.created_at == original.info.created_at
    again = panel.push_selected(str(target))  # pushing twice is harmless
    assert again.pushed == [] and "already has a run of that name" in again.skipped[0][1]


def _opscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opscope.app.cli", *args], capture_output=True, text=True, timeout=120)


def test_runs_push_headless_to_sqlite(tmp_path):
    local, team = str(tmp_path / "local.sqlite"), str(tmp_path / "team.sqlite")
    _fill(local, "a-run", "b-run")
    done = _opscope("--db", local, "runs", "push", "--to", team, "b-run")
    assert done.returncode == 0, done.stderr
    assert "pushed run 'b-run'" in done.stdout and f"1 run(s) copied to sqlite:///{team}" in done.stdout
    done = _opscope("--db", local, "runs", "push", "--to", team)
    assert "pushed run 'a-run'" in done.stdout and "skipped run 'b-run'" in done.stdout
    with RunStore.open(team) as store:
        assert sorted(r.name for r in store.list()) == ["a-run", "b-run"]
    same = _opscope("--db", local, "runs", "push", "--to", local)
    assert same.returncode == 2 and "is the store the runs come from" in same.stderr


@pytest.mark.postgres
@pytest.mark.slow
def test_runs_push_headless_to_postgresql(tmp_path, pg_url):
    local = str(tmp_path / "local.sqlite")
    _fill(local, "pg-a", "pg-b")
    done = _opscope("--db", local, "runs", "push", "--to", pg_url)
    assert done.returncode == 0, done.stderr
    assert "2 run(s) copied to postgresql+psycopg://" in done.stdout
    with RunStore.open(pg_url) as team, RunStore.open(local) as mine:
        assert sorted(r.name for r in team.list()) == ["pg-a", "pg-b"]
        got, want = team.load("pg-b"), mine.load("pg-b")
        assert got.result.metrics[0].samples == want.result.metrics[0].samples
        assert got.result.settings == want.result.settings and got.info.status == "completed"


def test_an_empty_store_says_why_the_list_is_empty(panel, tmp_path):
    panel, _host = panel
    assert not panel.empty_hint.isVisible()
    assert panel.open_store(str(tmp_path / "new.sqlite"))
    assert panel.table.rowCount() == 0 and panel.empty_hint.isVisible()
    assert panel.empty_hint.text().startswith("No runs in this store yet")
    assert panel.open_store(str(tmp_path / "local.sqlite"))
    panel.search.setText("no-such-run")
    assert panel.empty_hint.isVisible() and panel.empty_hint.text().startswith("No run matches")
