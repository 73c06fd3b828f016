"""Reconfigure a running engine: validate, report what the change means (capacity, which
workers restart, what is dangerous), apply on request. Live keys reach the workers at once;
a structural change drains the workers it concerns, which restart with it. A restarted
worker that crashes before it is ready brings the previous config back (Rollback)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.capacity import CapacityFinding, check_capacity, exceeding
from engine.config import EngineConfig
from engine.errors import CheckpointError, ConfigError
from engine.model.config import ModelConfig
from engine.model.precheck import precheck
from engine.pool_memory import check_pool_memory
from engine.server.alert_forward import shown_config
from engine.server.audit import AuditLog
from engine.server.worker_handle import WorkerHandle
from engine.server.worker_pool import WorkerPool
from engine.wire.messages import to_worker

LIVE_ENGINE_KEYS = {"scrub_policy", "max_batch", "ownership_policy"}  # workers take them while running
SUPERVISOR_ENGINE_KEYS = {"context_window", "max_batch", "strict_capacity",  # the supervisor's own
                          "max_requests_per_client", "max_tokens_per_client"}


class RunningEngine(Protocol):
    """What reconfiguring needs of the supervisor, and no more."""

    config: EngineConfig
    model_config: ModelConfig
    findings: list[CapacityFinding]
    allow_faults: bool
    workers: WorkerPool
    audit: AuditLog

    def take_config(self, config: EngineConfig, model: ModelConfig, findings: list[CapacityFinding],
                    live: to_worker.Configure, restart: set[str]) -> None:
        """Make `config` the running one: `live` (a configure op) to the workers at once, the
        `restart` workers drained (they restart when their last request ends)."""

    def alert(self, kind: str, severity: str, detail: str, *, subject: str = "", condition: bool = False,
              **fields: Any) -> None: ...


@dataclass
class Rollback:
    """The config before an applied reconfigure, until the workers it restarts are ready:
    a restarted worker that crashes before its hello brings the old config back."""

    config: EngineConfig
    model_config: ModelConfig
    findings: list[CapacityFinding]
    waiting: set[str]  # restarted workers not yet ready with the new config


class Reconfigure:
    def __init__(self, engine: RunningEngine):
        self.engine = engine
        self.rollback: Rollback | None = None  # while a reconfigure is being taken up

    def __call__(self, changes: dict[str, Any], *, apply: bool) -> dict[str, Any]:
        """Validate `changes` against the running config and report the capacity consequence
        and which workers must restart; apply them only when `apply`. Raises ConfigError."""
        engine = self.engine
        try:
            new = engine.config.replace(**changes)
        except (ValueError, TypeError, AttributeError) as exc:  # ConfigError names the key; the rest say what they can
            raise ConfigError(f"reconfigure refused: {exc}") from None
        new.check_faults_allowed(engine.allow_faults)
        model = engine.model_config
        if new.model != engine.config.model:
            try:  # what can be checked before any worker loads it: readable, supported, weights there
                model = precheck(new.model.resolved_path())
            except CheckpointError as exc:
                raise ConfigError(f"reconfigure refused: model.path = {new.model.path!r}: {exc}") from None
        check_pool_memory(new, model)
        findings = check_capacity(new, model_max_positions=model.max_position_embeddings)
        restart = needs_restart(engine.config, new, engine.workers.values())
        result = {
            "valid": True, "applied": False, "findings": [f.to_dict() for f in findings],
            "exceeds": bool(exceeding(findings)), "restart": sorted(restart), "config": new.to_dict(),
            "consequence": [f.message() for f in findings], "dangerous": new.dangerous(),
        }
        if apply:
            if new.engine.strict_capacity and exceeding(findings):
                raise ConfigError("strict capacity refuses: " + "; ".join(f.message() for f in exceeding(findings)))
            if restart:  # kept until every restarted worker said hello with the new config
                self.rollback = Rollback(engine.config, engine.model_config, engine.findings, set(restart))
            self._take(new, model, findings, restart)  # findings: checked against this model already
            engine.audit.record("engine", "reconfigured", config=shown_config(new), restart=sorted(restart))
            result["applied"] = True
        return result

    def worker_ready(self, name: str) -> None:
        """A worker said hello: when it was one a reconfigure restarted, that part is done."""
        if self.rollback is not None:
            self.rollback.waiting.discard(name)
            if not self.rollback.waiting:
                self.rollback = None  # every restarted worker runs the new config: it stays

    def worker_crashed(self, name: str) -> None:
        """A worker crashed: when a reconfigure restarted it and it never came up, go back to the
        config before it, with an alert; every worker that took the new one restarts again."""
        rollback, engine = self.rollback, self.engine
        if rollback is None or name not in rollback.waiting:
            return
        failed = engine.config
        self.rollback = None
        # the workers that came up with the new config restart with the old one; the crashed one
        # is restarted by the restart policy, with the old one too
        again = needs_restart(failed, rollback.config, engine.workers.values()) - rollback.waiting
        self._take(rollback.config, rollback.model_config, rollback.findings, again)
        engine.alert("reconfigure_rolled_back", "error",
                     f"worker {name} crashed while starting with the new configuration "
                     f"({engine.workers[name].reason}); the previous configuration is back and the workers "
                     f"restart with it", subject="engine", worker=name)
        engine.audit.record("engine", "reconfigure_rolled_back", worker=name, config=shown_config(rollback.config))

    def _take(self, config: EngineConfig, model: ModelConfig, findings: list[CapacityFinding],
              restart: set[str]) -> None:
        """Make `config` the running one (an apply, or a rollback)."""
        wire = config.to_dict()
        live = to_worker.Configure(engine={k: v for k, v in wire["engine"].items() if k in LIVE_ENGINE_KEYS},
                                   defences=wire["defences"], faults=wire["faults"])
        self.engine.take_config(config, model, findings, live, restart)


def needs_restart(old: EngineConfig, new: EngineConfig, workers: Iterable[WorkerHandle]) -> set[str]:
    """Workers whose process must restart for the change to take effect."""
    restart = set()
    old_d, new_d = old.to_dict(), new.to_dict()
    engine_changed = {k for k in new_d["engine"] if new_d["engine"][k] != old_d["engine"][k]}
    structural = engine_changed - LIVE_ENGINE_KEYS - SUPERVISOR_ENGINE_KEYS
    for worker in workers:
        # a new prefix-cache scope: the pages cached under the old one must not be found under it
        if structural or new_d["model"] != old_d["model"] or new_d["audit"] != old_d["audit"] or \
                new_d["prefix_cache"] != old_d["prefix_cache"] or \
                new_d["pools"][worker.role] != old_d["pools"][worker.role] or \
                new_d["workers"]["threads"] != old_d["workers"]["threads"]:
            restart.add(worker.name)
    if any(new_d["workers"][role] != old_d["workers"][role] for role in ("prefill", "decode")):
        raise ConfigError("the number of workers cannot change while serving; restart the engine")
    return restart
