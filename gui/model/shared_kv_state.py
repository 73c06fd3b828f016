"""SharedKvEventState: a KvEventState written by one thread and read by another.

The KV-event thread's watcher changes it only through the methods below, each under
`lock`; the GUI thread holds `lock` while it reads (KvEventMap.update, the status texts),
so it never sees half of a batch. Qt-free.
"""

from __future__ import annotations

import threading

from engine.adapters.kv_event_state import KvEventState


class SharedKvEventState(KvEventState):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def apply(self, batch, endpoint: str) -> None:
        with self.lock:
            super().apply(batch, endpoint)

    def record_refusal(self, endpoint: str, message: str, seq: int | None = None) -> None:
        with self.lock:
            super().record_refusal(endpoint, message, seq)

    def record_gap(self, endpoint: str, expected: int, got: int, filled: bool) -> None:
        with self.lock:
            super().record_gap(endpoint, expected, got, filled)

    def record_replay(self, batches: int, complete: bool) -> None:
        with self.lock:
            super().record_replay(batches, complete)

    def record_replay_refusal(self, endpoint: str, message: str, seq: int | None = None) -> None:
        with self.lock:
            super().record_replay_refusal(endpoint, message, seq)

    def record_history(self, batches: int, complete: bool) -> None:
        with self.lock:
            super().record_history(batches, complete)

    def record_notice(self, message: str) -> None:
        with self.lock:
            super().record_notice(message)

    def record_duplicate(self) -> None:
        with self.lock:
            super().record_duplicate()

    def record_restart(self, endpoint: str) -> None:
        with self.lock:
            super().record_restart(endpoint)

    def record_seq_jump(self, endpoint: str, last: int, seq: int, how: str, outcome: str) -> None:
        with self.lock:
            super().record_seq_jump(endpoint, last, seq, how, outcome)

    def record_disconnect(self, endpoint: str, message: str) -> None:
        with self.lock:
            super().record_disconnect(endpoint, message)
