"""PageTelemetry (worker side) + PageMirror (subscriber side): keyframes, deltas, gaps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.client import PageMirror
from engine.kv.page_pool import PageLayout, PagePool
from engine.server.telemetry import TelemetryPublisher
from engine.wire.protocol import PAGE_FIELDS, ProtocolError, pack, unpack
from engine.workers.page_telemetry import PageTelemetry


def _wire(header, arrays):
    return unpack(pack(header, arrays))


def _pool():
    return PagePool("decode-0", 32, PageLayout(1, 1, 2, 4, torch.float32))


def test_keyframe_then_deltas_keep_the_mirror_equal():
    pool, mirror = _pool(), PageMirror()
    tel = PageTelemetry(pool, "decode")
    assert tel.due(0.0) == []  # nobody watching: nothing computed
    tel.enable(True)
    (keyframe,) = tel.due(100.0)
    assert keyframe[0]["kind"] == "keyframe" and mirror.apply(_wire(*keyframe))
    grant = pool.allocate(5, 3)
    pool.writer[torch.from_numpy(grant.pages.astype(np.int64))] = 77
    pool.mark_dirty(grant.pages)
    (delta,) = tel.due(100.2)
    assert delta[0]["kind"] == "delta" and delta[0]["seq"] == keyframe[0]["seq"] + 1
    assert sorted(delta[1]["index"].tolist()) == sorted(grant.pages.tolist())
    assert mirror.apply(_wire(*delta))
    assert tel.due(100.25) == []  # at most 10 Hz
    pool.free(5, grant.pages)
    (delta2,) = tel.due(100.4)
    mirror.apply(_wire(*delta2))
    truth = pool.metadata_snapshot()
    for key in PAGE_FIELDS:
        np.testing.assert_array_equal(mirror.pools["decode-0"].arrays[key], truth[key], err_msg=key)


def test_a_gap_marks_the_pool_stale_until_the_next_keyframe():
    pool, mirror = _pool(), PageMirror()
    tel = PageTelemetry(pool, "decode")
    tel.enable(True)
    mirror.apply(_wire(*tel.due(0.0)[0]))
    pool.allocate(1, 2)
    tel.due(0.2)  # this delta is lost on the way
    pool.allocate(2, 2)
    (late,) = tel.due(0.4)
    assert not mirror.apply(_wire(*late))
    assert mirror.stale_pools() == ["decode-0"] and mirror.gaps == 1
    tel.ask_keyframe()
    (keyframe,) = tel.due(0.5)
    assert mirror.apply(_wire(*keyframe)) and not mirror.stale_pools()
    np.testing.assert_array_equal(mirror.pools["decode-0"].arrays["owner"], pool.owner)


def test_disabling_stops_dirty_tracking_and_a_delta_before_a_keyframe_is_refused():
    pool, mirror = _pool(), PageMirror()
    tel = PageTelemetry(pool, "decode")
    tel.enable(True)
    tel.due(0.0)
    pool.allocate(1, 2)
    (delta,) = tel.due(0.2)
    assert not mirror.apply(_wire(*delta))  # no base to apply it to
    tel.enable(False)
    pool.allocate(2, 2)
    assert pool.take_dirty().size == 0
    with pytest.raises(ProtocolError):
        mirror.apply(_wire({"op": "pages", "pool": "x", "kind": "weird", "seq": 1}, None))


class _FakeSock:
    """Stands in for the XPUB's receive side only: subscription frames in a queue."""

    def __init__(self, frames):
        self.frames = list(frames)

    def recv_multipart(self, flags=0, copy=True):
        import zmq

        if not self.frames:
            raise zmq.Again()
        return [self.frames.pop(0)]  # an XPUB hands each (un)subscription over as one frame


def test_publisher_tracks_interest_in_pages():
    pub = TelemetryPublisher(_FakeSock([b"\x01metrics", b"garbage", b"\x01pages/decode-0"]))
    assert pub.drain_subscriptions() is True and pub.wants_pages() and pub.bad_subscriptions == 1
    pub.sock.frames = [b"\x00pages/decode-0"]
    assert pub.drain_subscriptions() is True and not pub.wants_pages()
    pub.sock.frames = [b"\x01"]  # everything
    assert pub.drain_subscriptions() is True and pub.wants_pages()
