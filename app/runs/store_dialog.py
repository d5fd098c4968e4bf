"""Choosing a run store from the Runs panel: another SQLite file or a database URL (e.g. a team's
PostgreSQL), and the URL runs are copied to ("Copy to store…"). Recent stores are remembered."""

from __future__ import annotations

from opscope.app.ui import settings
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

RECENT_KEY = "runs/recent_stores"
MAX_RECENT = 8
HINT = (
    "An SQLite file (a path, created if missing) or a SQLAlchemy URL, e.g. "
    "postgresql+psycopg://user@host:5432/opscope. The store is checked (and its schema created or "
    "upgraded) before it replaces the current one."
)


def recent_stores() -> list[str]:
    value = settings.value(RECENT_KEY, [])
    return [str(v) for v in ([value] if isinstance(value, str) else value or [])]


def remember_store(url: str) -> None:
    settings.set_value(RECENT_KEY, [url, *[u for u in recent_stores() if u != url]][:MAX_RECENT])


class StoreDialog(QDialog):
    """Asks for a store location; ``location()`` is what the user typed or picked."""

    def __init__(self, title: str, action: str, current: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent, windowTitle=title)
        self.url = QComboBox(editable=True, minimumContentsLength=48)
        self.url.addItems(recent_stores())
        self.url.setEditText(current)
        self.url.lineEdit().setPlaceholderText("/path/to/runs.sqlite  or  postgresql+psycopg://user@host/db")
        browse = QPushButton("SQLite file…", clicked=self._browse)
        row = QHBoxLayout()
        row.addWidget(self.url, 1)
        row.addWidget(browse)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.button(QDialogButtonBox.Ok).setText(action)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Store location"))
        layout.addLayout(row)
        layout.addWidget(QLabel(HINT, wordWrap=True, objectName="panelHint"))
        layout.addWidget(buttons)

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Run store (SQLite)",
            "",
            "SQLite (*.sqlite *.db);;All files (*)",
            options=QFileDialog.DontConfirmOverwrite,
        )
        if path:
            self.url.setEditText(path)

    def location(self) -> str:
        return self.url.currentText().strip()
