"""Searchers and pruners, without a database: grid and random search (MADlib's
generate_model_configs), the ask/tell contract, the default pruner."""

from __future__ import annotations

import pytest

from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar import model_config as mc
from madlib_mop.search import grid
from madlib_mop.search.base import Decision, NoPruner, Report


def grid_search(model_ids, compile_grid, fit_grid):
    return grid.all_configs(grid.GridSearcher(model_ids, compile_grid, fit_grid))


def random_search(model_ids, compile_grid, fit_grid, num_configs, random_state):
    return grid.all_configs(grid.RandomSearcher(model_ids, compile_grid, fit_grid, num_configs,
                                                random_state))


COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
                "{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}, {'optimizer': ['SGD'], 'lr': [0.1], "
                "'momentum': [0.9, 0.99]}], 'metrics': ['accuracy', ['accuracy', 'top_k_categorical_accuracy']]}")
FIT_GRID = "{'batch_size': [32, 64], 'epochs': [1]}"


def test_grid_search_is_the_full_product():
    configs = grid_search([1, 2], mc.parse_grid(COMPILE_GRID, "c"), mc.parse_grid(FIT_GRID, "f"))
    # 2 models x (2 Adam + 2 SGD) x 2 metric choices x 2 batch sizes
    assert len(configs) == 2 * 4 * 2 * 2 == len(set(configs))
    assert configs[0] == mc.Config(
        1, "optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',metrics=['accuracy']",
        "batch_size=32,epochs=1")
    assert {c.model_id for c in configs} == {1, 2}
    for config in configs:  # every generated string parses back to itself
        assert str(mc.parse_compile_params(config.compile_params)) == config.compile_params
        assert mc.fit_params_text(mc.parse_fit_params(config.fit_params)) == config.fit_params


def test_json_grids_work_too():
    grid = mc.parse_grid('{"loss": ["mse"], "optimizer": ["SGD(lr=0.1)", "Adam"]}', "c")
    configs = grid_search([3], grid, mc.parse_grid('{"epochs": [1, 2]}', "f"))
    assert [c.compile_params for c in configs[::2]] == [
        "optimizer='SGD(lr=0.1)',loss='mse'", "optimizer='Adam()',loss='mse'"]


def test_random_search_is_reproducible_and_samples_in_bounds():
    grid = mc.parse_grid(
        "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
        "{'optimizer': ['SGD'], 'lr': [0.0001, 0.1, 'log'], 'momentum': [0.9, 0.999, 'log_near_one']},"
        "{'optimizer': ['Adam'], 'lr': [0.001, 0.01, 'linear']}]}", "c")
    fit = mc.parse_grid("{'batch_size': [16, 32, 64], 'epochs': [1]}", "f")
    first = random_search([1, 2], grid, fit, 20, random_state=7)
    assert first == random_search([1, 2], grid, fit, 20, random_state=7)
    assert first != random_search([1, 2], grid, fit, 20, random_state=8)
    assert len(first) == len(set(first)) == 20
    for config in first:
        params = mc.parse_compile_params(config.compile_params).optimizer.written_arguments()
        if "momentum" in params:
            assert 0.0001 <= params["learning_rate"] <= 0.1 and 0.9 <= params["momentum"] <= 0.999
        else:
            assert 0.001 <= params["learning_rate"] <= 0.01
    assert {c.model_id for c in first} == {1, 2}


def test_log_sampling_spreads_over_orders_of_magnitude():
    grid = mc.parse_grid("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
                         "'lr': [0.00001, 0.1, 'log']}]}", "c")
    configs = random_search([1], grid, {"epochs": [1]}, 200, random_state=0)
    rates = [mc.parse_compile_params(c.compile_params).optimizer.written_arguments()["learning_rate"]
             for c in configs]
    below = sum(r < 0.001 for r in rates)  # half of the log range; a linear draw gives ~1%
    assert 70 <= below <= 130


def test_random_search_cannot_draw_more_than_the_grid_holds():
    with pytest.raises(MadlibMopError, match="distinct configurations"):
        random_search([1], {"loss": ["mse"]}, {"epochs": [1, 2]}, 5, random_state=0)


def test_grid_search_refuses_distributions():
    grid = mc.parse_grid("{'loss': ['mse'], 'optimizer_params_list': "
                         "[{'optimizer': ['SGD'], 'lr': [0.001, 0.1, 'log']}]}", "c")
    with pytest.raises(MadlibMopError, match="grid search cannot sample"):
        grid_search([1], grid, {"epochs": [1]})


def test_bad_distribution():
    grid = mc.parse_grid("{'loss': ['mse'], 'optimizer_params_list': "
                         "[{'optimizer': ['SGD'], 'lr': [0.1, 0.001, 'log']}]}", "c")
    with pytest.raises(MadlibMopError, match="not a distribution"):
        random_search([1], grid, {"epochs": [1]}, 1, random_state=0)


def test_searchers_answer_none_once_finished():
    searcher = grid.GridSearcher([1], mc.parse_grid("{'loss': ['mse']}", "c"),
                                 mc.parse_grid("{'epochs': [1, 2]}", "f"))
    assert not searcher.finished()
    asked = [searcher.ask(), searcher.ask()]
    assert [c.fit_params for c in asked] == ["epochs=1", "epochs=2"]
    assert searcher.ask() is None and searcher.finished() and searcher.ask() is None
    random = grid.RandomSearcher([1], mc.parse_grid("{'loss': ['mse']}", "c"),
                                 mc.parse_grid("{'epochs': [1, 2, 3]}", "f"), 2, random_state=3)
    drawn = [random.ask(), random.ask()]
    assert None not in drawn and random.finished() and random.ask() is None
    assert len(set(drawn)) == 2


def test_random_searcher_asked_one_at_a_time_draws_what_a_batch_draws():
    compile_grid = mc.parse_grid("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': "
                                 "['SGD'], 'lr': [0.0001, 0.1, 'log']}]}", "c")
    fit_grid = mc.parse_grid("{'batch_size': [8, 16, 32]}", "f")
    batch = random_search([1, 2], compile_grid, fit_grid, 6, random_state=11)
    searcher = grid.RandomSearcher([1, 2], compile_grid, fit_grid, 6, random_state=11)
    one_by_one = []
    for _ in range(6):
        searcher.tell(Report(1, 1, {"loss": 0.5}, None))  # results do not steer random search
        one_by_one.append(searcher.ask())
    assert one_by_one == batch


def test_the_default_pruner_stops_nothing():
    pruner = NoPruner()
    reports = {k: Report(k, 3, {"loss": float(k)}, {"loss": 10.0 * k}) for k in range(1, 6)}
    assert {pruner.decide(r, reports) for r in reports.values()} == {Decision.CONTINUE}
