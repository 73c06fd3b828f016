"""Reconfigure a running engine: validate, report what the change means (capacity, which
workers restart, what is dangerous), apply on request. Live keys reach the workers at once;
a structural change drains the workers it concerns, which restart with it."""

from __future__ import annotations

from dataclasses import dataclass

from engine.capacity import check_capacity, exceeding
from engine.errors import CheckpointError, ConfigError
from engine.model.precheck import precheck
from engine.pool_memory import check_pool_memory
from engine.server.alert_forward import shown_config

LIVE_ENGINE_KEYS = {"scrub_policy", "max_batch", "ownership_policy"}  # workers take them while running
SUPERVISOR_ENGINE_KEYS = {"context_window", "max_batch", "strict_capacity",  # the supervisor's own
                          "max_requests_per_client", "max_tokens_per_client"}


def reconfigure(sup, changes: dict, *, apply: bool) -> dict:
    """Validate `changes` against the running config and report the capacity consequence
    and which workers must restart; apply them only when `apply`. Raises ConfigError."""
    try:
        new = sup.config.replace(**changes)
    except (ValueError, TypeError, AttributeError) as exc:  # ConfigError names the key; the rest say what they can
        raise ConfigError(f"reconfigure refused: {exc}") from None
    new.check_faults_allowed(sup.allow_faults)
    model = sup.model_config
    if new.model != sup.config.model:
        try:  # what can be checked before any worker loads it: readable, supported, weights there
            model = precheck(new.model.resolved_path())
        except CheckpointError as exc:
            raise ConfigError(f"reconfigure refused: model.path = {new.model.path!r}: {exc}") from None
    check_pool_memory(new, model)
    findings = check_capacity(new, model_max_positions=model.max_position_embeddings)
    restart = needs_restart(sup.config, new, sup.workers.values())
    result = {
        "valid": True, "applied": False, "findings": [f.to_dict() for f in findings],
        "exceeds": bool(exceeding(findings)), "restart": sorted(restart), "config": new.to_dict(),
        "consequence": [f.message() for f in findings], "dangerous": new.dangerous(),
    }
    if apply:
        if new.engine.strict_capacity and exceeding(findings):
            raise ConfigError("strict capacity refuses: " + "; ".join(f.message() for f in exceeding(findings)))
        _apply(sup, new, model, findings, restart)
        result["applied"] = True
    return result


@dataclass
class Rollback:
    """The config before an applied reconfigure, until the workers it restarts are ready:
    a restarted worker that crashes before its hello brings the old config back."""

    config: object
    model_config: object
    findings: list
    waiting: set[str]  # restarted workers not yet ready with the new config


def worker_ready(sup, name: str) -> None:
    """A worker said hello: when it was one a reconfigure restarted, that part is done."""
    if sup.rollback is not None:
        sup.rollback.waiting.discard(name)
        if not sup.rollback.waiting:
            sup.rollback = None  # every restarted worker runs the new config: it stays


def worker_crashed(sup, name: str) -> None:
    """A worker crashed: when a reconfigure restarted it and it never came up, go back to the
    config before it, with an alert; every worker that took the new one restarts again."""
    rollback = sup.rollback
    if rollback is None or name not in rollback.waiting:
        return
    failed = sup.config
    sup.rollback = None
    # the workers that came up with the new config restart with the old one; the crashed one
    # is restarted by the restart policy, with the old one too
    again = needs_restart(failed, rollback.config, sup.workers.values()) - rollback.waiting
    _take(sup, rollback.config, rollback.model_config, rollback.findings, again)
    sup.alert("reconfigure_rolled_back", "error",
              f"worker {name} crashed while starting with the new configuration "
              f"({sup.workers[name].reason}); the previous configuration is back and the workers "
              f"restart with it", subject="engine", worker=name)
    sup.audit.record("engine", "reconfigure_rolled_back", worker=name, config=shown_config(rollback.config))


def needs_restart(old, new, workers) -> set[str]:
    """Workers whose process must restart for the change to take effect."""
    restart = set()
    old_d, new_d = old.to_dict(), new.to_dict()
    engine_changed = {k for k in new_d["engine"] if new_d["engine"][k] != old_d["engine"][k]}
    structural = engine_changed - LIVE_ENGINE_KEYS - SUPERVISOR_ENGINE_KEYS
    for worker in workers:
        if structural or new_d["model"] != old_d["model"] or new_d["audit"] != old_d["audit"] or \
                new_d["pools"][worker.role] != old_d["pools"][worker.role] or \
                new_d["workers"]["threads"] != old_d["workers"]["threads"]:
            restart.add(worker.name)
    if any(new_d["workers"][role] != old_d["workers"][role] for role in ("prefill", "decode")):
        raise ConfigError("the number of workers cannot change while serving; restart the engine")
    return restart


def _apply(sup, new, model, findings, restart: set[str]) -> None:
    if restart:  # kept until every restarted worker said hello with the new config
        sup.rollback = Rollback(sup.config, sup.model_config, sup.findings, set(restart))
    _take(sup, new, model, findings, restart)  # findings: checked against this model already
    sup.audit.record("engine", "reconfigured", config=shown_config(new), restart=sorted(restart))


def _take(sup, config, model, findings, restart: set[str]) -> dict:
    """Make `config` the running one (an apply, or a rollback): live settings to the workers at
    once, the `restart` workers drained (they restart when their last request ends). Returns
    the config's dict."""
    wire = config.to_dict()
    sup.config, sup.model_config, sup.findings = config, model, findings
    sup.configure_canaries(config.canaries)
    sup.configure_forwarding(config.alerts)
    sup.broadcast({"op": "configure", "engine": {k: v for k, v in wire["engine"].items() if k in LIVE_ENGINE_KEYS},
                   "defences": wire["defences"], "faults": wire["faults"]})
    for name in restart:
        sup.workers.drain(sup.workers[name])
    sup.publish_capacity()
    sup.publish_workers()
    return wire
