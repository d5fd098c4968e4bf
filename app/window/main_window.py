"""The main window: five dockable panels, the model toolbar, the notification area and the status bar.

Panels are QDockWidgets with stable object names, so QSettings can restore their arrangement and
the window geometry between sessions. The window owns the EngineClient and shuts the worker down
when it closes. Every failure (engine jobs, a crashed worker, exports, uncaught exceptions) goes
through ``self.notifier`` to the notification area; a failed model load also opens a dialog. The
toolbar's model box and the status bar name the model the worker actually holds. The engine
settings (Engine → Settings…: threads, attention, fast path, compile, quantize, context length) go
with every load and are persisted; they always describe the model the worker holds.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from opscope.app.chat.panel import ChatPanel
from opscope.app.chat.session import ChatSession
from opscope.app.ui import settings
from opscope.app.ui.engine_client import EngineClient, Job
from opscope.app.ui.notify import Notice, NotificationArea, Notifier, details_dialog, install_excepthooks
from opscope.app.ui.status import EngineStatusBar
from opscope.app.ui.theme import ThemeManager, app_icon
from opscope.app.window.panels import build_optional_panels
from opscope.app.window.toolbar import ModelToolBar
from opscope.app.worker.protocol import InfoRequest, LoadRequest
from opscope.app.worker.settings import EngineSettings
from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMessageBox, QTabWidget, QWidget

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1  # bump when dock object names change: old saved layouts are then ignored

JOB_TEXT = {
    "chat": "The chat reply",
    "generate": "Generation",
    "trace": "The trace",
    "bench": "The benchmark",
    "roofline": "The roofline",
    "info": "Listing the engine's backends",
    "debug": "The debug request",
}


def _model_name(spec: LoadRequest) -> str:
    return spec.model or "the embedded default model"


def _reason(error_type: str, message: str) -> str:
    """What went wrong, as the engine says it, without the error's class name (the Details show
    it with the traceback); the class only where the engine said nothing else."""
    return message.strip().rstrip(". ") or error_type


def _short_name(spec: LoadRequest) -> str:
    return os.path.basename(spec.model.rstrip("/\\")) if spec.model else "the embedded default model"


class MainWindow(QMainWindow):
    engineInfo = Signal(dict)  # backends, devices, dtypes, suites, trace variants (InfoRequest)

    def __init__(
        self,
        client: EngineClient,
        theme: ThemeManager,
        *,
        db_url: str | None = None,
        initial_model: LoadRequest | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("OpScope")
        self.setWindowIcon(app_icon())
        self.setObjectName("mainWindow")
        self.client, self.theme, self.db_url = client, theme, db_url
        self.save_layout_on_close = True  # off for non-interactive runs (--screenshot)
        self.notifier = Notifier(self)
        self._uninstall_hooks = install_excepthooks(self.notifier)
        self.error_dialog: QMessageBox | None = None
        self.engine_settings = EngineSettings.from_json(settings.value("engine/settings"))
        self.load_options: dict | None = None  # what each engine setting may take (from the worker)
        self.settings_dialog = None
        self.docks: dict[str, QDockWidget] = {}
        self.toolbar = ModelToolBar(self)
        self.addToolBar(self.toolbar)
        self.notifications = NotificationArea(self.notifier, self)
        self.chat_session = ChatSession(client, self)
        self.chat_session.context_length = self.engine_settings.context_length
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
    def add_panel(
        self, name: str, title: str, widget: QWidget, area=Qt.LeftDockWidgetArea, tabify_with: str | None = None
    ) -> QDockWidget:
        dock = self._add_dock(name, title, widget, area)
        if tabify_with in self.docks:
            self.tabifyDockWidget(self.docks[tabify_with], dock)
        return dock

    def _add_dock(self, name: str, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self, objectName=f"dock_{name}")
        dock.setWidget(widget)
        dock.setFeatures(
            QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable | QDockWidget.DockWidgetClosable
        )
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
        engine.addAction("Settings…", self.open_engine_settings, QKeySequence.Preferences)
        engine.addAction("Stop current job", lambda: self.client.stop(None))
        engine.addAction("Restart engine", self.restart_engine)

    def _connect(self) -> None:
        self.toolbar.loadRequested.connect(self.load_model)
        self.toolbar.settingsRequested.connect(self.open_engine_settings)
        self.engineInfo.connect(lambda info: setattr(self, "load_options", info.get("load_options")))
        self.client.crashed.connect(lambda msg: self.notifier.error(msg, self.client.worker_output()))
        self.client.jobFailed.connect(self._on_job_failed)
        self.client.modelLoaded.connect(self._on_model_loaded)
        self.client.modelChanged.connect(self._on_model_changed)
        self.notifier.posted.connect(self._on_notice)

    # -- engine ---------------------------------------------------------------------------------
    def _start_engine(self, spec: LoadRequest) -> None:
        if any(getattr(spec, k) != getattr(LoadRequest(), k) for k in self.engine_settings.load_fields()):
            # Model options given at launch (or by a test) win over the saved settings.
            self.engine_settings = self.engine_settings.with_load_fields(spec)
        info = self.client.submit(InfoRequest())
        info.finished.connect(self.toolbar.set_engine_info)
        info.finished.connect(self.engineInfo.emit)
        self.load_model(spec)

    def load_model(self, spec: LoadRequest) -> Job:
        """Load ``spec`` (model, backend, device, dtype) with the engine settings' model options."""
        spec = dataclasses.replace(spec, **self.engine_settings.load_fields())
        job = self.client.submit(spec)
        self.toolbar.show_model(spec, loaded=False)
        self.statusBar().showMessage(f"Loading {_short_name(spec)}…")
        job.progress.connect(
            lambda msg: self.statusBar().showMessage(  # a first start compiles for minutes
                f"Loading {_short_name(spec)}: {msg.get('stage', 'working')} ({msg.get('elapsed_s', 0)} s)…"
            )
        )
        return job

    def _on_model_loaded(self, info: dict) -> None:
        # The file name only: a full path pushes the permanent labels off a 1400 px window.
        name = os.path.basename(str(info.get("path", "")).rstrip("/\\")) or "the model"
        self.statusBar().showMessage(f"Loaded {name} in {info.get('load_ms', 0):.0f} ms", 8000)

    def _on_model_changed(self, info: dict | None) -> None:
        """Toolbar and status bar follow what the worker holds, whatever was asked for."""
        self.toolbar.show_model(self.client.model_spec if info is not None else None, loaded=True)
        if info is not None and self.client.model_spec is not None:
            # The settings name what is loaded: after a failed reload, the options still in use.
            self._store_engine_settings(self.engine_settings.with_load_fields(self.client.model_spec))

    # -- engine settings ------------------------------------------------------------------------
    def open_engine_settings(self):
        from opscope.app.window.settings_dialog import EngineSettingsDialog

        if self.settings_dialog is not None:
            self.settings_dialog.done(0)
        context = (self.client.model_info or {}).get("config", {}).get("max_seq_len", 0)
        active = str((self.client.model_info or {}).get("fastpath", "")).startswith("on")
        self.settings_dialog = EngineSettingsDialog(
            self.engine_settings, self.load_options, model_context=context, fastpath_active=active, parent=self
        )
        self.settings_dialog.applied.connect(self.apply_engine_settings)
        self.settings_dialog.open()
        return self.settings_dialog

    def apply_engine_settings(self, new: EngineSettings) -> Job | None:
        """Use ``new``; reload the model when a model option changed (the old model stays on failure)."""
        loaded = self.client.model_spec
        self._store_engine_settings(new)
        self.chat_session.context_length = new.context_length
        current = {k: getattr(loaded, k) for k in new.load_fields()} if loaded is not None else None
        if current == new.load_fields():
            self.statusBar().showMessage("Engine settings applied (no reload needed)", 8000)
            return None
        return self.load_model(self.toolbar.request())

    def _store_engine_settings(self, new: EngineSettings) -> None:
        self.engine_settings = new
        settings.set_value("engine/settings", new.to_json())

    def _on_job_failed(self, job: Job) -> None:
        """The one place every failed engine job turns into something the user sees."""
        error_type, message = job.error or ("EngineError", "")
        if error_type == "Cancelled" or (error_type == "EngineCrashed" and job.kind != "load"):
            return  # cancelled on purpose; a crash is reported once, by ``crashed``
        details = job.traceback or self.client.worker_output()
        if job.kind == "load":
            self._load_failed(job.request, error_type, message, details, job.reply)
            return
        what = JOB_TEXT.get(job.kind, job.kind)
        self.notifier.error(f"{what} failed: {_reason(error_type, message)}", details)

    def _load_failed(self, spec: LoadRequest, error_type: str, message: str, details: str, reply: dict) -> None:
        if "model" in reply:
            now = reply["model"]
            kept = (
                f"{os.path.basename(now.get('path', ''))} is still loaded"
                if now
                else "no model is loaded: pick one in the toolbar (Model) or with File → Open model"
            )
        else:  # the worker died while loading: the box names what comes back with it, or nothing
            kept = (
                "the engine restarts with the last model that loaded on the next request"
                if self.client.model_spec is not None
                else "no model is loaded: pick one in the toolbar"
            )
            self.toolbar.show_model(self.client.model_spec, loaded=True)
            if self.client.model_spec is None:
                self.statusBar().on_model_changed(None)
        # One sentence, in one place (the dialog): no error class, no card or status line repeating it.
        self.statusBar().clearMessage()
        self.notifier.error(
            f"Could not load {_model_name(spec)} on {spec.device}/{spec.dtype}: "
            f"{_reason(error_type, message).removeprefix(f'{spec.model}: ')} ({kept}).",
            details,
            modal=True,
            title=f"Could not load {os.path.basename(spec.model or '') or _model_name(spec)}",
        )

    def _on_notice(self, notice: Notice) -> None:
        if not notice.modal:
            return
        if self.error_dialog is not None:
            self.error_dialog.done(0)
        self.error_dialog = details_dialog(self, notice)
        self.error_dialog.open()  # window-modal, asynchronous: the event loop keeps running

    def restart_engine(self) -> None:
        self.client.kill("restarted from the Engine menu")

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
        self._uninstall_hooks()
        if self.save_layout_on_close:
            self.save_layout()
        for panel in self.panels.values():
            if hasattr(panel, "shutdown"):
                panel.shutdown()
        self.client.shutdown()
        super().closeEvent(event)
