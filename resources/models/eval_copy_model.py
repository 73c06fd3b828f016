"""Evaluate a copy model: does the greedy completion reproduce a fresh random marker?

    python resources/models/eval_copy_model.py --model DIR [--n 100] [--lengths 32,128,512,1024,2048]

For each context length L (bytes = tokens of the text), N texts are built as a fresh random
marker (24-40 lowercase letters + digits, from a seed unrelated to training) followed by filler
up to L bytes (the text is the marker alone when L is shorter). The prompt is
``<s>{text}\\n\\nRepeat the text above exactly:\\n``; generation is greedy with KV cache and
stops at ``</s>`` or after len(marker)+8 tokens. A case passes when the decoded output contains
the marker exactly. Prompts of one length share a size, so they are generated in batches.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_copy_model import BOS, EOS, INSTR_IDS, filler, marker  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="/tmp/pw-copy-model")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--lengths", default="32,128,512,1024,2048")
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
            text = m if L <= len(m) else (m + " " + filler(rng, L))[:L]
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
    return results


if __name__ == "__main__":
    main()
