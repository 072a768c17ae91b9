"""AutoML's pure logic without a database: the Hyperband schedule, the pruners' decisions
(never dependent on the order reports arrive in), objectives, TPE proposals, bad params."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from madlib_mop.api.automl import _params
from madlib_mop.errors import MadlibMopError
from madlib_mop.job.schedule import Dispatcher
from madlib_mop.search.base import Decision, Report
from madlib_mop.search.hyperband import s_max, schedule
from madlib_mop.search.objective import Objective, direction_of, objective_from
from madlib_mop.search.pruners import (HyperbandPruner, MedianPruner, SuccessiveHalvingPruner,
                                       pruner_from)
from madlib_mop.search.setup import hyperband_brackets
from madlib_mop.search.tpe import OptunaSearcher, SearchSpace

LOSS = Objective("loss", "validation", maximize=False)
ACCURACY = Objective("accuracy", "validation", maximize=True)


def test_hyperband_schedule_is_madlibs_documented_table():
    # MADlib's docs: hyperband_schedule('hb_schedule', 81, 3, 0), ORDER BY s DESC, i.
    expected = [(4, 0, 81, 1), (4, 1, 27, 3), (4, 2, 9, 9), (4, 3, 3, 27), (4, 4, 1, 81),
                (3, 0, 27, 3), (3, 1, 9, 9), (3, 2, 3, 27), (3, 3, 1, 81),
                (2, 0, 9, 9), (2, 1, 3, 27), (2, 2, 1, 81),
                (1, 0, 6, 27), (1, 1, 2, 81),
                (0, 0, 5, 81)]
    assert [(r.s, r.i, r.n_i, r.r_i) for r in schedule(81, 3, 0)] == expected


def test_hyperband_schedule_follows_the_formula():
    for R, eta in [(81, 3), (9, 3), (6, 3), (27, 3), (16, 2), (100, 4), (243, 3), (10, 3)]:
        top = s_max(R, eta)
        assert eta ** top <= R < eta ** (top + 1)  # floor(log_eta R), exact for powers of eta
        for rung in schedule(R, eta):
            # The paper's r_i = R eta^(i - s), rounded; MADlib's n = floor((s_max+1)/(s+1)) eta^s.
            assert rung.r_i == round(R * eta ** (rung.i - rung.s) + 1e-9)
            assert rung.n_i == (top + 1) // (rung.s + 1) * eta ** rung.s // eta ** rung.i
        assert max(r.r_i for r in schedule(R, eta)) == R
    # skip_last drops the last rounds of every bracket (MADlib's unit test: 15 - (2*5 - 1)).
    assert len(schedule(81, 3, 2)) == 6
    assert {(r.s, r.i) for r in schedule(81, 3, 2)} == {(4, 0), (4, 1), (4, 2), (3, 0), (3, 1), (2, 0)}
    assert [(r.s, r.i, r.n_i, r.r_i) for r in schedule(9, 3)] == [
        (2, 0, 9, 1), (2, 1, 3, 3), (2, 2, 1, 9), (1, 0, 3, 3), (1, 1, 1, 9), (0, 0, 3, 9)]


@pytest.mark.parametrize("method, params, fragment", [
    ("hyperband", "R=2, eta=3", "R (2) must be at least eta (3)"),
    ("hyperband", "R=9, eta=1", "eta must be a whole number of at least 2"),
    ("hyperband", "R=9, eta=3, skip_last=3", "skip_last (3) is more than"),
    ("hyperband", "R=9, eta=3, skip_last=-1", "skip_last must be a whole number of at least 0"),
    ("hyperband", "R=9.5", "R must be a whole number"),
    ("hyperband", "R=9, gamma=2", "gamma is not a parameter of hyperband"),
    ("hyperband", "R=9,, eta=3", "automl_params is not valid"),
    ("hyperopt", "num_configs=0, num_iterations=5, algorithm=tpe", "num_configs must be a whole number of at least 1"),
    ("hyperopt", "num_configs=5, num_iterations=5, algorithm=atpe", "algorithm must be tpe or rand"),
    ("hyperopt", "num_configs=5, num_iterations=5, R=3", "R is not a parameter of hyperopt"),
    ("hyperopt", "num_configs=5, num_iterations=5, parallelism=0", "parallelism must be a whole number of at least 1"),
    ("hyperopt", "num_configs=5, num_iterations=2.5", "num_iterations must be a whole number"),
])
def test_bad_automl_params_get_clean_errors(method, params, fragment):
    with pytest.raises(MadlibMopError) as raised:
        _params(method, params)
    assert fragment in str(raised.value)
    assert raised.value.sqlstate in ("22023", "42601") and raised.value.hint


def test_params_defaults_are_madlibs():
    assert _params("hyperband", None) == {"R": 6, "eta": 3, "skip_last": 0}
    assert _params("hyperopt", "num_configs=4") == {"num_configs": 4, "num_iterations": 5,
                                                    "algorithm": "tpe"}


def test_objectives_know_their_direction():
    assert direction_of("accuracy") and direction_of("top_k_categorical_accuracy")
    assert direction_of("auc") and not direction_of("loss")
    assert direction_of("mean_squared_error") is False
    objective = objective_from("accuracy", None, True, [["accuracy"]], "pruner")
    assert objective == Objective("accuracy", "validation", True)
    assert objective_from(None, None, False, [[]], "pruner") == Objective("loss", "training", False)
    assert objective_from("training_accuracy", None, True, [["accuracy"]], "x").source == "training"
    with pytest.raises(MadlibMopError, match="not reported by every configuration"):
        objective_from("accuracy", None, True, [["accuracy"], []], "pruner")
    with pytest.raises(MadlibMopError, match="needs a validation_table"):
        objective_from("validation_loss", None, False, [[]], "pruner")
    with pytest.raises(MadlibMopError, match="better high or low"):
        objective_from("kappa", None, True, [["kappa"]], "pruner")
    assert objective_from("kappa", "maximize", True, [["kappa"]], "pruner").maximize
    # Better: higher accuracy, lower loss; NaN always last.
    a = Report(1, 1, {}, {"accuracy": 0.9, "loss": 0.5})
    b = Report(2, 1, {}, {"accuracy": 0.8, "loss": 0.4})
    c = Report(3, 1, {}, {"accuracy": math.nan, "loss": math.nan})
    assert ACCURACY.better(a, b) and LOSS.better(b, a)
    assert ACCURACY.better(b, c) and LOSS.better(a, c)


def _deliver(pruner, report: Report, by_iteration: dict, waiting: set, stopped: dict) -> None:
    """One report, as the coordinator takes it: waiting decisions are asked again, in
    (iteration, mst_key) order, until none changes."""
    by_iteration.setdefault(report.iteration, {})[report.mst_key] = report
    waiting.add((report.iteration, report.mst_key))
    changed = True
    while changed:
        changed = False
        for iteration, key in sorted(waiting):
            decision = pruner.decide(by_iteration[iteration][key], by_iteration[iteration])
            if decision is not Decision.WAIT:
                waiting.discard((iteration, key))
                changed = True
                if decision is Decision.STOP:
                    stopped[key] = iteration


def _replay(pruner, reports: list[Report]) -> dict[int, int]:
    """Reports in the given order (a stopped model's later ones are never sent); returns
    the iteration each stopped model stopped at."""
    by_iteration: dict = {}
    waiting: set = set()
    stopped: dict[int, int] = {}
    for report in reports:
        if report.mst_key not in stopped:
            _deliver(pruner, report, by_iteration, waiting, stopped)
    return stopped


def _reports(values: dict[int, list[float]], metric: str = "loss") -> list[Report]:
    return [Report(key, i + 1, {"loss": v}, {metric: v})
            for key, series in values.items() for i, v in enumerate(series)]


def test_successive_halving_keeps_the_best_third_at_each_rung():
    rng = random.Random(0)
    values = {k: [rng.random() for _ in range(9)] for k in range(1, 10)}
    pruner = SuccessiveHalvingPruner(LOSS, num_iterations=9, eta=3, min_iterations=1)
    pruner.start(list(values))
    assert pruner.rungs() == [1, 3]
    stopped = _replay(pruner, sorted(_reports(values), key=lambda r: (r.iteration, r.mst_key)))
    first = sorted(values, key=lambda k: values[k][0])[:3]
    second = sorted(first, key=lambda k: values[k][2])[:1]
    assert set(values) - set(stopped) == set(second)
    assert {k for k, i in stopped.items() if i == 1} == set(values) - set(first)


def _simulate(pruner, values: dict[int, list[float]], rng: random.Random) -> dict[int, int]:
    """A run in which models finish iterations in a random order, as workers would: a
    model held for a decision or stopped reports nothing further."""
    by_iteration: dict = {}
    waiting: set = set()
    stopped: dict[int, int] = {}
    done = {k: 0 for k in values}
    while True:
        held = {key for _, key in waiting}
        runnable = [k for k in values if k not in stopped and k not in held and done[k] < len(values[k])]
        if not runnable:
            assert not waiting, "a decision waits for reports that cannot come"
            return stopped
        key = rng.choice(runnable)
        done[key] += 1
        value = values[key][done[key] - 1]
        _deliver(pruner, Report(key, done[key], {"loss": value}, {"loss": value}), by_iteration,
                 waiting, stopped)


def test_pruning_decisions_do_not_depend_on_the_order_reports_arrive_in():
    rng = random.Random(1)
    values = {k: [rng.random() for _ in range(6)] for k in range(1, 12)}
    for make in (lambda: SuccessiveHalvingPruner(LOSS, 6, eta=2, min_iterations=1),
                 lambda: MedianPruner(LOSS, warmup=2, interval=1, min_models=3)):
        outcomes = set()
        for trial in range(30):
            pruner = make()
            pruner.start(list(values))
            outcomes.add(tuple(sorted(_simulate(pruner, values, random.Random(trial)).items())))
        assert len(outcomes) == 1, outcomes
        assert outcomes.pop()  # somebody was stopped


def test_median_pruner_stops_the_worse_half_from_the_warmup_on():
    values = {1: [0.1, 0.1, 0.1], 2: [0.2, 0.2, 0.2], 3: [0.3, 0.3, 0.05], 4: [0.4, 0.4, 0.4],
              5: [0.5, 0.5, 0.5]}
    pruner = MedianPruner(LOSS, warmup=2, interval=1, min_models=3)
    pruner.start(list(values))
    stopped = _replay(pruner, sorted(_reports(values), key=lambda r: (r.iteration, r.mst_key)))
    assert stopped == {4: 2, 5: 2, 2: 3}  # 3 overtakes 2 at iteration 3; 2 of 3 left is worse
    assert "worse than the median" in pruner.reason(Report(4, 2, {}, {"loss": 0.4}))


def test_hyperband_pruner_promotes_the_best_of_each_bracket():
    R, eta = 9, 3
    brackets = hyperband_brackets(R, eta, 0)
    assert sorted(brackets.values()).count(2) == 9 and sorted(brackets.values()).count(1) == 3
    pruner = HyperbandPruner(ACCURACY, brackets, R, eta, 0, R)
    pruner.start(list(brackets))
    rng = random.Random(2)
    values = {k: [rng.random() for _ in range(R)] for k in brackets}
    reports = [Report(k, i + 1, {}, {"accuracy": values[k][i]}) for k in brackets for i in range(R)]
    stopped = _replay(pruner, sorted(reports, key=lambda r: (r.iteration, -r.mst_key)))
    bracket2 = [k for k, s in brackets.items() if s == 2]
    round1 = sorted(bracket2, key=lambda k: -values[k][0])[:3]
    survivor = sorted(round1, key=lambda k: -values[k][2])[:1]
    assert [k for k in bracket2 if k not in stopped] == survivor
    assert all(stopped[k] == 1 for k in bracket2 if k not in round1)
    bracket1 = [k for k, s in brackets.items() if s == 1]
    assert [k for k in bracket1 if k not in stopped] == sorted(bracket1, key=lambda k: -values[k][2])[:1]
    assert not any(k in stopped for k, s in brackets.items() if s == 0)
    assert pruner.labels(survivor[0], 9) == {"s": 2, "i": 2}
    assert pruner.required_iterations() == {1, 3, 9}


def test_hyperband_pruner_decides_as_soon_as_it_is_certain():
    brackets = {k: 1 for k in range(1, 4)}  # R=6, eta=3: bracket 1 keeps 1 of 3 at 2 iterations
    pruner = HyperbandPruner(LOSS, {**brackets, 4: 0, 5: 0}, 6, 3, 0, 6)
    peers = {1: Report(1, 2, {}, {"loss": 0.5}), 2: Report(2, 2, {}, {"loss": 0.1})}
    assert pruner.decide(peers[1], peers) is Decision.STOP  # 2 is better: 1 cannot be kept
    assert pruner.decide(peers[2], peers) is Decision.WAIT  # 3 may still be better
    peers[3] = Report(3, 2, {}, {"loss": 0.3})
    assert pruner.decide(peers[2], peers) is Decision.CONTINUE


def test_the_dispatcher_prefers_promoted_models():
    dispatcher = Dispatcher({1: [[0]], 2: [[0]], 3: [[0]]}, 1)
    dispatcher.prefer(3, 2)
    assert dispatcher.next_visit(0) == ((3,), 0)


def test_pruner_argument_parsing():
    def objective_of(metric, direction):
        return objective_from(metric, direction, True, [["accuracy"]], "pruner")
    pruner = pruner_from("successive_halving, eta=2, min_iterations=2, metric=accuracy", 16, objective_of)
    assert isinstance(pruner, SuccessiveHalvingPruner) and pruner.rungs() == [2, 4, 8]
    assert pruner.objective.maximize
    assert isinstance(pruner_from("median", 5, objective_of), MedianPruner)
    assert pruner_from(None, 5, objective_of) is None
    for text, fragment in [("mediocre", "unknown"), ("median, eta=3", "unknown option eta"),
                           ("successive_halving, eta=1", "at least 2"),
                           ("median, metric=f9", "not reported")]:
        with pytest.raises(MadlibMopError, match=fragment):
            pruner_from(text, 5, objective_of)


GRID = {"loss": ["categorical_crossentropy"], "metrics": ["accuracy"],
        "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.1, "log"]},
                                  {"optimizer": ["SGD"], "lr": [0.001, 0.1, "log"],
                                   "momentum": [0.5, 0.99, "log_near_one"]}]}
FIT = {"batch_size": [4, 8], "epochs": [1]}


def _searcher(algorithm="tpe", parallelism=2):
    return OptunaSearcher(SearchSpace([1, 2], GRID, FIT), LOSS, 12, 3, algorithm, 7, parallelism, 4)


def _result(config) -> float:
    lr = float(config.compile_params.split("lr=")[1].split(")")[0].split(",")[0])
    return abs(math.log10(lr) + 2) + (0.5 if config.model_id == 2 else 0)


def _run(searcher, order_seed):
    """Ask as slots free; finish running configurations in a random order."""
    rng = random.Random(order_seed)
    running, asked = [], []
    while not (searcher.finished() and not running):
        while (config := searcher.ask()) is not None:
            asked.append(config)
            running.append((len(asked), config))
        assert running, "the searcher neither proposes nor waits for anything"
        key, config = running.pop(rng.randrange(len(running)))
        searcher.tell(Report(key, 3, {"loss": 0}, {"loss": _result(config)}))
    return asked


def test_tpe_proposals_depend_on_results_not_on_finishing_order():
    first = _run(_searcher(), 0)
    assert len(first) == 12 and len(set(first)) == 12
    for order in (1, 2):
        assert _run(_searcher(), order) == first
    # A resumed job's new searcher, told the recorded results, proposes the same again.
    resumed = _searcher()
    results = {k: _result(c) for k, c in enumerate(first, start=1)}
    for key in range(1, 9):
        resumed.tell(Report(key, 3, {}, {"loss": results[key]}))
    again = []
    while (config := resumed.ask()) is not None:
        again.append(config)
    assert again == first[:10]  # 10 = 8 finished + parallelism 2
    # Sampled values stay inside the grid; log_near_one stays below 1.
    for config in first:
        if "momentum" in config.compile_params:
            assert 0.5 <= float(config.compile_params.split("momentum=")[1].split(")")[0]) < 0.99 + 1e-12
    assert _run(_searcher("rand"), 0) != first


def test_tpe_waits_for_the_results_it_needs():
    searcher = _searcher(parallelism=3)
    proposed = [searcher.ask() for _ in range(3)]
    assert all(proposed) and searcher.ask() is None
    searcher.tell(Report(2, 3, {}, {"loss": 1.0}))  # configuration 1 finished, 0 did not
    assert searcher.ask() is None
    searcher.tell(Report(1, 2, {}, {"loss": 1.0}))  # not its last iteration
    assert searcher.ask() is None
    searcher.tell(Report(1, 3, {}, {"loss": 1.0}))
    assert searcher.ask() is not None and searcher.ask() is not None
    assert list(itertools.islice(iter(searcher.ask, None), 5)) == []


def test_tpe_on_a_small_discrete_grid_tries_every_configuration():
    grid = {"loss": ["categorical_crossentropy"], "optimizer_params_list": [
        {"optimizer": ["Adam"], "lr": [0.001, 0.01, 0.1]}]}
    space = SearchSpace([1, 2], grid, {"batch_size": [8, 16], "epochs": [1]})
    assert space.size() == 12 and SearchSpace([1], GRID, FIT).size() is None
    searcher = OptunaSearcher(space, LOSS, 12, 3, "tpe", 0, 2, 2)
    # TPE soon settles on the best few; repeats are replaced by random proposals.
    assert len(set(_run(searcher, 0))) == 12


def _decisions_of(brackets: dict, reports: list[Report]) -> dict[int, tuple[int, Decision, dict]]:
    """Each model's last decision passed on by the coordinator's SearchDecisions (iteration,
    decision, Hyperband's labels), the reports handed over in the given order."""
    from madlib_mop.job.search_driver import SearchDecisions

    pruner = HyperbandPruner(LOSS, brackets, 9, 3, 0, 9)
    pruner.start(sorted(brackets))
    last: dict[int, tuple[int, Decision, dict]] = {}

    def decided(report, decision, why):
        assert report.iteration >= last.get(report.mst_key, (0,))[0], "a decision went back"
        last[report.mst_key] = (report.iteration, decision, pruner.labels(report.mst_key, report.iteration))

    decisions = SearchDecisions(None, pruner, Dispatcher({k: [[0]] for k in brackets}, 1), decided)
    for report in reports:
        decisions.report(report)
    return last


def test_a_resumed_job_decides_as_the_uninterrupted_one():
    """A resumed job hands over each model's reports at once (model by model): a later
    iteration's decision can then come before an earlier one's, which must not undo it
    (Hyperband's `i` of a model stopped in round 1 went back to 0)."""
    brackets = hyperband_brackets(9, 3, 0)
    rng = random.Random(5)
    values = {k: [rng.random() for _ in range(9)] for k in brackets}
    # The reports a run has: a stopped model reports nothing after its stop.
    pruner = HyperbandPruner(LOSS, brackets, 9, 3, 0, 9)
    pruner.start(sorted(brackets))
    stopped = _replay(pruner, sorted(_reports(values), key=lambda r: (r.iteration, r.mst_key)))
    reports = [r for r in _reports(values) if r.iteration <= stopped.get(r.mst_key, 9)]
    in_time = _decisions_of(brackets, sorted(reports, key=lambda r: (r.iteration, r.mst_key)))
    resumed = _decisions_of(brackets, reports)  # model by model
    assert resumed == in_time
    promoted_then_stopped = [k for k, (i, d, labels) in in_time.items()
                             if d is Decision.STOP and labels["i"] >= 1]
    assert promoted_then_stopped  # the case that went wrong: i of a model stopped in round 1
