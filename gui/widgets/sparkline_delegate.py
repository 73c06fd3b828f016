"""SparklineDelegate: a cell that paints a series of 0..1 values as a polyline (QPainter only:
one cheap paint per visible cell, no plot widget per row). A None is a step with no sample (the
engine was not scraped then): the line breaks there, so a gap reads as a gap."""

from __future__ import annotations

from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QPen, QPolygonF
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from gui import theme

SERIES_ROLE = Qt.ItemDataRole.UserRole + 1  # the cell's values: a sequence of floats in 0..1 (or None)


def runs(values) -> list[list[tuple[int, float]]]:
    """The unbroken runs of (index, value) between Nones."""
    out: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((i, v))
    return [run for run in out if run]


class SparklineDelegate(QStyledItemDelegate):
    def paint(self, painter, option, index) -> None:
        values = index.data(SERIES_ROLE)
        style = option.widget.style() if option.widget is not None else None
        if style is not None:  # the row's background (its tint) and selection, as any cell
            cell = QStyleOptionViewItem(option)
            self.initStyleOption(cell, index)
            style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelItemViewItem, cell, painter, option.widget)
        if not values or len(values) < 2:
            return
        rect = option.rect.adjusted(3, 3, -3, -3)
        step = rect.width() / (len(values) - 1)
        seen = [v for v in values if v is not None]
        painter.save()
        painter.setRenderHint(painter.RenderHint.Antialiasing, True)
        pen = QPen(theme.color("danger" if seen and max(seen) >= 0.9 else "info"))
        pen.setWidthF(1.5)
        painter.setPen(pen)
        for run in runs(values):
            points = [QPointF(rect.left() + i * step, rect.bottom() - min(1.0, max(0.0, v)) * rect.height())
                      for i, v in run]
            if len(points) == 1:
                painter.drawPoint(points[0])
            else:
                painter.drawPolyline(QPolygonF(points))
        painter.restore()
