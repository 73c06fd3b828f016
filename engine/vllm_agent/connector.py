"""PageWardenConnector: a vLLM v1 KV connector that moves no KV at all; it watches.

Loaded by vLLM (no change to vLLM's source) with

    --kv-transfer-config '{"kv_connector": "PageWardenConnector", "kv_role": "kv_producer",
      "kv_connector_module_path": "engine.vllm_agent.connector",
      "kv_connector_extra_config": {"control": "tcp://127.0.0.1:7600"}}'

(this repository on PYTHONPATH; docs/vllm-agent.md). Written against vLLM 0.32.0.

kv_role: kv_producer. The agent loads no KV, and a consumer role (kv_consumer, kv_both)
changes vLLM itself: under async scheduling its scheduler then defers returning a finished
request's blocks to the pool by a step (`defer_block_free`), in case a connector is still
loading into them. A consumer role is accepted (MultiConnector with a real consumer needs
it) with a warning.

On the scheduler side vLLM binds its KVCacheManager (`bind_kv_cache_manager`) and calls
`build_connector_meta` once per step, between steps: there the connector copies a
PoolSnapshot out of the manager's block pool and per-request block tables, at most every
`snapshot_period_s`, and hands it to the AgentServer's thread. Checks and publishing run there.
`take_events`, called after each step's finished requests are freed, snapshots once more when
some finished and none is left running (vLLM goes idle then). State that lives shorter than the period between two
snapshots is not seen. The worker side does nothing.

extra config keys: control (ROUTER endpoint, loopback unless CURVE, default
tcp://127.0.0.1:7600), telemetry (XPUB endpoint, default control's port + 1),
snapshot_period_s (default 0.05), tenant_field (a key of the requests' `vllm_xargs` naming
their tenant, for `cross_tenant_share`: engine/vllm_agent/tenant_share.py), test_fault (tests
only: engine/vllm_agent/test_faults.py).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from engine.vllm_agent import test_faults
from engine.vllm_agent.checks import capacity_finding
from engine.vllm_agent.snapshot import BlockView, PoolSnapshot, RequestView
from engine.vllm_agent.tenant_share import salt_tag

logger = logging.getLogger(__name__)
DEFAULT_CONTROL = "tcp://127.0.0.1:7600"
MAX_TENANT_CHARS = 64  # a tenant name comes from the request: alerts carry no more of it than this
HASH_GROUP_SUFFIX = 4  # vLLM's BlockHashWithGroupId: the block hash, then a 4-byte group id


@dataclass
class _NoMeta(KVConnectorMetadata):
    pass


def _next_port(endpoint: str) -> str:
    head, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"telemetry endpoint not given and control {endpoint!r} has no port to add 1 to")
    return f"{head}:{int(port) + 1}"


class PageWardenConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.control = str(extra.get("control") or os.environ.get("PAGEWARDEN_VLLM_AGENT") or DEFAULT_CONTROL)
        self.telemetry = str(extra.get("telemetry") or _next_port(self.control))
        self.metrics = str(extra["metrics"]) if extra.get("metrics") else None  # HOST:PORT of its /metrics
        self.metrics_allow_remote = extra.get("metrics_allow_remote") is True
        self.period = float(extra.get("snapshot_period_s", 0.05))
        if not 0.0 <= self.period <= 60.0:
            raise ValueError(f"snapshot_period_s {self.period:g} is out of range: 0 to 60 seconds")
        self.tenant_field = str(extra["tenant_field"]) if extra.get("tenant_field") else None
        self.fault = extra.get("test_fault")
        test_faults.refuse_unless_allowed(self.fault, test_faults.AGENT_FAULTS,
                                          "a test breaking vLLM's state on purpose")
        if self._kv_transfer_config.is_kv_consumer:
            logger.warning("PageWarden agent: kv_role %r makes vLLM defer block frees by a step; the agent loads "
                           "no KV, so kv_producer is enough (docs/vllm-agent.md)", self._kv_transfer_config.kv_role)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vllm_config = vllm_config
        self.server = None
        self._live: dict[str, Any] = {}  # request id -> vLLM's Request, from on_new_request
        self._who: dict[str, tuple[str | None, str | None]] = {}  # live request id -> (salt tag, tenant)
        self._finished: dict[str, str] = {}
        self._rewound: set[str] = set()  # live requests vLLM rewinds after a failed KV load
        self._step = 0
        self._last = 0.0
        self.fault_applied: str | None = None

    # ---- scheduler side ---------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        from engine.vllm_agent.agent_server import AgentServer

        pool = kv_cache_manager.block_pool
        self.block_pool = pool
        managers = kv_cache_manager.coordinator.single_type_managers
        if len(managers) != 1:
            raise ValueError(f"PageWarden's vLLM agent watches one KV cache group; this model has {len(managers)}")
        self.manager = managers[0]
        self.block_size = int(self.manager.block_size)
        self.hash_stride = max(1, self.block_size // int(pool.hash_block_size))
        if self.fault == "salt_ignored":  # before the first request is hashed, in the process that hashes them
            from vllm.v1.core import kv_cache_utils

            test_faults.ignore_salt_when_asked(kv_cache_utils)
            self.fault_applied = self.fault
        import vllm

        facts = {"vllm_version": vllm.__version__, "model": str(self.vllm_config.model_config.model),
                 "max_model_len": self.max_model_len, "block_size": self.block_size,
                 "prefix_caching": bool(pool.enable_caching), "pid": os.getpid(), "tenant_field": self.tenant_field,
                 "device": str(self.vllm_config.device_config.device_type)}
        self.server = AgentServer(self.control, self.telemetry, num_blocks=pool.num_gpu_blocks,
                                  block_size=self.block_size, facts=facts, metrics=self.metrics,
                                  metrics_allow_remote=self.metrics_allow_remote,
                                  capacity=capacity_finding(self.max_model_len, pool.num_gpu_blocks, self.block_size))

    def on_new_request(self, request) -> None:
        self._live[request.request_id] = request
        extra = getattr(request.sampling_params, "extra_args", None) or {}
        tenant = extra.get(self.tenant_field) if self.tenant_field else None
        # hashed here once: the snapshot, on every step, only looks it up
        self._who[request.request_id] = (salt_tag(request.cache_salt),
                                         None if tenant is None else str(tenant)[:MAX_TENANT_CHARS])

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        self._step += 1
        now = time.monotonic()
        if self.server is not None and not self.server.paused and now - self._last >= self.period:
            self._last = now
            if self.fault and not self.fault_applied and test_faults.break_scheduler_state(
                    self.fault, self.manager, self.block_pool, self._live):
                self.fault_applied = self.fault
            self._offer(scheduler_output.num_scheduled_tokens)
        return _NoMeta()

    def update_connector_output(self, connector_output) -> None:
        """Requests whose KV load failed (any connector's): vLLM rewinds them to the first
        failed block and recomputes, so their tables run ahead of their tokens until then.
        Costs nothing on a step without load errors."""
        bad = connector_output.invalid_block_ids
        if bad:
            self._rewound.update(rid for rid, table in self.manager.req_to_blocks.items()
                                 if rid in self._live and any(b.block_id in bad for b in table))
        self._rewound.update(rid for rid in connector_output.failed_recving or () if rid in self._live)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._live.pop(request.request_id, None)
        self._who.pop(request.request_id, None)
        self._rewound.discard(request.request_id)
        reason = request.get_finished_reason()
        self._finished[request.request_id] = str(getattr(reason, "name", reason) or request.status.name).lower()
        return False, None

    def take_events(self):
        """Called once per step after the step's output is processed and finished requests'
        blocks are freed: the moment to show what they released (the engine may go idle now)."""
        now = time.monotonic()
        watching = self.server is not None and not self.server.paused
        if self._finished and watching and (now - self._last >= self.period or not self._live):
            self._last = now  # running requests: the next step's snapshot shows it; none left: show it now
            self._offer({})
        return ()

    def _offer(self, scheduled: dict[str, int]) -> None:
        """Copy a snapshot out and queue it. Its time is the agent's cost on vLLM's scheduler
        thread (besides a clock read per step), counted: status `cost.scheduler_s`."""
        start = time.perf_counter()
        self.server.offer(self.snapshot(scheduled))
        self.server.cost["scheduler_s"] += time.perf_counter() - start

    def snapshot(self, scheduled: dict[str, int]) -> PoolSnapshot:
        requests, blocks = {}, {}
        stride = self.hash_stride
        for rid, table in self.manager.req_to_blocks.items():
            req = self._live.get(rid)
            if req is None or not table:
                continue
            ids = tuple(b.block_id for b in table)
            for b in table:
                if b.block_id not in blocks:
                    key = b.block_hash
                    blocks[b.block_id] = BlockView(b.ref_cnt, None if key is None else bytes(key[:-HASH_GROUP_SUFFIX]))
            own = tuple(bytes(h) for h in req.block_hashes[stride - 1::stride][:len(ids)])
            needed = req.num_computed_tokens + scheduled.get(rid, 0)
            rewound = rid in self._rewound
            if rewound and len(ids) <= -(-needed // self.block_size):
                self._rewound.discard(rid)  # recomputed up to its table again
            salt, tenant = self._who.get(rid, (None, None))
            requests[rid] = RequestView(rid, ids, needed, req.num_prompt_tokens, req.num_output_tokens, own,
                                        rewound=rewound, salt_tag=salt, tenant=tenant)
        finished, self._finished = self._finished, {}
        return PoolSnapshot(time.time(), self._step, self.block_pool.num_gpu_blocks, self.block_size, requests,
                            blocks, finished, waiting=len(self._live) - len(requests))

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # ---- worker side: nothing to load or save -----------------------------------------
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
