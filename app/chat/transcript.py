"""The chat transcript: one rich-text document, one block group per turn.

Each turn is built in a scratch QTextDocument and inserted as a fragment: the role label on a line
of its own with its own format (nothing of it bleeds into the text), the user's text as typed, an
assistant reply through Qt's own Markdown reader (``QTextDocument.setMarkdown``, GitHub dialect,
raw HTML off) with code in the system's fixed-width font on a tinted background, and a footer line
(stats or error). Long code lines wrap inside their block (Qt's reader marks code blocks
non-breaking, which would widen the whole transcript and scroll every turn sideways), and so does a
long word such as a URL. The reply being streamed is re-rendered in place, only its own turn, at most
``1000 / RENDER_INTERVAL_MS`` times a second, so a long reply stays cheap.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
    QTextOption,
)
from PySide6.QtWidgets import QTextBrowser, QWidget

RENDER_INTERVAL_MS = 50  # ≤ 20 re-renders a second while a reply streams
MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
ROLE_COLORS = {"user": "#3182ce", "assistant": "#38a169", "system": "#805ad5"}
ERROR_COLOR = "#e53e3e"
TURN_GAP_PX = 14
CODE_BLOCK = QTextFormat.UserProperty + 1  # set on a code block's lines once they may wrap


class ChatTranscript(QTextBrowser):
    paletteChanged = Signal()  # code tints and footers were rendered in the old palette: render again

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setOpenExternalLinks(True)
        self.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)  # never wider than the view
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._stream_start: int | None = None  # where the streamed turn begins in the document
        self._stream_text = ""
        self._timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS, timeout=self.flush)
        self.renders = 0  # streamed re-renders so far (the throttle's effect, for tests)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        # A hidden transcript (the Chat tab behind another panel) gets its new palette only when
        # it is shown again, so this, not the theme switch, is the moment to render again.
        if event.type() == QEvent.PaletteChange:
            self.paletteChanged.emit()

    # -- whole history --------------------------------------------------------------------------
    def show_turns(self, turns, footer, empty_html: str) -> None:
        """Replace everything with ``turns``; ``footer(turn)`` → (text, is_error) under a reply."""
        self._timer.stop()
        self._stream_start = None
        if not turns:
            self.setHtml(empty_html)
            return
        self.clear()
        cursor = QTextCursor(self.document())
        for turn in turns:
            text, error = footer(turn) if turn.role == "assistant" else ("", False)
            self._insert(cursor, turn.role, turn.content, markdown=turn.role == "assistant", footer=text, error=error)
        self._scroll_to_end()

    # -- the reply being streamed ---------------------------------------------------------------
    def begin_stream(self) -> None:
        """Start an assistant turn at the end: its label now, its text with each ``stream``."""
        self._stream_text = ""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        self._stream_start = self._next_turn_start(cursor)
        self._insert(cursor, "assistant", "", markdown=True, start=self._stream_start)
        self._scroll_to_end()

    def stream(self, text: str) -> None:
        """The reply so far; rendered on the next tick of the throttle, not at once."""
        self._stream_text = text
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Render the streamed reply now (the throttle's tick, or the end of the stream)."""
        self._timer.stop()
        if self._stream_start is None:
            return
        at_end = self._at_end()
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._stream_start)
        cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
        cursor.removeSelectedText()
        self._insert(cursor, "assistant", self._stream_text, markdown=True, start=self._stream_start)
        self.renders += 1
        if at_end:
            self._scroll_to_end()

    # -- building one turn ----------------------------------------------------------------------
    def _next_turn_start(self, cursor: QTextCursor) -> int:
        if not self.document().isEmpty():
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        return cursor.position()

    def _insert(
        self,
        cursor: QTextCursor,
        role: str,
        content: str,
        *,
        markdown: bool,
        footer: str = "",
        error: bool = False,
        start: int | None = None,
    ) -> None:
        if start is None:
            start = self._next_turn_start(cursor)
        cursor.insertFragment(QTextDocumentFragment(self._turn_document(role, content, markdown, footer, error)))
        label = QTextCursor(self.document())
        label.setPosition(start)
        block = QTextBlockFormat()
        block.setTopMargin(TURN_GAP_PX if start > 0 else 0)
        block.setBottomMargin(2)
        label.setBlockFormat(block)

    def _turn_document(self, role: str, content: str, markdown: bool, footer: str, error: bool) -> QTextDocument:
        doc = QTextDocument()
        doc.setDefaultFont(self.font())
        if markdown and content.strip():
            # The label is a paragraph of its own: a blank line keeps the reply out of it.
            doc.setMarkdown(f"{role}\n\n{content}", MARKDOWN)
            self._style_code(doc)
        else:
            cursor = QTextCursor(doc)
            cursor.insertText(role)
            if content:
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
                cursor.insertText(content, QTextCharFormat())
        self._style_label(doc, role)
        if footer:
            self._add_footer(doc, footer, error)
        return doc

    def _style_label(self, doc: QTextDocument, role: str) -> None:
        cursor = QTextCursor(doc.begin())
        cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setFontWeight(QFont.Bold)
        fmt.setFontCapitalization(QFont.Capitalize)
        fmt.setForeground(QColor(ROLE_COLORS.get(role, ROLE_COLORS["system"])))
        cursor.setCharFormat(fmt)

    def _add_footer(self, doc: QTextDocument, text: str, error: bool) -> None:
        cursor = QTextCursor(doc)
        cursor.movePosition(QTextCursor.End)
        block = QTextBlockFormat()
        block.setTopMargin(4)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(ERROR_COLOR) if error else self.palette().color(QPalette.PlaceholderText))
        fmt.setFontPointSize(max(self.font().pointSizeF() - 1.5, 6.0))
        cursor.insertBlock(block, fmt)
        cursor.insertText(text, fmt)

    def _style_code(self, doc: QTextDocument) -> None:
        """Code blocks and inline code in the fixed-width font on a tint of the text colour."""
        fixed = QTextCharFormat()
        fixed.setFontFamilies([QFontDatabase.systemFont(QFontDatabase.FixedFont).family()])
        fixed.setFontFixedPitch(True)
        fixed.setFontStyleHint(QFont.Monospace)
        tint = self._code_background()
        block = doc.begin().next()  # the label is never code
        while block.isValid():
            fmt = block.blockFormat()
            if _is_code(block):
                fmt.setBackground(tint)
                if not _is_code(block.previous()):
                    fmt.setTopMargin(4)  # a code block sets itself off from the text around it
                if not _is_code(block.next()):
                    fmt.setBottomMargin(4)
                fmt.setNonBreakableLines(False)
                fmt.setProperty(CODE_BLOCK, True)
                cursor = QTextCursor(block)
                cursor.setBlockFormat(fmt)
                cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                cursor.mergeCharFormat(fixed)
            else:
                self._style_inline_code(doc, block, fixed, tint)
            block = block.next()

    @staticmethod
    def _style_inline_code(doc: QTextDocument, block, fixed: QTextCharFormat, tint: QColor) -> None:
        inline = QTextCharFormat(fixed)
        inline.setBackground(tint)
        spans, it = [], block.begin()
        while not it.atEnd():  # collect first: formatting splits fragments under the iterator
            piece = it.fragment()
            if piece.charFormat().fontFixedPitch():
                spans.append((piece.position(), piece.position() + piece.length()))
            it += 1
        for begin, end in spans:
            cursor = QTextCursor(doc)
            cursor.setPosition(begin)
            cursor.setPosition(end, QTextCursor.KeepAnchor)
            cursor.mergeCharFormat(inline)

    def _code_background(self) -> QColor:
        base, text = self.palette().color(QPalette.Base), self.palette().color(QPalette.Text)
        mix = 0.08
        return QColor.fromRgbF(*(b * (1 - mix) + t * mix for b, t in zip(base.getRgbF()[:3], text.getRgbF()[:3])))

    # -- scrolling ------------------------------------------------------------------------------
    def _at_end(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _scroll_to_end(self) -> None:
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())


def _is_code(block) -> bool:
    fmt = block.blockFormat()
    return block.isValid() and (
        fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.nonBreakableLines() or fmt.boolProperty(CODE_BLOCK)
    )
