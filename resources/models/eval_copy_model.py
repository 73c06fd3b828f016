"""Evaluate a copy model: does the greedy completion reproduce a fresh random marker?

    python resources/models/eval_copy_model.py [--model DIR] [--n 500] [--lengths 32,...,2048] [--json]

For each context length L, N texts are built as a fresh random marker (24-40 lowercase
letters + digits, from a seed unrelated to training) followed by random words, so that the
prompt ``<s>{text}\\n\\nRepeat the text above exactly:\\n`` plus the generated tokens fill L
tokens (the text is the marker alone when L is too short for more). Generation is greedy
(HF transformers, KV cache) and stops at ``</s>`` or after len(marker)+8 tokens. A case passes
when the decoded output contains the marker exactly. Exit status 1 when any length is below
--require (default 0.95).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_copy_model import BOS, EOS, INSTR_IDS, filler, marker  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(HERE / "pagewarden-copy"))
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--lengths", default="32,128,256,512,1024,1536,2048")
    p.add_argument("--require", type=float, default=0.95, help="least pass rate at every length")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    p.add_argument("--seed", type=int, default=987654321, help="eval seed (differs from training)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--show", type=int, default=0, help="print this many failures per length")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", dtype=torch.float32)
    model.eval()
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"model {args.model}  n={args.n}")
    print(f"{'ctx_len':>8} {'contains':>9} {'starts':>7} {'sec':>6}")
    results = {}
    for L in lengths:
        rng = random.Random(args.seed * 7919 + L)
        cases = []
        for _ in range(args.n):
            m = marker(rng)
            size = L - 1 - len(INSTR_IDS) - (len(m) + 8)  # prompt + generated tokens = L
            text = m if size <= len(m) else (m + " " + filler(rng, size))[:size]
            cases.append((m, text))
        t0 = time.time()
        ok = pre = 0
        fails = []
        # group by prompt length (marker-only texts differ in length)
        groups: dict[int, list] = {}
        for c in cases:
            groups.setdefault(len(c[1]), []).append(c)
        for _, group in sorted(groups.items()):
            for i in range(0, len(group), args.batch):
                chunk = group[i : i + args.batch]
                ids = torch.tensor([[BOS] + list(t.encode()) + INSTR_IDS for _, t in chunk])
                max_new = max(len(m) for m, _ in chunk) + 8
                with torch.no_grad():
                    out = model.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                        eos_token_id=EOS, pad_token_id=EOS, use_cache=True,
                    )
                for (m, t), row in zip(chunk, out[:, ids.shape[1] :].tolist()):
                    row = row[: len(m) + 8]
                    if EOS in row:
                        row = row[: row.index(EOS)]
                    s = bytes(b for b in row if b < 256).decode("latin-1")
                    hit = m in s
                    ok += hit
                    pre += s.startswith(m)
                    if not hit and len(fails) < args.show:
                        fails.append((m, s))
        dt = time.time() - t0
        results[L] = ok / args.n
        print(f"{L:>8} {ok/args.n:>9.2%} {pre/args.n:>7.2%} {dt:>6.1f}", flush=True)
        for m, s in fails:
            print(f"    want {m!r}\n    got  {s!r}")
    if args.json:
        print(json.dumps({"model": str(args.model), "n": args.n, "pass_rate": results}))
    return 0 if all(rate >= args.require for rate in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
