"""Train the default model: a small byte-level Llama that repeats its context.

    python resources/models/train_copy_model.py            # the committed recipe, ~25 min on 2 cores
    python resources/models/train_copy_model.py --out DIR [--steps N] [--minutes M] [--seed S] ...

Task: the prompt is ``<s>{text}\\n\\nRepeat the text above exactly:\\n`` and the target
completion is ``{text}</s>``. Texts are synthetic and generated on the fly (no downloads):
a random marker (lowercase letters + digits) followed by filler (random strings, identifiers,
numbers, short sentences), or pure filler. The loss is only on completion tokens. For long
texts only the first ``--copy-tokens`` completion tokens are trained (no ``</s>``), which keeps
sequence length ~ context length; texts that fit completely are trained with the final ``</s>``.
Text lengths follow a curriculum up to ``--max-len`` (beyond the 2,048-token default window,
so that every position of the window was trained).

The model is ``transformers.LlamaForCausalLM`` with the same byte-level vocabulary and special
ids as ``make_tiny_random.py`` (the engine loader must stay token-for-token equal to HF), saved
with ``save_pretrained`` plus the byte-level tokenizer and ``train_meta.json`` (the arguments,
steps done, tokens, seconds).

Determinism: the schedule (LR, curriculum, data) depends only on the step and the seed, so
the same seed, step count and thread count give the same weights. ``--minutes`` is only a
safety cap: if it stops training before ``--steps``, train_meta.json shows fewer steps than asked.
Evaluate with eval_copy_model.py (500 fresh markers per context length).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_tiny_random import CONFIG as TINY_CONFIG  # noqa: E402
from make_tiny_random import write_tokenizer_files  # noqa: E402

BOS, EOS, PAD = 256, 257, 258
INSTRUCTION = "\n\nRepeat the text above exactly:\n"
INSTR_IDS = list(INSTRUCTION.encode())
ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
WORDS = (
    "the a an of to and in is it for on with as at by from this that be are was were not "
    "we you they he she data file page cache token model memory block table value key "
    "user server request time list index node queue buffer stream batch layer weight "
    "run load save read write open close start stop check test build copy text line "
    "small large fast slow new old first last next other same each every some many "
    "red green blue north south river stone light dark cold warm early late simple"
).split()


# ----------------------------------------------------------------------------- data
def rand_alnum(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALNUM) for _ in range(n))


def marker(rng: random.Random) -> str:
    return rand_alnum(rng, rng.randint(24, 40))


def filler_piece(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.30:
        return rand_alnum(rng, rng.randint(3, 16))
    if r < 0.50:  # identifiers
        ws = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
        style = rng.random()
        if style < 0.4:
            s = "_".join(ws)
        elif style < 0.7:
            s = ws[0] + "".join(w.capitalize() for w in ws[1:])
        else:
            s = "-".join(ws)
        if rng.random() < 0.4:
            s += str(rng.randint(0, 999))
        return s
    if r < 0.65:  # numbers
        k = rng.random()
        if k < 0.5:
            return str(rng.randint(0, 10 ** rng.randint(1, 9)))
        if k < 0.8:
            return f"{rng.uniform(-1000, 1000):.{rng.randint(1, 5)}f}"
        return "0x" + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(2, 12)))
    # short sentence
    ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
    return " ".join(ws).capitalize() + rng.choice(".!?")


def filler(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        p = filler_piece(rng) + rng.choice([" ", " ", " ", "\n", ", ", "; ", " | "])
        out.append(p)
        size += len(p)
    return "".join(out)[:n]


def make_text(rng: random.Random, n: int) -> str:
    """A text of exactly n bytes (ASCII): usually a marker first, then filler."""
    r = rng.random()
    if r < 0.6:
        m = marker(rng)
        if len(m) >= n:
            return m[:n]
        return (m + rng.choice([" ", "\n", ", ", " | "]) + filler(rng, n))[:n]
    if r < 0.8:  # marker somewhere inside the first bytes, then filler
        pre = filler(rng, rng.randint(1, 12))
        return (pre + " " + marker(rng) + " " + filler(rng, n))[:n]
    return filler(rng, n)


def make_batch(rng: random.Random, n: int, batch: int, copy_tokens: int):
    """Equal-length examples: returns input ids [B, T] and the index of the first target."""
    full = n <= copy_tokens
    rows = []
    for _ in range(batch):
        t = list(make_text(rng, n).encode())
        target = t + [EOS] if full else t[:copy_tokens]
        rows.append([BOS] + t + INSTR_IDS + target)
    ids = torch.tensor(rows, dtype=torch.long)
    n_target = (n + 1) if full else copy_tokens
    return ids, n_target


# ----------------------------------------------------------------------------- model
def build_config(args) -> dict:
    cfg = dict(TINY_CONFIG)
    cfg.update(
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": float(args.rope_theta), "rope_type": "default"},
    )
    return cfg


def save_checkpoint(model, cfg: dict, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    write_tokenizer_files(out, cfg["max_position_embeddings"])
    (out / "train_meta.json").write_text(json.dumps(meta, indent=2) + "\n")


# ----------------------------------------------------------------------------- schedule
def curriculum_len(rng: random.Random, progress: float, args) -> int:
    """Text length for a step: the cap grows geometrically from --min-len to --max-len over
    the first --curriculum fraction of training; lengths are log-uniform below the cap, with
    extra weight on [cap/2, cap]."""
    f = min(1.0, progress / max(args.curriculum, 1e-9))
    cap = args.start_len * (args.max_len / args.start_len) ** f
    lo = args.min_len
    if rng.random() < 0.35:  # near the cap, spread out (an exact-cap spike teaches fixed offsets)
        n = rng.uniform(cap / 2, cap)
    else:
        n = math.exp(rng.uniform(math.log(lo), math.log(max(cap, lo + 1))))
    return max(lo, int(n))


def lr_at(progress: float, step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


# ----------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "pagewarden-copy")
    p.add_argument("--minutes", type=float, default=None, help="wall-clock budget")
    p.add_argument("--steps", type=int, default=10500, help="step budget (deterministic schedule)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--batch-tokens", type=int, default=4096, help="approx tokens per step")
    p.add_argument("--copy-tokens", type=int, default=64, help="completion tokens trained for long texts")
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--start-len", type=int, default=48)
    p.add_argument("--max-len", type=int, default=2300)
    p.add_argument("--curriculum", type=float, default=0.4, help="fraction of training to reach --max-len")
    p.add_argument("--log-every", type=int, default=250)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1) if hasattr(torch, "set_num_interop_threads") else None
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = build_config(args)
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "dtype")})
    hf_cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa")
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params/1e6:.3f}M  fp32 {n_params*4/2**20:.2f} MiB  cfg={json.dumps({k: cfg[k] for k in ('hidden_size','intermediate_size','num_hidden_layers','num_attention_heads','num_key_value_heads')})}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
    )

    t0 = time.time()
    budget_s = args.minutes * 60 if args.minutes is not None else None
    step, tokens, loss_acc, acc_acc, n_acc = 0, 0, 0.0, 0.0, 0
    while True:
        elapsed = time.time() - t0
        if args.steps is not None:
            progress = step / args.steps
            if step >= args.steps or (budget_s is not None and elapsed >= budget_s):
                break
        else:
            progress = elapsed / budget_s
            if progress >= 1.0:
                break
        n = curriculum_len(rng, progress, args)
        seq = 1 + n + len(INSTR_IDS) + min(n + 1, args.copy_tokens)
        batch = max(1, args.batch_tokens // seq)
        ids, n_target = make_batch(rng, n, batch, args.copy_tokens)
        lr = lr_at(progress, step, args)
        for g in opt.param_groups:
            g["lr"] = lr

        hidden = model.model(input_ids=ids[:, :-1]).last_hidden_state
        h = hidden[:, -n_target:]  # positions predicting the target tokens
        logits = model.lm_head(h).float()
        tgt = ids[:, -n_target:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()

        with torch.no_grad():
            loss_acc += loss.item()
            acc_acc += (logits.argmax(-1) == tgt).float().mean().item()
            n_acc += 1
        tokens += ids.numel()
        step += 1
        if step % args.log_every == 0:
            el = time.time() - t0
            print(
                f"step {step:6d} t {el/60:5.1f}m prog {progress:4.2f} len {n:5d} bs {batch:3d} lr {lr:.2e} "
                f"loss {loss_acc/n_acc:.4f} tokacc {acc_acc/n_acc:.4f} tok/s {tokens/el:7.0f}",
                flush=True,
            )
            loss_acc, acc_acc, n_acc = 0.0, 0.0, 0

    el = time.time() - t0
    meta = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "steps": step, "tokens": tokens, "seconds": round(el, 1), "params": n_params}
    save_checkpoint(model, cfg, args.out, meta)
    print(f"done: {step} steps, {tokens} tokens, {el/60:.1f} min, {tokens/el:.0f} tok/s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
