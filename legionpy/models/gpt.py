"""GPT decoders: GPT-2 (Radford et al., "Language Models are Unsupervised
Multitask Learners", 2019) and the GPT-3 family (Brown et al., "Language
Models are Few-Shot Learners", NeurIPS 2020, Table 2.1).

``tokens (N, S) -> wte (vocab, D) + wpe (S, D) learned positions -> layers x
[x = x + attn(LN(x)); x = x + W2 gelu(W1 LN(x))] -> LN -> x @ wte.T ->
softmax``: pre-norm blocks, causal multi-head self-attention (heads split
as attribute dims, ``Graph.multihead_attention``), an MLP of width 4 D with
GELU (the tanh form GPT-2 uses), a final LayerNorm, and the output
projection **tied** to the token embedding (``Graph.tied_dense``: one
parameter, both uses reduce into its gradient). Next-token loss over the
vocabulary, as the zoo Transformer.

Sizes (:data:`CONFIGS`): GPT-2 small (124M) and the GPT-3 models the
pipeline issue (25) searches. Table 2.1 lists heads x d_head that do not
equal d_model for two of them; here d_head is the table's 128 and the heads
follow from d_model (GPT-3 XL: 16 heads, not 24), and GPT-3 13B's d_model
is 5,120 (40 heads of 128; the table prints 5,140, which no integer head
count of 128 gives). :func:`gpt_parameters` is the closed form; the counts
match the table's figures at the table's precision (tests/unit/test_gpt.py).
"""

from __future__ import annotations

__all__ = ["build_gpt", "gpt_parameters", "CONFIGS"]

#: name -> (layers, d_model, heads, sequence); vocabulary 50,257 for all
CONFIGS = {
    "gpt2": (12, 768, 12, 1024),
    "gpt3-1.3b": (24, 2048, 16, 2048),
    "gpt3-2.7b": (32, 2560, 32, 2048),
    "gpt3-6.7b": (32, 4096, 32, 2048),
    "gpt3-13b": (40, 5120, 40, 2048),
}
VOCAB = 50257


def gpt_parameters(layers: int, d_model: int, seq: int, vocab: int = VOCAB) -> int:
    """Parameters of the decoder: per layer ``12 D^2 + 13 D`` (q, k, v, out
    with biases; the 4 D MLP with biases; two LayerNorms), the tied ``vocab
    x D`` table, the ``S x D`` positions and the final LayerNorm."""
    return layers * (12 * d_model * d_model + 13 * d_model) + (vocab + seq) * d_model \
        + 2 * d_model


def build_gpt(b, seq: int = 1024, d_model: int = 768, heads: int = 12, layers: int = 12,
              vocab: int = VOCAB):
    tokens = b.input((seq,), dtype="int32", name="tokens")
    wte = b.embedding(tokens, vocab, d_model, name="wte")
    x = b.add_bias(wte, ndim=2, name="wpe")  # learned positions (S, D)
    for i in range(layers):
        n = f"h{i}"
        a = b.multihead_attention(b.layer_norm(x, name=f"{n}.ln1"), heads, causal=True,
                                  name=f"{n}.attn")
        x = b.add(x, a, name=f"{n}.res1")
        h = b.dense(b.layer_norm(x, name=f"{n}.ln2"), 4 * d_model, activation="gelu",
                    name=f"{n}.fc")
        x = b.add(x, b.dense(h, d_model, name=f"{n}.proj"), name=f"{n}.res2")
    x = b.layer_norm(x, name="ln_f")
    return b.softmax(b.tied_dense(x, wte, name="lm_head"), name="softmax")


def builder(name: str):
    """``build_gpt`` with ``name``'s sizes as defaults (keyword sizes still win)."""
    layers, d_model, heads, seq = CONFIGS[name]

    def build(b, seq: int = seq, d_model: int = d_model, heads: int = heads,
              layers: int = layers, vocab: int = VOCAB):
        return build_gpt(b, seq, d_model, heads, layers, vocab)

    build.__name__ = f"build_{name.replace('-', '_').replace('.', '_')}"
    return build
