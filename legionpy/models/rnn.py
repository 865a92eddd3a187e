"""Recurrent and attention zoo graphs at the paper's shapes (section 8.1 and
REFERENCE.md): RNNTC (4 LSTM layers, hidden 1024), RNNLM (2 layers, hidden
2048), NMT (2 + 2 layers, hidden 1024, attention, softmax over 32k words),
all unrolled 40 steps (the Transformer: models/transformer.py).

Every builder ends in ONE softmax with the loss, so the model trains with
:class:`legionpy.nn.Model` (whose last op carries the loss): the per-step
outputs of RNNLM and NMT are concatenated into ``(N, T, H)`` (one ``concat``
+ ``reshape``) and projected by one dense layer to ``(N, T, vocab)``; their
targets are token ids ``(N, T)``. RNNTC classifies from the last step's top
state, targets ``(N,)``.

Each LSTM step is its own op (one cell = one time step, as FlexFlow's NMT);
the cells of a layer share their Parameters (``share=`` the layer's first
cell), so do the per-step embeddings and output projections.
"""

from __future__ import annotations

__all__ = ["build_rnntc", "build_rnnlm", "build_nmt"]


def lstm_stack(b, xs, layers, hidden, prefix, first=None, init=None):
    """Run ``layers`` LSTM layers over the per-step inputs ``xs``; returns the
    top layer's states per step and the last state of each layer."""
    first = first if first is not None else [None] * layers
    state = list(init) if init is not None else [None] * layers
    tops = []
    for t, x in enumerate(xs):
        for layer in range(layers):
            s = b.lstm(x, state[layer], hidden, share=first[layer],
                       name=f"{prefix}{layer}.t{t}")
            if first[layer] is None:
                first[layer] = s
            state[layer] = s
            x = s.h
        tops.append(state[-1])
    return tops, state


def embed_tokens(b, tokens, steps, vocab, dim, name):
    """One embedding per step of ``tokens`` (N, steps), all sharing the
    first step's table; returns the per-step embeddings."""
    out, first = [], None
    for t in range(steps):
        e = b.embedding(tokens.select(1, t), vocab, dim, share=first, name=f"{name}.t{t}")
        first = first or e
        out.append(e)
    return out


def build_rnntc(b, steps: int = 40, hidden: int = 1024, layers: int = 4,
                vocab: int = 32000, num_classes: int = 2):
    tokens = b.input((steps,), dtype="int32", name="tokens")
    xs = embed_tokens(b, tokens, steps, vocab, hidden, "embed")
    tops, _ = lstm_stack(b, xs, layers, hidden, "lstm")
    t = b.dense(tops[-1].h, num_classes, name="classifier")
    return b.softmax(t, name="softmax")


def build_rnnlm(b, steps: int = 40, hidden: int = 2048, layers: int = 2,
                vocab: int = 10000):
    tokens = b.input((steps,), dtype="int32", name="tokens")
    xs = embed_tokens(b, tokens, steps, vocab, hidden, "embed")
    tops, _ = lstm_stack(b, xs, layers, hidden, "lstm")
    return _project(b, [s.h for s in tops], hidden, vocab)


def _project(b, hs, hidden, vocab):
    """Per-step (N, H) outputs -> softmax over (N, T, vocab), one projection."""
    seq = b.reshape(b.concat(hs, axis=1, name="steps"), (len(hs), hidden), name="seq")
    return b.softmax(b.dense(seq, vocab, name="proj"), name="softmax")


def build_nmt(b, steps: int = 40, hidden: int = 1024, layers: int = 2, vocab: int = 32000):
    src = b.input((steps,), dtype="int32", name="src")
    tgt = b.input((steps,), dtype="int32", name="tgt")
    enc, enc_last = lstm_stack(b, embed_tokens(b, src, steps, vocab, hidden, "src_embed"), layers,
                           hidden, "enc")
    keys = [s.h for s in enc]
    dec, _ = lstm_stack(b, embed_tokens(b, tgt, steps, vocab, hidden, "tgt_embed"), layers, hidden,
                    "dec", init=enc_last)
    out, att0 = [], None
    for t, s in enumerate(dec):
        a = b.attention(s.h, keys, share=att0, name=f"attn.t{t}")
        att0 = att0 or a
        out.append(a)
    return _project(b, out, hidden, vocab)
