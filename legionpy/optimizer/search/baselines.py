"""Hand-written baseline strategies the searched ones are measured against
(FlexFlow paper section 8.2): data parallelism, model parallelism, and the
expert strategy -- Krizhevsky's "one weird trick" (OWT: data parallel
convolutions, model-parallel dense layers) for CNNs, the paper's RNN expert
(data parallel across nodes, one layer per GPU within a node) for graphs
with LSTM cells. The constructors live on
:class:`~legionpy.optimizer.strategy.Strategy`; this module only picks them.
"""

from __future__ import annotations

from ..strategy import Strategy

__all__ = ["baselines", "expert_name", "is_rnn"]


def is_rnn(graph) -> bool:
    """True for graphs with LSTM cells (the RNN expert applies)."""
    return any(op.kind == "lstm" for op in graph.ops)


def expert_name(graph) -> str:
    """``"expert"`` for RNNs, ``"owt"`` otherwise (the report's key)."""
    return "expert" if is_rnn(graph) else "owt"


def baselines(graph, machine) -> dict[str, Strategy]:
    """``{"data": ..., "model": ..., "owt" | "expert": ..., "hybrid": ...}``
    (``hybrid``: data parallel across nodes, tensor parallel inside each)."""
    expert = (Strategy.rnn_expert(graph, machine) if is_rnn(graph)
              else Strategy.owt(graph, machine))
    return {"data": Strategy.data_parallel(graph, machine),
            "model": Strategy.model_parallel(graph, machine),
            expert_name(graph): expert,
            "hybrid": Strategy.hybrid(graph, machine)}
