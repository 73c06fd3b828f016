"""Build the default model: a byte-level Llama whose weights are computed, not trained, to
repeat its context exactly (an explicit n-gram induction circuit).

    python resources/models/build_copy_model.py [--out DIR] [--ngram 8] [--check]

Why computed: trained copy models (train_copy_model.py, bench/RESULTS.md "Copy model, all
alphabets") copied lowercase markers but not mixed case, punctuation or multi-byte UTF-8
within the 60-minute budget; the marker-in-output evidence needs a model that copies any
bytes. This one does by construction, and eval_copy_model.py measures it like any other.

The circuit (standard ``LlamaForCausalLM``: two layers, RMSNorm, RoPE, GQA, a zero MLP):

* Each byte is coded by its 8 bits as +-1 (``<s>`` by a separate flag of the same norm), plus
  a constant dimension. The residual stream holds the current token's code (slot 0).
* Layer 1: head d (d = 1..n) is a *previous-token head* at offset d. Its query and key are
  constants rotated by RoPE, so its score depends only on the distance t - s:
  ``f(t-s) = sum_i w cos(theta_i (t-s-d))`` over the 27 fastest rotary planes, which peaks
  at t-s = d with a margin of >= MARGIN logits over every other distance up to MAX_POSITIONS
  (checked below, in float64). ``<s>`` gets a small bonus so that near the start (t < d) the
  head reads ``<s>``: positions before the text look like padding. The heads share one K/V
  head (the value is the token's code) and write tok[t-d] into slot d.
* Layer 2: one induction head. Its query is the last n tokens (slots 0..n-1), its key the n
  tokens before the key's position (slots 1..n), both in rotary planes slow enough to be
  position-free (angle < 0.04 rad over MAX_POSITIONS). The score counts agreeing bits
  (8 per equal byte, 7 for ``<s>`` padding against anything, <s> itself never a key), so the position s whose preceding n bytes
  equal the last n bytes wins by >= 1 bit, i.e. >= MARGIN / 2 logits; its value, tok[s], is
  written to the output slot.
* The LM head reads the output slot: the copied byte's logit leads every other byte by
  >= 2 bits * LM_SCALE. ``</s>`` is emitted instead of a second ``\\n`` when copying
  ``\\n\\n`` (the prompt's text ends at ``\\n\\nRepeat the text above exactly:``).

So after ``<s>{text}\\n\\nRepeat the text above exactly:\\n`` the first completion token
matches the padded start of the text, and every next one continues the copy. What it cannot
do: tell apart two places where the same n bytes are followed by different bytes (an n-gram
that repeats in the text); a larger --ngram makes that rarer (8 bytes: 2-8 characters).

Deterministic, no training data, no randomness: the same arguments write the same files.
Needs torch, safetensors and tokenizers only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_tiny_random import CONFIG as TINY_CONFIG  # noqa: E402
from make_tiny_random import write_tokenizer_files  # noqa: E402

BOS, EOS, NEWLINE = 256, 257, 10
BITS = 8
CODE = BITS + 1  # 8 bits as +-1, then the <s> flag
HEAD_DIM = 128
ROPE_THETA = 1e12
MAX_POSITIONS = 4096  # the checkpoint's max_position_embeddings
CHECK_POSITIONS = 4400  # margins are checked this far (the eval's longest prompt + completion)
POSITION_PLANES = range(0, 27)  # rotary planes used by the previous-token heads
MARGIN = 40.0  # least logit lead of the right key over any other, both layers
LM_SCALE = 10.0  # logit per agreeing output bit
EOS_BONUS = 5.0
PAD_AGREE = BITS - 1  # agreement of <s> padding with any byte: between a byte one bit off (6) and an equal one (8)
BOS_KEY_PENALTY = 4 * BITS * BITS  # <s> itself is never the key (its 'next byte' is the text's first)


def code_table(vocab: int) -> torch.Tensor:
    """[vocab, CODE]: a byte's bits as +-1; <s> a flag of the same norm; others zero."""
    table = torch.zeros(vocab, CODE, dtype=torch.float64)
    for b in range(256):
        table[b, :BITS] = torch.tensor([1.0 if b >> k & 1 else -1.0 for k in range(BITS)])
    table[BOS, BITS] = math.sqrt(BITS)
    return table


def inv_freq() -> torch.Tensor:
    return 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))


def position_scores(delta: int) -> torch.Tensor:
    """f(distance) of the offset-`delta` head for distances 0..CHECK_POSITIONS (weights sum to 1)."""
    freqs = inv_freq()[list(POSITION_PLANES)]
    dist = torch.arange(0, CHECK_POSITIONS + 1, dtype=torch.float64)
    return torch.cos((dist[:, None] - delta) * freqs[None, :]).mean(dim=1)


def position_margins(ngram: int, bonuses: torch.Tensor) -> torch.Tensor:
    """For each <s> bonus, the least lead (weights sum to 1) of the wanted key over every other,
    for every head and query position: at t >= d the key d back beats every other key (and <s>
    with its bonus); at t < d, <s> (at distance t) beats every later key."""
    worst = torch.full_like(bonuses, math.inf)
    for delta in range(1, ngram + 1):
        f = position_scores(delta)
        others = torch.cat([f[:delta], f[delta + 1 :]]).max()
        worst = torch.minimum(worst, (f[delta] - others).expand_as(bonuses))
        worst = torch.minimum(worst, f[delta] - f[delta + 1 :].max() - bonuses)
        for t in range(1, delta):
            worst = torch.minimum(worst, f[t] + bonuses - f[:t].max())
    return worst


def best_bonus(ngram: int) -> tuple[float, float]:
    """The <s> bonus (0..0.1 in steps of 1e-4) with the largest position margin, and that margin."""
    bonuses = torch.arange(0, 1001, dtype=torch.float64) * 1e-4
    margins = position_margins(ngram, bonuses)
    i = int(margins.argmax())
    return float(bonuses[i]), float(margins[i])


def content_dims(ngram: int) -> list[int]:
    """Head dims of the slowest rotary planes (both halves of each plane), enough for n codes."""
    need = ngram * CODE + 1  # + the <s> key penalty
    planes = list(range(HEAD_DIM // 2 - 1, -1, -1))  # slowest first
    dims: list[int] = []
    for p in planes:
        dims += [p, p + HEAD_DIM // 2]
        if len(dims) >= need:
            break
    slowest_used = min(p for p in planes[: len(dims) // 2])
    angle = float(inv_freq()[slowest_used]) * CHECK_POSITIONS
    if slowest_used <= max(POSITION_PLANES) or angle > 0.04:
        raise ValueError(f"--ngram {ngram} needs {need} position-free dims; plane {slowest_used} turns {angle:.3f} rad")
    return dims[:need]


def build(ngram: int) -> tuple[dict, dict[str, torch.Tensor], dict]:
    if not 1 <= ngram <= 8:
        raise ValueError(f"--ngram must be 1..8 (8 heads of {HEAD_DIM} dims share the planes), got {ngram}")
    heads = 8
    cfg = dict(TINY_CONFIG)
    hidden = 128
    cfg.update(
        hidden_size=hidden, intermediate_size=16, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=1, head_dim=HEAD_DIM, max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default"}, tie_word_embeddings=False,
    )
    vocab = cfg["vocab_size"]
    codes = code_table(vocab)
    # residual layout
    CONST = 0
    slot = [1 + CODE * k for k in range(ngram + 1)]  # slot 0: this token; slot d: the token d back
    OUT = 1 + CODE * (ngram + 1)
    assert OUT + CODE <= hidden
    half = HEAD_DIM // 2
    scale = HEAD_DIM ** -0.5  # attention multiplies q.k by this

    def rms(norm2: float) -> float:
        return math.sqrt(norm2 / hidden)

    r1 = rms(1.0 + BITS)  # embedding: const 1 + one code (norm^2 8)
    r2 = rms(1.0 + BITS * (ngram + 1))  # after layer 1: + n codes
    rf = rms(1.0 + BITS * (ngram + 2))  # after layer 2: + the output code

    w: dict[str, torch.Tensor] = {}
    emb = torch.zeros(vocab, hidden, dtype=torch.float64)
    emb[:, CONST] = 1.0
    emb[:, slot[0] : slot[0] + CODE] = codes
    w["model.embed_tokens.weight"] = emb

    # ---- layer 1: previous-token heads at offsets 1..n (one shared K/V head)
    bonus, margin = best_bonus(ngram)
    if margin <= 0:
        raise ValueError(f"no <s> bonus separates the previous-token heads (margin {margin})")
    strength = MARGIN / margin / scale  # q.k for a total weight of 1
    freqs = inv_freq()
    planes = list(POSITION_PLANES)
    bonus_plane = half - 1  # slowest plane: position-free
    q1 = torch.zeros(heads * HEAD_DIM, hidden, dtype=torch.float64)
    k1 = torch.zeros(HEAD_DIM, hidden, dtype=torch.float64)
    v1 = torch.zeros(HEAD_DIM, hidden, dtype=torch.float64)
    o1 = torch.zeros(hidden, heads * HEAD_DIM, dtype=torch.float64)
    const_in = 1.0 / r1  # the constant after the input norm
    amp = math.sqrt(strength / len(planes))
    for i in planes:
        k1[i, CONST] = amp / const_in
    k1[bonus_plane, slot[0] + BITS] = 1.0 / (math.sqrt(BITS) / r1)  # 1 for <s> only
    for d in range(1, ngram + 1):
        h = (d - 1) * HEAD_DIM
        for i in planes:
            a = -d * float(freqs[i])
            q1[h + i, CONST] = amp * math.cos(a) / const_in
            q1[h + i + half, CONST] = amp * math.sin(a) / const_in
        q1[h + bonus_plane, CONST] = bonus * strength / const_in
        o1[slot[d] : slot[d] + CODE, h : h + CODE] = torch.eye(CODE, dtype=torch.float64)
    v1[:CODE, slot[0] : slot[0] + CODE] = torch.eye(CODE, dtype=torch.float64) * r1
    p = "model.layers.0."
    w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"] = q1, k1
    w[p + "self_attn.v_proj.weight"], w[p + "self_attn.o_proj.weight"] = v1, o1

    # ---- layer 2: the induction head (head 0); the other heads are off
    dims = content_dims(ngram)
    match = MARGIN / 2 / scale  # q.k per agreeing bit: 2 bits apart -> MARGIN logits
    aq = ak = math.sqrt(match)
    q2 = torch.zeros(heads * HEAD_DIM, hidden, dtype=torch.float64)
    k2 = torch.zeros(HEAD_DIM, hidden, dtype=torch.float64)
    v2 = torch.zeros(HEAD_DIM, hidden, dtype=torch.float64)
    o2 = torch.zeros(hidden, heads * HEAD_DIM, dtype=torch.float64)
    for k in range(ngram):  # query slot k (tok[t-k]) against key slot k+1 (tok[s-1-k])
        block = dims[k * CODE : (k + 1) * CODE]
        for b in range(BITS):
            q2[block[b], slot[k] + b] = aq * r2
            k2[block[b], slot[k + 1] + b] = ak * r2
        # padding: <s> in the key's window (before the text) agrees more than a byte one bit
        # off and less than an equal byte, so that the padded start is the best key for the
        # first completion token (8 pads against 7 pads and the text's first byte) but loses
        # to a key whose bytes agree (1 equal byte and 7 pads against 8 pads)
        k2[block[BITS], slot[k + 1] + BITS] = ak * r2
        q2[block[BITS], CONST] = aq * PAD_AGREE / math.sqrt(BITS) * r2
    penalty_dim = dims[ngram * CODE] if len(dims) > ngram * CODE else None
    if penalty_dim is None:
        raise ValueError(f"--ngram {ngram}: no head dim left for the <s> key penalty")
    k2[penalty_dim, slot[0] + BITS] = ak * r2  # sqrt(8) ak at <s> only
    q2[penalty_dim, CONST] = -aq * BOS_KEY_PENALTY / math.sqrt(BITS) * r2
    v2[:BITS, slot[0] : slot[0] + BITS] = torch.eye(BITS, dtype=torch.float64) * r2
    o2[OUT : OUT + BITS, :BITS] = torch.eye(BITS, dtype=torch.float64)
    p = "model.layers.1."
    w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"] = q2, k2
    w[p + "self_attn.v_proj.weight"], w[p + "self_attn.o_proj.weight"] = v2, o2

    for layer in range(2):
        p = f"model.layers.{layer}."
        w[p + "mlp.gate_proj.weight"] = torch.zeros(cfg["intermediate_size"], hidden, dtype=torch.float64)
        w[p + "mlp.up_proj.weight"] = torch.zeros(cfg["intermediate_size"], hidden, dtype=torch.float64)
        w[p + "mlp.down_proj.weight"] = torch.zeros(hidden, cfg["intermediate_size"], dtype=torch.float64)
        w[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.float64)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.float64)
    w["model.norm.weight"] = torch.ones(hidden, dtype=torch.float64)

    # ---- LM head: the output slot's bits; </s> instead of the second "\n" of "\n\n"
    head = torch.zeros(vocab, hidden, dtype=torch.float64)
    head[:256, OUT : OUT + BITS] = codes[:256, :BITS] * LM_SCALE * rf
    nl = codes[NEWLINE, :BITS]
    head[EOS, OUT : OUT + BITS] = nl * LM_SCALE * rf
    head[EOS, slot[0] : slot[0] + BITS] = nl * EOS_BONUS * rf
    head[EOS, CONST] = -(BITS - 1) * EOS_BONUS * rf  # +bonus when this token is "\n", <= -bonus otherwise
    w["lm_head.weight"] = head

    meta = {
        "method": "constructed (build_copy_model.py), not trained",
        "ngram": ngram, "margin_logits": MARGIN, "position_margin_rel": margin, "bos_bonus_rel": bonus,
        "lm_scale": LM_SCALE, "checked_positions": CHECK_POSITIONS,
        "params": int(sum(t.numel() for t in w.values())),
    }
    return cfg, {k: v.to(torch.float32).contiguous() for k, v in w.items()}, meta


def write(out: Path, ngram: int) -> dict:
    cfg, weights, meta = build(ngram)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out, cfg["max_position_embeddings"])
    (out / "build_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    stale = out / "train_meta.json"
    if stale.exists():
        stale.unlink()
    return meta


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "pagewarden-copy")
    p.add_argument("--ngram", type=int, default=8, help="bytes matched before each copied byte (1..8)")
    args = p.parse_args()
    meta = write(args.out, args.ngram)
    print(f"wrote {args.out}: {json.dumps(meta)}")


if __name__ == "__main__":
    main()
