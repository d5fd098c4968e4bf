"""The Xvfb walk's checks: the real window on the X server that packaging/xvfb_walk.sh started (Qt's
xcb platform), driven by real X input (xdotool moves and clicks the pointer and types) at the places
where its widgets are drawn, so a changed layout moves the clicks with it. After each step it saves a
screenshot of the X screen and prints one line per check ("xvfb_walk: PASS|FAIL <check>: <what>"):

- chat: three turns on the embedded model; turn 3's TTFT within 1.5x turn 1's, and turns 2 and 3
  show the reused prefix in the stats line ("prefill 250 tok (220 cached)")
- trace: a table row clicked is outlined on the timeline; a bar clicked selects its table row
- roofline: a quick matmul run's roofline shows both roofs (compute and memory)
- trace hover: the pointer resting on a bar shows the op's tooltip
- compare: two runs compared in a 1280x800 window, its header and column titles not cut
- dark theme: View → Theme → Dark turns the Trace panel dark

    python packaging/xvfb_walk.py OUT_DIR      (on a display: xvfb_walk.sh sets one up)

Exit 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtCore import QPoint, QPointF, QRect
from PySide6.QtGui import QColor, QImage
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QPushButton, QTabBar, QToolTip, QWidget

TURNS = ("Name three primary colours.", "Which of them is the warmest?", "Say that again in one short sentence.")
TTFT_LIMIT = 1.5  # turn 3's TTFT at most this times turn 1's: the cache holds the conversation
OUTLINE = QColor("#ffd400")  # the timeline's selected-op outline (app.trace.timeline.SELECTED_COLOR)


class Walk:
    def __init__(self, out: Path) -> None:
        self.out, self.failed, self.shots = out, [], 0

    # -- X input and output ---------------------------------------------------------------------
    def click(self, widget: QWidget, pos: QPoint | None = None, *, ctrl: bool = False) -> None:
        """A real pointer move and click where ``pos`` (widget coordinates) is on the screen."""
        at = widget.mapToGlobal(pos if pos is not None else widget.rect().center())
        _xdo("mousemove", at.x(), at.y())
        QTest.qWait(300)  # Qt takes a click only after the pointer has arrived
        _xdo(*(["keydown", "ctrl"] if ctrl else []), "click", "1", *(["keyup", "ctrl"] if ctrl else []))
        QTest.qWait(400)

    def type(self, text: str, *keys: str) -> None:
        _xdo("type", "--delay", "15", text)
        if keys:
            _xdo("key", *keys)
        QTest.qWait(200)

    def shot(self, name: str) -> QImage:
        QTest.qWait(300)  # the last paint reaches the X server
        self.shots += 1
        path = self.out / f"{self.shots:02d}-{name}.png"
        subprocess.run(["import", "-window", "root", str(path)], check=True)
        print(f"xvfb_walk: {path}", flush=True)
        return QImage(str(path))

    def check(self, name: str, ok: bool, what: str) -> bool:
        print(f"xvfb_walk: {'PASS' if ok else 'FAIL'} {name}: {what}", flush=True)
        if not ok:
            self.failed.append(name)
        return ok


def _xdo(*args) -> None:
    subprocess.run(["xdotool", *map(str, args)], check=True)


def wait_until(predicate, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        QTest.qWait(100)
    return bool(predicate())


def show_tab(walk: Walk, window, title: str) -> None:
    """Click the dock tab titled ``title`` (Chat, Trace, Benchmarks, Runs)."""
    for bar in window.findChildren(QTabBar):
        for i in range(bar.count()):
            if bar.tabText(i) == title and bar.isVisible():
                walk.click(bar, bar.tabRect(i).center())
                return
    raise RuntimeError(f"no dock tab {title!r}")


def colour_pixels(image: QImage, rect: QRect, colour: QColor, tolerance: int = 24) -> list[tuple[int, int]]:
    """Screen pixels in ``rect`` within ``tolerance`` of ``colour`` (each channel)."""
    out = []
    for y in range(max(rect.top(), 0), min(rect.bottom(), image.height() - 1) + 1):
        for x in range(max(rect.left(), 0), min(rect.right(), image.width() - 1) + 1):
            c = image.pixelColor(x, y)
            if (
                max(abs(c.red() - colour.red()), abs(c.green() - colour.green()), abs(c.blue() - colour.blue()))
                <= tolerance
            ):
                out.append((x, y))
    return out


def median_lightness(image: QImage, rect: QRect) -> int:
    """The median lightness of ``rect`` on the screen (a plot's background: bars and text are few)."""
    values = sorted(
        image.pixelColor(x, y).lightness()
        for y in range(rect.top(), rect.bottom(), 5)
        for x in range(rect.left(), rect.right(), 5)
    )
    return values[len(values) // 2]


def screen_rect(widget: QWidget) -> QRect:
    return QRect(widget.mapToGlobal(QPoint(0, 0)), widget.size())


# -- the checks -----------------------------------------------------------------------------------
def chat_turns(walk: Walk, window) -> None:
    chat, session = window.chat, window.chat_session
    if not wait_until(lambda: session.model_name and not session.busy, 600):
        walk.check("chat", False, "the embedded model did not load within 600 s")
        return
    stats = []
    for i, text in enumerate(TURNS, 1):
        walk.click(chat.input)
        walk.type(text, "ctrl+Return")
        wait_until(lambda: session.busy, 30)
        done = wait_until(lambda: not session.busy and "stop:" in chat.stats_label.text(), 600)
        stats.append(chat.stats_label.text() if done else "")
        walk.shot(f"chat-turn{i}")
    ttft = [_number(r"TTFT (\d+) ms", s) for s in stats]
    cached = [_number(r"\((\d+) cached\)", s) or 0 for s in stats]
    ok = None not in ttft and ttft[2] <= TTFT_LIMIT * ttft[0] and cached[1] > 0 and cached[2] > cached[1]
    ratio = f"{ttft[2] / ttft[0]:.2f}x" if None not in ttft and ttft[0] else "?"
    walk.check(
        "chat",
        ok,
        f"3 turns, TTFT {' / '.join(str(t) for t in ttft)} ms (turn 3 at {ratio} turn 1, limit {TTFT_LIMIT}x), "
        f"cached {' / '.join(map(str, cached))} tokens; turn 3 reads: {stats[2]!r}",
    )


def _number(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def trace_selection(walk: Walk, window) -> None:
    panel = window.panels["trace"]
    show_tab(walk, window, "Trace")
    panel.variant.setCurrentIndex(min(1, panel.variant.count() - 1))  # the planted leaky-norm bug
    panel.target.setCurrentIndex(1)  # on the simulated accelerator: a device lane and a host lane
    panel.tokens.setValue(2)
    walk.click(panel.run_button)
    if not wait_until(lambda: len(panel.timeline.columns.get("t_us", ())) and panel.run_button.isEnabled(), 600):
        walk.check("trace", False, "the trace did not finish within 600 s")
        return
    QTest.qWait(1500)  # 3,500 ops drawn on a loaded machine
    table, timeline, ops = panel.table, panel.timeline, panel.model.ops
    row = min(3, ops.rowCount() - 1)
    walk.click(table.viewport(), table.visualRect(ops.index(row, 1)).center())
    want = int(ops.rows[row])
    image = walk.shot("trace-row-selected")
    outline = colour_pixels(image, screen_rect(timeline.viewport()), OUTLINE)
    walk.check(
        "trace row -> timeline",
        timeline.selected.tolist() == [want] and len(outline) >= 20,
        f"row {row + 1} ({ops.data(ops.index(row, 1))}) clicked: op {timeline.selected.tolist()} outlined "
        f"({len(outline)} outline pixels on screen)",
    )
    bar, at = _other_bar(timeline, want)
    walk.click(timeline.viewport(), at)
    current = table.currentIndex().row()
    image = walk.shot("trace-bar-clicked")
    near = colour_pixels(
        image, QRect(timeline.viewport().mapToGlobal(at) - QPoint(12, 12), QRect(0, 0, 25, 25).size()), OUTLINE
    )
    shown = 0 <= table.rowViewportPosition(current) < table.viewport().height()
    walk.check(
        "trace timeline -> row",
        current >= 0
        and int(ops.rows[current]) == bar
        and table.selectionModel().isRowSelected(current)
        and shown
        and near,
        f"bar of op {bar} ({timeline.columns['op'][bar]}) clicked: table row {current + 1} selected "
        f"({ops.data(ops.index(current, 1)) if current >= 0 else 'none'}), in view {shown}, outlined {bool(near)}",
    )


def trace_hover(walk: Walk, window) -> None:
    """The pointer resting on a bar shows that op in a tooltip."""
    timeline = window.panels["trace"].timeline
    if not len(timeline.columns.get("t_us", ())):
        walk.check("trace hover", False, "no trace to hover")
        return
    bar, at = _other_bar(timeline, int(timeline.selected[0]) if len(timeline.selected) else -1)
    for pos in (at + QPoint(0, 3), at):  # a short movement that ends on the bar
        spot = timeline.viewport().mapToGlobal(pos)
        _xdo("mousemove", spot.x(), spot.y())
    shown = wait_until(lambda: QToolTip.isVisible() and QToolTip.text() != "", 5)
    walk.shot("trace-hover")
    op = str(timeline.columns["op"][bar]).removeprefix("aten.")
    text = QToolTip.text() if shown else ""
    walk.check("trace hover", text.startswith(f"{op}  ("), f"pointer on the bar of op {bar}: tooltip {text!r}")


def dark_theme(walk: Walk, window) -> None:
    """View → Theme → Dark from the menu bar, then the Trace panel: dark, timeline included."""
    bar = window.menuBar()
    view = next(a for a in bar.actions() if a.text() == "&View")
    walk.click(bar, bar.actionGeometry(view).center())
    menu = view.menu()
    theme = next(a for a in menu.actions() if a.text() == "Theme")
    walk.click(menu, menu.actionGeometry(theme).center())
    sub = theme.menu()
    walk.click(sub, sub.actionGeometry(next(a for a in sub.actions() if a.text() == "Dark")).center())
    show_tab(walk, window, "Trace")
    image = walk.shot("dark-trace")
    lightness = median_lightness(image, screen_rect(window.panels["trace"].timeline))  # its background
    walk.check(
        "dark theme",
        window.theme.mode == "dark" and lightness < 90,
        f"theme {window.theme.mode}, the timeline's median lightness {lightness}",
    )


def _other_bar(timeline, not_row: int) -> tuple[int, QPoint]:
    """The widest op in view other than ``not_row``, and where its bar's middle is drawn."""
    x0, x1 = timeline.visible_span()
    c = timeline.columns
    t0 = c["t_us"] / 1e6
    t1 = t0 + c["dur_us"] / 1e6
    rows = [r for r in range(len(t0)) if r != not_row and x0 < t0[r] and t1[r] < x1]
    bar = max(rows, key=lambda r: c["dur_us"][r])
    y = float(timeline.lanes.index(timeline._lane_of(bar)))
    scene = timeline.getPlotItem().getViewBox().mapViewToScene(QPointF((t0[bar] + t1[bar]) / 2, y))
    return bar, timeline.mapFromScene(scene)


def bench_run(walk: Walk, window, name: str) -> bool:
    """A quick matmul run from the Benchmarks panel (Run clicked); True once it is saved."""
    panel = window.panels["bench"]
    show_tab(walk, window, "Benchmarks")
    panel.suite_combo.setCurrentText("matmul")
    panel.quick.setChecked(True)
    panel.name_edit.setText(name)
    walk.click(panel.run_button)
    started = wait_until(lambda: not panel.run_button.isEnabled(), 30)
    return started and wait_until(lambda: panel.run_button.isEnabled(), 900)


def roofline_roofs(walk: Walk, window) -> None:
    panel = window.panels["bench"]
    if not bench_run(walk, window, "walk-matmul-1"):
        walk.check("roofline", False, "the quick matmul run did not finish within 900 s")
        return
    view = panel.roofline_view
    wait_until(lambda: view.roof is not None and panel.tabs.currentWidget() is view, 300)
    image = walk.shot("roofline")
    kinds = sorted({c.kind for c in view.roof.ceilings}) if view.roof is not None else []
    roof = colour_pixels(image, screen_rect(view.plot), QColor("#c0392b"), tolerance=40)
    rows = {}
    for x, y in roof:
        rows.setdefault(y, []).append(x)
    flat = max((max(xs) - min(xs) for xs in rows.values()), default=0)
    walk.check(
        "roofline",
        kinds == ["bandwidth", "compute"] and len(rows) >= 30 and flat >= 30,
        f"ceilings {kinds}; the roof drawn over {len(rows)} px of height (the memory slope) and "
        f"{flat} px flat (the compute roof); {view.summary.text()!r}",
    )


def compare_1280(walk: Walk, window) -> None:
    if not bench_run(walk, window, "walk-matmul-2"):
        walk.check("compare", False, "the second quick matmul run did not finish within 900 s")
        return
    window.resize(1280, 800)
    QTest.qWait(1000)
    panel = window.panels["runs"]
    show_tab(walk, window, "Runs")
    panel.refresh()
    table = panel.table
    names = {table.item(r, 1).text(): r for r in range(table.rowCount()) if table.item(r, 1) is not None}
    rows = [r for n, r in names.items() if n.startswith("walk-matmul-")]
    for i, r in enumerate(sorted(rows)):
        walk.click(table.viewport(), table.visualRect(table.model().index(r, 1)).center(), ctrl=i > 0)
    compare = next(b for b in panel.findChildren(QPushButton) if b.text() == "Compare")
    walk.click(compare)
    view = panel.compare_view
    QTest.qWait(1000)
    walk.shot("compare-1280x800")
    header = view.header
    fits = header.isVisible() and header.height() >= header.heightForWidth(header.width())
    cut = cut_titles(view.table) + cut_titles(table)
    walk.check(
        "compare",
        len(rows) == 2 and window.width() == 1280 and fits and not cut,
        f"{len(rows)} runs compared at {window.width()}x{window.height()}: header "
        f"{'whole' if fits else 'cut'} ({header.height()} px for {header.heightForWidth(header.width())}), "
        f"column titles cut (compare and runs list): {cut or 'none'}, {view.table.rowCount()} rows",
    )


def cut_titles(table) -> list[str]:
    """The column titles of ``table`` that do not fit their column, or that scroll out of its view."""
    titles, model = table.horizontalHeader(), table.model()
    out = []
    for i in range(model.columnCount()):
        text = str(model.headerData(i, titles.orientation()))
        right = titles.sectionViewportPosition(i) + titles.sectionSize(i)
        if titles.fontMetrics().horizontalAdvance(text) + 8 > titles.sectionSize(i) or right > titles.width():
            out.append(text)
    return out


def main(argv: list[str]) -> int:
    from opscope.app.main import close_window
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.theme import ThemeManager
    from opscope.app.window.main_window import MainWindow
    from opscope.app.worker.protocol import LoadRequest

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    walk = Walk(Path(argv[0]))
    walk.out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(["opscope"])
    app.setApplicationName("OpScope")
    window = MainWindow(EngineClient(), ThemeManager(app, "light"), initial_model=LoadRequest())
    window.save_layout_on_close = False
    window.setGeometry(0, 0, 1400, 900)
    window.show()
    QTest.qWaitForWindowExposed(window)
    walk.shot("start")
    try:
        for step in (chat_turns, trace_selection, trace_hover, roofline_roofs, compare_1280, dark_theme):
            try:
                step(walk, window)
            except Exception as e:  # one broken step is reported; the walk goes on to the next
                walk.check(step.__name__, False, f"{type(e).__name__}: {e}")
                walk.shot(f"error-{step.__name__}")
    finally:
        close_window(window)
    print(f"xvfb_walk: {'every check passed' if not walk.failed else 'failed: ' + ', '.join(walk.failed)}")
    return 1 if walk.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
