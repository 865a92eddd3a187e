"""The zoo Transformer: an encoder stack as a next-token model (Vaswani et
al., "Attention Is All You Need", 2017, sections 3.1-3.5).

``tokens (N, S) -> embedding (vocab, D) -> + sinusoidal positional encoding
-> layers x [x = LN(x + MHA(x)); x = LN(x + W2 gelu(W1 x))] -> dense (D,
vocab) -> softmax``, post-norm as ``torch.nn.TransformerEncoderLayer``'s
default (``norm_first=False``) with ``activation="gelu"`` (exact GELU).
Multi-head attention (:meth:`~legionpy.optimizer.Graph.multihead_attention`)
scales the scores by ``1/sqrt(D/h)`` and takes an optional causal mask; its
head dim is an attribute dim of the scores, softmax and context, so the
search can split heads.

The encoder stack has exactly the parameters of ``torch.nn.TransformerEncoder(
nn.TransformerEncoderLayer(D, h, ff, activation="gelu", batch_first=True),
layers)``: per layer ``4 (D^2 + D)`` for q, k, v and the output projection
(PyTorch's ``in_proj`` and ``out_proj``), ``2 D ff + ff + D`` for the MLP and
``4 D`` for the two LayerNorms (:func:`encoder_parameters`). The model adds
the embedding ``vocab D`` and the head ``D vocab + vocab``.
"""

from __future__ import annotations

__all__ = ["build_transformer", "encoder_parameters"]


def encoder_parameters(d_model: int, ff: int, layers: int) -> int:
    """Parameters of ``torch.nn.TransformerEncoder`` with that configuration."""
    return layers * (4 * (d_model * d_model + d_model) + 2 * d_model * ff + ff + d_model
                     + 4 * d_model)


def build_transformer(b, seq: int = 64, d_model: int = 512, heads: int = 8, ff: int = 2048,
                      layers: int = 6, vocab: int = 32000, causal: bool = True):
    tokens = b.input((seq,), dtype="int32", name="tokens")
    x = b.positional_encoding(b.embedding(tokens, vocab, d_model, name="embed"), name="pos")
    for i in range(layers):
        n = f"enc{i}"
        a = b.multihead_attention(x, heads, causal=causal, name=f"{n}.attn")
        x = b.layer_norm(b.add(x, a, name=f"{n}.res1"), name=f"{n}.norm1")
        f = b.dense(b.dense(x, ff, activation="gelu_erf", name=f"{n}.ff1"), d_model,
                    name=f"{n}.ff2")
        x = b.layer_norm(b.add(x, f, name=f"{n}.res2"), name=f"{n}.norm2")
    return b.softmax(b.dense(x, vocab, name="lm_head"), name="softmax")
