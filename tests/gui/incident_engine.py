"""A real engine reproducing the 2026 incident on loopback, for the app's tests: the window
exceeds the prefill pool (capacity banner), faults are on (faults banner), and with the
manifest and writer-tag checks off each wave makes requests read other requests' data
(data-crossed banner, a critical ownership_violation alert)."""

from __future__ import annotations

import random

from engine.client.local_server import LocalServer, write_config
from engine.config import EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections

SCENARIO = SCENARIOS["incident-placeholder"]
LEAKING = {"defences": {"manifest_check": False, "writer_tag_check": False}}


class IncidentEngine:
    def __init__(self, directory, bind: str = "tcp://127.0.0.1:0", seed: int = 7):
        self.config = write_config(directory / "incident.toml", EngineConfig().replace(canaries={"enabled": False}),
                                   **config_sections(SCENARIO))
        self.rng = random.Random(seed)
        self.bind = bind
        self.server = self.client = None
        self.start()

    def start(self) -> None:
        """Start (again, on the same address and config) and turn the two checks off."""
        self.server = LocalServer(self.config, "--allow-faults", bind=self.bind)
        self.client = self.server.client(timeout_s=300)
        self.server.wait_workers(self.client)
        self.client.reconfigure(LEAKING, apply=True)
        self.server.wait_workers(self.client)

    @property
    def control(self) -> str:
        return self.server.control

    def wave(self, scale: float = 0.5) -> list[dict]:
        """One wave of the incident workload; returns each request's end."""
        return run_workload(self.client, SCENARIO.workload(self.rng, scale))

    def kill(self) -> None:
        """kill -9 of serve (its workers die with it)."""
        self.client.close()
        self.server.kill()
        self.server.stop()  # closes what is left of it (its clients, its pipe)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.server.stop()
