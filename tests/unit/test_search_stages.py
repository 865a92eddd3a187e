"""Issue 18 item 2: disjoint device sets for repeated layers (the DP's
placement pass and MCMC's group moves)."""

from __future__ import annotations

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.search import eliminate, run_all, run_mcmc
from legionpy.optimizer.search.mcmc import _groups
from legionpy.optimizer.search.space import ConfigSpace
from legionpy.optimizer.search.stages import fit_config, staged_candidates


def _rnn(steps: int = 4, layers: int = 2):
    return models.rnnlm(batch_size=16, steps=steps, hidden=64, layers=layers, vocab=128).graph


def test_staged_candidates_put_layers_on_disjoint_blocks():
    g, m = _rnn(), Machine.parse("p100:1x4")
    dp = eliminate(g, m).strategy
    cands = staged_candidates(g, m, dp)
    assert set(cands) == {"stages=2/fit", "stages=2/sample"}
    for s in cands.values():
        s.validate(g, m)
        d0 = {d for t in range(4) for d in s[f"lstm0.t{t}"].devices}
        d1 = {d for t in range(4) for d in s[f"lstm1.t{t}"].devices}
        assert d0 and d1 and not d0 & d1 and len(d0 | d1) <= 4
        assert s["proj"] == dp["proj"]      # ops outside the repeated layers keep the DP's
    assert staged_candidates(models.lenet(batch_size=16).graph, m, dp) == {}


def test_fit_config_shrinks_and_places():
    g = _rnn()
    op = g.op("lstm0.t0")
    from legionpy.optimizer import ParallelConfig
    c = ParallelConfig((4, 1, 4), tuple(range(16)))
    f = fit_config(op, c, 8, 8)
    assert f.num_tiles == 8 and f.devices == tuple(range(8, 16))
    s = fit_config(op, c, 4, 4, sample_only=True)
    assert s.degrees == (4, 1, 1) and s.devices == (4, 5, 6, 7)


def test_run_all_elimination_row_is_never_worse_than_the_dp():
    g, m = _rnn(steps=6), Machine.parse("p100:1x4")
    rep = run_all(g, m, seed=0, iterations=8, methods=["data", "elimination"])
    staged = rep.details["elimination"]["staged"]
    assert "dp" in staged and len(staged) == 3
    assert rep.rows["elimination"]["search_cost"] <= staged["dp"] * (1 + 1e-12)
    assert rep.rows["elimination"]["search_cost"] == min(staged.values())


def test_mcmc_group_moves_move_whole_layers():
    g, m = _rnn(), Machine.parse("p100:1x4")
    table = ConfigSpace().table(g, m)
    groups = _groups(g, table)
    assert sorted(len(x) for x in groups) == [4, 4, 4]   # embeddings, layer 0, layer 1
    start = {"data": Strategy.data_parallel(g, m)}
    res = run_mcmc(g, m, iterations=60, seed=0, initial=start, polish_limit=0,
                   group_moves=1.0)
    for layer in ("lstm0", "lstm1"):  # only whole-group proposals: layers stay tied
        assert len({res.strategy[f"{layer}.t{t}"] for t in range(4)}) == 1
    assert res.accepted > 0
    assert res.cost_s == Simulator(g, m).run(res.strategy).search_cost
