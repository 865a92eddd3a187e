"""``legionpy train MODEL``: train a (small by default) zoo model on
generated data under a strategy and report throughput and loss.

    legionpy train rnnlm --steps 50 --strategy data --json

``--json`` prints one object with ``samples_per_s``, ``first_loss``,
``final_loss``, ``steps``, ``strategy``, the local machine model's
prediction per step (``simulated_iteration_s``, the one ``simulate
--compare`` makes) next to ``measured_iteration_s`` and their
``prediction_error`` (and the rest of :func:`legionpy.models.training.train`'s
result). Under ``mpirun`` rank 0 prints the one report.

``--checkpoint FILE [--checkpoint-every N]`` resumes from FILE when it
exists (the same command continues the run exactly where it stopped) and
saves to it every N steps, at the end and on Ctrl-C. Ctrl-C stops after the
step in flight (on every rank), saves the checkpoint when one was asked
for and exits with status 130.
"""

from __future__ import annotations

from ..cli import command


def _configure(p) -> None:
    p.add_argument("model", help="a zoo model (see `legionpy models`) or a .onnx file")
    from .args import add_train_arguments

    add_train_arguments(p, steps=30)


@command("train", "train a small zoo model on synthetic data and report samples/s and loss")
def _train(args) -> dict:
    from ..measure.calibration import note_faster_run
    from ..models import check_model
    from ..models.training import start_runtime, train_from_args
    from ..optimizer import Machine
    from ..probe.hostspeed import host_speed_text, slowdown

    check_model(args.model)
    rt = start_runtime(args.devices)
    from ..measure import judge_searches, train_prediction

    with judge_searches():  # --strategy search: the pick must beat the baselines here
        r = train_from_args(args.model, args, predict=train_prediction,
                            progress=not args.json)
    losses = r["losses"]
    start = r["resumed_from_step"]
    every = max(1, len(losses) // 10)
    shown = ", ".join(f"{start + i}:{losses[i]:.3f}" for i in range(0, len(losses), every))
    picked = f" (picked: {r['picked'] or 'its own'})" if r["strategy"] == "search" else ""
    head = (f"{r['model']} ({r['parameters']:,} parameters, batch {r['batch_size']}) on "
            f"{r['devices']} device(s), strategy {r['strategy']}{picked}: {r['steps']} steps")
    if start:
        head += f", resumed at step {start} from {r['checkpoint']}"
    if not losses:
        text = head + f"\n  nothing to do: the checkpoint is already at step {start}"
    else:
        text = (f"{head}\n  loss {r['first_loss']:.4f} -> {r['final_loss']:.4f}   "
                f"{r['samples_per_s']:.1f} samples/s\n  loss by step: {shown}\n"
                f"  per step: measured {r['measured_iteration_s'] * 1e3:.2f} ms; predicted "
                f"{r['loaded_iteration_s'] * 1e3:.2f} ms (error "
                f"{r['prediction_error'] * 100:.0f}%) with other programs using "
                f"{r['background_cores'] or 0:.1f} of this machine's cores, "
                f"{r['simulated_iteration_s'] * 1e3:.2f} ms on it alone; data parallelism "
                f"{r['simulated_data_parallel_s'] * 1e3:.2f} ms alone\n"
                f"  (predictions: the local machine model, as `legionpy simulate --compare`)")
        slow = slowdown(r.get("host_probe_s"), r.get("host_quiet_probe_s"))
        if slow is not None:
            # a calibration taken in a busy spell of the host: the next run takes it again
            again = note_faster_run(Machine.local().name, slow)
            text += f"\n  {host_speed_text(slow, retake=again)}"
    if r["checkpoint"]:
        text += f"\n  checkpoint: {r['checkpoint']} (run the same command again to continue)"
    out = {"text": text, **r}
    if rt.rank != 0:  # under mpirun: one report, from rank 0
        out["quiet"] = True
    return out


_train.configure = _configure
