"""``legionpy train MODEL``: train a (small by default) zoo model on
generated data under a strategy and report throughput and loss.

    legionpy train rnnlm --steps 50 --strategy data --json

``--json`` prints one object with ``samples_per_s``, ``first_loss``,
``final_loss``, ``steps``, ``strategy`` (and the rest of
:func:`legionpy.models.training.train`'s result).
"""

from __future__ import annotations

from ..cli import command


def _configure(p) -> None:
    p.add_argument("model", help="a zoo model (see `legionpy models`)")
    from ..models.training import add_train_arguments

    add_train_arguments(p, steps=30)


@command("train", "train a small zoo model on synthetic data and report samples/s and loss")
def _train(args) -> dict:
    from ..models import check_model
    from ..models.training import start_runtime, train_from_args

    check_model(args.model)
    start_runtime(args.devices)
    r = train_from_args(args.model, args)
    losses = r["losses"]
    every = max(1, len(losses) // 10)
    shown = ", ".join(f"{i}:{losses[i]:.3f}" for i in range(0, len(losses), every))
    text = (f"{r['model']} ({r['parameters']:,} parameters, batch {r['batch_size']}) on "
            f"{r['devices']} device(s), strategy {r['strategy']}: {r['steps']} steps\n"
            f"  loss {r['first_loss']:.4f} -> {r['final_loss']:.4f}   "
            f"{r['samples_per_s']:.1f} samples/s\n  loss by step: {shown}\n"
            f"  simulated iteration: {r['simulated_iteration_s'] * 1e3:.2f} ms under this "
            f"strategy, {r['simulated_data_parallel_s'] * 1e3:.2f} ms under data parallelism")
    return {"text": text, **r}


_train.configure = _configure
