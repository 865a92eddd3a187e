"""GPT decoders: GPT-2 (Radford et al., "Language Models are Unsupervised
Multitask Learners", 2019) and GPT-3 (Brown et al., "Language Models are
Few-Shot Learners", 2020, Table 2.1).

``tokens (N, S) -> wte (vocab, D) -> + wpe (S, D, learned) -> layers x
[x = x + MHA(LN(x)) (causal); x = x + W2 gelu(W1 LN(x)) (width 4 D)] ->
LN -> x @ wte^T (tied) -> softmax``: the pre-norm block of GPT-2 (section
2.3), next-token cross-entropy like the zoo transformer. The output head is
:class:`~legionpy.ops.TiedDense` holding the embedding's very Parameter
(weight tying, Press & Wolf 2017), so the table is counted, stored and
updated once and its gradient is the sum of both uses. GELU is the tanh
approximation GPT-2's code uses.

Configurations (layers, d_model, heads; vocabulary 50,257; sequence 1,024
for GPT-2, 2,048 for GPT-3):

============  ======  =======  =====  ======  =====================
name          layers  d_model  heads  d_head  parameters (exact)
============  ======  =======  =====  ======  =====================
gpt2          12      768      12     64      124,439,808
gpt3-1.3b     24      2048     16     128     1,315,723,264
gpt3-2.7b     32      2560     32     80      2,651,553,280
gpt3-6.7b     32      4096     32     128     6,658,404,352
gpt3-13b      40      5120     40     128     12,853,386,240
============  ======  =======  =====  ======  =====================

Where Table 2.1's heads x d_head is not d_model we keep d_model and the
paper's d_head = 128: GPT-3 XL (1.3B) lists 24 heads of 128 for d_model
2048, so it gets 16 heads; GPT-3 13B lists d_model 5140 with 40 heads of
128 (= 5120, and 5140 is not divisible by 40), so it gets d_model 5120,
the width 13B-class models use (OPT-13B, Megatron). The paper's
"1.3B/2.7B/13.0B" are rounded: the exact counts of its shapes (tied
embedding, learned positions, biases everywhere, two LayerNorms per block
and a final one) are those above, +1.2%, -1.8% and -1.1% from the rounded
names (:func:`gpt_parameters` is the closed form; ``gpt2`` matches
Hugging Face's ``GPT2LMHeadModel``, 124,439,808).
"""

from __future__ import annotations

__all__ = ["build_gpt", "gpt_parameters", "GPT_CONFIGS"]

#: name -> (layers, d_model, heads, seq, vocab, batch of the paper)
#: (GPT-3's batch: 0.5M/1M/1M/2M/2M tokens of 2048 -> sequences)
GPT_CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "gpt2": (12, 768, 12, 1024, 50257, 512),
    "gpt3-1.3b": (24, 2048, 16, 2048, 50257, 512),
    "gpt3-2.7b": (32, 2560, 32, 2048, 50257, 512),
    "gpt3-6.7b": (32, 4096, 32, 2048, 50257, 1024),
    "gpt3-13b": (40, 5120, 40, 2048, 50257, 1024),
}


def gpt_parameters(layers: int, d_model: int, seq: int, vocab: int) -> int:
    """Trainable scalars of :func:`build_gpt`: per block ``4 (D^2 + D)``
    (q, k, v, out), ``8 D^2 + 5 D`` (MLP of width 4 D) and ``4 D`` (two
    LayerNorms); plus ``vocab D`` (tied), ``seq D`` (positions), ``2 D``."""
    d = d_model
    return layers * (12 * d * d + 13 * d) + vocab * d + seq * d + 2 * d


def build_gpt(b, seq: int = 1024, d_model: int = 768, heads: int = 12, layers: int = 12,
              vocab: int = 50257):
    """The decoder on builder ``b`` (a Graph or an nn.Model); returns the softmax."""
    tokens = b.input((seq,), dtype="int32", name="tokens")
    emb = b.embedding(tokens, vocab, d_model, name="wte")
    x = b.add_bias(emb, ndim=2, name="wpe")
    for i in range(layers):
        n = f"h{i}"
        a = b.multihead_attention(b.layer_norm(x, name=f"{n}.ln1"), heads, causal=True,
                                  name=f"{n}.attn")
        x = b.add(x, a, name=f"{n}.res1")
        f = b.dense(b.layer_norm(x, name=f"{n}.ln2"), 4 * d_model, activation="gelu",
                    name=f"{n}.fc")
        x = b.add(x, b.dense(f, d_model, name=f"{n}.proj"), name=f"{n}.res2")
    x = b.layer_norm(x, name="ln_f")
    return b.softmax(b.tied_dense(x, share=emb, name="lm_head"), name="softmax")
