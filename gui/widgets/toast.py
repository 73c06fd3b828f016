"""Toast: short, non-modal cards in the window's bottom-right corner, one per newly firing alert.

Cards stack upwards, hide themselves after a few seconds, and never take focus; a click
on a card emits `activated(alert_id)` so the window can select the alert. Given a state,
it follows its alerts and pops a card for each newly firing one.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from gui import theme
from gui.model.engine_state import AlertRow, EngineState
from gui.widgets.state_view import StateView

MARGIN = 12
SPACING = 6
WIDTH = 340
PER_KIND = 2  # cards of one kind from one batch of new alerts; past it, one card says how many


class ToastCard(QFrame):
    clicked = Signal(str)

    def __init__(self, alert: AlertRow, parent: QWidget):
        super().__init__(parent)
        self.alert_id = alert.id
        self.setObjectName("toastCard")
        self.setAttribute(Qt.WA_ShowWithoutActivating)
        self.setFocusPolicy(Qt.NoFocus)
        self.setFixedWidth(WIDTH)
        accent = theme.severity_color(alert.severity).name()
        pal = self.palette()
        self.setStyleSheet(
            f"QFrame#toastCard {{ background: {pal.color(pal.ColorRole.ToolTipBase).name()}; "
            f"border: 1px solid {pal.color(pal.ColorRole.Mid).name()}; border-left: 5px solid {accent}; "
            f"border-radius: 4px; }}")
        self.title = QLabel(f"<b style='color:{accent}'>{alert.severity.upper()}</b>&nbsp; {alert.kind}")
        detail = alert.detail.splitlines()[0] if alert.detail else ""
        if len(detail) > 160:
            detail = detail[:157] + "…"
        who = f"requests {', '.join(alert.requests[:3])}" + (" …" if len(alert.requests) > 3 else "") \
            if alert.requests else ""
        self.body = QLabel("\n".join(x for x in (detail, who) if x))
        self.body.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 8, 6)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.body)

    def mousePressEvent(self, event) -> None:
        event.accept()
        self.clicked.emit(self.alert_id)


class Toast(StateView, QObject):
    """Shows ToastCards over `parent` (the main window) and keeps them stacked in its corner."""

    activated = Signal(str)  # alert id of a clicked card

    def __init__(self, parent: QWidget, duration_ms: int = 6000, max_cards: int = 5, *,
                 state: EngineState | None = None):
        super().__init__(parent)
        self.host = parent
        self.duration_ms = duration_ms
        self.max_cards = max_cards
        self._cards: list[ToastCard] = []
        parent.installEventFilter(self)
        if state is not None:
            self.state = state

    def follows(self) -> dict:
        return {"alerts": self.show_new_alerts}

    def show_new_alerts(self) -> None:
        """A card for each alert newly firing in the state since the last call; more than
        PER_KIND of one kind at once are one card for the newest, saying how many came (a
        faulted vLLM load raises one alert per request: 200 cards would hide the window)."""
        by_kind: dict[str, list[AlertRow]] = {}
        for alert in self.state.take_new_alerts():
            by_kind.setdefault(alert.kind, []).append(alert)
        for kind, alerts in by_kind.items():
            if len(alerts) <= PER_KIND:
                for alert in alerts:
                    self.show_alert(alert)
            else:
                newest = alerts[-1]
                self.show_alert(replace(newest, detail=f"{len(alerts)} new {kind} alerts (the Alerts tab lists "
                                                       f"them all); the newest: {newest.detail}"))

    def show_alert(self, alert: AlertRow) -> ToastCard:
        """Pop a card for `alert`; it hides after duration_ms. The oldest goes beyond max_cards
        or when the stack would not fit in the window."""
        card = ToastCard(alert, self.host)
        card.clicked.connect(self.activated)
        card.clicked.connect(lambda _id, c=card: self._dismiss(c))
        self._cards.append(card)
        card.show()
        card.raise_()
        QTimer.singleShot(self.duration_ms, card, lambda c=card: self._dismiss(c))
        while len(self._cards) > self.max_cards:
            self._dismiss(self._cards[0], restack=False)
        self._restack()
        return card

    def cards(self) -> list[ToastCard]:
        """The cards on screen, oldest first."""
        return [c for c in self._cards if c.isVisible()]

    def _dismiss(self, card: ToastCard, *, restack: bool = True) -> None:
        if card in self._cards:
            self._cards.remove(card)
            card.hide()
            card.deleteLater()
            if restack:
                self._restack()

    def _restack(self) -> None:
        """Newest at the bottom right, older ones above; a card that would not fit below the
        window's top (menu and tool bars) goes. The list of cards is the only owner: a card
        is either in it and placed, or hidden (a card dropped from it unhidden stayed at the
        window's top-left for good)."""
        top = MARGIN + self._top_bars()
        bottom = self.host.height() - MARGIN
        for card in reversed(list(self._cards)):
            height = card.heightForWidth(WIDTH) if card.hasHeightForWidth() else card.sizeHint().height()
            card.resize(WIDTH, max(height, card.minimumSizeHint().height()))  # wrapped text whole
            if bottom - card.height() < top:
                self._dismiss(card, restack=False)
                continue
            bottom -= card.height()
            card.move(self.host.width() - card.width() - MARGIN, bottom)
            bottom -= SPACING

    def _top_bars(self) -> int:
        """Pixels at the top of the host taken by its menu and tool bars (a QMainWindow's)."""
        central = getattr(self.host, "centralWidget", lambda: None)()
        return max(0, central.geometry().top()) if central is not None else 0

    def eventFilter(self, watched, event) -> bool:
        if watched is self.host and event.type() == QEvent.Resize:
            self._restack()
        return False
