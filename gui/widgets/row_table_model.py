"""RowTableModel: a table model over a list of row objects with fixed column titles;
subclasses say what each cell shows in data(). row_table_view: the view the side tables share."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView


class RowTableModel(QAbstractTableModel):
    columns: tuple[str, ...] = ()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list = []

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section, orientation, role=Qt.DisplayRole):
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return self.columns[section]
        return None

    def row_key(self, row):
        """What names a row across updates."""
        return row.id

    def update_rows(self, rows: list) -> bool:
        """Swap in new rows. The same row objects: nothing to do. The same keys in the same
        order: the cells repaint (dataChanged) and the selection stays. Otherwise the model
        resets. Returns True when it reset."""
        old = self.rows
        if len(rows) == len(old) and all(a is b for a, b in zip(rows, old)):
            return False
        if [self.row_key(r) for r in rows] == [self.row_key(r) for r in old]:
            self.rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(self.columns) - 1))
            return False
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()
        return True


def row_table_view(model: RowTableModel, widths: tuple[int, ...], stretch: int, *, multi: bool = False,
                   row_padding: int = 6, striped: bool = True, view_class=QTableView) -> QTableView:
    """A QTableView over `model`: whole-row selection (several rows when `multi`), no row
    numbers, fixed row height (font + row_padding), column widths, column `stretch` filling
    the rest."""
    view = view_class()
    view.setModel(model)
    view.setSelectionBehavior(QAbstractItemView.SelectRows)
    view.setSelectionMode(QAbstractItemView.ExtendedSelection if multi else QAbstractItemView.SingleSelection)
    view.setAlternatingRowColors(striped)
    view.setWordWrap(False)
    vertical = view.verticalHeader()
    vertical.hide()
    vertical.setSectionResizeMode(QHeaderView.Fixed)
    vertical.setDefaultSectionSize(view.fontMetrics().height() + row_padding)
    header = view.horizontalHeader()
    for col, width in enumerate(widths):
        header.resizeSection(col, width)
    header.setSectionResizeMode(stretch, QHeaderView.Stretch)
    return view
