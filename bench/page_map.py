"""Page map frame time: a real delta into a PageMirror, then the widget's refresh and paint.

    python bench/page_map.py [--pages 1048576] [--small-pages 65536] [--frames 50]
                             [--change 0.10] [--size 1200x640] [--png PATH] [--quick]

Offscreen Qt. Each frame changes a random --change fraction of the big pool's pages (new
owners from a rolling set of live requests, new states) and as large a share of the
small pool; the message goes through engine.wire.protocol pack/unpack like telemetry does.
Timed per frame: apply (unpack + EngineState.apply), index image update (PoolImage),
setImage (ImageItem), paint (QApplication.processEvents() after refresh: the repaint the
window's event loop does, ImageItem.render + drawImage of every pool). Goal: median frame
<= 15 ms. The paint is checked to be real: ImageItem.paint must run for every pool in
every frame, and a widget.grab() after each frame (timed apart, as the cost of a full
render of the whole widget) must differ from the one before and show LUT colours.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyqtgraph as pg  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.wire.protocol import pack, page_arrays, unpack  # noqa: E402
from gui import theme  # noqa: E402
from gui.model.engine_state import EngineState  # noqa: E402
from gui.model.page_grid import PoolImage  # noqa: E402
from gui.widgets.page_map import PageMapWidget  # noqa: E402

GOAL_MS = 15.0
LIVE_REQUESTS = 100  # rolling window of owners
NEW_PER_FRAME = 4
STATE_P = (0.30, 0.08, 0.06, 0.555, 0.005)  # FREE, RESERVED, IN_FLIGHT, WRITTEN, QUARANTINED


class PoolSim:
    """The engine side of one pool: metadata arrays and numbered messages."""

    def __init__(self, name: str, role: str, num_pages: int, rng: np.random.Generator):
        self.name, self.role, self.n, self.rng, self.seq = name, role, num_pages, rng, 0
        self.meta = {"owner": np.full(num_pages, -1, np.int32), "epoch": np.zeros(num_pages, np.int64),
                     "writer": np.full(num_pages, -1, np.int64), "filled": np.zeros(num_pages, np.int32),
                     "state": np.zeros(num_pages, np.uint8)}

    def _message(self, kind: str, arrays: dict) -> list:
        self.seq += 1
        return pack({"topic": f"pages/{self.name}", "pool": self.name, "role": self.role, "kind": kind,
                     "seq": self.seq, "num_pages": self.n, "page_size": 16}, arrays)

    def keyframe(self) -> list:
        return self._message("keyframe", page_arrays(self.meta))

    def delta(self, fraction: float, live: np.ndarray) -> list:
        index = np.flatnonzero(self.rng.random(self.n) < fraction).astype(np.int32)
        k = len(index)
        state = self.rng.choice(5, size=k, p=STATE_P).astype(np.uint8)
        owner = np.where(state == 0, -1, live[self.rng.integers(0, len(live), size=k)]).astype(np.int32)
        m = self.meta
        m["owner"][index], m["state"][index] = owner, state
        m["epoch"][index] += 1
        m["filled"][index] = np.where(state == 3, 16, 0)
        m["writer"][index] = np.where(state == 3, (owner.astype(np.int64) << 32) | m["epoch"][index], -1)
        return self._message("delta", page_arrays(m, index))


class Timer:
    """Wraps a method so each call's seconds add up in `spent[key]`."""

    def __init__(self):
        self.spent = defaultdict(float)

    def wrap(self, owner, name: str, key: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[key] += time.perf_counter() - t0

        setattr(owner, name, timed)


def lut_pixel_share(img, widget: PageMapWidget) -> float:
    """Share of the view pixels whose colour is one of the LUT's (1.0: nothing blended)."""
    rgb = pg.imageToArray(img, copy=True, transpose=False)[..., [2, 1, 0]].reshape(-1, 3)  # BGRA -> RGB
    lut = widget.colors.lut(widget.selected_slot)[:, :3]
    codes = (rgb[:, 0].astype(np.int64) << 16) | (rgb[:, 1].astype(np.int64) << 8) | rgb[:, 2]
    lut_codes = (lut[:, 0].astype(np.int64) << 16) | (lut[:, 1].astype(np.int64) << 8) | lut[:, 2]
    return float(np.isin(codes, lut_codes).mean())


def run(args) -> int:
    app = QApplication.instance() or QApplication([])
    theme.apply_theme(app, "dark")
    rng = np.random.default_rng(7)
    pools = [PoolSim("prefill-0", "prefill", args.pages, rng)]
    if args.small_pages:
        pools.append(PoolSim("decode-0", "decode", args.small_pages, rng))
    state = EngineState()
    next_slot = 1 + LIVE_REQUESTS
    live = np.arange(1, 1 + LIVE_REQUESTS, dtype=np.int32)
    for pool in pools:
        pool.delta(0.7, live)  # a populated pool to start from
        state.apply(unpack(pool.keyframe()))
    # wrapped before the first paint: PySide resolves a Python override once per class
    timer = Timer()
    timer.wrap(PoolImage, "update", "index image update")
    timer.wrap(pg.ImageItem, "setImage", "setImage")
    timer.wrap(pg.ImageItem, "paint", "ImageItem.paint")
    paints = []
    original_paint = pg.ImageItem.paint
    pg.ImageItem.paint = lambda item, *a: (paints.append(item), original_paint(item, *a))[1]
    widget = PageMapWidget(state, theme_name="dark")
    w, h = (int(v) for v in args.size.split("x"))
    widget.resize(w, h)
    widget.show()
    widget.refresh()
    app.processEvents()
    previous = widget.grab().toImage()

    rows, checks, painted = [], [], []
    for frame in range(args.frames + args.warmup):
        arriving = np.arange(next_slot, next_slot + NEW_PER_FRAME, dtype=np.int32)
        live = np.concatenate([live[NEW_PER_FRAME:], arriving])
        next_slot += NEW_PER_FRAME
        messages = [pool.delta(args.change, live) for pool in pools]  # the engine's work: not timed
        timer.spent.clear()
        paints.clear()
        t0 = time.perf_counter()
        for frames in messages:
            state.apply(unpack(frames))
        t1 = time.perf_counter()
        widget.refresh()
        t2 = time.perf_counter()
        app.processEvents()  # the event loop repaints what refresh() invalidated
        t3 = time.perf_counter()
        painted.append(len({id(item) for item in paints}))
        spent = dict(timer.spent)
        image = widget.grab().toImage()
        t4 = time.perf_counter()
        if frame >= args.warmup:
            rows.append({"apply delta": t1 - t0, "index image update": spent["index image update"],
                         "setImage": spent["setImage"], "paint": t3 - t2, "frame": t3 - t0,
                         "refresh other": (t2 - t1) - spent["index image update"] - spent["setImage"],
                         "ImageItem.paint": spent["ImageItem.paint"], "grab": t4 - t3})
            checks.append(image != previous)
            previous = image
    share = lut_pixel_share(previous, widget)
    if args.png:
        previous.save(args.png)

    ms = {k: [1e3 * r[k] for r in rows] for k in rows[0]}
    med = {k: statistics.median(v) for k, v in ms.items()}
    p95 = {k: float(np.percentile(v, 95)) for k, v in ms.items()}
    cpu = platform.processor() or platform.machine()
    print(f"# page map: {cpu}, {os.cpu_count()} cores, Qt {os.environ['QT_QPA_PLATFORM']}, "
          f"pyqtgraph {pg.__version__}, window {args.size}")
    sizes = " + ".join(f"{p.name} {p.n:,}" for p in pools)
    print(f"# pools: {sizes} pages; {args.change:.0%} of pages change per frame; {args.frames} frames "
          f"after {args.warmup} warm-up; {len(live)} live requests, {NEW_PER_FRAME} new per frame\n")
    print("| step | median ms | p95 ms |")
    print("|---|---:|---:|")
    steps = {"apply delta": "apply delta", "index image update": "index image update", "setImage": "setImage",
             "refresh other": "refresh other (titles, LUT)", "paint": "paint (event loop repaint)",
             "ImageItem.paint": "&nbsp;&nbsp;of which ImageItem.paint"}
    for key, label in steps.items():
        print(f"| {label} | {med[key]:.2f} | {p95[key]:.2f} |")
    verdict = "met" if med["frame"] <= GOAL_MS else "missed"
    print(f"| **frame (state update + render)** | **{med['frame']:.2f}** | **{p95['frame']:.2f}** |")
    print(f"| widget.grab() (whole widget, not in frame) | {med['grab']:.2f} | {p95['grab']:.2f} |")
    print("\n| pages | goal | median ms | p95 ms | result |")
    print("|---:|---:|---:|---:|---|")
    total = sum(p.n for p in pools)
    print(f"| {total:,} | <= {GOAL_MS:.0f} ms | {med['frame']:.2f} | {p95['frame']:.2f} | {verdict} |")
    every = sum(n == len(pools) for n in painted[args.warmup:])
    print(f"\nrender check: {every}/{len(checks)} frames painted every pool; {sum(checks)}/{len(checks)} frames "
          f"changed the grabbed pixels; {share:.1%} of pixels are LUT colours")
    if every != len(checks) or sum(checks) != len(checks) or share < 0.5:
        print("render check FAILED: the timed paint did not show the new frames", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1_048_576)
    parser.add_argument("--small-pages", type=int, default=65_536)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--change", type=float, default=0.10)
    parser.add_argument("--size", default="1200x640")
    parser.add_argument("--png", default="", help="save the last frame here")
    parser.add_argument("--quick", action="store_true", help="small pools, few frames (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.pages, args.small_pages, args.frames, args.warmup = 16_384, 4_096, 8, 1
    sys.exit(run(args))


if __name__ == "__main__":
    main()
