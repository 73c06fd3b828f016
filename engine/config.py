"""EngineConfig: the TOML file an operator edits, validated field by field.

Every mistake is a ConfigError naming the key, the value and the allowed range;
unknown keys are errors too (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.errors import ConfigError
from engine.wire.defences import DEFENCES, FAULTS, weakening_keys

REPO_ROOT = Path(__file__).resolve().parent.parent
# the default model: repeats its context, any bytes (built by resources/models/build_copy_model.py), so data
# that crosses requests shows in the text
DEFAULT_MODEL_DIR = REPO_ROOT / "resources" / "models" / "pagewarden-copy"
# a random checkpoint of the same vocabulary, with grouped-query attention (4 query, 2 KV heads)
TINY_RANDOM_MODEL_DIR = REPO_ROOT / "resources" / "models" / "pagewarden-tiny-random"
DEFAULT_CONFIG_PATH = REPO_ROOT / "resources" / "configs" / "default.toml"

POOL_NAMES = ("prefill", "decode")
SCRUB_POLICIES = ("zero", "poison", "none")
KERNEL_CHOICES = ("auto", "triton", "torch")
OWNERSHIP_POLICIES = ("abort", "report_only")
DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_WEIGHT_LAYOUTS = ("packed", "plain")  # engine/model/cpu_linear.py
MAX_TOKENS = 1 << 31  # page tables and kernels index tokens with int32
WORKER_ROLES = ("prefill", "decode")  # the worker processes' roles, in start order
MAX_WORKERS_PER_ROLE = 64  # prefill (and decode) worker processes of one supervisor
CORE_SLOTS = len(WORKER_ROLES) * MAX_WORKERS_PER_ROLE  # slots of the core-share file (engine/workers/core_share.py)


def core_slot(role: str, index: int) -> int:
    """The core-share slot of worker `index` of `role`: one per worker a supervisor can hold."""
    if not 0 <= index < MAX_WORKERS_PER_ROLE:
        raise ValueError(f"worker index {index} is out of range: at most {MAX_WORKERS_PER_ROLE} per role")
    return WORKER_ROLES.index(role) * MAX_WORKERS_PER_ROLE + index


@dataclass(frozen=True)
class ModelSection:
    path: str = ""  # empty: the embedded default model
    dtype: str = "auto"
    device: str = "auto"
    # "packed": on CPU in float32, large weights in oneDNN's packed layout (faster decode)
    cpu_weight_layout: str = "packed"

    def resolved_path(self) -> Path:
        return Path(self.path) if self.path else DEFAULT_MODEL_DIR


@dataclass(frozen=True)
class EngineSection:
    context_window: int = 2048
    page_size: int = 16
    max_batch: int = 16
    max_prefill_tokens: int = 4096
    scrub_policy: str = "zero"
    kernels: str = "auto"
    strict_capacity: bool = False
    ownership_policy: str = "abort"  # abort | report_only (for measurement)
    # One client's share of the queue: requests, and tokens (prompt + max_new_tokens), queued
    # or running at once; past it a submit is refused (budget_exceeded) until some end.
    max_requests_per_client: int = 1024
    max_tokens_per_client: int = 8_388_608


# [defences] and [faults]: one boolean per switch of engine/wire/defences.py (declared there once)
DefencesSection = dataclasses.make_dataclass(
    "DefencesSection", [(d.name, bool, field(default=True)) for d in DEFENCES], frozen=True,
    namespace={"__doc__": "The isolation defences, all on by default. Turning one off needs --allow-faults: it "
                          "exists to show, one at a time, what the others catch."})
FaultsSection = dataclasses.make_dataclass(
    "FaultsSection", [(f.name, bool, field(default=False)) for f in FAULTS], frozen=True,
    namespace={"__doc__": "Injected bugs (only with --allow-faults): each breaks one defence's assumption."})
DefencesSection.__module__ = FaultsSection.__module__ = __name__  # pickle and repr find them here


@dataclass(frozen=True)
class CanariesSection:
    enabled: bool = True
    per_minute: int = 3  # canary requests the supervisor sends on its own
    marker_chars: int = 32  # length of each canary's random marker


@dataclass(frozen=True)
class AuditSection:
    # Per-token content owner beside every pool: what incident scoping and the reproduction
    # ground truth are computed from.
    provenance: bool = True
    # The evidence journal (SQLite, engine/evidence/): "auto" is a file per engine under the state
    # directory ($PAGEWARDEN_STATE_DIR, else $XDG_STATE_HOME/pagewarden, else
    # ~/.local/state/pagewarden), named by the control endpoint; a path puts it there; "" turns
    # it off (nothing survives a restart then).
    journal: str = "auto"
    # Pruned oldest first past either bound. The incident workload writes about 6 KB per request
    # (0.77 MB per three waves, bench/RESULTS.md); served nonstop at this machine's ~10 requests/s
    # that is ~37 GB a week, so the default keeps a week of it on a workstation disk.
    journal_max_age_days: int = 7
    journal_max_mb: int = 40960


@dataclass(frozen=True)
class AlertsSection:
    # Forward every alert to an Alertmanager-compatible receiver: POST <webhook_url>/api/v2/alerts
    # (engine/server/alert_forward.py). Empty: not forwarded.
    webhook_url: str = ""
    webhook_resend_s: int = 60  # firing alerts are sent again this often (Alertmanager expects resends)
    webhook_queue: int = 1000  # alert changes waiting to be sent; past it the oldest is dropped and counted
    generator_url: str = ""  # a link sent with every alert (e.g. the operator's dashboard); empty: none


PREFIX_CACHE_SCOPES = ("tenant", "global", "off")


@dataclass(frozen=True)
class PrefixCacheSection:
    # Which requests may share cached prompt pages. "tenant": those of the same salt, which is
    # the request's cache_salt when it gives one, else its tenant; "global": the same
    # cache_salt (none counts as one salt), whatever the tenant, as vLLM does; "off": no
    # sharing. Sharing across tenants is a timing side channel (prompts recovered token by
    # token through cache hits), so it is not the default.
    scope: str = "tenant"


RESTART_POLICIES = ("on-failure", "never")
MAX_URL_CHARS = 2048


@dataclass(frozen=True)
class WorkersSection:
    prefill: int = 1  # prefill worker processes, each with its own prefill pool
    decode: int = 1  # decode worker processes, each with its own decode pool
    # A crashed worker is started again after restart_backoff_ms, doubled for each crash in a
    # row (at most 60 s), up to restart_limit crashes in a row; a worker that stayed ready for
    # a minute starts the count afresh. "never": a crashed worker stays down.
    restart: str = "on-failure"
    restart_limit: int = 5
    restart_backoff_ms: int = 1000
    # A request no worker of a role can take (none ready) fails after this long with the
    # reason; at once when none of that role can come back (stopped, or crashed for good).
    unplaced_timeout_s: int = 60
    # Compute threads of each worker process (torch/OpenMP). 0: on CPU, for a model with 8 MiB
    # of projection weights or more, the cores this process may use, divided before each layer
    # among the workers computing at that moment (all of them for a worker computing alone;
    # engine/workers/core_share.py); for a smaller model on CPU, and on a GPU, the cores
    # divided among the workers once. More threads than cores across processes make OpenMP's
    # waiting threads spin against each other: beside one busy core, the e2e scenarios took
    # 262 s with two threads per worker, 167 s with one.
    threads: int = 0

    def threads_per_worker(self, cores: int) -> int:
        """The threads a worker starts with (a CPU worker with `threads` 0 whose model is
        `worth_sharing` then follows its share of the cores; engine/workers/core_share.py)."""
        return self.threads or max(1, cores // (self.prefill + self.decode))


@dataclass(frozen=True)
class PoolConfig:
    name: str
    pages: int

    def capacity_tokens(self, page_size: int) -> int:
        return self.pages * page_size


@dataclass(frozen=True)
class EngineConfig:
    model: ModelSection = field(default_factory=ModelSection)
    engine: EngineSection = field(default_factory=EngineSection)
    workers: WorkersSection = field(default_factory=WorkersSection)
    defences: DefencesSection = field(default_factory=DefencesSection)
    faults: FaultsSection = field(default_factory=FaultsSection)
    canaries: CanariesSection = field(default_factory=CanariesSection)
    audit: AuditSection = field(default_factory=AuditSection)
    alerts: AlertsSection = field(default_factory=AlertsSection)
    prefix_cache: PrefixCacheSection = field(default_factory=PrefixCacheSection)
    pools: dict[str, PoolConfig] = field(
        default_factory=lambda: {n: PoolConfig(n, 4096) for n in POOL_NAMES}
    )
    source: str = "<defaults>"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in the TOML's shape (for status, telemetry and snapshots)."""
        return {
            "model": dataclasses.asdict(self.model),
            "engine": dataclasses.asdict(self.engine),
            "workers": dataclasses.asdict(self.workers),
            "defences": dataclasses.asdict(self.defences),
            "faults": dataclasses.asdict(self.faults),
            "canaries": dataclasses.asdict(self.canaries),
            "audit": dataclasses.asdict(self.audit),
            "alerts": dataclasses.asdict(self.alerts),
            "prefix_cache": dataclasses.asdict(self.prefix_cache),
            "pools": {n: {"pages": p.pages} for n, p in self.pools.items()},
        }

    def dangerous(self) -> list[str]:
        """Defences turned off and faults turned on, and the two engine keys that switch an
        invariant's enforcement off by another name (I1's abort, I5's scrub): what needs
        --allow-faults."""
        off = [f"defences.{k} = false" for k, v in dataclasses.asdict(self.defences).items() if not v]
        on = [f"faults.{k} = true" for k, v in dataclasses.asdict(self.faults).items() if v]
        weaker = [f"engine.{key.name} = {value!r}" for key, value in weakening_keys(dataclasses.asdict(self.engine))]
        return off + on + weaker

    def check_faults_allowed(self, allow_faults: bool) -> None:
        """Raises ConfigError naming each defence turned off or fault turned on, unless allowed."""
        dangerous = self.dangerous()
        if dangerous and not allow_faults:
            raise ConfigError(f"{', '.join(dangerous)}: turning defences off or faults on needs "
                              f"`serve --allow-faults` (it exists to reproduce incidents)")

    @property
    def scrubs_freed_pages(self) -> bool:
        """I5 in effect: the scrub defence on and the skip_scrub fault off."""
        return self.defences.scrub and not self.faults.skip_scrub

    def replace(self, **sections: dict[str, Any]) -> "EngineConfig":
        """A validated copy with some keys changed, e.g. replace(engine={"page_size": 32})."""
        merged = self.to_dict()
        for name, values in sections.items():
            if name not in merged:
                raise ConfigError(f"unknown section '{name}' (known: {', '.join(merged)})")
            if not isinstance(values, dict):
                raise ConfigError(f"section '{name}' must be a table, got {values!r}")
            if name == "pools":
                for pool, pool_values in values.items():
                    if not isinstance(pool_values, dict):
                        raise ConfigError(f"pools.{pool} must be a table like {{pages = 4096}}, got {pool_values!r}")
                    merged["pools"].setdefault(pool, {}).update(pool_values)
            else:
                merged[name].update(values)
        return config_from_dict(merged, source=self.source)


def load_config(path: str | Path | None = None) -> EngineConfig:
    """Read and validate a TOML config; None reads the shipped default.

    Raises ConfigError for a missing file, bad TOML or any invalid value.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # found by bench/fuzz.py: tables or arrays nested thousands deep
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    except ValueError as exc:  # found by bench/fuzz.py: an integer past Python's 4,300 digits
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    model = data.get("model")
    if isinstance(model, dict) and model.get("path"):
        # A relative model path is relative to the config file, not to the caller's cwd.
        model_path = Path(model["path"])
        if not model_path.is_absolute():
            model["path"] = str((path.parent / model_path).resolve())
    return config_from_dict(data, source=str(path))


def config_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> EngineConfig:
    """Validate a TOML-shaped dict. Raises ConfigError naming the key and the limit."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: config must be a table, got {type(data).__name__}")
    _no_unknown(data, {"model", "engine", "workers", "defences", "faults", "canaries", "audit", "alerts",
                       "prefix_cache", "pools"}, "", source)
    model = _section(data, "model", ModelSection, source)
    engine = _section(data, "engine", EngineSection, source)
    workers = _section(data, "workers", WorkersSection, source)
    extra = {name: _section(data, name, cls, source) for name, cls in (
        ("defences", DefencesSection), ("faults", FaultsSection), ("canaries", CanariesSection),
        ("audit", AuditSection), ("alerts", AlertsSection), ("prefix_cache", PrefixCacheSection))}
    pools = _pools(data.get("pools", {n: {"pages": 4096} for n in POOL_NAMES}), source)
    _check_choices(model, engine, source)
    if extra["prefix_cache"].scope not in PREFIX_CACHE_SCOPES:
        raise ConfigError(f"{source}: prefix_cache.scope = {extra['prefix_cache'].scope!r} is not one of "
                          f"{', '.join(PREFIX_CACHE_SCOPES)}")
    if workers.restart not in RESTART_POLICIES:
        raise ConfigError(f"{source}: workers.restart = {workers.restart!r} is not one of {', '.join(RESTART_POLICIES)}")
    for key in ("webhook_url", "generator_url"):
        try:
            check_http_url(f"alerts.{key}", getattr(extra["alerts"], key))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return EngineConfig(model=model, engine=engine, workers=workers, pools=pools, source=source, **extra)


# ---- validation helpers -------------------------------------------------------------

_RANGES = {
    "context_window": (1, MAX_TOKENS - 1),
    "page_size": (1, 1024),
    "max_batch": (1, 4096),
    "max_prefill_tokens": (1, MAX_TOKENS - 1),
    "pages": (1, (1 << 31) - 1),
    "prefill": (1, MAX_WORKERS_PER_ROLE),
    "decode": (1, MAX_WORKERS_PER_ROLE),
    "per_minute": (0, 600),
    "max_requests_per_client": (1, 1_000_000),
    "max_tokens_per_client": (1, MAX_TOKENS - 1),
    "restart_limit": (0, 1000),
    "restart_backoff_ms": (0, 60_000),
    "unplaced_timeout_s": (1, 86_400),
    "threads": (0, 1024),
    "marker_chars": (8, 128),
    "webhook_resend_s": (1, 3600),
    "webhook_queue": (1, 100_000),
    "journal_max_age_days": (1, 3650),
    "journal_max_mb": (16, 1 << 20),
}


def check_http_url(name: str, value: str) -> str:
    """`value` when empty or an http(s) URL with a host; raises ConfigError naming `name`, the
    value and what is allowed. A user or password in it is refused: status shows the config
    to every client."""
    if not value:
        return value
    shown = value if len(value) <= 200 else value[:200] + "..."
    if len(value) > MAX_URL_CHARS:
        raise ConfigError(f"{name} = {shown!r} is {len(value):,} characters long: at most {MAX_URL_CHARS:,}")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{name} = {shown!r} holds whitespace or control characters")
    try:
        parts = urlsplit(value)
        if parts.port == 0:  # raises ValueError itself past 65535 or for a port not a number
            raise ValueError("port 0")
    except ValueError as exc:
        raise ConfigError(f"{name} = {shown!r} is not a valid URL ({exc}); ports are 1..65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name} = {shown!r} is not an http:// or https:// URL with a host "
                          f"(e.g. http://alertmanager:9093)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{name} must not carry a user or password (status shows the config to every "
                          f"client): {parts.scheme}://{parts.hostname}...")
    return value


def _no_unknown(table: dict, known: set[str], prefix: str, source: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(
                f"{source}: unknown key '{prefix}{key}' (known: {', '.join(sorted(known))})"
            )


def _typed(key: str, value: Any, kind: type, source: str) -> Any:
    # bool is an int in Python; a boolean where a number belongs is still a mistake.
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{source}: {key} must be an integer, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, got {value!r}")
    short = key.rsplit(".", 1)[-1]
    if kind is int and short in _RANGES:
        low, high = _RANGES[short]
        if not low <= value <= high:
            raise ConfigError(
                f"{source}: {key} = {value:,} is out of range: must be between {low:,} and {high:,}"
            )
    return value


def _section(data: dict, name: str, cls: type, source: str):
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{name}] must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _no_unknown(table, set(fields), f"{name}.", source)
    values = {}
    for key, value in table.items():
        kind = type(fields[key].default)
        values[key] = _typed(f"{name}.{key}", value, kind, source)
    return cls(**values)


def _pools(table: Any, source: str) -> dict[str, PoolConfig]:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [pools] must be a table, got {table!r}")
    _no_unknown(table, set(POOL_NAMES), "pools.", source)
    pools = {}
    for name in POOL_NAMES:
        if name not in table:
            raise ConfigError(f"{source}: missing [pools.{name}] (both pools are required)")
        pool = table[name]
        if not isinstance(pool, dict):
            raise ConfigError(f"{source}: [pools.{name}] must be a table, got {pool!r}")
        _no_unknown(pool, {"pages"}, f"pools.{name}.", source)
        if "pages" not in pool:
            raise ConfigError(f"{source}: pools.{name}.pages is required")
        pools[name] = PoolConfig(name, _typed(f"pools.{name}.pages", pool["pages"], int, source))
    return pools


def _check_choices(model: ModelSection, engine: EngineSection, source: str) -> None:
    choices = [
        ("model.dtype", model.dtype, DTYPES),
        ("model.cpu_weight_layout", model.cpu_weight_layout, CPU_WEIGHT_LAYOUTS),
        ("engine.scrub_policy", engine.scrub_policy, SCRUB_POLICIES),
        ("engine.kernels", engine.kernels, KERNEL_CHOICES),
        ("engine.ownership_policy", engine.ownership_policy, OWNERSHIP_POLICIES),
    ]
    for key, value, allowed in choices:
        if value not in allowed:
            raise ConfigError(f"{source}: {key} = {value!r} is not one of {', '.join(allowed)}")
    if not _valid_device(model.device):
        raise ConfigError(
            f"{source}: model.device = {model.device!r} is not one of auto, cpu, cuda, cuda:N"
        )
    if engine.page_size & (engine.page_size - 1):
        raise ConfigError(
            f"{source}: engine.page_size = {engine.page_size} must be a power of two"
        )


def _valid_device(device: str) -> bool:
    if device in ("auto", "cpu", "cuda"):
        return True
    prefix, _, index = device.partition(":")
    return prefix == "cuda" and index.isdigit()
