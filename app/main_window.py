"""The main window: five dockable panels, the model toolbar, the notice bar and the status bar.

Panels are QDockWidgets with stable object names, so QSettings can restore their arrangement and
the window geometry between sessions. The window owns the EngineClient and shuts the worker down
when it closes.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QSizePolicy, QTabWidget, QToolBar, QWidget

from app import settings
from app.chat.panel import ChatPanel
from app.chat.session import ChatSession
from app.engine_client import EngineClient
from app.notify import NoticeBar, Notifier
from app.panels import build_optional_panels
from app.protocol import InfoRequest, LoadRequest
from app.status import EngineStatusBar
from app.theme import ThemeManager, app_icon
from app.toolbar import ModelToolBar

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1  # bump when dock object names change: old saved layouts are then ignored


class MainWindow(QMainWindow):
    engineInfo = Signal(dict)  # backends, devices, dtypes, suites, trace variants (InfoRequest)

    def __init__(self, client: EngineClient, theme: ThemeManager, *, db_url: str | None = None,
                 initial_model: LoadRequest | None = None) -> None:
        super().__init__()
        self.setWindowTitle("OpScope")
        self.setWindowIcon(app_icon())
        self.setObjectName("mainWindow")
        self.client, self.theme, self.db_url = client, theme, db_url
        self.notifier = Notifier(self)
        self.docks: dict[str, QDockWidget] = {}
        self.toolbar = ModelToolBar(self)
        self.addToolBar(self.toolbar)
        self._add_notice_bar()
        self.chat_session = ChatSession(client, self)
        self.chat = ChatPanel(self.chat_session)
        self._add_dock("chat", "Chat", self.chat, Qt.LeftDockWidgetArea)
        self.panels: dict[str, QWidget] = {}
        build_optional_panels(self)
        self.setStatusBar(EngineStatusBar(client, self))
        self._build_menus()
        self._connect()
        self._restore_layout()
        self._start_engine(initial_model or LoadRequest())

    # -- construction ---------------------------------------------------------------------------
    def _add_notice_bar(self) -> None:
        self.addToolBarBreak()
        bar = QToolBar("Notices", self, objectName="noticeToolBar", movable=False, floatable=False)
        self.notice_bar = NoticeBar(self.notifier)
        self.notice_bar.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        bar.addWidget(self.notice_bar)
        bar.toggleViewAction().setVisible(False)
        self.addToolBar(bar)
        bar.hide()  # an empty strip until there is something to say
        self.notifier.posted.connect(lambda _notice: bar.show())
        self.notice_bar.dismissed.connect(bar.hide)

    def add_panel(self, name: str, title: str, widget: QWidget, area=Qt.LeftDockWidgetArea,
                  tabify_with: str | None = None) -> QDockWidget:
        dock = self._add_dock(name, title, widget, area)
        if tabify_with in self.docks:
            self.tabifyDockWidget(self.docks[tabify_with], dock)
        return dock

    def _add_dock(self, name: str, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self, objectName=f"dock_{name}")
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable
                         | QDockWidget.DockWidgetClosable)
        self.addDockWidget(area, dock)
        self.docks[name] = dock
        return dock

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        file_menu.addAction("Open model…", self.toolbar.open_model_dialog, QKeySequence.Open)
        file_menu.addAction("Save conversation…", self.chat.save_dialog, QKeySequence.Save)
        file_menu.addSeparator()
        file_menu.addAction("Quit", self.close, QKeySequence.Quit)
        view = self.menuBar().addMenu("&View")
        for dock in self.docks.values():
            view.addAction(dock.toggleViewAction())
        view.addSeparator()
        view.addAction("Reset layout", self.reset_layout)
        themes = view.addMenu("Theme")
        group = QActionGroup(self)
        for mode in ("system", "light", "dark"):
            action = QAction(mode.capitalize(), self, checkable=True, checked=mode == self.theme.mode)
            action.triggered.connect(lambda _checked, m=mode: self._set_theme(m))
            group.addAction(action)
            themes.addAction(action)
        engine = self.menuBar().addMenu("&Engine")
        engine.addAction("Stop current job", lambda: self.client.stop(None))
        engine.addAction("Restart engine", self.restart_engine)

    def _connect(self) -> None:
        self.toolbar.loadRequested.connect(self.load_model)
        self.client.crashed.connect(lambda msg: self.notifier.error(msg, self.client_details()))
        self.client.modelLoaded.connect(self._on_model_loaded)

    # -- engine ---------------------------------------------------------------------------------
    def _start_engine(self, spec: LoadRequest) -> None:
        info = self.client.submit(InfoRequest())
        info.finished.connect(self.toolbar.set_engine_info)
        info.finished.connect(self.engineInfo.emit)
        info.failed.connect(lambda t, m: self.notifier.error(f"Could not list the engine's backends: {m}"))
        self.load_model(spec)

    def load_model(self, spec: LoadRequest) -> None:
        job = self.client.submit(spec)
        self.statusBar().showMessage(f"Loading {spec.model or 'the embedded default model'}…")
        job.failed.connect(lambda _t, msg: self.notifier.error(
            f"Could not load {spec.model or 'the default model'} on {spec.device}/{spec.dtype}: {msg}"))

    def _on_model_loaded(self, info: dict) -> None:
        self.statusBar().showMessage(f"Loaded {info.get('path', '')} in {info.get('load_ms', 0):.0f} ms", 8000)

    def restart_engine(self) -> None:
        self.client.kill("restarted from the Engine menu")

    def client_details(self) -> str:
        return "\n".join(self.client._stderr_tail)

    def _set_theme(self, mode: str) -> None:
        self.theme.set_mode(mode)
        settings.set_value("ui/theme", mode)

    # -- layout persistence ---------------------------------------------------------------------
    def _restore_layout(self) -> None:
        self.setTabPosition(Qt.AllDockWidgetAreas, QTabWidget.North)
        self.resize(1400, 900)
        self.resizeDocks([self.docks["chat"], self.docks["telemetry"]], [860, 540], Qt.Horizontal)
        self._default_state = self.saveState(LAYOUT_VERSION)
        geometry = settings.value("window/geometry")
        state = settings.value("window/state")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        if isinstance(state, QByteArray):
            self.restoreState(state, LAYOUT_VERSION)

    def reset_layout(self) -> None:
        self.restoreState(self._default_state, LAYOUT_VERSION)
        for dock in self.docks.values():
            dock.show()

    def save_layout(self) -> None:
        settings.set_value("window/geometry", self.saveGeometry())
        settings.set_value("window/state", self.saveState(LAYOUT_VERSION))

    def closeEvent(self, event) -> None:
        self.save_layout()
        for panel in self.panels.values():
            if hasattr(panel, "shutdown"):
                panel.shutdown()
        self.client.shutdown()
        super().closeEvent(event)
