"""Invariant 1 on several ranks: the randomized sequential-semantics tests of
tests/runtime (same generators, same reference), untraced and with a traced
block replayed (test_tracing), derandomized so every rank draws the same
programs. Usage: sequential.py EXAMPLES."""

import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from test_sequential_semantics import _allowed, _check, programs  # noqa: E402
from test_tracing import check as check_traced  # noqa: E402
from test_tracing import programs as traced_programs  # noqa: E402

from legionpy.mapper import DefaultMapper, RandomMapper  # noqa: E402

comm = MPI.COMM_WORLD
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
seen = []


@settings(max_examples=N, derandomize=True, database=None, phases=[Phase.generate],
          deadline=None, suppress_health_check=list(HealthCheck))
@given(programs.map(lambda p: [o for o in p if _allowed(o)]), st.integers(0, 2**16))
def run(program, seed):
    seen.append(repr((program, seed)))
    assert comm.allgather(seen[-1]) == [seen[-1]] * comm.size, "ranks drew different programs"
    for cpus in (1, 2):  # devices per rank
        _check(program, cpus, DefaultMapper())
        _check(program, cpus, RandomMapper(seed))


@settings(max_examples=N, derandomize=True, database=None, phases=[Phase.generate],
          deadline=None, suppress_health_check=list(HealthCheck))
@given(traced_programs, st.integers(0, 2**16))
def run_traced(program, seed):
    seen.append(repr((program, seed)))
    assert comm.allgather(seen[-1]) == [seen[-1]] * comm.size, "ranks drew different programs"
    for cpus in (1, 2):
        check_traced(program, cpus, DefaultMapper())
        check_traced(program, cpus, RandomMapper(seed))


run()
run_traced()
block = [("fill", "b", 1, None), ("index", "red+", "b", 2, "eq22"),
         ("index", "RW2", "a", 3, "eq4"), ("read", "a", "halo"), ("index", "RW", "a", 1, "eq4"),
         ("write", "b", 4), ("index", "redmax", "a", 5, "halo"), ("read", "a", None)]
for cpus in (1, 2):
    stats = check_traced(([("write", "a", 3)], block, 5, []), cpus, DefaultMapper())
    assert stats["replayed"] >= 3, stats
halo = [("fill", "a", 3, None), ("index", "red+", "a", 1, "halo"),
        ("index", "RW", "a", 2, "eq4"), ("single", "red+", "a", 4, "eq22"),
        ("read", "a", "halo"), ("index", "R", "a", 0, "halo")]
for cpus in (1, 2):
    _check(halo, cpus, DefaultMapper())
    _check(halo, cpus, RandomMapper(3))
print(f"OK rank {comm.rank}: {len(seen)} programs on {comm.size} ranks", flush=True)
