"""PageWarden against vLLM (issue 17, part 1): the same OpenAI requests to each server, started
here, one at a time:

    make vllm-venv                        # once: vLLM's CPU build in .venv-vllm (or set PAGEWARDEN_VLLM_PYTHON)
    .venv/bin/python bench/make_random_llama.py   # once, for --model llama135m (or let this bench write it)
    .venv/bin/python bench/vs_vllm.py [--model copy|llama135m|DIR ...] [--reps 5] [--quick] [--json PATH]
                                      [--only vllm|ours] [--rounds N] [--pin] [--ours-threads N]

Checkpoints: `copy` = resources/models/pagewarden-copy (2 layers, 272 ids), `llama135m` =
build/models/random-llama-135m (SmolLM-135M's shape, random weights; bench/make_random_llama.py,
written here when missing), or any checkpoint directory (for example one written by
`make_random_llama.py --out DIR --set hidden_size=192 ...`). Default: copy and llama135m.

For each checkpoint, each server (vLLM via tests/vllm/vllm_server.py, ours via `serve --http-port 0`
with canaries off) is started, warmed up, then measured with `POST /v1/completions` at concurrency
1, 16 and 64, streamed and not: 64-token prompts given as token-id lists (seeded random ids, the
special ids left out; for the byte-level `copy` checkpoint printable ASCII only, so that each
token is one character and our server sends one SSE chunk per token), 128 new tokens, greedy,
`ignore_eos`. The cases are interleaved within a server's run, repeated --reps times. Neither
server caches prefixes on this workload (vLLM is started with prefix caching off, ours with
[prefix_cache] scope = "off"), so repeated prompts are computed again.

`--workload shared-prefix`: both prefix caches on (vLLM's, ours at scope "tenant": every request
here is one tenant). Each prompt is one of 3 system prompts of 512 ids followed by a user part
of 64 ids; every rep (and the warm-up) draws fresh user parts, so only the system prompts can be
cached between requests, as in a chat service. Default concurrency 16 and 64. Ours runs with
every defence on, its shared pages checked by the extended I1 in every decode step.

The two servers run one after the other, never together: this machine class has 2 cores, and
an idle vLLM spins on one (sched_yield), so a second server beside it would be measured against a
busy core. `--rounds N` alternates whole server runs (vLLM, ours, vLLM, ours, ...) so that drift
between the runs shows in the spread; the numbers of all rounds are pooled.

Printed per checkpoint: tokens/s (completion tokens of a batch / its wall time) median and best
per case, and ours / vLLM; for streamed requests TTFT, ITL and TPOT p50/p99 (ms), pooled over
all requests of all reps. ITL comes from SSE chunk arrival times: a chunk that carries k tokens
(vLLM's per-chunk usage via `stream_options.continuous_usage_stats`, or token ids, tell k) stands
for k gaps of (its delay / k); when a server tells neither and sent fewer chunks than tokens, k
is spread evenly and the row says "approx". TPOT is per request (last chunk - first) / (tokens - 1).
On 2 cores vLLM's API server may get the CPU only in bursts, and then many chunks reach the
client at once: an ITL p50 near 0 with a large p99 is what the client saw, not a parsing error;
TPOT is the steadier figure.
Then an identical-output check: the greedy outputs of the largest batch's prompts, vLLM's token
ids (`return_token_ids`) against ours (the same server over ZeroMQ, which returns ids), else the
texts: how many match exactly, and where the others first differ (random fp32 weights have
near-ties; a difference is reported, not fatal).

`--quick`: 1 rep, concurrency 1 and 16, 32 new tokens. `--json PATH`: every raw number. Run it
on a quiet machine; the client (this process) shares the cores with the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHECKPOINTS = {
    # name: (directory, prompt ids drawn from range(low, high))
    "copy": (REPO / "resources" / "models" / "pagewarden-copy", (32, 127)),  # printable ASCII bytes
    "llama135m": (REPO / "build" / "models" / "random-llama-135m", (3, 49152)),  # past <unk> <s> </s>
}
SERVERS = ("vllm", "ours")
VLLM_BLOCK = 32
OUR_PAGE = 16


class BenchError(RuntimeError):
    pass


# ---- prompts ------------------------------------------------------------------------------

def make_prompts(n: int, length: int, low: int, high: int, *, exclude: tuple[int, ...] = (),
                 seed: int = 0) -> list[list[int]]:
    """n seeded random prompts of `length` ids from range(low, high), none in `exclude`."""
    allowed = [i for i in range(low, high) if i not in set(exclude)]
    if not allowed:
        raise ValueError(f"no token id left in range({low}, {high}) after excluding {exclude}")
    rng = random.Random(seed)
    return [[rng.choice(allowed) for _ in range(length)] for _ in range(n)]


def special_ids(model_dir: Path) -> tuple[int, ...]:
    """The ids of the checkpoint's added/special tokens (from tokenizer.json) and its BOS/EOS."""
    ids = set()
    tok = model_dir / "tokenizer.json"
    if tok.is_file():
        ids |= {int(t["id"]) for t in json.loads(tok.read_text()).get("added_tokens", [])}
    cfg = json.loads((model_dir / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = cfg.get(key)
        ids |= set(value) if isinstance(value, list) else ({value} if isinstance(value, int) else set())
    return tuple(sorted(ids))


# ---- statistics ---------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def med_best(values: list[float]) -> tuple[float, float]:
    """(median, best = max) of throughputs; nan, nan for none."""
    return (statistics.median(values), max(values)) if values else (math.nan, math.nan)


# ---- one answer -----------------------------------------------------------------------------

@dataclass
class Chunk:
    t: float  # arrival (perf_counter seconds)
    text: str
    n_tokens: int | None  # tokens it carries, when the server says (usage delta or token ids)


@dataclass
class Reply:
    sent: float
    done: float
    completion_tokens: int
    text: str
    token_ids: list[int] | None = None
    chunks: list[Chunk] = field(default_factory=list)  # streamed only
    finish_reason: str | None = None


def parse_stream(events: list[tuple[float, str]]) -> dict:
    """SSE `data:` payloads (arrival time, JSON text; [DONE] left out) of one streamed
    completion -> {chunks, text, completion_tokens, token_ids, finish_reason}. A chunk's token
    count comes from its `token_ids` when present, else from the growth of cumulative
    `usage.completion_tokens` (vLLM's continuous_usage_stats), else None. Raises BenchError on
    an error chunk."""
    chunks: list[Chunk] = []
    text, ids, finish = [], [], None
    have_ids = False
    usage_total = None
    seen_usage = 0
    for t, payload in events:
        msg = json.loads(payload)
        if "error" in msg:
            raise BenchError(f"error chunk: {msg['error']}")
        usage = msg.get("usage") or None
        choices = msg.get("choices") or []
        if not choices:
            if usage:
                usage_total = int(usage["completion_tokens"])
            continue
        choice = choices[0]
        n = None
        if choice.get("token_ids") is not None:
            have_ids = True
            ids += choice["token_ids"]
            n = len(choice["token_ids"])
        elif usage:
            n = int(usage["completion_tokens"]) - seen_usage
        if usage:
            seen_usage = int(usage["completion_tokens"])
            usage_total = seen_usage
        piece = choice.get("text") or ""
        text.append(piece)
        finish = choice.get("finish_reason") or finish
        if piece or n:
            chunks.append(Chunk(t, piece, n))
    if usage_total is None:
        usage_total = sum(c.n_tokens for c in chunks) if all(c.n_tokens is not None for c in chunks) else len(chunks)
    return {"chunks": chunks, "text": "".join(text), "completion_tokens": usage_total,
            "token_ids": ids if have_ids else None, "finish_reason": finish}


def chunk_token_counts(chunks: list[Chunk], total: int) -> tuple[list[int], bool]:
    """Tokens per content chunk and whether that is known (True) or spread evenly (False)."""
    if not chunks:
        return [], total == 0
    if all(c.n_tokens is not None for c in chunks):
        counts = [c.n_tokens for c in chunks]
        return counts, sum(counts) == total
    if len(chunks) == total:
        return [1] * total, True
    base, extra = divmod(total, len(chunks))
    return [base + (1 if i >= len(chunks) - extra else 0) for i in range(len(chunks))], False


def stream_latency(reply: Reply) -> dict:
    """TTFT (s), ITL samples (s: a chunk of k tokens gives k samples of delay / k), TPOT (s) and
    whether the per-chunk token counts were known."""
    counts, exact = chunk_token_counts(reply.chunks, reply.completion_tokens)
    if not reply.chunks:
        return {"ttft": math.nan, "itl": [], "tpot": math.nan, "exact": exact}
    itl = []
    for prev, chunk, k in zip(reply.chunks, reply.chunks[1:], counts[1:]):
        if k > 0:
            itl += [(chunk.t - prev.t) / k] * k
    first, last = reply.chunks[0].t, reply.chunks[-1].t
    tpot = (last - first) / (reply.completion_tokens - 1) if reply.completion_tokens > 1 else math.nan
    return {"ttft": first - reply.sent, "itl": itl, "tpot": tpot, "exact": exact}


def batch_throughput(start: float, replies: list[Reply]) -> float:
    """Completion tokens of the batch / its wall time (first send to last answer)."""
    end = max(r.done for r in replies)
    return sum(r.completion_tokens for r in replies) / (end - start)


# ---- identical outputs ----------------------------------------------------------------------

def first_difference(a, b) -> int | None:
    """First index where the sequences differ (the shorter length when one is a prefix of the
    other); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(ours: list, theirs: list) -> dict:
    """{"n", "match", "diffs": [[request index, first differing position], ...]}."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} outputs against {len(theirs)}")
    diffs = [[i, d] for i, (a, b) in enumerate(zip(ours, theirs)) if (d := first_difference(a, b)) is not None]
    return {"n": len(ours), "match": len(ours) - len(diffs), "diffs": diffs}


# ---- summary and table ----------------------------------------------------------------------

def case_name(concurrency: int, stream: bool) -> str:
    return f"c={concurrency} {'stream' if stream else 'whole'}"


def summarize_case(batches: list[dict]) -> dict:
    """batches: [{"tok_s": float, "replies": [Reply-like dicts]}] -> tokens/s median/best and,
    when streamed, pooled TTFT/ITL/TPOT p50/p99 in ms."""
    tok_s = [b["tok_s"] for b in batches]
    med, best = med_best(tok_s)
    out = {"tok_s": tok_s, "median": med, "best": best}
    lat = [b["latency"] for b in batches if b.get("latency")]
    if lat:
        ttft = [x["ttft"] for ls in lat for x in ls]
        itl = [s for ls in lat for x in ls for s in x["itl"]]
        tpot = [x["tpot"] for ls in lat for x in ls if not math.isnan(x["tpot"])]
        out |= {f"{name}_{q}": percentile(vals, q) * 1000 for name, vals in
                (("ttft", ttft), ("itl", itl), ("tpot", tpot)) for q in (50, 99)}
        out["exact_chunks"] = all(x["exact"] for ls in lat for x in ls)
    return out


def _pair(a: float, b: float, fmt: str) -> str:
    return "-" if math.isnan(a) else f"{a:{fmt}} / {b:{fmt}}"


def _ratio(ours: float, theirs: float, floor: float = 0.0) -> str:
    """ours / theirs, "-" when either is missing or theirs is at most `floor` (a ratio to a
    near-zero latency says nothing)."""
    if math.isnan(ours) or math.isnan(theirs) or theirs <= floor:
        return "-"
    return f"{ours / theirs:.2f}x"


NAN_CASE = {"median": math.nan, "best": math.nan}


def format_table(title: str, cases: list[str], summary: dict, identical: dict | None) -> str:
    """summary: {"vllm": {case: summarize_case(...)}, "ours": {...}} (a server may be absent)."""
    v, o = summary.get("vllm", {}), summary.get("ours", {})
    lines = [title, f"{'case':16s} {'vLLM tok/s med / best':>24s} {'ours tok/s med / best':>24s} {'ours/vLLM':>10s}"]
    for case in cases:
        a, b = v.get(case, NAN_CASE), o.get(case, NAN_CASE)
        lines.append(f"{case:16s} {_pair(a['median'], a['best'], ',.1f'):>24s} "
                     f"{_pair(b['median'], b['best'], ',.1f'):>24s} {_ratio(b['median'], a['median']):>10s}")
    streamed = [c for c in cases if c.endswith("stream")]
    if streamed:
        lines.append(f"{'latency, ms':16s} {'vLLM p50 / p99':>24s} {'ours p50 / p99':>24s} {'ours/vLLM p50':>14s}")
        for case in streamed:
            a, b = v.get(case, {}), o.get(case, {})
            for metric in ("ttft", "itl", "tpot"):
                p50a, p99a = a.get(f"{metric}_50", math.nan), a.get(f"{metric}_99", math.nan)
                p50b, p99b = b.get(f"{metric}_50", math.nan), b.get(f"{metric}_99", math.nan)
                approx = [name for name, s in (("vLLM", a), ("ours", b)) if s.get("exact_chunks") is False]
                note = f"  (approx: {', '.join(approx)})" if metric == "itl" and approx else ""
                lines.append(f"{case.split()[0] + ' ' + metric.upper():16s} {_pair(p50a, p99a, '.1f'):>24s} "
                             f"{_pair(p50b, p99b, '.1f'):>24s} {_ratio(p50b, p50a, 0.05):>14s}{note}")
    if identical:
        line = f"identical outputs ({identical['by']}): {identical['match']}/{identical['n']}"
        if identical["diffs"]:
            shown = ", ".join(f"#{i} at {pos}" for i, pos in identical["diffs"][:12])
            more = len(identical["diffs"]) - 12
            line += f"; first differing position: {shown}" + (f" (+{more} more)" if more > 0 else "")
        lines.append(line)
    return "\n".join(lines)


# ---- the HTTP client --------------------------------------------------------------------------

def request_body(model: str, prompt: list[int], new: int, stream: bool) -> dict:
    """The same body for both servers (ours ignores return_token_ids and continuous_usage_stats)."""
    body = {"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "stream": stream, "return_token_ids": True}
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


async def _post(session, url: str, body: dict):
    """The response to POST /v1/completions. A keep-alive connection the server closed as it
    was reused (uvicorn under load; it failed a run with ServerDisconnectedError before any
    reply) is retried on a new one, up to twice: nothing was answered, so nothing is counted
    twice, and the reply's time still runs from the first send."""
    import aiohttp

    for attempt in range(3):
        try:
            return await session.post(url + "/v1/completions", json=body)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if attempt == 2:
                raise
            RETRIES[url] = RETRIES.get(url, 0) + 1


RETRIES: dict[str, int] = {}  # per server: requests sent again after a dropped keep-alive connection


async def complete(session, url: str, body: dict) -> Reply:
    sent = time.perf_counter()
    async with await _post(session, url, body) as resp:
        if resp.status != 200:
            raise BenchError(f"{url}: HTTP {resp.status}: {(await resp.text())[:500]}")
        if not body["stream"]:
            out = await resp.json()
            done = time.perf_counter()
            choice = out["choices"][0]
            return Reply(sent, done, int(out["usage"]["completion_tokens"]), choice.get("text") or "",
                         choice.get("token_ids"), finish_reason=choice.get("finish_reason"))
        events = []
        async for raw in resp.content:
            now = time.perf_counter()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            events.append((now, data.decode()))
        done = time.perf_counter()
    parsed = parse_stream(events)
    return Reply(sent, done, parsed["completion_tokens"], parsed["text"], parsed["token_ids"], parsed["chunks"],
                 parsed["finish_reason"])


async def run_batch(session, url: str, model: str, prompts: list[list[int]], new: int, stream: bool) -> dict:
    start = time.perf_counter()
    replies = await asyncio.gather(*(complete(session, url, request_body(model, p, new, stream)) for p in prompts))
    for i, r in enumerate(replies):
        if r.completion_tokens != new:
            raise BenchError(f"{url}: request {i} gave {r.completion_tokens} tokens, asked {new} "
                             f"(finish_reason {r.finish_reason})")
    batch = {"tok_s": batch_throughput(start, replies), "start": start, "replies": replies}
    if stream:
        batch["latency"] = [stream_latency(r) for r in replies]
    return batch


def prompt_sets(prompts, reps: int) -> list[list[list[int]]]:
    """[warm-up, rep 1, ..., rep N] prompt lists: one list (the plain workload) is every set."""
    if prompts and isinstance(prompts[0][0], int):
        return [prompts] * (reps + 1)
    return prompts


def shared_prefix_prompts(n: int, reps: int, low: int, high: int, *, exclude: tuple[int, ...] = (),
                          seed: int = 0, systems: int = 3, system_len: int = 512,
                          user_len: int = 64) -> list[list[list[int]]]:
    """[warm-up, rep 1, ..., rep N] sets of n prompts: system prompt i % 3, then a user part
    drawn afresh for every set."""
    heads = make_prompts(systems, system_len, low, high, exclude=exclude, seed=seed)
    return [[heads[i % systems] + user for i, user in
             enumerate(make_prompts(n, user_len, low, high, exclude=exclude, seed=seed + 1 + k))]
            for k in range(reps + 1)]


async def measure(url: str, prompts, args) -> dict:
    """Warm up, then every case per rep, interleaved (prompts: one list, or prompt_sets' form).
    Returns {"model", "cases": {case: [batch...]}}."""
    sets = prompt_sets(prompts, args.reps)
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=900)
    # keep-alive, as an OpenAI client does, but a connection idle for 1 s is dropped here first:
    # uvicorn (vLLM) closes idle ones after 5 s, and reusing one as it closes failed a run
    # with ServerDisconnectedError
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        warm = sets[0]
        for c in args.concurrency:  # warm-up: every batch size once, short, and one stream
            await run_batch(session, url, model, warm[:c], min(args.new_tokens, 8), False)
        await run_batch(session, url, model, warm[:1], min(args.new_tokens, 8), True)
        cases: dict[str, list] = {case_name(c, s): [] for c in args.concurrency for s in (True, False)}
        for rep in range(args.reps):
            for c in args.concurrency:
                for stream in (True, False):
                    batch = await run_batch(session, url, model, sets[1 + rep][:c], args.new_tokens, stream)
                    cases[case_name(c, stream)].append(batch)
                    print(f"    rep {rep + 1} {case_name(c, stream):12s} {batch['tok_s']:9,.1f} tok/s", flush=True)
    if RETRIES.get(url):
        print(f"    {RETRIES[url]} request(s) sent again after a dropped keep-alive connection", flush=True)
    return {"model": model, "cases": cases, "resent": RETRIES.get(url, 0)}


# ---- the servers ------------------------------------------------------------------------------

def vllm_blocks(concurrency: int, prompt: int, new: int) -> int:
    """KV blocks for every request of the largest batch at full length, plus a margin."""
    return math.ceil(concurrency * (prompt + new) / VLLM_BLOCK) + 16


def our_pages(concurrency: int, prompt: int, new: int) -> int:
    return math.ceil(concurrency * (math.ceil((prompt + new) / OUR_PAGE) + 1) * 1.25)


def run_vllm(model_dir: Path, prompts, args, pin) -> dict:
    from tests.vllm.vllm_server import VllmServer

    top = max(args.concurrency)
    server = VllmServer(model=model_dir, num_blocks=vllm_blocks(top, args.prompt, args.new_tokens),
                        block_size=VLLM_BLOCK, max_model_len=max(512, args.prompt + args.new_tokens),
                        prefix_caching=args.workload == "shared-prefix", pin=pin)
    t0 = time.perf_counter()
    with server:
        print(f"  vLLM ready in {time.perf_counter() - t0:.0f} s (log {server.log_path})", flush=True)
        try:
            got = asyncio.run(measure(server.url, prompts, args))
        except BaseException:
            print(server.log_tail(40), file=sys.stderr)
            raise
    last = got["cases"][case_name(top, False)][-1]["replies"]
    got["outputs"] = {"token_ids": [r.token_ids for r in last], "text": [r.text for r in last]}
    return got


def run_ours(model_dir: Path, prompts, args, work: Path, sections: dict | None = None) -> dict:
    """sections: more config sections for our server (bench/journal_cost.py turns the journal off)."""
    from engine.client import EngineClient
    from engine.client.local_server import LocalServer, write_config

    top = max(args.concurrency)
    pages = our_pages(top, args.prompt, args.new_tokens)
    sections = {"prefix_cache": {"scope": "tenant" if args.workload == "shared-prefix" else "off"},
                **(sections or {})}
    config = write_config(work / "ours.toml", model={"path": str(model_dir)},
                          engine={"max_batch": max(64, top), "max_prefill_tokens": max(4096, top * args.prompt)},
                          canaries={"enabled": False}, workers={"threads": args.ours_threads},
                          pools={"prefill": {"pages": pages}, "decode": {"pages": pages}}, **sections)
    t0 = time.perf_counter()
    server = LocalServer(config, "--http-port", "0")
    try:
        server.wait_workers(server.client(timeout_s=300))
        print(f"  ours ready in {time.perf_counter() - t0:.0f} s (log {server.log_path})", flush=True)
        got = asyncio.run(measure(server.ready["http"], prompts, args))

        def ids(prompt):  # the same greedy request over ZeroMQ, which returns token ids
            client = EngineClient(server.control, timeout_s=600)
            try:
                return client.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True,
                                       temperature=0.0)["token_ids"]
            finally:
                client.close()

        with ThreadPoolExecutor(top) as pool:
            token_ids = list(pool.map(ids, prompt_sets(prompts, args.reps)[-1][:top]))
    except BaseException:
        print(server.log()[-4000:], file=sys.stderr)
        raise
    finally:
        server.stop()
    last = got["cases"][case_name(top, False)][-1]["replies"]
    got["outputs"] = {"token_ids": [list(map(int, t)) for t in token_ids], "text": [r.text for r in last]}
    return got


def identical_outputs(vllm: dict, ours: dict) -> dict:
    a, b = ours["outputs"], vllm["outputs"]
    if all(t is not None for t in a["token_ids"]) and all(t is not None for t in b["token_ids"]):
        return {"by": "token ids", **compare_outputs(a["token_ids"], b["token_ids"])}
    return {"by": "text", **compare_outputs(a["text"], b["text"])}


def ensure_checkpoint(name: str, model_dir: Path) -> None:
    if name == "llama135m":
        sys.path.insert(0, str(REPO / "bench"))
        from make_random_llama import write_checkpoint

        if write_checkpoint(model_dir):
            print(f"  wrote {model_dir}", flush=True)
    elif not (model_dir / "config.json").is_file():
        raise BenchError(f"no checkpoint at {model_dir}")


def jsonable(obj):
    if isinstance(obj, (Reply, Chunk)):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def checkpoint(name: str) -> tuple[Path, tuple[int, int]]:
    """A named checkpoint, or a checkpoint directory (prompt ids drawn from its whole
    vocabulary, its special ids left out)."""
    if name in CHECKPOINTS:
        return CHECKPOINTS[name]
    model_dir = Path(name).resolve()  # our server reads a relative path from its config file's directory
    try:
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"--model {name!r} is neither one of {', '.join(sorted(CHECKPOINTS))} "
                         f"nor a checkpoint directory with a config.json naming vocab_size ({exc})") from exc
    return model_dir, (0, vocab)


def bench_checkpoint(name: str, args, pin, work: Path) -> dict:
    model_dir, (low, high) = checkpoint(name)
    ensure_checkpoint(name, model_dir)
    if args.workload == "shared-prefix":
        prompts = shared_prefix_prompts(max(args.concurrency), args.reps, low, high,
                                        exclude=special_ids(model_dir), seed=args.seed)
    else:
        prompts = make_prompts(max(args.concurrency), args.prompt, low, high, exclude=special_ids(model_dir),
                               seed=args.seed)
    servers = [s for s in SERVERS if args.only in (None, s)]
    rounds = []
    for r in range(args.rounds):
        got = {}
        for server in servers:
            print(f"\n[{name}] round {r + 1}/{args.rounds}: {server}", flush=True)
            got[server] = run_vllm(model_dir, prompts, args, pin) if server == "vllm" else \
                run_ours(model_dir, prompts, args, work)
        rounds.append(got)
    cases = [case_name(c, s) for c in args.concurrency for s in (True, False)]
    summary = {s: {case: summarize_case([b for got in rounds for b in got[s]["cases"][case]]) for case in cases}
               for s in servers}
    identical = identical_outputs(rounds[-1]["vllm"], rounds[-1]["ours"]) if len(servers) == 2 else None
    title = (f"\n== {name} ({model_dir.name}): {args.workload}, prompt {args.prompt} ids, {args.new_tokens} new "
             f"tokens, greedy, "
             f"{args.reps} rep(s) x {args.rounds} round(s) ==")
    print(format_table(title, cases, summary, identical), flush=True)
    return {"model_dir": str(model_dir), "prompts": prompts, "summary": summary, "identical": identical,
            "rounds": rounds}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", default=["copy", "llama135m"],
                   help=f"{' | '.join(sorted(CHECKPOINTS))} | a checkpoint directory (default: copy llama135m)")
    p.add_argument("--reps", type=int, default=None, help="default 5 (--quick: 1)")
    p.add_argument("--rounds", type=int, default=1, help="alternate whole server runs this many times")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help="default 1 16 64 (--quick: 1 16)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 128 (--quick: 32)")
    p.add_argument("--prompt", type=int, default=64, help="prompt length in token ids")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--quick", action="store_true", help="1 rep, concurrency 1 and 16, 32 new tokens")
    p.add_argument("--workload", choices=("plain", "shared-prefix"), default="plain",
                   help="shared-prefix: 3 system prompts of 512 ids + 64-id user parts, both prefix caches on")
    p.add_argument("--only", choices=SERVERS, default=None, help="run one server only")
    p.add_argument("--ours-threads", type=int, default=0,
                   help="our workers.threads (default 0: the cores shared among the workers computing)")
    p.add_argument("--pin", action="store_true", help="vLLM's worker alone on one core, the rest on another")
    p.add_argument("--json", type=Path, default=None, help="write every raw number here")
    args = p.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 5)
    if args.workload == "shared-prefix":
        args.prompt = 512 + 64  # for sizing the pools and the window
        args.concurrency = args.concurrency or [16, 64]
    args.concurrency = args.concurrency or ([1, 16] if args.quick else [1, 16, 64])
    args.new_tokens = args.new_tokens or (32 if args.quick else 128)
    if min(args.reps, args.rounds, args.prompt, args.new_tokens, *args.concurrency) < 1:
        p.error("--reps, --rounds, --prompt, --new-tokens and --concurrency must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    pin = None
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        cores = sorted(os.sched_getaffinity(0))
        pin = (cores[0], cores[1])
    print(f"cores {len(os.sched_getaffinity(0))}, python {platform.python_version()}, concurrency "
          f"{args.concurrency}, prompt {args.prompt}, new {args.new_tokens}, reps {args.reps}, "
          f"rounds {args.rounds}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="pw-vs-vllm-"))
    results = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "cores": len(os.sched_getaffinity(0)), "checkpoints": {}}
    for name in args.model:
        results["checkpoints"][name] = bench_checkpoint(name, args, pin, work)
        if args.json:  # after each checkpoint, so a later failure keeps what was measured
            args.json.write_text(json.dumps(jsonable(results), indent=1) + "\n")
    if args.json:
        print(f"\nraw numbers: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
