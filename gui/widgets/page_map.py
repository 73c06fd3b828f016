"""PageMapWidget: every KV page of every pool, coloured by owner, tenant or state.

One pyqtgraph ImageItem per pool (prefill pools first, then decode, by name) shows the
pool's uint8 index image through a 256-entry LUT (the Indexed8 fast path). `refresh()`
repaints from the latest EngineState; the widget follows the state's pages, requests,
stale and selection events, which the window's 10 Hz timer flushes (never per message).
Hover names the page under the mouse; a click selects the page's request in the state's
one Selection, and the selection is a LUT swap shared by all pools. Pages held by more than
one request (engines that send `refs`: vLLM's prefix cache) carry a striped marker, drawn as
one RGBA image item per pool over the index image (gui.model.page_grid.shared_overlay).
"""

from __future__ import annotations

import datetime as dt
import weakref
from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QCursor, QImage
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from engine.client import PoolMirror
from engine.wire.page_tags import NO_WRITER, SHARED_OWNER, pack_tag, unpack_tag
from gui import theme
from gui.model.engine_state import EngineState
from gui.model.page_colors import (
    BRIGHT_BASE,
    CANARY_PAGE,
    FREE,
    FREE_PAGE,
    LEVELS,
    MODES,
    QUARANTINED_PAGE,
    STATE_BASE,
    STATE_NAMES,
    PageColors,
)
from gui.model.page_grid import SHARED_EDGE, SHARED_STRIPE, PageGrid, PoolImage, shared_overlay
from gui.model.page_history import HistoryFrame
from gui.model.selection import Selection
from gui.widgets.elided_label import ElidedLabel
from gui.widgets.state_view import StateView

ROLE_ORDER = {"prefill": 0, "decode": 1}
MAX_COLUMNS = 3
LEGEND_TENANTS = 8  # tenants named in the legend (colour by tenant)
STOPPED_OPACITY = 0.35  # a pool whose worker is not running: its last known pages, greyed
MODE_LABELS = {"request": "Request", "tenant": "Tenant", "state": "State"}
FIND_VEIL = (0, 0, 0, 200)  # RGBA over pages that do not match the find
PAN_SIDES = 3  # a pool pans at most this many of its longer sides off centre


def pool_order(pool: PoolMirror) -> tuple[int, str]:
    return ROLE_ORDER.get(pool.role, len(ROLE_ORDER)), pool.name


def writer_text(tag: int) -> str:
    """A writer tag as '(slot 5, epoch 3)', or 'never written'."""
    unpacked = unpack_tag(tag)
    if unpacked is None:
        return "never written"
    return f"(slot {unpacked[0]}, epoch {unpacked[1]})"


def writer_slots(writer: np.ndarray) -> np.ndarray:
    """The request slot of each page's writer tag (-1 where nobody wrote it): the vector form
    of unpack_tag."""
    tags = np.asarray(writer, dtype=np.int64)
    return np.where(tags == NO_WRITER, -1, tags >> 32)


def _plot_background(name: str) -> tuple[int, int, int]:
    """The app theme's plot background, so padding cells match the view around them."""
    return QColor(theme.plot_colors(name)[0]).getRgb()[:3]


def _hex(rgb) -> str:
    return "#%02x%02x%02x" % tuple(int(c) for c in rgb[:3])


class PageImageItem(pg.ImageItem):
    """An ImageItem that turns its Indexed8 QImage into ARGB32 premultiplied once per render:
    Qt draws a scaled Indexed8 image 3-8x slower than ARGB32 (1.85 ms against 0.23 ms for
    1024x1024 on 560x560 here), and the conversion costs about 0.5 ms."""

    def render(self) -> None:
        super().render()
        if self.qimage is not None and self.qimage.format() == QImage.Format.Format_Indexed8:
            self.qimage = self.qimage.convertToFormat(QImage.Format.Format_ARGB32_Premultiplied)


class PoolTitle(pg.LabelItem):
    """A pool's title that never widens its column: a LabelItem asks for its text's width as a
    minimum, so a long title pushed the pool beside it out of the widget. It wraps instead."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.setFlag(self.GraphicsItemFlag.ItemClipsChildrenToShape)

    def resizeEvent(self, ev) -> None:
        width = max(1.0, self.size().width())
        if self.item.textWidth() != width:  # wrap at the column; the height follows
            self.item.setTextWidth(width)
            self.updateMin()
        super().resizeEvent(ev)

    def updateMin(self) -> None:
        super().updateMin()
        height = self.itemRect().height()
        self.setMinimumWidth(0)
        self._sizeHint[Qt.SizeHint.MinimumSize] = (0, height)
        self._sizeHint[Qt.SizeHint.PreferredSize] = (0, height)
        self.updateGeometry()


class _PoolView:
    """The title, view box and image item of one pool."""

    def __init__(self, layout: pg.GraphicsLayoutWidget, row: int, col: int, colors: PageColors):
        self.title = PoolTitle("", justify="left")
        layout.addItem(self.title, row=2 * row, col=col)
        self.view = layout.addViewBox(row=2 * row + 1, col=col, lockAspect=True, invertY=True,
                                      enableMenu=False, defaultPadding=0.01)
        self.item = PageImageItem(axisOrder="row-major")  # autoDownsample stays off: it averages ids
        self.view.addItem(self.item)
        self.dim = pg.ImageItem(axisOrder="row-major")  # the find: a veil over pages that do not match
        self.dim.setZValue(1)
        self.dim.setVisible(False)
        self.view.addItem(self.dim)
        self.shared = pg.ImageItem(axisOrder="row-major")  # the marker of pages held by > 1 request
        self.shared.setZValue(0.5)  # over the pages, under the find's veil
        self.shared.setVisible(False)
        self.view.addItem(self.shared)
        self.shared_pages = np.empty(0, dtype=np.int32)  # the pages marked, ascending
        self._shared_shape: tuple[int, int] | None = None
        self.image = PoolImage(colors)
        self.shape: tuple[int, int] | None = None
        self.lut: np.ndarray | None = None
        self.title_text = ""
        self.found: int | None = None  # pages matching the find (None: no find)

    def set_found(self, keep: np.ndarray | None) -> None:
        """Veil every cell but `keep` ((rows, cols) bool), or lift the veil (None)."""
        if keep is None:
            self.found = None
            self.dim.setVisible(False)
            return
        self.found = int(np.count_nonzero(keep))
        veil = np.zeros((*keep.shape, 4), dtype=np.uint8)
        veil[~keep] = FIND_VEIL
        self.dim.setImage(veil, levels=(0, 255), autoLevels=False)
        self.dim.setVisible(True)

    def set_shared(self, pages: np.ndarray) -> None:
        """Mark these pages (ascending) as shared; redrawn only when they or the grid change."""
        grid = self.image.grid
        shape = (grid.rows, grid.cols)
        if shape == self._shared_shape and np.array_equal(pages, self.shared_pages):
            return
        self.shared_pages, self._shared_shape = np.asarray(pages, dtype=np.int32).copy(), shape
        if not len(pages):
            self.shared.setVisible(False)
            return
        self.shared.setImage(shared_overlay(grid, pages), levels=(0, 255), autoLevels=False)
        self.shared.setRect(QRectF(0, 0, grid.cols, grid.rows))  # the overlay's pixels are finer than cells
        self.shared.setVisible(True)

    def set_title(self, text: str) -> None:
        if text != self.title_text:  # a LabelItem relayouts on every setText
            self.title_text = text
            self.title.setText(text)

    def show(self, lut: np.ndarray, image_changed: bool) -> None:
        img = self.image.image
        if self.shape != img.shape:
            self.shape = img.shape
            rows, cols = img.shape
            # pan limits as wide as the longer side on both axes: limits of a few rows let an
            # aspect-locked box taller than the pool show only a square crop of it
            side = PAN_SIDES * max(rows, cols)
            self.view.setLimits(xMin=-side, xMax=cols + side, yMin=-side, yMax=rows + side)
            self.view.setRange(xRange=(0, cols), yRange=(0, rows), padding=0.01)
            # keep the whole pool in view as the window resizes (until the user zooms)
            self.view.enableAutoRange(pg.ViewBox.XYAxes, True)
            image_changed = True
        if image_changed or self.lut is None or not np.array_equal(lut, self.lut):
            self.lut = lut
            self.item.setImage(img, levels=LEVELS, lut=lut, autoLevels=False)


class PageMapWidget(StateView, QWidget):
    """The page map of every pool in `state.pages`.

    Signals: `request_selected(str)`: a click selected this request id ("" when the click
    cleared the selection; nothing when it selected a slot whose request is not known);
    `page_hovered(str)`: the hover text ("" off the pages); `color_mode_changed(str)`.
    """

    request_selected = Signal(str)
    page_hovered = Signal(str)
    color_mode_changed = Signal(str)

    def __init__(self, state: EngineState, parent: QWidget | None = None, *, theme_name: str | None = None):
        super().__init__(parent)
        self._follow_app_theme = theme_name is None
        name = theme_name or theme.current_mode()
        self.colors = PageColors(name, background=_plot_background(name), selection=self._selection_of(state))
        self._colors_state = state  # the state these colours were given out for
        self._colors_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # other states' colours
        self._views: dict[str, _PoolView] = {}
        self._order: list[str] | None = None  # None: rebuild the pool views on the next refresh
        self._stale = False
        self._legend_tenants = 0  # tenants in the legend's key as last written
        self._legend_shared = False  # the legend keys the shared-page marker (some pool sends refs)
        self.state = state
        self._hover_text = ""
        self.frame: HistoryFrame | None = None  # a frame of the history shown instead of live pages

        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.ci.setSpacing(6)
        self.graphics.ci.setContentsMargins(6, 4, 6, 4)
        self.graphics.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.graphics.scene().sigMouseClicked.connect(self._on_mouse_clicked)

        self.mode_box = QComboBox()
        self.mode_box.addItems([MODE_LABELS[m] for m in MODES])
        self.mode_box.currentIndexChanged.connect(lambda i: self.set_color_mode(MODES[i]))
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.RichText)
        # a long key (many tenants) must never widen the window: it is cut at the right
        self.legend.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.hover_label = ElidedLabel("Hover a page for its owner; click it to select its request.")
        self.hover_label.setTextInteractionFlags(Qt.TextSelectableByMouse)

        # a selected request that holds no pages (finished, say) dims every page: say why
        self.selection_note = QLabel()
        self.selection_note.setVisible(False)
        self.clear_selection_button = QPushButton("Clear selection")
        self.clear_selection_button.setVisible(False)
        self.clear_selection_button.clicked.connect(lambda: self.select_request(None))

        top = QHBoxLayout()
        top.addWidget(QLabel("Colour by"))
        top.addWidget(self.mode_box)
        top.addSpacing(12)
        top.addWidget(self.legend, 1)
        top.addWidget(self.selection_note)
        top.addWidget(self.clear_selection_button)
        # the wheel zooms a pool and a drag pans it (large pools); this shows every page again
        self.fit_button = QPushButton("Fit")
        self.fit_button.setToolTip("Zoom: the mouse wheel over a pool; pan: drag it. Fit shows every page again.")
        self.fit_button.clicked.connect(self.fit_all)
        top.addWidget(self.fit_button)
        box = QVBoxLayout(self)
        box.setContentsMargins(4, 4, 4, 4)
        box.setSpacing(4)
        box.addLayout(top)
        box.addWidget(self.graphics, 1)
        box.addWidget(self.hover_label)
        self._apply_theme_colours()

    # ---- following the state ----------------------------------------------------------------
    def follows(self) -> dict:
        return {"pages": self.refresh, "requests": self.refresh, "selection": self.refresh,
                "workers": self.refresh, "stale": self._follow_stale, "find": self.refresh}

    def state_replaced(self) -> None:
        """A new engine: slots start over, so colours and tenants are forgotten too. A state
        shown before (the live session behind a closed snapshot) gets its own colours back."""
        self._colors_of[self._colors_state] = self.colors
        colors = self._colors_of.pop(self.state, None)
        if colors is None:
            colors = PageColors(self.colors.theme.name, background=self.colors.theme.background,
                                selection=self._selection_of(self.state))
        elif colors.theme.name != self.colors.theme.name:
            colors.set_theme(self.colors.theme.name, self.colors.theme.background)
        colors.mode = self.colors.mode
        self.colors, self._colors_state = colors, self.state
        self._order = None
        self._legend_tenants = -1  # rewrite the key
        self._legend_shared = False
        self.frame = None  # the history was the other engine's
        self.refresh()

    def _follow_stale(self) -> None:
        self.set_stale(bool(self.state.stale))

    def _selection_of(self, state: EngineState) -> Selection | None:
        """The selection the colours follow: the state's (None: the colours keep their own)."""
        return state.selection

    # ---- settings -----------------------------------------------------------------------
    @property
    def pool_names(self) -> list[str]:
        """The pools shown, in display order (prefill first, then decode, by name)."""
        return list(self._order or [])

    @property
    def color_mode(self) -> str:
        return self.colors.mode

    def set_color_mode(self, mode: str) -> None:
        """"request", "tenant" or "state"; raises ValueError for anything else."""
        self.colors.mode = mode
        if self.mode_box.currentIndex() != MODES.index(mode):
            self.mode_box.setCurrentIndex(MODES.index(mode))  # re-enters with the same mode
            return
        self.legend.setText(self._legend_html())
        self.refresh()
        self.color_mode_changed.emit(mode)

    def set_theme(self, name: str) -> None:
        """"dark" or "light" (stops following the app's theme); raises ValueError otherwise."""
        self._follow_app_theme = False
        self.colors.set_theme(name, _plot_background(name))
        self._apply_theme_colours()
        self.refresh()

    def set_stale(self, stale: bool) -> None:
        """Telemetry stopped: say so in every title (the colours are the last known)."""
        if stale != self._stale:
            self._stale = stale
            self.refresh()

    def changeEvent(self, event) -> None:
        if event.type() == QEvent.PaletteChange and self._follow_app_theme:
            mode = theme.current_mode()
            if mode != self.colors.theme.name:
                self.colors.set_theme(mode, _plot_background(mode))
                self._apply_theme_colours()
                self.refresh()
        super().changeEvent(event)

    # ---- selection ----------------------------------------------------------------------
    @property
    def selected_slot(self) -> int | None:
        return self.colors.selected_slot  # the state's selection

    def select_request(self, request_id: str | None) -> None:
        """Select this request in the state's selection (None or "" clears): every view that
        follows it, this one included, highlights it. No signal."""
        self.state.select_request(request_id)

    def _select_slot(self, slot: int | None) -> None:
        self.state.select_slot(slot)  # repaints through the selection event
        row = self.state.request_for_slot(slot) if slot is not None else None
        if row is not None or slot is None:
            self.request_selected.emit(row.request_id if row else "")

    def swatch_of(self, slot: int) -> QColor | None:
        """The colour a slot's written pages show in the current mode (None: no colour yet,
        or in state mode): the requests table's key to the map."""
        rgb = self.colors.swatch(slot)
        return QColor(*rgb) if rgb is not None else None

    def fit_all(self) -> None:
        """Undo any zoom and pan: every pool whole in its box, following resizes again."""
        for view in self._views.values():
            view.view.enableAutoRange(pg.ViewBox.XYAxes, True)
            view.view.autoRange(padding=0.01)

    # ---- history ------------------------------------------------------------------------
    def show_frame(self, frame: HistoryFrame | None) -> None:
        """Show the pages of a recorded frame (the history slider), or live ones (None)."""
        self.frame = frame
        self.refresh()

    def _shown_pools(self) -> dict[str, PoolMirror]:
        return self.frame.pools if self.frame is not None else self.state.pages.pools

    def _request_id_of_slot(self, slot: int) -> str | None:
        """The request that held `slot` at the time shown (a slot is reused by later requests)."""
        if self.frame is not None:
            return self.frame.request_of_slot(slot)
        row = self.state.request_for_slot(slot)
        return row.request_id if row else None

    def _tenant_of_slot(self, slot: int) -> str | None:
        return self.frame.tenant_of_slot(slot) if self.frame is not None else self.state.tenant_of_slot(slot)

    # ---- repaint --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Repaint every pool from the latest EngineState, or from the history frame shown
        (only pages that changed are recomputed)."""
        pools = sorted(self._shown_pools().values(), key=pool_order)
        if [p.name for p in pools] != self._order:
            self._rebuild_layout(pools)
        self.colors.set_tenant_lookup(self._tenant_of_slot)
        self.colors.begin_frame()  # picks up the selection (state mode marks its pages)
        changed = {pool.name: self._views[pool.name].image.update(pool) for pool in pools}
        self.colors.end_frame()
        lut = self.colors.lut(self.selected_slot)
        down = self._pools_not_running() if self.frame is None else {}
        shared_key = any(pool.has_refs for pool in pools)
        if (self.colors.mode == "tenant" and len(self.colors.tenants.of_tenant) != self._legend_tenants
                or shared_key != self._legend_shared):
            self._legend_tenants = len(self.colors.tenants.of_tenant)
            self._legend_shared = shared_key
            self.legend.setText(self._legend_html())
        self._note_selection(pools)
        self._apply_find(pools)
        for pool in pools:
            view = self._views[pool.name]
            view.show(lut, changed[pool.name])
            view.set_shared(pool.shared_pages())
            opacity = STOPPED_OPACITY if pool.name in down else 1.0
            view.item.setOpacity(opacity)
            view.shared.setOpacity(opacity)
            view.set_title(self._title(pool, view.image, down.get(pool.name)))

    def _note_selection(self, pools: list[PoolMirror]) -> None:
        """Say when the selection holds no pages (everything else is dimmed around nothing)."""
        slot, rid = self.selected_slot, self.state.selected_request
        holds = slot is not None and any(bool(np.any(p.arrays["owner"] == slot)) for p in pools)
        selected = slot is not None or bool(rid)
        self.clear_selection_button.setVisible(selected)
        if not selected or holds:
            self.selection_note.setVisible(False)
            return
        row = self.state.requests.get(rid) if rid else self.state.request_for_slot(slot)
        who = f"request {row.request_id}" if row else (f"request {rid}" if rid else f"slot {slot}")
        phase = f" ({row.phase})" if row and row.phase and self.frame is None else ""
        when = "then" if self.frame is not None else "now"
        self.selection_note.setText(f"<span style='color:{theme.color('warning').name()}'>Selected {escape(who)}"
                                    f"{escape(phase)} holds no pages {when}</span>")
        self.selection_note.setVisible(True)

    def _apply_find(self, pools: list[PoolMirror]) -> None:
        """Veil the pages whose owner does not match the find (of the time shown)."""
        find = self.state.find
        if not find.active:
            for view in self._views.values():
                view.set_found(None)
            return
        slots = find.matching_slots(self.state.requests.values())  # slots are never reused: any time's requests
        if self.frame is not None:
            then = [s for s, (rid, tenant) in self.frame.owners.items() if find.matches(rid, tenant)]
            slots = np.union1d(slots, np.array(then, dtype=np.int64))
        for pool in pools:
            view = self._views[pool.name]
            rows, cols = view.image.image.shape
            keep = np.zeros(rows * cols, dtype=bool)
            held = pool.arrays["state"] != FREE
            # a page matches by its owner, or by whose data it holds: after a leak the data
            # of tenant:acme sits in pages another tenant's request owns
            keep[:pool.num_pages] = held & (np.isin(pool.arrays["owner"], slots)
                                            | np.isin(writer_slots(pool.arrays["writer"]), slots))
            view.set_found(keep.reshape(rows, cols))

    def _pools_not_running(self) -> dict[str, str]:
        """Pools whose worker is not running now (pool -> its state): their pages are the
        last the worker sent, no longer what the engine holds."""
        return {w.pool: w.state for w in self.state.workers if not w.running}

    def _rebuild_layout(self, pools: list[PoolMirror]) -> None:
        for view in self._views.values():
            view.image.detach()
        self.graphics.ci.clear()
        self._views = {}
        for i, pool in enumerate(pools):
            self._views[pool.name] = _PoolView(self.graphics, i // MAX_COLUMNS, i % MAX_COLUMNS, self.colors)
        for col in range(min(len(pools), MAX_COLUMNS)):  # equal columns, whatever the titles say
            self.graphics.ci.layout.setColumnStretchFactor(col, 1)
        self._order = [p.name for p in pools]
        self._apply_theme_colours()

    def _title(self, pool: PoolMirror, image: PoolImage, worker_down: str | None = None) -> str:
        t = self.colors.theme
        fg = theme.plot_colors(t.name)[1]
        used, total = image.used_pages, pool.num_pages
        share = f" ({100 * used / total:.1f}%)" if total else ""
        role = "" if pool.role in pool.name else f" {pool.role}"  # "prefill-0" already says it
        text = f"<span style='color:{fg}'><b>{pool.name}</b>{role} · {used:,}/{total:,} used{share}</span>"
        # notes go on a second line: a long title would widen its column past the window
        notes = []
        view = self._views.get(pool.name)
        if view is not None and view.found is not None:
            notes.append(f"<b>{view.found:,} pages match the find</b>")
        if self.frame is not None:
            at = dt.datetime.fromtimestamp(self.frame.time).strftime("%H:%M:%S.%f")[:-5]
            notes.append(f"<b style='color:{theme.color('warning', t.name).name()}'>history: as at {at}</b>")
        if view is not None and (pool.has_refs or len(view.shared_pages)):
            # said even when 0 for a pool that sends refs: the title keeps its two lines, and the
            # map does not jump each time a page becomes shared or stops being so
            notes.append(f"{len(view.shared_pages):,} shared")
        if image.quarantined_pages:
            notes.append(f"<b style='color:{_hex(t.quarantined)}'>{image.quarantined_pages:,} quarantined</b>")
        warning = theme.color("warning", t.name).name()
        if worker_down:
            notes.append(f"<span style='color:{warning}'>worker {worker_down}: last known pages</span>")
        elif self._stale:
            notes.append(f"<span style='color:{warning}'>telemetry stale: last known pages</span>")
        elif pool.stale:
            notes.append(f"<span style='color:{warning}'>missed a delta: waiting for a keyframe</span>")
        return text + ("<br>" + " · ".join(notes) if notes else "")

    def _apply_theme_colours(self) -> None:
        t = self.colors.theme
        self.graphics.setBackground(_hex(t.background))
        for view in self._views.values():
            view.item.setBorder(pg.mkPen(_hex(t.free), width=1))
        self.legend.setText(self._legend_html())

    def _legend_html(self) -> str:
        lut = self.colors.lut()

        def swatch(index: int, label: str) -> str:
            return f"<span style='color:{_hex(lut[index])}'>■</span>&nbsp;{label}"

        items = []
        if self._legend_shared:  # the marker itself, a white stripe edged in black; first: the key is cut at the right
            items.append(f"<span style='color:{_hex(SHARED_STRIPE)}; background-color:{_hex(SHARED_EDGE)}'>"
                         f"&nbsp;╱&nbsp;</span>&nbsp;shared (prefix cache)")
        items.append(swatch(FREE_PAGE, "free"))
        if self.colors.mode == "state":
            items += [swatch(STATE_BASE + s, STATE_NAMES[s].lower().replace("_", " ")) for s in (1, 2, 3)]
        else:
            items.append("bright: written · dim: reserved or in flight")
            items.append(swatch(CANARY_PAGE, "canary"))
        items.append(swatch(QUARANTINED_PAGE, "quarantined"))
        if self.colors.mode == "tenant":  # the tenant -> colour key, in first-seen order
            tenants = list(self.colors.tenants.of_tenant.items())
            items += [swatch(BRIGHT_BASE + colour, escape(tenant)) for tenant, colour in tenants[:LEGEND_TENANTS]]
            if len(tenants) > LEGEND_TENANTS:
                items.append(f"+{len(tenants) - LEGEND_TENANTS} more tenants (hover a page)")
        return " &nbsp; ".join(items)

    # ---- hover and click ------------------------------------------------------------------
    def page_at_scene(self, scene_pos: QPointF) -> tuple[str, int] | None:
        """(pool name, page) under a scene position, or None (padding, gaps, titles)."""
        for name, view in self._views.items():
            if not view.view.sceneBoundingRect().contains(scene_pos):
                continue
            p = view.item.mapFromScene(scene_pos)
            page = view.image.grid.page_at(p.x(), p.y())
            return None if page is None else (name, page)
        return None

    def scene_pos_of(self, pool: str, page: int) -> QPointF:
        """The scene position of the middle of a page's cell (for tests and tools)."""
        view = self._views[pool]
        x, y = view.image.grid.cell_center(page)
        return view.item.mapToScene(QPointF(x, y))

    def describe_page(self, pool: str, page: int) -> str:
        """The hover text of one page: id, owner request, tenant, state, filled, epoch, writer.
        Raises KeyError for an unknown pool and IndexError for a page outside it."""
        mirror = self._shown_pools()[pool]
        row, col = PageGrid.for_pages(mirror.num_pages).cell_of(page)
        a = {k: v[page] for k, v in mirror.arrays.items()}
        owner, state = int(a["owner"]), int(a["state"])
        state_name = STATE_NAMES[state] if state < len(STATE_NAMES) else f"unknown state {state}"
        lines = [f"{pool} · page {page:,} (row {row}, col {col})"]
        if owner == SHARED_OWNER:
            writer = int(a["writer"]) >> 32
            rid, tenant = self._request_id_of_slot(writer), self._tenant_of_slot(writer)
            who = f"request {rid} (slot {writer})" if rid else f"slot {writer}"
            lines.append(f"owner: the prefix cache · written by {who} · carries tenant {tenant or '?'}'s salt")
        elif owner < 0:
            lines.append("owner: none")
        else:
            rid, tenant = self._request_id_of_slot(owner), self._tenant_of_slot(owner)
            who = f"request {rid} (slot {owner})" if rid else f"slot {owner} (request not known)"
            lines.append(f"{who} · tenant {tenant or '?'}")
        holders = int(mirror.holders(page))
        if holders > 1:
            lines.append(f"shared by {holders} requests (prefix cache)")
        filled = f"{int(a['filled']):,}/{mirror.page_size:,} tokens"
        if state == FREE:  # what `filled` says is what its last owner wrote, if anything
            lines.append(f"state {state_name} · epoch {int(a['epoch']):,}"
                         + (f" · last held {filled} before it was freed" if int(a["filled"]) else ""))
        else:
            lines.append(f"state {state_name} · filled {filled} · epoch {int(a['epoch']):,}")
        tag = int(a["writer"])
        note = ""
        if tag != NO_WRITER and owner >= 0 and state != FREE:
            own = pack_tag(owner, int(a["epoch"]))
            note = " (the owner, this epoch)" if tag == own else " (NOT the owner's tag for this epoch)"
        unpacked = unpack_tag(tag)
        writer = self._request_id_of_slot(unpacked[0]) if unpacked is not None else None
        who = f"request {writer} " if writer is not None else ""
        lines.append(f"writer {who}{writer_text(tag)}{note}")
        return "\n".join(lines)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        hit = self.page_at_scene(scene_pos)
        text = self.describe_page(*hit) if hit else ""
        if text == self._hover_text:
            return
        self._hover_text = text
        self.hover_label.setText(text.replace("\n", "  ·  ") if text else " ")
        if text:
            QToolTip.showText(QCursor.pos(), text, self.graphics)
        else:
            QToolTip.hideText()
        self.page_hovered.emit(text)

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.LeftButton:
            return
        hit = self.page_at_scene(event.scenePos())
        slot = None
        if hit:
            arrays = self._shown_pools()[hit[0]].arrays
            owner, state = int(arrays["owner"][hit[1]]), int(arrays["state"][hit[1]])
            slot = owner if owner >= 0 and state != FREE else None
        if self.frame is not None and slot is not None:  # the request of that time, by id
            rid = self.frame.request_of_slot(slot)
            self.state.selection.select(rid, slot)
            if rid:
                self.request_selected.emit(rid)
            return
        self._select_slot(slot)

