"""The zoo's operator graphs run by PyTorch: the baseline of bench/gpu_step.py.

:class:`TorchGraph` walks a legionpy operator graph (``model.graph``) in
order and runs each operator with the PyTorch function that computes the
same thing (``F.conv2d``, ``F.max_pool2d``, ``F.batch_norm``, an LSTM cell
with legionpy's gate-major weights, ...), on parameters of the same shapes
(copied from a legionpy model, or freshly initialised), so the two sides do
the same arithmetic on the same shapes: the ratio of their step times is
legionpy's cost over PyTorch's for one model. A training step is forward,
mean cross-entropy over every position (as legionpy's loss), backward and an
SGD step (momentum 0.9). ``tests/unit/test_gpu_step.py`` checks the
interpreter gives legionpy's predictions on the three benchmarked models.

:func:`cudnn_rnnlm` is the idiomatic PyTorch RNNLM (``nn.LSTM``, cuDNN on a
GPU): what a PyTorch user would write, reported beside the op-for-op one.

Import only where torch is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["TorchGraph", "cudnn_rnnlm", "KINDS"]

KINDS = ("input", "conv2d", "pool2d", "flat", "reshape", "dropout", "dense", "softmax",
         "batch_norm", "add", "relu", "embedding", "lstm", "concat")


def _act(x: Any, name: str | None) -> Any:
    if name in (None, "none", "linear"):
        return x
    return {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[name](x)


class TorchGraph:
    """A legionpy graph as a PyTorch program on ``device``.

    ``params``: ``{parameter name: numpy array}`` (``model.parameters()``);
    None initialises N(0, 0.05) weights and zero biases (timing only)."""

    def __init__(self, graph: Any, device: str = "cpu",
                 params: dict[str, np.ndarray] | None = None, seed: int = 0) -> None:
        bad = sorted({op.kind for op in graph.ops} - set(KINDS))
        if bad:
            raise ValueError(f"{graph.name}: the torch interpreter lacks operators {bad}")
        self.graph, self.device = graph, torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        self.params: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        for op in graph.ops:
            for pname, p in op.params.items():
                if p.name in self.params:
                    continue  # shared (the LSTM cells of a layer)
                if params is not None:
                    t = torch.tensor(np.asarray(params[p.name]))
                elif pname in ("bias", "beta"):
                    t = torch.zeros(p.shape)
                elif pname == "gamma":
                    t = torch.ones(p.shape)
                else:
                    t = torch.randn(p.shape, generator=gen) * 0.05
                self.params[p.name] = t.to(self.device).requires_grad_(True)
            if op.kind == "batch_norm":
                c = op.output_shape[1]
                self.buffers[op.name] = (torch.zeros(c, device=self.device),
                                         torch.ones(c, device=self.device))
        self.opt = torch.optim.SGD(self.params.values(), lr=0.01, momentum=0.9)

    def _w(self, op: Any, pname: str) -> torch.Tensor:
        return self.params[op.params[pname].name]

    def _input(self, values: dict, ref: Any) -> torch.Tensor:
        v = values[ref.op.name]
        if ref.view is not None:
            v = v.select(ref.view[0], ref.view[1])
        return v

    def forward(self, xs: list[torch.Tensor], training: bool = True) -> torch.Tensor:
        """The logits (the softmax's input) for inputs ``xs`` (one per input op)."""
        values: dict[str, torch.Tensor] = {}
        feeds = iter(xs)
        logits = None
        for op in self.graph.ops:
            a = [self._input(values, r) for r in op.inputs]
            at, k = op.attrs, op.kind
            if k == "input":
                y = next(feeds)
            elif k == "conv2d":
                y = _act(F.conv2d(a[0], self._w(op, "weight"),
                                  self._w(op, "bias") if at.get("bias") else None,
                                  at["stride"], at["padding"], 1, at.get("groups", 1)),
                         at.get("activation"))
            elif k == "pool2d":
                if at["pool_type"] == "max":
                    y = F.max_pool2d(a[0], at["kernel"], at["stride"], at["padding"])
                else:
                    y = F.avg_pool2d(a[0], at["kernel"], at["stride"], at["padding"],
                                     count_include_pad=False)
            elif k in ("flat", "reshape"):
                y = a[0].reshape(op.output_shape[0], *op.output_shape[1:])
            elif k == "dropout":
                y = F.dropout(a[0], at["rate"], training)
            elif k == "dense":
                y = a[0] @ self._w(op, "weight")
                if at.get("bias", True):
                    y = y + self._w(op, "bias")
                y = _act(y, at.get("activation"))
            elif k == "batch_norm":
                mean, var = self.buffers[op.name]
                y = F.batch_norm(a[0], mean, var, self._w(op, "gamma"), self._w(op, "beta"),
                                 training, at["momentum"], at["eps"])
                y = torch.relu(y) if at.get("relu") else y
            elif k == "add":
                y = _act(a[0] + a[1], at.get("activation"))
            elif k == "relu":
                y = torch.relu(a[0])
            elif k == "embedding":
                y = F.embedding(a[0].long(), self._w(op, "weight"))
            elif k == "lstm":
                y = self._lstm(op, a)
            elif k == "concat":
                y = torch.cat(a, dim=at["axis"])
            elif k == "softmax":
                logits = a[0]
                y = a[0]
            values[op.name] = y
        return logits

    def _lstm(self, op: Any, a: list) -> torch.Tensor:
        """One cell: gates i, f, g, o from gate-major ``w_ih`` (4, H, I),
        ``w_hh`` (4, H, H), ``bias`` (4, H); out ``[h; c]`` (N, 2, H)."""
        w_ih, w_hh, b = self._w(op, "w_ih"), self._w(op, "w_hh"), self._w(op, "bias")
        hid = w_hh.shape[1]
        z = a[0] @ w_ih.reshape(4 * hid, -1).t() + b.reshape(-1)
        c_prev = None
        if len(a) > 1:
            z = z + a[1][:, 0] @ w_hh.reshape(4 * hid, hid).t()
            c_prev = a[1][:, 1]
        i, f, g, o = z.chunk(4, dim=1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = i * g if c_prev is None else f * c_prev + i * g
        return torch.stack([o * torch.tanh(c), c], dim=1)

    def probabilities(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """Inference-mode softmax output (running statistics, no dropout)."""
        with torch.no_grad():
            return torch.softmax(self.forward(xs, training=False), dim=-1)

    def step(self, xs: list[torch.Tensor], y: torch.Tensor) -> float:
        """One training step (forward, loss, backward, SGD); returns the loss."""
        logits = self.forward(xs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1).long())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()


def cudnn_rnnlm(graph: Any, device: str) -> Any:
    """``step(tokens, labels)`` of the idiomatic PyTorch RNNLM with the
    shapes of legionpy's ``rnnlm`` graph: embedding, ``nn.LSTM`` (cuDNN on a
    GPU) over all steps, a linear projection, mean cross-entropy, SGD."""
    emb = next(op for op in graph.ops if op.kind == "embedding")
    cells = [op for op in graph.ops if op.kind == "lstm"]
    layers = len({op.params["w_ih"].name for op in cells})
    proj = next(op for op in graph.ops if op.kind == "dense")
    vocab, dim = emb.params["weight"].shape
    hid = cells[0].attrs["units"]
    dev = torch.device(device)
    e = torch.nn.Embedding(vocab, dim).to(dev)
    lstm = torch.nn.LSTM(dim, hid, layers, batch_first=True).to(dev)
    fc = torch.nn.Linear(hid, proj.attrs["units"]).to(dev)
    opt = torch.optim.SGD([*e.parameters(), *lstm.parameters(), *fc.parameters()], lr=0.01,
                          momentum=0.9)

    def step(tokens: torch.Tensor, labels: torch.Tensor) -> Any:
        out, _ = lstm(e(tokens.long()))
        logits = fc(out)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step
