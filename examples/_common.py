"""What every zoo example shares: arguments (:mod:`legionpy.commands.args`),
runtime start, the training loop and the printout
(:mod:`legionpy.models.training`), as ``legionpy train`` does.

Each example runs as ``python examples/NAME.py`` (2 CPU devices) or
``mpirun -n 2 python examples/NAME.py`` (1 device per rank); both print the
same losses, since the strategy sees the same 2 devices.
"""

from __future__ import annotations

import argparse
import json


def run(name: str, doc: str, steps: int = 30, every: int = 5) -> dict:
    """Parse the shared arguments, train zoo model ``name`` and print (rank 0
    only) the loss every ``every`` steps, then throughput and first/final loss."""
    from legionpy.commands.args import add_train_arguments
    from legionpy.models.training import is_root, start_runtime, train_from_args

    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc)
    add_train_arguments(p, steps=steps)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args()
    start_runtime(args.devices)
    root = is_root()

    def log(step: int, loss: float) -> None:
        if root and not args.json and (step % every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.6f}", flush=True)

    r = train_from_args(name, args, log=log)
    if root:
        if args.json:
            print(json.dumps({k: v for k, v in r.items() if k != "losses"}))
        else:
            print(f"{name}: {r['parameters']:,} parameters, batch {r['batch_size']}, "
                  f"{r['devices']} device(s) on {r['ranks']} rank(s), strategy {r['strategy']}\n"
                  f"{name}: loss {r['first_loss']:.6f} -> {r['final_loss']:.6f}, "
                  f"{r['samples_per_s']:.1f} samples/s")
    return r
