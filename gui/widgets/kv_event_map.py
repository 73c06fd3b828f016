"""KvEventMapWidget: the page map of a vLLM / SGLang KV-event stream, one map per rank and
medium, each block at its stable slot and coloured by its prefix lineage.

It is the page map with another model: the same ImageItem per pool, index images and
256-entry LUT (PageColors' owner palette, where the owner is a lineage id), theme and
hover. A click on a block highlights its whole lineage in every map (a LUT swap, as a
selected request is in the engine's map).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QWidget

from gui import theme
from gui.model.kv_event_map import KvEventMap, KvPool
from gui.model.page_colors import FREE_PAGE
from gui.widgets.page_map import PageMapWidget, _hex

HINT = "Hover a block for its hash, parent, tokens and lineage root; click it to highlight its lineage."
WAITING = ("No KV events yet. vLLM and SGLang publish only when their prefix cache changes: "
           "send the engine a request.")


class KvEventMapWidget(PageMapWidget):
    """Shows a KvEventMap; `refresh()` repaints from it (the window calls it after the model
    changed). Signal `lineage_selected(str)`: the root hash a click selected ("" cleared)."""

    lineage_selected = Signal(str)
    shows_window_state = False  # its model is the KvEventMap, not the window's EngineState

    def __init__(self, model: KvEventMap, parent: QWidget | None = None, *, theme_name: str | None = None):
        super().__init__(model, parent, theme_name=theme_name)
        self._selected_root: str | None = None
        self.mode_box.hide()  # one colouring only: by lineage
        for label in self.findChildren(QLabel):
            if label.text() == "Colour by":
                label.hide()
        self.hover_label.setText(HINT)  # an ElidedLabel: long hashes never widen the window

    @property
    def model(self) -> KvEventMap:
        return self.state

    def _selection_of(self, state) -> None:
        return None  # the selected lineage is this widget's alone (the colours hold it)

    @property
    def selected_root(self) -> str | None:
        return self._selected_root

    def select_lineage(self, root: str | None) -> None:
        """Highlight the blocks of the lineage rooted at `root` (None or "" clears); no signal."""
        self._selected_root = root or None
        self.refresh()

    def refresh(self) -> None:
        pools = list(self.model.pools.values())
        if [p.name for p in pools] != self._order:
            self._rebuild_layout(pools)
        lineage = self.model.lineage_of(self._selected_root) if self._selected_root else None
        if lineage is None:
            self._selected_root = None  # its blocks are gone
        self.colors.selected_slot = lineage
        self.colors.begin_frame()
        changed = {p.name: self._views[p.name].image.update(p.mirror) for p in pools}
        self.colors.end_frame()
        lut = self.colors.lut(lineage)
        for pool in pools:
            view = self._views[pool.name]
            view.show(lut, changed[pool.name])
            view.set_title(self._pool_title(pool))

    def _rebuild_layout(self, pools: list[KvPool]) -> None:
        super()._rebuild_layout(pools)
        if not pools:  # say why the map is empty rather than show a blank area
            muted = theme.color("muted", self.colors.theme.name).name()
            self.graphics.ci.addLabel(WAITING, row=0, col=0, color=muted, size="11pt")

    def _pool_title(self, pool: KvPool) -> str:
        name = self.colors.theme.name
        fg, muted = theme.plot_colors(name)[1], theme.color("muted", name).name()
        text = (f"<span style='color:{fg}'><b>{pool.name}</b> · {pool.blocks:,} blocks · "
                f"{pool.lineages:,} lineages · {pool.tokens:,} tokens</span>")
        where = ", ".join(pool.endpoints) or "no endpoint"
        note = f"<span style='color:{muted}'>{where} · {pool.num_slots:,} slots shown</span>"
        if len(pool.endpoints) > 1:  # two engines both calling themselves this rank
            warning = theme.color("warning", name).name()
            note += f" · <span style='color:{warning}'>{len(pool.endpoints)} endpoints report this rank: merged</span>"
        return f"{text}<br>{note}"

    def _legend_html(self) -> str:
        lut = self.colors.lut()
        free = f"<span style='color:{_hex(lut[FREE_PAGE])}'>■</span>&nbsp;free slot"
        return f"{free} &nbsp; one colour per prefix lineage (blocks sharing a root hash)"

    def describe_page(self, pool: str, page: int) -> str:
        """The hover text of one slot (KeyError for an unknown pool, IndexError outside it)."""
        return self.model.describe(pool, page)

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        hit = self.page_at_scene(event.scenePos())
        block = self.model.block_at(*hit) if hit else None
        self.select_lineage(block.root if block else None)
        self.lineage_selected.emit(self._selected_root or "")
