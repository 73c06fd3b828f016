"""Train a copy model: a small byte-level Llama that repeats its context.

    python resources/models/train_copy_model.py --out DIR [--data all] [--steps N] [--minutes M] [--seed S] ...

The default model is no longer trained: build_copy_model.py computes weights that copy any
bytes (issue 12). This script is kept for the comparison in bench/RESULTS.md: its default
recipe (``--data lower``, 10,500 steps, 2 threads, ~29 min on 2 idle cores) made the previous
default, which copied lowercase markers only.

Task: the prompt is ``<s>{text}\\n\\nRepeat the text above exactly:\\n`` and the target
completion is ``{text}</s>``. Texts are synthetic and generated on the fly (no downloads), as
bytes (one token per byte, so a multi-byte UTF-8 character is several tokens). Two data sets:

``--data lower`` (default; the committed weights, byte for byte): a random marker (lowercase
letters + digits) followed by filler (random strings, identifiers, numbers, short sentences),
or pure filler.

``--data all`` (issue 12, not committed: it does not yet reach the bar, see bench/RESULTS.md
"Copy model, all alphabets"): a random marker of 4-64 characters of one alphabet (lowercase
alphanumeric, mixed-case alphanumeric, all printable ASCII with punctuation and symbols, or
characters of 1-3 scripts among accented Latin, Greek, Cyrillic, Hebrew, Arabic, Devanagari,
kana, CJK, Hangul, symbols and emoji) or a structured line (invoice, timestamp, e-mail, URL,
code, path), followed by filler of a random style (lowercase words/identifiers/numbers/
sentences; mixed-case prose; printable ASCII strings and structured lines; UTF-8 words and
prose), or filler alone; texts are cut to exactly n bytes (the last character may be split).
Runs measured: ``--data all --steps 4800 --threads 1 --copy-tokens 160`` (22.7 min, shared
machine) and the same with ``--layers 3`` (50.4 min under heavy contention).

The loss is only on completion tokens. For long texts only the first ``--copy-tokens``
completion tokens are trained (no ``</s>``), which keeps sequence length ~ context length;
texts that fit completely are trained with the final ``</s>``. Text lengths follow a
curriculum up to ``--max-len`` (beyond the 2,048-token default window, so that every
position of the window was trained).

The model is ``transformers.LlamaForCausalLM`` with the same byte-level vocabulary and special
ids as ``make_tiny_random.py`` (the engine loader must stay token-for-token equal to HF), saved
with ``save_pretrained`` plus the byte-level tokenizer and ``train_meta.json`` (the arguments,
steps done, tokens, seconds).

Determinism: the schedule (LR, curriculum, data) depends only on the step and the seed, so
the same seed, step count and thread count give the same weights. ``--minutes`` is only a
safety cap: if it stops training before ``--steps``, train_meta.json shows fewer steps than
asked (``--steps 0`` schedules by ``--minutes`` instead: pilots only, not deterministic).
With another process busy on one of two cores, two torch threads ran 3-7x slower than one:
use ``--threads 1`` on a shared machine (different float sums, so different weights).
Evaluate with eval_copy_model.py (500 fresh markers per alphabet and context length).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
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


# ----------------------------------------------------------------------------- data
# Alphabets of the markers (the eval measures each one separately, see eval_copy_model.py).
LOWER = ALNUM
MIXED = string.ascii_letters + string.digits
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))  # space .. ~: letters, digits, punctuation


def _span(a: int, b: int, skip: str = "") -> str:
    return "".join(chr(c) for c in range(a, b + 1) if chr(c) not in skip)


# Non-ASCII scripts: 2-byte (Latin-1 / Latin Extended-A, Greek, Cyrillic, Hebrew, Arabic),
# 3-byte (Devanagari, kana, CJK, Hangul, symbols) and 4-byte (emoji) UTF-8 sequences.
SCRIPTS = {
    "latin": _span(0xC0, 0xFF, "×÷") + _span(0x100, 0x17F),
    "greek": _span(0x391, 0x3A9, "\u03a2") + _span(0x3B1, 0x3C9),
    "cyrillic": _span(0x410, 0x44F) + "ЁёЄєІіЇїЎў",
    "hebrew": _span(0x5D0, 0x5EA),
    "arabic": _span(0x621, 0x64A),
    "devanagari": _span(0x905, 0x939),
    "kana": _span(0x3041, 0x3096) + _span(0x30A1, 0x30FA),
    "cjk": _span(0x4E00, 0x9FA5),
    "hangul": _span(0xAC00, 0xD7A3),
    "symbols": "€£¥¢©®°±µ¶§·…—–‘’“”•←→↑↓≤≥≠≈∞√∑∏∫∂∆∇∈∉∩∪⊂⊃★☆♠♣♥♦♪✓✗",
    "emoji": _span(0x1F600, 0x1F64F) + _span(0x1F300, 0x1F3FF) + _span(0x1F680, 0x1F6C5),
}
SCRIPT_NAMES = sorted(SCRIPTS)
UTF8_WORDS = (
    "café naïve résumé façade déjà Straße Größe über schön Ärger jalapeño niño mañana "
    "São Paulo Zürich Kraków Łódź Ångström smörgåsbord façon où été garçon crème brûlée "
    "αβγ λόγος καλημέρα Αθήνα φίλος θάλασσα привет мир Москва спасибо данные память "
    "日本語 東京 漢字 中文 数据 模型 内存 こんにちは ありがとう カタカナ 서울 한국어 안녕하세요 "
    "שלום עולם مرحبا العالم नमस्ते दुनिया 😀 🚀 🎉 ✓ → € £ ¥ ©"
).split()
WORDS = (
    "the a an of to and in is it for on with as at by from this that be are was were not "
    "we you they he she data file page cache token model memory block table value key "
    "user server request time list index node queue buffer stream batch layer weight "
    "run load save read write open close start stop check test build copy text line "
    "small large fast slow new old first last next other same each every some many "
    "red green blue north south river stone light dark cold warm early late simple"
).split()
NAMES = "ACME Corp|Globex|Initech|Umbrella Ltd|Stark Industries|Wayne Enterprises|Hooli|Vandelay Import".split("|")


def rand_alnum(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALNUM) for _ in range(n))


def marker(rng: random.Random) -> str:
    """The original marker: 24-40 lowercase letters and digits."""
    return rand_alnum(rng, rng.randint(24, 40))


def utf8_pool(rng: random.Random) -> list[str]:
    """Character pools for one UTF-8 text: 1-3 scripts, sometimes with ASCII letters/digits."""
    pools = [SCRIPTS[s] for s in rng.sample(SCRIPT_NAMES, rng.randint(1, 3))]
    if rng.random() < 0.5:
        pools.append(MIXED)
    return pools


def rand_chars(rng: random.Random, n: int, alphabet: str) -> str:
    """n random characters of one alphabet: lower, mixed, printable or utf8 (several scripts,
    each script equally likely whatever its size)."""
    if alphabet == "utf8":
        pools = utf8_pool(rng)
        return "".join(rng.choice(rng.choice(pools)) for _ in range(n))
    chars = {"lower": LOWER, "mixed": MIXED, "printable": PRINTABLE}[alphabet]
    return "".join(rng.choice(chars) for _ in range(n))


def alphabet_marker(rng: random.Random, alphabet: str, lo: int = 24, hi: int = 40) -> str:
    """A random marker of lo..hi characters of one alphabet (the eval's markers)."""
    if alphabet == "lower":
        return rand_alnum(rng, rng.randint(lo, hi))
    return rand_chars(rng, rng.randint(lo, hi), alphabet)


def identifier(rng: random.Random) -> str:
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


def number(rng: random.Random) -> str:
    k = rng.random()
    if k < 0.5:
        return str(rng.randint(0, 10 ** rng.randint(1, 9)))
    if k < 0.8:
        return f"{rng.uniform(-1000, 1000):.{rng.randint(1, 5)}f}"
    return "0x" + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(2, 12)))


def filler_piece(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.30:
        return rand_alnum(rng, rng.randint(3, 16))
    if r < 0.50:  # identifiers
        return identifier(rng)
    if r < 0.65:  # numbers
        return number(rng)
    # short sentence
    ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
    return " ".join(ws).capitalize() + rng.choice(".!?")


def filler(rng: random.Random, n: int) -> str:
    """The original filler: lowercase strings, identifiers, numbers, short sentences."""
    out, size = [], 0
    while size < n:
        p = filler_piece(rng) + rng.choice([" ", " ", " ", "\n", ", ", "; ", " | "])
        out.append(p)
        size += len(p)
    return "".join(out)[:n]


def structured(rng: random.Random) -> str:
    """Invoice lines, dates, money, emails, URLs, paths, code: text with punctuation."""
    k = rng.randrange(8)
    name = rng.choice(NAMES)
    date = f"{rng.randint(1990, 2039)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    money = f"{rng.choice('$€£¥')}{rng.randint(0, 99999):,}.{rng.randint(0, 99):02d}"
    if k == 0:
        return f"Invoice {date}: {name} owes {money}"
    if k == 1:
        return f"#{rng.randint(1, 99999)} {date} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} {money}"
    if k == 2:
        user = rand_chars(rng, rng.randint(3, 10), "mixed")
        return f"{user}.{rng.choice(WORDS)}@{rng.choice(WORDS)}-{rng.randint(1, 99)}.{rng.choice(['com', 'org', 'io', 'de'])}"
    if k == 3:
        parts = "/".join(identifier(rng) for _ in range(rng.randint(1, 4)))
        return f"https://{rng.choice(WORDS)}.example/{parts}?id={rng.randint(0, 10**6)}&k={rand_chars(rng, 6, 'mixed')}"
    if k == 4:
        return f"{identifier(rng)}({number(rng)}, \"{rand_chars(rng, rng.randint(2, 9), 'printable')}\") -> {{'{rng.choice(WORDS)}': [{number(rng)}]}}"
    if k == 5:
        return f"C:\\{identifier(rng)}\\{identifier(rng)}.{rng.choice(['txt', 'csv', 'py', 'log'])}"
    if k == 6:
        return f"{name} <{rng.choice(WORDS)}@{rng.choice(WORDS)}.com> ({rng.randint(10, 99)}%) ~{number(rng)}"
    return f"{rng.choice(WORDS).upper()}={rand_chars(rng, rng.randint(8, 24), 'printable')};"


def utf8_word(rng: random.Random, pools: list[str]) -> str:
    if rng.random() < 0.3:
        return rng.choice(UTF8_WORDS)
    pool = rng.choice(pools)
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))


def styled_piece(rng: random.Random, style: str, pools: list[str]) -> str:
    """One piece of filler text of a style: words (the original), mixed, printable, utf8."""
    if style == "words":
        return filler_piece(rng)
    r = rng.random()
    if style == "mixed":
        if r < 0.35:
            return rand_chars(rng, rng.randint(3, 16), "mixed")
        if r < 0.55:
            return identifier(rng).title() if rng.random() < 0.3 else identifier(rng)
        if r < 0.65:
            return number(rng)
        ws = [rng.choice(WORDS).capitalize() if rng.random() < 0.3 else rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
        return " ".join(ws).capitalize() + rng.choice(".!?")
    if style == "printable":
        if r < 0.35:
            return rand_chars(rng, rng.randint(2, 16), "printable")
        if r < 0.7:
            return structured(rng)
        if r < 0.8:
            return number(rng)
        ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
        return (" ".join(ws).capitalize() + rng.choice(".!?:;") + rng.choice(["", " (", " \"", " [", " -- "]))
    # utf8: words of the text's scripts and prose mixing them with ASCII
    if r < 0.6:
        return " ".join(utf8_word(rng, pools) for _ in range(rng.randint(1, 6)))
    if r < 0.8:
        return " ".join(rng.choice(WORDS + UTF8_WORDS) for _ in range(rng.randint(2, 8))) + rng.choice(".!?。")
    return rng.choice([number(rng), structured(rng), identifier(rng)])


STYLES = ("words", "mixed", "printable", "utf8")


def styled_filler(rng: random.Random, n_bytes: int, style: str, pools: list[str] | None = None) -> str:
    """Filler text of at least n_bytes UTF-8 bytes (cut it with ``cut_bytes``)."""
    if style == "words":
        return filler(rng, n_bytes)
    pools = pools or utf8_pool(rng)
    out, size = [], 0
    while size < n_bytes:
        p = styled_piece(rng, style, pools) + rng.choice([" ", " ", " ", "\n", ", ", "; ", " | ", "\t", " — "])
        out.append(p)
        size += len(p.encode())
    return "".join(out)


def cut_bytes(text: str, n: int) -> bytes:
    """The first n bytes of the UTF-8 text (a multi-byte character may be cut at the end)."""
    return text.encode()[:n]


def train_marker(rng: random.Random) -> str:
    """A marker of any alphabet, 4-64 characters, or a structured line."""
    r = rng.random()
    n = rng.randint(24, 40) if rng.random() < 0.5 else rng.randint(4, 64)
    if r < 0.10:
        return rand_chars(rng, n, "lower")
    if r < 0.25:
        return rand_chars(rng, n, "mixed")
    if r < 0.45:
        return rand_chars(rng, n, "printable")
    if r < 0.85:  # multi-byte text is the hardest to copy byte by byte: the largest share
        return rand_chars(rng, n, "utf8")
    return structured(rng)


def make_text_lower(rng: random.Random, n: int) -> bytes:
    """The committed recipe's text (``--data lower``): exactly n ASCII bytes, usually a
    lowercase marker first, then the original filler."""
    r = rng.random()
    if r < 0.6:
        m = marker(rng)
        if len(m) >= n:
            return m[:n].encode()
        return (m + rng.choice([" ", "\n", ", ", " | "]) + filler(rng, n))[:n].encode()
    if r < 0.8:  # marker somewhere inside the first bytes, then filler
        pre = filler(rng, rng.randint(1, 12))
        return (pre + " " + marker(rng) + " " + filler(rng, n))[:n].encode()
    return filler(rng, n).encode()


def make_text(rng: random.Random, n: int) -> bytes:
    """``--data all``: a text of exactly n bytes: usually a marker of any alphabet first, then filler of a
    random style (any text, not only the eval's), or filler alone."""
    style = rng.choices(STYLES, weights=(0.15, 0.2, 0.25, 0.4))[0]
    sep = rng.choice([" ", "\n", ", ", " | ", ": ", "\t"])
    r = rng.random()
    if r < 0.6:
        m = train_marker(rng)
        if len(m.encode()) >= n:
            return cut_bytes(m, n)
        return cut_bytes(m + sep + styled_filler(rng, n, style), n)
    if r < 0.8:  # marker somewhere inside the first bytes, then filler
        pre = styled_filler(rng, rng.randint(1, 12), style)[: rng.randint(1, 12)]
        return cut_bytes(pre + " " + train_marker(rng) + sep + styled_filler(rng, n, style), n)
    return cut_bytes(styled_filler(rng, n, style), n)


def make_batch(rng: random.Random, n: int, batch: int, copy_tokens: int, data: str = "lower"):
    """Equal-length examples: returns input ids [B, T] and the index of the first target."""
    full = n <= copy_tokens
    rows = []
    text = make_text_lower if data == "lower" else make_text
    for _ in range(batch):
        t = list(text(rng, n))
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
    p.add_argument("--out", type=Path, required=True, help="output directory (the default model is built, not trained)")
    p.add_argument("--minutes", type=float, default=None, help="wall-clock budget")
    p.add_argument("--steps", type=int, default=10500,
                   help="step budget (deterministic schedule); 0: schedule by --minutes (pilots only, not deterministic)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data", choices=("lower", "all"), default="lower",
                   help="lower: the committed recipe (lowercase markers); all: every alphabet (experimental, see the docstring)")
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
        if args.steps:
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
        ids, n_target = make_batch(rng, n, batch, args.copy_tokens, args.data)
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
