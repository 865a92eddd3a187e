"""Memory-aware search: a Transformer the size of GPT-2 large (36 layers,
hidden 1280, 20 heads, sequence 1024, vocabulary 50257;
about 0.84 B parameters) on ``p100:4x4`` (16 GiB per GPU), at a batch where
data parallelism does not fit. Prints the search table: every method's
iteration time and peak memory, and which strategies were infeasible and by
how much (issue 17 item 3).

    python bench/memory_search.py [--batch 8] [--budget 120] [--machine p100:4x4]
"""

from __future__ import annotations

import argparse
import time

from legionpy import models
from legionpy.optimizer import Machine, search

GPT2_LARGE = {"seq": 1024, "d_model": 1280, "heads": 20, "ff": 5120, "layers": 36,
              "vocab": 50257}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--machine", default="p100:4x4")
    ap.add_argument("--methods", default=None, help="comma-separated (default: all)")
    args = ap.parse_args(argv)
    g = models.transformer(batch_size=args.batch, **GPT2_LARGE).graph
    m = Machine.parse(args.machine)
    print(f"transformer {GPT2_LARGE} batch {args.batch}: {g.num_parameters() / 1e6:.0f} M "
          f"parameters, {len(g.ops)} ops, on {m.name} "
          f"({m.devices[0].memory / 2**30:.0f} GiB per device)", flush=True)
    t = time.perf_counter()
    methods = args.methods.split(",") if args.methods else None
    rep = search.run_all(g, m, budget_s=args.budget, seed=0, methods=methods,
                         stage=lambda s: print(f"  [{time.perf_counter() - t:6.1f} s] {s}",
                                               flush=True))
    print(rep.table())
    h = rep.details.get("hierarchical")
    if h:
        tried = ", ".join(f"{k} stage(s): "
                          + (f"{v * 1e3:.0f} ms" if v < 1e3 else "infeasible")
                          for k, v in h["tried"].items())
        print(f"hierarchical: {tried}")


if __name__ == "__main__":
    main()
