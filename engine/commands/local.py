"""`generate` and `capacity`: commands that need no running engine."""

from __future__ import annotations

import json
import sys

from engine.commands.common import EXIT_FINDING, EXIT_OK, add_model_args, fail, load_config


def register(sub) -> None:
    gen = sub.add_parser(
        "generate", help="run prompts through the single-process paged engine",
        description="Generate with the single-process paged engine (prefill + decode over one pool).",
    )
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (encoded with the model's tokenizer.json)")
    source.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    gen.set_defaults(func=cmd_generate)

    cap = sub.add_parser(
        "capacity", help="check the context window against every pool (I6)",
        description="Compare the advertised context window with each pool's real capacity. "
        "Exits 1 when the window exceeds any pool.",
    )
    cap.add_argument("--config", help="engine TOML config (default: resources/configs/default.toml)")
    cap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    cap.set_defaults(func=cmd_capacity)


def add_sampling_args(parser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="below 1e-5 (0, the default, too): greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")


def parse_ids(text: str) -> list[int]:
    from engine.errors import InvalidRequest

    ids = []
    for i, part in enumerate(text.split(",")):
        part = part.strip()
        try:
            ids.append(int(part))
        except ValueError:
            raise InvalidRequest(f"--prompt-ids: item {i} = {part!r} is not an integer token id") from None
    return ids


def check_generate_pool(config) -> None:
    """`generate` allocates one pool, the decode pool: ConfigError naming its pages, its bytes and
    this machine's memory when it cannot fit (pages = 2**31 - 1 asked torch for 70 TB and ended
    in a RuntimeError traceback)."""
    from engine.errors import ConfigError
    from engine.model.config import read_model_config
    from engine.pool_memory import host_memory_bytes, pool_memory

    decode = next(p for p in pool_memory(config, read_model_config(config.model.resolved_path())) if p.name == "decode")
    memory = host_memory_bytes()
    if memory is not None and decode.bytes_per_worker > memory:
        raise ConfigError(f"pools.decode.pages = {config.pools['decode'].pages:,} needs "
                          f"{decode.bytes_per_worker / 2**30:,.1f} GiB ({decode.bytes_per_worker:,} bytes) but this "
                          f"machine has {memory / 2**30:,.1f} GiB of memory; make the pool smaller")


def cmd_generate(args) -> int:
    from engine.errors import AdmissionRejected, ConfigError, PageWardenError

    try:
        config = load_config(args)
        check_generate_pool(config)
        from engine.core import Engine
        from engine.model.load import load_model
        from engine.request import SamplingParams

        model = load_model(
            config.model.resolved_path(), dtype=config.model.dtype, device=config.model.device,
            max_positions=config.engine.context_window,
            cpu_weight_layout=config.model.cpu_weight_layout,
        )
        prompt = parse_ids(args.prompt_ids) if args.prompt_ids is not None else model.tokenizer.encode(args.prompt)
        params = SamplingParams(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos,
        )
        try:
            engine = Engine(config, model)
        except RuntimeError as exc:  # torch: the pool does not fit the device (a GPU is smaller than the host)
            raise ConfigError(f"pools.decode.pages = {config.pools['decode'].pages:,} could not be allocated on "
                              f"{model.device}: {str(exc).splitlines()[0]}; make the pool smaller") from None
        request = engine.submit(prompt, params)
        engine.run_until_idle()
    except AdmissionRejected as exc:
        return fail(args, exc, EXIT_FINDING)
    except PageWardenError as exc:
        return fail(args, exc)
    if request.error is not None:
        return fail(args, request.error, EXIT_FINDING)
    text = _decode_text(model, request.output_ids)
    ttft = request.first_token_time - request.arrival_time
    elapsed = request.finish_time - request.arrival_time
    if args.json:
        print(json.dumps({
            "token_ids": request.output_ids, "text": text, "prompt_ids": request.prompt_ids,
            "finish_reason": request.finish_reason, "model": str(model.path),
            "kernels": engine.kernels.name, "device": str(model.device),
            "ttft_s": round(ttft, 6), "elapsed_s": round(elapsed, 6),
        }))
    else:
        print(text if text is not None else " ".join(map(str, request.output_ids)))
        print(
            f"[{len(request.output_ids)} tokens, finish={request.finish_reason}, "
            f"ttft {ttft * 1e3:.1f} ms, {elapsed:.2f} s, kernels={engine.kernels.name}]",
            file=sys.stderr,
        )
    return EXIT_OK


def _decode_text(model, ids: list[int]) -> str | None:
    from engine.errors import CheckpointError

    try:
        return model.tokenizer.decode(ids)
    except CheckpointError:
        return None  # a model used only through token ids may ship no tokenizer


def cmd_capacity(args) -> int:
    from engine.capacity import check_capacity, exceeding
    from engine.errors import PageWardenError
    from engine.model.config import read_model_config

    try:
        config = load_config(args)
    except PageWardenError as exc:
        return fail(args, exc)
    try:
        positions = read_model_config(config.model.resolved_path()).max_position_embeddings
        model_note = None
    except PageWardenError as exc:
        positions, model_note = None, f"model not checked: {exc}"
    findings = check_capacity(config, model_max_positions=positions)
    bad = exceeding(findings)
    if args.json:
        print(json.dumps({
            "config": config.source, "exceeds": bool(bad), "model_note": model_note,
            "findings": [f.to_dict() for f in findings],
        }))
    else:
        for f in findings:
            print(f"{'EXCEEDS' if f.exceeds else 'ok':8}{f.message()}")
        if model_note:
            print(f"{'note':8}{model_note}")
    return EXIT_FINDING if bad else EXIT_OK
