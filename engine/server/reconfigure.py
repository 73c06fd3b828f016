"""Reconfigure a running engine: validate, report what the change means (capacity, which
workers restart, what is dangerous), apply on request. Live keys reach the workers at once;
a structural change drains the workers it concerns, which restart with it."""

from __future__ import annotations

from engine.capacity import exceeding
from engine.errors import ConfigError

LIVE_ENGINE_KEYS = {"scrub_policy", "max_batch", "ownership_policy"}  # workers take them while running
SUPERVISOR_ENGINE_KEYS = {"context_window", "max_batch", "strict_capacity"}  # the supervisor's own


def reconfigure(sup, changes: dict, *, apply: bool) -> dict:
    """Validate `changes` against the running config and report the capacity consequence
    and which workers must restart; apply them only when `apply`. Raises ConfigError."""
    try:
        new = sup.config.replace(**changes)
    except (ValueError, TypeError, AttributeError) as exc:  # ConfigError names the key; the rest say what they can
        raise ConfigError(f"reconfigure refused: {exc}") from None
    new.check_faults_allowed(sup.allow_faults)
    findings = sup._capacity(new)  # the supervisor's one capacity check, for the new config
    restart = needs_restart(sup.config, new, sup.workers.values())
    result = {
        "valid": True, "applied": False, "findings": [f.to_dict() for f in findings],
        "exceeds": bool(exceeding(findings)), "restart": sorted(restart), "config": new.to_dict(),
        "consequence": [f.message() for f in findings], "dangerous": new.dangerous(),
    }
    if apply:
        if new.engine.strict_capacity and exceeding(findings):
            raise ConfigError("strict capacity refuses: " + "; ".join(f.message() for f in exceeding(findings)))
        _apply(sup, new, findings, restart)
        result["applied"] = True
    return result


def needs_restart(old, new, workers) -> set[str]:
    """Workers whose process must restart for the change to take effect."""
    restart = set()
    old_d, new_d = old.to_dict(), new.to_dict()
    engine_changed = {k for k in new_d["engine"] if new_d["engine"][k] != old_d["engine"][k]}
    structural = engine_changed - LIVE_ENGINE_KEYS - SUPERVISOR_ENGINE_KEYS
    for worker in workers:
        if structural or new_d["model"] != old_d["model"] or new_d["audit"] != old_d["audit"] or \
                new_d["pools"][worker.role] != old_d["pools"][worker.role]:
            restart.add(worker.name)
    if any(new_d["workers"][role] != old_d["workers"][role] for role in ("prefill", "decode")):
        raise ConfigError("the number of workers cannot change while serving; restart the engine")
    return restart


def _apply(sup, new, findings, restart: set[str]) -> None:
    wire = new.to_dict()
    live = {k: v for k, v in wire["engine"].items() if k in LIVE_ENGINE_KEYS}
    sup.config = new
    sup.findings = findings  # checked above against the same model: not computed again
    sup.canaries.configure(new.canaries)
    sup.broadcast({"op": "configure", "engine": live, "defences": wire["defences"], "faults": wire["faults"]})
    for name in restart:
        sup.workers.drain(sup.workers[name])  # restarts when its last request ends
    sup.publish_capacity()
    sup.publish_workers()
    sup.audit.record("engine", "reconfigured", config=wire, restart=sorted(restart))
