"""PageWardenVerifyingConnector: a vLLM v1 KV connector that wraps the one moving the KV and
lets vLLM use a transfer only once it matches its manifest (I3).

    --kv-transfer-config '{"kv_connector": "PageWardenVerifyingConnector",
      "kv_connector_module_path": "engine.vllm_agent.verify.connector",
      "kv_role": "kv_consumer", "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"inner": {"kv_connector": "ExampleConnector",
          "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}}}'

The inner connector is built the way vLLM's MultiConnector builds its children (a
KVTransferConfig from `inner`, our role unless it names one) and every call is handed to it.
On top:

- producer (prefill): the scheduler asks its worker to digest each prompt block of a request
  sent with `do_remote_decode` in the step that writes it (save_kv_layer, per layer, combined
  per block); the digests come back through build_connector_worker_meta ->
  update_connector_output. `request_finished` returns the manifest in kv_transfer_params.
  vLLM calls request_finished *before* update_connector_output in the same
  update_from_output, so the manifest goes out as a dict whose digests are filled in later in
  that same call, before vLLM serializes the outputs. A manifest whose digests never came is
  sent without them: the consumer then trusts none of its blocks.
- consumer (decode): the scheduler learns the loaded range at update_state_after_alloc,
  checks the manifest against the request (manifest.py) and sends the worker one check per
  request. The worker digests the loaded blocks right after the inner's load finished (sync:
  the end of start_load_kv, before the forward; async: when the inner reports the request
  received) and compares. A block that fails is zeroed and reported through
  get_block_ids_with_load_errors: with kv_load_failure_policy "recompute" vLLM discards the
  step's output for that request and recomputes from the first failed block. A
  `transfer_mismatch` alert names the request, the blocks, what was expected and found.

extra config keys: inner (required), verify (default true; false keeps the bookkeeping and
checks nothing, for measuring), agent (optional: PageWardenConnector's extra config; the
agent then runs beside, maps the pool and raises the alerts), test_fault and fault_blocks
(tests only: engine/vllm_agent/test_faults.py).

Only one KV cache group and tensor parallel 1 have been run (vLLM 0.32 CPU).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)

import numpy as np

from engine.vllm_agent import test_faults
from engine.vllm_agent.verify import manifest as mf
from engine.vllm_agent.verify.digest import (combine, copy_blocks, digest_blocks, layer_digests, put_blocks,
                                             scrub_blocks)

logger = logging.getLogger("vllm.pagewarden.verify")  # a child of vLLM's logger: its handler, level and format
COST_LOG_PERIOD_S = 10.0  # how often a worker logs what its own checks have cost so far (when they ran)
MASK64 = (1 << 64) - 1


@dataclass
class BlockSet:
    """Blocks of one request: their positions in its table, ids and token rows."""
    request_id: str
    positions: list[int]
    block_ids: list[int]
    rows: list[int]


@dataclass
class CheckTask:
    blocks: BlockSet
    expected: list[int] | None  # None: no block can be trusted, `reason` says why
    reason: str = ""
    after_recv: bool = False  # an async inner: check once it reports the request received
    verify: bool = True  # False: bookkeeping only (the wrapper's `verify`, or a test's row)
    fault: bool = False  # tests only: this load gets the short_transfer fault


@dataclass
class VerifyMetadata(KVConnectorMetadata):
    inner: KVConnectorMetadata | None
    digest: list[BlockSet] = field(default_factory=list)
    check: list[CheckTask] = field(default_factory=list)


@dataclass
class VerifyWorkerMetadata(KVConnectorWorkerMetadata):
    inner: KVConnectorWorkerMetadata | None
    digests: dict[str, dict[int, int]] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, VerifyWorkerMetadata)
        inner = other.inner if self.inner is None else self.inner if other.inner is None else \
            self.inner.aggregate(other.inner)
        digests = {rid: dict(d) for rid, d in self.digests.items()}
        for rid, d in other.digests.items():  # ranks' shards: summed, the same on both sides
            for p, v in d.items():
                digests.setdefault(rid, {})[p] = (digests.get(rid, {}).get(p, 0) + v) & MASK64
        return VerifyWorkerMetadata(inner, digests, self.findings + other.findings)


class PageWardenVerifyingConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        extra = dict(ktc.kv_connector_extra_config or {})
        inner = extra.get("inner")
        if not isinstance(inner, dict) or not inner.get("kv_connector"):
            raise ValueError("PageWardenVerifyingConnector needs kv_connector_extra_config.inner: the connector that "
                             'moves the KV, e.g. {"kv_connector": "ExampleConnector", ...}')
        self.verify = bool(extra.get("verify", True))
        self.fault = extra.get("test_fault")
        test_faults.refuse_unless_allowed(self.fault, test_faults.TRANSFER_FAULTS,
                                          "a test breaking the transfer on purpose")
        self.fault_blocks = int(extra.get("fault_blocks", 2))
        self.block_size = int(vllm_config.cache_config.block_size)
        self.inner = self._build(vllm_config, {"kv_role": ktc.kv_role, **inner}, role, kv_cache_config)
        self.agent = None
        if isinstance(extra.get("agent"), dict):
            spec = {"kv_connector": "PageWardenConnector", "kv_connector_module_path": "engine.vllm_agent.connector",
                    "kv_role": ktc.kv_role, "kv_connector_extra_config": extra["agent"]}
            self.agent = self._build(vllm_config, spec, role, kv_cache_config)
        # scheduler side
        self._requests: dict[str, Any] = {}  # live vLLM Requests
        self._matched: dict[str, bool] = {}  # request -> the inner loads it asynchronously
        self._loads: dict[str, tuple[int, bool]] = {}  # request -> (external tokens, async), this step
        self._next_digest: dict[str, int] = {}  # producer: first block position not yet asked for
        self._digests: dict[str, dict[int, int]] = {}
        self._open: dict[str, dict] = {}  # manifests sent out this step, still waiting for digests
        self.counters = {"manifests": 0, "manifests_without_digests": 0, "checked_blocks": 0, "failed_blocks": 0,
                         "failed_requests": 0}
        # worker side
        self._layers: dict[str, Any] = {}
        self._pending: dict[str, CheckTask] = {}  # async checks waiting for the inner's receive
        self._layer_digests: dict[tuple[str, int], dict[str, Any]] = {}
        self._errors: set[int] = set()
        self._findings: list[dict] = []
        self._done_digests: dict[str, dict[int, int]] = {}
        # the worker's own time in digests and checks, on vLLM's forward path: what verifying costs
        self.worker_cost = {"digest_s": 0.0, "blocks_digested": 0, "check_s": 0.0, "blocks_checked": 0}
        self._cost_logged = (time.monotonic(), 0)

    @staticmethod
    def _build(vllm_config, spec: dict, role, kv_cache_config) -> KVConnectorBase_V1:
        """A connector built the way MultiConnector builds its children."""
        config = copy.copy(vllm_config)
        outer = vllm_config.kv_transfer_config
        config.kv_transfer_config = KVTransferConfig(**{"engine_id": outer.engine_id, **spec})
        cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        return cls(config, role, kv_cache_config)

    def _children(self) -> list[KVConnectorBase_V1]:
        return [self.inner] if self.agent is None else [self.inner, self.agent]

    # ==== worker side ================================================================
    def register_kv_caches(self, kv_caches) -> None:
        self._layers = dict(kv_caches)
        self.inner.register_kv_caches(kv_caches)
        if self._layers:  # at start, not in the first request's step: the CPU module may build here
            name, kv = next(iter(self._layers.items()))
            layer_digests(kv, [0], [self.block_size], self.block_size)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.inner.bind_connector_metadata(connector_metadata.inner)

    def clear_connector_metadata(self) -> None:
        self.inner.clear_connector_metadata()
        super().clear_connector_metadata()

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta: VerifyMetadata = self._get_connector_metadata()
        layers = self._layers or _layers_of(forward_context)
        now = [t for t in meta.check if not t.after_recv]
        self._pending.update({t.blocks.request_id: t for t in meta.check if t.after_recv})
        saved = self._fault_before(now, layers)
        self.inner.start_load_kv(forward_context, **kwargs)
        self._fault_after(saved, layers)
        self._check(now, layers)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.inner.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        tasks = self._get_connector_metadata().digest
        if not tasks:
            return
        start = time.perf_counter()
        # every request's blocks of this step in one call per layer: the call's fixed cost, not
        # the bytes, is most of a digest of a few blocks
        try:
            found, ok = layer_digests(kv_layer, [b for t in tasks for b in t.block_ids],
                                      [r for t in tasks for r in t.rows], self.block_size)
        except Exception:  # no digest, no trust: these manifests leave without digests
            logger.exception("PageWarden: digesting the blocks of requests %s failed",
                             ", ".join(t.request_id for t in tasks)[:300])
            found, ok = None, None
        at = 0
        for task in tasks if found is not None else ():
            for position in task.positions:
                per_layer = self._layer_digests.setdefault((task.request_id, position), {})
                per_layer[layer_name] = (int(found[at]), bool(ok[at]))
                at += 1
        self.worker_cost["digest_s"] += time.perf_counter() - start

    def wait_for_save(self) -> None:
        self.inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]):
        return self.inner.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        results = self.inner.get_transfer_results(finished_req_ids)
        for rid in set(results.finished_recving) & set(self._pending):
            task = self._pending.pop(rid)
            if rid in results.failed_recving:
                continue  # the inner failed it itself: vLLM recomputes it already
            self._check([task], self._layers)
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors | self.inner.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        inner = self.inner.build_connector_worker_meta()
        if self._layer_digests:
            start = time.perf_counter()
            self.worker_cost["blocks_digested"] += len(self._layer_digests)
            self._combine_layer_digests()
            self.worker_cost["digest_s"] += time.perf_counter() - start
        self._log_cost()
        if inner is None and not self._done_digests and not self._findings:
            return None
        meta = VerifyWorkerMetadata(inner, self._done_digests, self._findings)
        self._done_digests, self._findings = {}, []
        return meta

    def _log_cost(self) -> None:
        """What this worker's digests and checks have cost so far, every COST_LOG_PERIOD_S
        while they run (bench/vllm_verify_cost.py reads it; an operator can too)."""
        now, done = time.monotonic(), self.worker_cost["blocks_digested"] + self.worker_cost["blocks_checked"]
        if done == self._cost_logged[1] or now - self._cost_logged[0] < COST_LOG_PERIOD_S:
            return
        self._cost_logged = (now, done)
        c = self.worker_cost
        logger.info("PageWarden verify cost: %d blocks digested in %.6f s, %d blocks checked in %.6f s (all layers)",
                    c["blocks_digested"], c["digest_s"], c["blocks_checked"], c["check_s"])

    def _combine_layer_digests(self) -> None:
        """One digest per block over every layer; a block some layer did not save, or could
        not digest, gets none (its manifest then goes out without digests: fail closed)."""
        want = set(self._layers) if self._layers else None
        for (rid, position), per_layer in self._layer_digests.items():
            if (want is not None and set(per_layer) != want) or not all(ok for _, ok in per_layer.values()):
                continue
            parts = [(name, np.array([d], dtype=np.uint64)) for name, (d, _) in per_layer.items()]
            self._done_digests.setdefault(rid, {})[position] = int(combine(parts)[0])
        self._layer_digests = {}

    def _check(self, tasks: list[CheckTask], layers) -> None:
        """Digest every loaded block of these loads (one call per layer for them all) and
        compare each load with its manifest."""
        tasks = [t for t in tasks if t.verify and t.blocks.block_ids]
        if not tasks:
            return
        start = time.perf_counter()
        try:
            known = [t for t in tasks if t.expected is not None]
            ids = [b for t in known for b in t.blocks.block_ids]
            rows = [r for t in known for r in t.blocks.rows]
            try:
                digests, ok = digest_blocks(layers, ids, rows, self.block_size) if ids else ([], [])
            except Exception:  # a check that cannot run fails its blocks; it never takes vLLM down
                logger.exception("PageWarden: checking the loaded blocks of requests %s failed",
                                 ", ".join(t.blocks.request_id for t in known)[:300])
                digests, ok = [0] * len(ids), [False] * len(ids)
            at = 0
            for task in tasks:
                n = len(task.blocks.block_ids) if task.expected is not None else 0
                self._compare(task, layers, [int(d) for d in digests[at:at + n]], list(ok[at:at + n]))
                at += n
        finally:
            self.worker_cost["check_s"] += time.perf_counter() - start
            self.worker_cost["blocks_checked"] += sum(len(t.blocks.block_ids) for t in tasks)

    def _compare(self, task: CheckTask, layers, found: list[int], ok: list[bool]) -> None:
        blocks = task.blocks
        if task.expected is None:
            bad = list(range(len(blocks.block_ids)))
        else:
            bad = [i for i, want in enumerate(task.expected) if not ok[i] or found[i] != want]
        finding = {"request": blocks.request_id, "checked": len(blocks.block_ids), "reason": task.reason,
                   "blocks": [blocks.block_ids[i] for i in bad], "positions": [blocks.positions[i] for i in bad],
                   "expected": [f"{task.expected[i]:016x}" for i in bad] if task.expected is not None else [],
                   "found": [f"{found[i]:016x}" for i in bad] if found else []}
        if bad:
            # Zeroed before the forward reads them: vLLM discards this step's output for the
            # request, but the forward itself must not see another request's data either.
            scrub_blocks(layers, finding["blocks"])
            self._errors.update(finding["blocks"])
        self._findings.append(finding)

    def _fault_before(self, tasks: list[CheckTask], layers):
        ids = [b for t in tasks if t.fault
               for b in test_faults.unwritten_blocks(t.blocks.request_id, t.blocks.block_ids, self.fault_blocks)]
        return (ids, copy_blocks(layers, ids)) if ids else None

    @staticmethod
    def _fault_after(saved, layers) -> None:
        """The incident's short transfer: those blocks keep what they held before the load
        (another request's KV), while the inner connector reports the load finished."""
        if saved is not None:
            put_blocks(layers, *saved)

    # ==== scheduler side =============================================================
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        self._kv_cache_manager = kv_cache_manager  # not super(): it would bind the block pool twice
        for child in self._children():
            child.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        for child in self._children():
            child.bind_gpu_block_pool(gpu_block_pool)

    def on_new_request(self, request) -> None:
        self._requests[request.request_id] = request
        for child in self._children():
            child.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        tokens, is_async = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        self._matched[request.request_id] = bool(is_async)
        return tokens, is_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self.inner.update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._loads[request.request_id] = (num_external_tokens, self._matched.get(request.request_id, False))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = VerifyMetadata(self.inner.build_connector_meta(scheduler_output))
        if self.agent is not None:
            self.agent.build_connector_meta(scheduler_output)
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            task = self._digest_task(rid, scheduled)
            if task is not None:
                meta.digest.append(task)
        loads, self._loads = self._loads, {}
        for rid, (external, is_async) in loads.items():
            task = self._check_task(rid, external, is_async)
            if task is not None:
                meta.check.append(task)
        return meta

    def _table(self, rid: str) -> list[int]:
        return list(self._kv_cache_manager.get_block_ids(rid)[0])

    def _digest_task(self, rid: str, scheduled: int) -> BlockSet | None:
        """Producer: the prompt blocks this step completes (and, in a request's first step, the
        ones a prefix-cache hit brought), to be digested as the worker saves them."""
        request = self._requests.get(rid)
        if request is None or not _wants_manifest(request):
            return None
        done = min(request.num_computed_tokens + scheduled, request.num_prompt_tokens)
        rows = mf.block_rows(request.num_prompt_tokens, self.block_size)
        start = self._next_digest.get(rid, 0)
        positions = [p for p in range(start, len(rows)) if p * self.block_size + rows[p] <= done]
        if not positions:
            return None
        self._next_digest[rid] = positions[-1] + 1
        table = self._table(rid)
        return BlockSet(rid, positions, [table[p] for p in positions], [rows[p] for p in positions])

    def _check_task(self, rid: str, external: int, is_async: bool) -> CheckTask | None:
        """Consumer: the blocks the inner connector loads for a request, and what they must hold."""
        request = self._requests.get(rid)
        if request is None:
            return None
        end, bs = request.num_computed_tokens, self.block_size
        start = end - external
        table = self._table(rid)
        positions = [p for p in range(start // bs, -(-end // bs)) if p < len(table)]
        loaded = {p: min(end, (p + 1) * bs) - max(start, p * bs) for p in positions}
        blocks = BlockSet(rid, positions, [table[p] for p in positions], [loaded[p] for p in positions])
        found = mf.parse(request.kv_transfer_params)
        expected = mf.expected_digests(found, request_id=rid, token_ids=request.prompt_token_ids,
                                       block_size=bs, loaded=loaded)
        verify, fault = self._test_switches(request)
        if isinstance(expected, str):
            return CheckTask(blocks, None, expected, is_async, verify, fault)
        return CheckTask(blocks, [expected[p] for p in positions], "", is_async, verify, fault)

    def _test_switches(self, request) -> tuple[bool, bool]:
        """(check this load, give it the test fault): test_faults.switches."""
        return test_faults.switches(self.fault, self.verify, request.kv_transfer_params)

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        ours = meta if isinstance(meta, VerifyWorkerMetadata) else None
        if ours is not None:
            connector_output.kv_connector_worker_meta = ours.inner
        try:
            self.inner.update_connector_output(connector_output)
            if self.agent is not None:
                self.agent.update_connector_output(connector_output)
        finally:
            connector_output.kv_connector_worker_meta = meta
        if ours is not None:
            for rid, digests in ours.digests.items():
                self._digests.setdefault(rid, {}).update(digests)
            for finding in ours.findings:
                self._report(finding)
        # Manifests handed out by request_finished earlier in this same update_from_output:
        # their last digests are the ones that just came; vLLM serializes the outputs after.
        for rid, wire in self._open.items():
            if not mf.fill_digests(wire, self._digests.pop(rid, {})):
                self.counters["manifests_without_digests"] += 1
                logger.warning("PageWarden: request %s's manifest leaves without digests; the consumer will "
                               "recompute its blocks", rid)
        self._open = {}

    def request_finished(self, request, block_ids: list[int]):
        rid = request.request_id
        delay, params = self.inner.request_finished(request, block_ids)
        if self.agent is not None:
            self.agent.request_finished(request, block_ids)
        self._requests.pop(rid, None)
        self._matched.pop(rid, None)
        self._next_digest.pop(rid, None)
        if not _wants_manifest(request):
            self._digests.pop(rid, None)
            return delay, params
        wire = mf.new_manifest(rid, request.prompt_token_ids, self.block_size)
        self.counters["manifests"] += 1
        if not mf.fill_digests(wire, self._digests.get(rid, {})):
            self._open[rid] = wire  # filled in by update_connector_output, before vLLM sends it
        else:
            self._digests.pop(rid, None)
        # A nested dict: MultiConnector merges its children's params with dict.update, which
        # keeps this same object, so digests filled in later still reach the response.
        return delay, {**(params or {}), mf.MANIFEST_KEY: wire}

    def _report(self, finding: dict) -> None:
        self.counters["checked_blocks"] += finding["checked"]
        if not finding["blocks"]:
            return
        self.counters["failed_blocks"] += len(finding["blocks"])
        self.counters["failed_requests"] += 1
        rid = finding["request"]
        why = finding["reason"] or "digest mismatch"
        shown = ", ".join(f"block {b} (position {p}): expected {e}, found {f}" for b, p, e, f in
                          zip(finding["blocks"], finding["positions"], finding["expected"] or ["-"] * 99,
                              finding["found"] or ["-"] * 99))
        detail = (f"request {rid}: {len(finding['blocks'])} of {finding['checked']} loaded block(s) failed the "
                  f"transfer check ({why}); reported to vLLM as load errors, so it recomputes them. {shown[:600]}")
        logger.warning("PageWarden transfer_mismatch: %s", detail)
        server = getattr(self.agent, "server", None)
        if server is not None:
            server.offer_alert("transfer_mismatch", detail, subject=f"request:{rid}", requests=(rid,),
                               pages=tuple(finding["blocks"]), expected=finding["expected"][:16],
                               found=finding["found"][:16], reason=why, prevented=True)

    def take_events(self):
        for child in self._children():
            yield from child.take_events()

    # ==== everything else: the inner connector's ======================================
    @property
    def requires_kv_delivery(self) -> bool:
        return self.inner.requires_kv_delivery

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.inner.supports_divergent_local_hybrid_hits

    def get_loaded_kv_cache_group_ids(self, request):
        return self.inner.get_loaded_kv_cache_group_ids(request)

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        return self.inner.get_external_cache_hit_sources(request, num_external_tokens)

    def has_pending_block_frees(self) -> bool:
        return self.inner.has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        return self.inner.has_pending_push_work()

    def register_finished_partial_tail(self, request, block_ids, partial_tail_offloads) -> bool:
        return self.inner.register_finished_partial_tail(request, block_ids, partial_tail_offloads)

    def get_mem_pool_context(self):
        return self.inner.get_mem_pool_context()

    def set_host_xfer_buffer_ops(self, copy_operation) -> None:
        self.inner.set_host_xfer_buffer_ops(copy_operation)

    def finish_forward(self) -> None:
        self.inner.finish_forward()

    def reset_capture_state(self) -> None:
        self.inner.reset_capture_state()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        self.inner.handle_preemptions(kv_connector_metadata.inner)

    def get_finished_count(self):
        return self.inner.get_finished_count()

    def get_kv_connector_stats(self):
        return self.inner.get_kv_connector_stats()

    def get_kv_connector_kv_cache_events(self):
        return self.inner.get_kv_connector_kv_cache_events()

    def get_handshake_metadata(self):
        return self.inner.get_handshake_metadata()

    def set_xfer_handshake_metadata(self, metadata) -> None:
        self.inner.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        self.inner.set_xfer_handshake_metadata_pp_aware(metadata)

    def reset_cache(self):
        return self.inner.reset_cache()

    def shutdown(self) -> None:
        for child in self._children():
            child.shutdown()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        inner = (vllm_config.kv_transfer_config.kv_connector_extra_config or {}).get("inner") or {}
        if not inner.get("kv_connector"):
            return None
        config = copy.copy(vllm_config)
        config.kv_transfer_config = KVTransferConfig(**{"kv_role": vllm_config.kv_transfer_config.kv_role, **inner})
        return KVConnectorFactory.get_connector_class(config.kv_transfer_config).get_required_kvcache_layout(config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        inner = (extra_config or {}).get("inner") or {}
        if not inner.get("kv_connector"):
            return False
        child = KVConnectorFactory.get_connector_class(KVTransferConfig(**{"kv_role": "kv_both", **inner}))
        return child.requires_piecewise_for_cudagraph(inner.get("kv_connector_extra_config") or {})


def _wants_manifest(request) -> bool:
    params = request.kv_transfer_params
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def _layers_of(forward_context) -> dict:
    return {name: layer.kv_cache for name, layer in forward_context.no_compile_layers.items()
            if getattr(layer, "kv_cache", None) is not None}
