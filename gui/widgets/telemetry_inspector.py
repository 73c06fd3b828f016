"""TelemetryInspector: every telemetry topic's latest payload as a tree, with when it arrived.

Read-only. A topic nobody wrote a view for is still seen here, with no GUI code: the model
keeps every topic's latest header (gui/model/topic_log.py). Hidden until View → Telemetry
(Ctrl+T); it rebuilds only the topics whose payload changed, and only while it is shown.
"""

from __future__ import annotations

import bisect
import time

from PySide6.QtWidgets import QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from gui.model.engine_state import EngineState
from gui.model.topic_log import TopicPayload
from gui.widgets.state_view import Dock, StateView

COLUMNS = ("Topic / field", "Value", "Arrived", "Messages")
MAX_ENTRIES = 50  # of one map or list; the rest are counted in one line
MAX_DEPTH = 8
MAX_TEXT = 200
SUMMARY_CHARS = 80


def arrived_text(wall: float) -> str:
    """"14:03:07.512": the local wall-clock time a payload arrived."""
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall * 1000) % 1000:03d}"


def value_text(value) -> str:
    """One value as the tree shows it: a map or list by its size, bytes by their length, text cut short."""
    if isinstance(value, dict):
        return f"{{{len(value):,} fields}}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value):,} items]"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value):,} bytes>"
    text = str(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def summary_text(header: dict) -> str:
    """A topic's one-line summary: its first plain fields, "key=value, …"."""
    plain = [f"{k}={value_text(v)}" for k, v in header.items()
             if k not in ("topic", "v") and not isinstance(v, (dict, list, tuple))]
    text = ", ".join(plain)
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS] + "…"


def _add(parent: QTreeWidgetItem, name: str, value, depth: int = 0) -> None:
    item = QTreeWidgetItem(parent, [name, value_text(value)])
    if depth >= MAX_DEPTH or not isinstance(value, (dict, list, tuple)):
        return
    entries = list(value.items() if isinstance(value, dict) else ((f"[{i}]", v) for i, v in enumerate(value)))
    for key, child in entries[:MAX_ENTRIES]:
        _add(item, str(key), child, depth + 1)
    if len(entries) > MAX_ENTRIES:
        QTreeWidgetItem(item, [f"… {len(entries) - MAX_ENTRIES:,} more", ""])


def _expanded(item: QTreeWidgetItem, path: tuple = ()) -> set[tuple]:
    out = set()
    for i in range(item.childCount()):
        child = item.child(i)
        if child.isExpanded():
            key = (*path, child.text(0))
            out |= {key} | _expanded(child, key)
    return out


def _expand(item: QTreeWidgetItem, paths: set[tuple], path: tuple = ()) -> None:
    for i in range(item.childCount()):
        child = item.child(i)
        key = (*path, child.text(0))
        if key in paths:
            child.setExpanded(True)
            _expand(child, paths, key)


class TelemetryInspector(StateView, QWidget):
    dock = Dock("Telemetry", area="right", shown=False, shortcut="Ctrl+T")

    def __init__(self, state: EngineState, parent=None):
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setColumnWidth(0, 180)
        self.tree.setColumnWidth(1, 220)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.caption)
        layout.addWidget(self.tree, 1)
        self._items: dict[str, QTreeWidgetItem] = {}  # topic -> its top-level item
        self._shown: dict[str, TopicPayload] = {}  # topic -> the payload its item shows
        self.state = state
        self._show_caption()

    def follows(self) -> dict:
        return {"topics": self.refresh}

    def state_replaced(self) -> None:
        self.tree.clear()
        self._items.clear()
        self._shown.clear()
        self.refresh()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()  # what arrived while it was hidden

    def item_of(self, topic: str) -> QTreeWidgetItem | None:
        return self._items.get(topic)

    def refresh(self) -> None:
        if not self.isVisible():
            return
        for topic, payload in self.state.topics.latest.items():
            if self._shown.get(topic) is not payload:
                self._show(payload)
        self._show_caption()

    def _show(self, payload: TopicPayload) -> None:
        item = self._items.get(payload.topic)
        if item is None:
            names = sorted(self._items)
            item = QTreeWidgetItem()
            self.tree.insertTopLevelItem(bisect.bisect(names, payload.topic), item)
            self._items[payload.topic] = item
        expanded = _expanded(item)
        for column, text in enumerate((payload.topic, summary_text(payload.header), arrived_text(payload.wall),
                                       f"{payload.count:,}")):
            item.setText(column, text)
        item.takeChildren()
        for key, value in payload.header.items():
            if key != "topic":
                _add(item, str(key), value)
        _expand(item, expanded)
        self._shown[payload.topic] = payload

    def _show_caption(self) -> None:
        topics = self.state.topics
        refused = f" · {topics.refused:,} messages of further topics not kept" if topics.refused else ""
        self.caption.setText(f"The latest message of each telemetry topic, as received (read-only): "
                             f"{len(topics.latest):,} topics{refused}.")
