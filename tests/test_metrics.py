"""A job's metric arithmetic (madlib_mop.job.metrics), without a database."""

from __future__ import annotations

import math

import pytest

from madlib_mop.job import metrics


def visit(rows, loss, accuracy, finished_at):
    return {"rows": rows, "metrics": {"loss": loss, "accuracy": accuracy}, "finished_at": finished_at}


def test_due_iterations_are_every_frequency_and_the_last():
    assert metrics.due_iterations(10, 3, 10) == [3, 6, 9, 10]
    assert metrics.due_iterations(5, 3, 10) == [3]
    assert metrics.due_iterations(4, 4, 4) == [4]
    assert not metrics.due(2, 3, 10) and metrics.due(10, 3, 10)


def test_weighted_means_weigh_by_rows():
    means = metrics.weighted([visit(30, 1.0, 0.5, 0), visit(10, 3.0, 0.9, 0)])
    assert means == pytest.approx({"loss": 1.5, "accuracy": 0.6})


def test_curves_use_each_iterations_last_pass_and_wait_for_validation():
    S, epochs = 2, 2  # 4 sub-epochs per iteration; the last 2 are its last pass
    visits = {s: visit(10, 10.0 - s, s / 10, 100.0 + s) for s in range(8)}
    evals = {(4, 0): visit(5, 2.0, 0.7, 105.0), (4, 1): visit(15, 4.0, 0.3, 104.5),
             (8, 0): visit(5, 1.0, 0.8, 109.0)}  # iteration 2's partition 1 still running
    curves = metrics.curves(visits, evals, S, epochs, frequency=1, iterations=2, partitions=2,
                            started_at=100.0)
    assert curves.iterations == [1]
    assert curves.training[0] == pytest.approx({"loss": 7.5, "accuracy": 0.25})  # steps 2, 3
    assert curves.validation[0] == pytest.approx({"loss": 3.5, "accuracy": 0.4})
    assert curves.elapsed == [5.0]  # the later of the last visit and the last evaluation
    evals[(8, 1)] = visit(5, 3.0, 0.6, 110.0)
    curves = metrics.curves(visits, evals, S, epochs, 1, 2, 2, 100.0)
    assert curves.iterations == [1, 2] and curves.elapsed == [5.0, 10.0]
    assert curves.final("validation", "loss") == pytest.approx(2.0)
    assert curves.final("training", None) is None


def test_curves_without_validation_and_with_a_frequency():
    visits = {s: visit(1, float(s), 0.0, float(s)) for s in range(4)}
    curves = metrics.curves(visits, {}, 1, 1, frequency=2, iterations=5, partitions=0,
                            started_at=0.0)
    assert curves.iterations == [2, 4] and curves.validation == []
    assert metrics.series(curves.training, "loss") == [1.0, 3.0]
    visits[4] = visit(1, 4.0, 0.0, 4.0)  # the last iteration always counts
    curves = metrics.curves(visits, {}, 1, 1, 2, 5, 0, 0.0)
    assert curves.iterations == [2, 4, 5] and curves.elapsed == [1.0, 3.0, 4.0]
    assert metrics.series([], "loss") is None and metrics.last(None) is None


def test_epoch_loss_needs_the_whole_pass_and_eta_its_rate():
    visits = {0: visit(10, 2.0, 0, 0), 1: visit(30, 1.0, 0, 0), 2: visit(10, 0.5, 0, 0)}
    assert metrics.epoch_loss(visits, 1, 2) == pytest.approx(1.25)
    assert metrics.epoch_loss(visits, 2, 2) is None
    assert metrics.eta(10.0, 15, 5, 45) == pytest.approx(30.0)
    assert math.isnan(metrics.eta(10.0, 5, 5, 45))
