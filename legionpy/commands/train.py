"""``legionpy train MODEL``: train a (small by default) zoo model on
generated data under a strategy and report throughput and loss.

    legionpy train rnnlm --steps 50 --strategy data --json

``--json`` prints one object with ``samples_per_s``, ``first_loss``,
``final_loss``, ``steps``, ``strategy``, the local machine model's
prediction per step (``simulated_iteration_s``, the one ``simulate
--compare`` makes) next to ``measured_iteration_s`` and their
``prediction_error`` (and the rest of :func:`legionpy.models.training.train`'s
result).
"""

from __future__ import annotations

from ..cli import command


def _configure(p) -> None:
    p.add_argument("model", help="a zoo model (see `legionpy models`)")
    from ..models.training import add_train_arguments

    add_train_arguments(p, steps=30)


@command("train", "train a small zoo model on synthetic data and report samples/s and loss")
def _train(args) -> dict:
    from ..errors import ModelError
    from ..models import MODELS
    from ..models.training import start_runtime, train_from_args

    if args.model not in MODELS:
        raise ModelError(f"unknown model {args.model!r}; the zoo has {sorted(MODELS)}")
    start_runtime(args.devices)
    from ..measure import train_prediction

    r = train_from_args(args.model, args, predict=train_prediction)
    losses = r["losses"]
    every = max(1, len(losses) // 10)
    shown = ", ".join(f"{i}:{losses[i]:.3f}" for i in range(0, len(losses), every))
    text = (f"{r['model']} ({r['parameters']:,} parameters, batch {r['batch_size']}) on "
            f"{r['devices']} device(s), strategy {r['strategy']}: {r['steps']} steps\n"
            f"  loss {r['first_loss']:.4f} -> {r['final_loss']:.4f}   "
            f"{r['samples_per_s']:.1f} samples/s\n  loss by step: {shown}\n"
            f"  per step: measured {r['measured_iteration_s'] * 1e3:.2f} ms; predicted "
            f"{r['loaded_iteration_s'] * 1e3:.2f} ms (error {r['prediction_error'] * 100:.0f}%)"
            f" with other programs using {r['background_cores'] or 0:.1f} of this machine's "
            f"cores, {r['simulated_iteration_s'] * 1e3:.2f} ms on it alone; data parallelism "
            f"{r['simulated_data_parallel_s'] * 1e3:.2f} ms alone\n"
            f"  (predictions: the local machine model, as `legionpy simulate --compare`)")
    return {"text": text, **r}


_train.configure = _configure
