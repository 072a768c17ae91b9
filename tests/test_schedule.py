"""The schedule's invariants, by simulating jobs with random sub-epoch durations."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from madlib_mop.job.schedule import (MAX_GROUP, Dispatcher, added_model_orders, clock_offsets, dispatcher_for,
                                    fusion_groups, model_orders, visit_orders)


def _simulate(models, segments, epochs, seed, durations, failures=frozenset(), done=None,
              fusion=None, units=None, on_finish=None):
    """Run a dispatcher against simulated time; return the visits as (start, end, model,
    segment, step).  A unit of fused models takes its slowest member's time; `units`, if
    given, collects each call's (models, step)."""
    orders = visit_orders(models, segments, epochs, seed)
    dispatcher = Dispatcher(orders, segments, dict(done or {}), dict(fusion or {}))
    clock, events, log, attempts = 0.0, [], [], {}
    free = set(range(segments))
    while not dispatcher.finished():
        for segment in sorted(free):
            given = dispatcher.next_visit(segment)
            if given:
                unit, step = given
                free.discard(segment)
                if units is not None:
                    units.append(given)
                seconds = max(durations[model] for model in unit)
                heapq.heappush(events, (clock + seconds, unit, segment, step, clock))
        assert events, "deadlock: nothing running, job not finished"
        clock, unit, segment, step, start = heapq.heappop(events)
        free.add(segment)
        attempts[(unit, step)] = attempts.get((unit, step), 0) + 1
        if any((model, step) in failures for model in unit) and attempts[(unit, step)] == 1:
            for model in unit:
                dispatcher.retry(model, segment)
            continue
        for model in unit:
            assert dispatcher.planned(model, step)[2] == segment
            dispatcher.finish(model, segment, durations[model])
            log.append((start, clock, model, segment, step))
            if on_finish is not None:
                on_finish(dispatcher, model, step)
    return orders, log


@pytest.mark.parametrize(("models", "segments"), [(8, 2), (3, 3), (2, 4), (16, 4), (1, 1)])
def test_invariants(models, segments):
    rng = np.random.default_rng(models * 10 + segments)
    durations = {m: float(rng.uniform(1, 5)) for m in range(1, models + 1)}
    epochs = 3
    orders, log = _simulate(list(range(1, models + 1)), segments, epochs, 0, durations)
    # Each model visits each segment exactly once per epoch, in its planned order.
    for model in orders:
        visits = sorted((step, segment) for _, _, m, segment, step in log if m == model)
        assert [step for step, _ in visits] == list(range(epochs * segments))
        for epoch in range(epochs):
            per_epoch = [s for step, s in visits if step // segments == epoch]
            assert sorted(per_epoch) == list(range(segments))
            assert per_epoch == orders[model][epoch]
    # No segment trains two models at once; no model is on two segments at once.
    for key in (3, 2):
        by = {}
        for visit in log:
            by.setdefault(visit[key], []).append(visit)
        for visits in by.values():
            visits.sort()
            assert all(a[1] <= b[0] for a, b in zip(visits, visits[1:]))


def test_orders_depend_on_the_seed_only():
    a = visit_orders([1, 2, 3, 4], 2, 5, seed=1)
    assert a == visit_orders([4, 3, 2, 1], 2, 5, seed=1)
    assert a != visit_orders([1, 2, 3, 4], 2, 5, seed=2)
    # Extending a job keeps the orders of its first epochs.
    longer = visit_orders([1, 2, 3, 4], 2, 8, seed=1)
    assert all(longer[m][:5] == a[m] for m in a)


def test_equal_models_never_wait_when_as_many_as_segments():
    durations = {m: 1.0 for m in range(4)}
    _, log = _simulate(list(range(4)), 4, 3, 5, durations)
    assert max(end for _, end, *_ in log) == pytest.approx(3 * 4 * 1.0)


def test_heterogeneous_models_stay_near_the_lower_bound():
    """Models whose sub-epochs differ 4x to 10x in cost: the makespan stays within 15% of
    max(total work / S, the longest model's own time), with no barrier between epochs."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        durations = {m: float(rng.choice([1.0, 4.0, 10.0])) for m in range(1, 9)}
        _, log = _simulate(list(range(1, 9)), 2, 3, seed, durations)
        makespan = max(end for _, end, *_ in log)
        bound = max(sum(durations.values()) * 3 * 2 / 2, max(durations.values()) * 3 * 2)
        assert makespan <= 1.15 * bound, (seed, makespan, bound)


def test_failed_visits_are_run_again():
    durations = {m: 1.0 + m for m in range(1, 5)}
    failures = {(1, 0), (2, 3), (4, 5)}
    orders, log = _simulate([1, 2, 3, 4], 2, 3, 9, durations, failures)
    assert sorted((m, step) for *_, m, _, step in log) == sorted(
        (m, s) for m in orders for s in range(6))


def test_resume_starts_where_models_stopped():
    durations = {m: 1.0 for m in range(1, 4)}
    orders, log = _simulate([1, 2, 3], 3, 2, 4, durations, done={1: 4, 2: 6, 3: 0})
    assert sorted(step for *_, m, _, step in log if m == 1) == [4, 5]
    assert not [1 for *_, m, _, _ in log if m == 2]
    assert len([1 for *_, m, _, _ in log if m == 3]) == 6


def test_dispatcher_refuses_inconsistent_calls():
    dispatcher = Dispatcher(visit_orders([1], 2, 1, 0), 2)
    segment = visit_orders([1], 2, 1, 0)[1][0][0]
    assert dispatcher.next_visit(1 - segment) is None
    assert dispatcher.next_visit(segment) == ((1,), 0)
    with pytest.raises(ValueError):
        dispatcher.next_visit(segment)
    with pytest.raises(ValueError):
        dispatcher.finish(1, 1 - segment)


def _drain(dispatcher, segments):
    """Run every planned visit to the end in dispatch order; the visits per model."""
    visits: dict[int, list[int]] = {}
    while not dispatcher.finished():
        progressed = False
        for segment in range(segments):
            given = dispatcher.next_visit(segment)
            if given:
                (model,), step = given
                visits.setdefault(model, []).append(dispatcher.planned(model, step)[2])
                dispatcher.finish(model, segment, 1.0)
                progressed = True
        assert progressed, "deadlock"
    return visits


def test_adding_a_model_changes_no_other_models_order():
    segments, epochs, seed = 3, 4, 5
    orders = visit_orders([1, 2, 3, 4], segments, epochs, seed)
    dispatcher = Dispatcher({k: list(o) for k, o in orders.items()}, segments)
    before: dict[int, list[int]] = {}
    for segment in range(segments):  # the job is under way when model 9 joins
        (model,), step = dispatcher.next_visit(segment)
        before.setdefault(model, []).append(dispatcher.planned(model, step)[2])
        dispatcher.finish(model, segment, 1.0)
    added = added_model_orders(9, segments, epochs, seed)
    dispatcher.add(9, added)
    joined = _drain(dispatcher, segments)
    for model in orders:  # every visit as planned before model 9 existed
        assert before.get(model, []) + joined[model] == [s for e in orders[model] for s in e]
    assert joined[9] == [s for epoch in added for s in epoch]
    assert all(sorted(epoch) == list(range(segments)) for epoch in added)
    # its stream is its own: the same whenever (and beside whichever models) it is added
    assert added == added_model_orders(9, segments, epochs, seed)
    assert added != added_model_orders(10, segments, epochs, seed)


def test_stopping_a_model_changes_no_other_models_order():
    segments, epochs = 2, 3
    orders = visit_orders([1, 2, 3], segments, epochs, 8)
    dispatcher = Dispatcher({k: list(o) for k, o in orders.items()}, segments)
    (stopped,), _ = dispatcher.next_visit(0)
    dispatcher.stop(stopped)  # stopped while running: that visit may still finish
    dispatcher.finish(stopped, 0, 1.0)
    visits = _drain(dispatcher, segments)
    assert stopped not in visits
    for model in set(orders) - {stopped}:
        assert visits[model] == [s for epoch in orders[model] for s in epoch]


def test_a_held_model_is_not_dispatched_until_released():
    orders = visit_orders([1, 2], 1, 1, 0)
    dispatcher = Dispatcher(orders, 1)
    dispatcher.hold(1)
    dispatcher.hold(2)
    assert dispatcher.next_visit(0) is None
    dispatcher.hold(2, False)
    assert dispatcher.next_visit(0) == ((2,), 0)


def _scanned_choice(dispatcher, segment):
    """The dispatch rule over a scan of every model (what the index of due models serves)."""
    return dispatcher.choose([m for m in dispatcher.progress if dispatcher.dispatchable(m)
                              and dispatcher.planned(m, dispatcher.progress[m].done)[2] == segment])


def test_the_index_of_due_models_chooses_as_a_scan_of_every_model_would():
    """Through retries, holds, stops, priorities and added models, every free segment gets
    the model a scan of all models picks."""
    rng = np.random.default_rng(11)
    models, segments = list(range(1, 25)), 5
    dispatcher = Dispatcher(visit_orders(models, segments, 3, seed=4), segments)
    events, free, clock, added, checked = [], set(range(segments)), 0.0, 100, 0
    while not dispatcher.finished():
        for segment in sorted(free):
            expected = _scanned_choice(dispatcher, segment)
            given = dispatcher.next_visit(segment)
            assert (given[0][0] if given else None) == expected
            checked += given is not None
            if given:
                free.discard(segment)
                heapq.heappush(events, (clock + float(rng.uniform(0.1, 2.0)), given[0][0], segment))
        if not events:  # only held models are left
            for model in models:
                dispatcher.hold(model, False)
            continue
        clock, model, segment = heapq.heappop(events)
        free.add(segment)
        if rng.random() < 0.05:
            dispatcher.retry(model, segment)
        else:
            dispatcher.finish(model, segment, float(rng.uniform(0.1, 2.0)))
        other, action = int(rng.choice(models)), rng.random()
        if action < 0.04:
            dispatcher.hold(other)
        elif action < 0.10:
            dispatcher.hold(other, False)
        elif action < 0.12:
            dispatcher.stop(other)
        elif action < 0.16:
            dispatcher.prefer(other, int(rng.integers(0, 3)))
        elif action < 0.18:
            dispatcher.add(added, added_model_orders(added, segments, 2, seed=4))
            models.append(added)
            added += 1
    assert checked > 300


# ---- fused groups -------------------------------------------------------------------------------

def _fused_run(durations_seed: int, stop_at=None):
    """16 models of two fusion classes (and two that do not fuse) on 4 segments, with random
    sub-epoch times; model 5 stopped at step 4 when `stop_at`.  The units called."""
    models, segments = list(range(1, 19)), 4
    fusion = {m: m % 2 for m in models if m <= 16}
    rng = np.random.default_rng(durations_seed)
    durations = {m: float(rng.uniform(1, 5)) for m in models}
    units = []

    def stop(dispatcher, model, step):
        if stop_at and model == 5 and step + 1 == stop_at:
            dispatcher.stop(5)
    orders, log = _simulate(models, segments, 3, 7, durations, fusion=fusion, units=units,
                            on_finish=stop)
    return orders, fusion, units, log


def test_fused_units_are_models_of_one_class_on_one_path_and_keep_their_orders():
    orders, fusion, units, log = _fused_run(1)
    assert any(len(unit) > 1 for unit, _ in units)
    for unit, step in units:
        epoch = step // 4
        assert len({fusion.get(m, -m) for m in unit}) == 1
        assert len({tuple(orders[m][epoch]) for m in unit}) == 1
    for model in orders:  # every model visits its own planned orders, fused or not
        visits = sorted((step, segment) for _, _, m, segment, step in log if m == model)
        assert [segment for _, segment in visits] == [s for epoch in orders[model] for s in epoch]
    assert all(len(unit) == 1 for unit, _ in units if unit[0] > 16)


def test_which_models_train_together_does_not_depend_on_timing():
    """The units called (as sets, per step) are the same whatever each model's time: a
    fused model's bits depend on its partners, so they must come from the plan."""
    def calls(seed, stop_at=None):
        _, _, units, _ = _fused_run(seed, stop_at)
        return sorted((step, unit) for unit, step in units)
    assert calls(1) == calls(2) == calls(3)
    stopped = calls(1, stop_at=4)
    assert stopped == calls(2, stop_at=4) != calls(1)
    assert all(5 not in unit for step, unit in stopped if step >= 4)


def test_a_held_member_holds_its_unit_and_a_stopped_one_leaves_it():
    orders = {1: [[0, 1]], 2: [[0, 1]], 3: [[0, 1]]}
    dispatcher = Dispatcher(orders, 2, fusion={1: 0, 2: 0, 3: 0})
    dispatcher.hold(2)
    assert dispatcher.next_visit(0) is None
    dispatcher.hold(2, False)
    assert dispatcher.next_visit(0) == ((1, 2, 3), 0)
    for model in (1, 2, 3):
        dispatcher.finish(model, 0, 1.0)
    dispatcher.stop(1)
    assert dispatcher.next_visit(1) == ((2, 3), 1)
    with pytest.raises(ValueError):
        dispatcher.next_visit(1)  # busy until its unit's last model finishes
    dispatcher.finish(2, 1, 1.0)
    assert 1 in dispatcher.busy_segments
    dispatcher.finish(3, 1, 1.0)
    assert dispatcher.finished()


def test_a_unit_waits_for_a_member_behind_it():
    """A resumed job whose model 2 is one step behind model 1 (the same path): model 2
    trains its step alone, then both go on together."""
    orders = {1: [[0, 1, 2]], 2: [[0, 1, 2]]}
    dispatcher = Dispatcher(orders, 3, done={1: 1, 2: 0}, fusion={1: 0, 2: 0})
    assert dispatcher.next_visit(1) is None
    assert dispatcher.next_visit(0) == ((2,), 0)
    dispatcher.finish(2, 0, 1.0)
    assert dispatcher.next_visit(1) == ((1, 2), 1)


def test_a_partner_stopped_or_given_steps_again_in_an_earlier_epoch_frees_or_holds_its_unit():
    """Model 1 waits at epoch 1's start for model 2, its partner there, still in epoch 0:
    model 2 stopped, model 1 goes on alone; given its steps back, model 1 waits again."""
    orders = {1: [[0, 1], [0, 1]], 2: [[1, 0], [0, 1]]}
    dispatcher = Dispatcher(orders, 2, fusion={1: 0, 2: 0})
    dispatcher.hold(2)  # (it waits for a decision: model 1 goes first)
    for step, segment in enumerate([0, 1]):
        assert dispatcher.next_visit(segment) == ((1,), step)
        dispatcher.finish(1, segment, 1.0)
    assert dispatcher.next_visit(0) is None  # waits for model 2
    dispatcher.stop(2)
    dispatcher.limit(2, 4)  # a person gives it its iterations back: model 1 waits again
    assert dispatcher.next_visit(0) is None
    dispatcher.stop(2)
    assert dispatcher.next_visit(0) == ((1,), 2)


@pytest.mark.parametrize("segments", [2, 3, 4])
def test_paths_drawn_by_class_keep_classes_whole_where_the_paths_lengths_allow(segments):
    """Orders drawn by class: every path as long as a rotation's, every model still a
    rotation of the epoch's labelling, and a class split across paths only where a path's
    end falls inside it; a job of classes that share nothing keeps its rotations."""
    models = list(range(1, 13))
    classes = {m: f"c{(m - 1) % 4}" for m in models}  # 4 classes of 3 (as MADlib's iris grid)
    orders = visit_orders(models, segments, 6, 11, classes)
    rotations = visit_orders(models, segments, 6, 11)
    for epoch in range(6):
        paths: dict[tuple, list[int]] = {}
        for m in models:
            paths.setdefault(tuple(orders[m][epoch]), []).append(m)
        lengths = sorted(len(members) for members in paths.values())
        assert lengths == sorted(len(members) for members in _paths(rotations, epoch).values())
        assert len(paths) == segments
        # a class lies on as many paths as the cuts that fall inside it, at most 2 here
        spread = {c: len({tuple(orders[m][epoch]) for m in models if classes[m] == c}) for c in "c0 c1 c2 c3".split()}
        assert sum(n - 1 for n in spread.values()) <= segments - 1
        if segments == 2:  # 12 models in 2 paths of 6: two whole classes each
            assert set(spread.values()) == {1}
    assert orders != rotations
    distinct = {m: f"only{m}" for m in models} | {1: None, 2: None}
    assert visit_orders(models, segments, 6, 11, distinct) == rotations


def _paths(orders, epoch):
    paths: dict[tuple, list[int]] = {}
    for m, each in orders.items():
        paths.setdefault(tuple(each[epoch]), []).append(m)
    return paths


def test_paths_drawn_by_class_depend_on_the_seed_and_the_classes_only():
    classes = {1: "a", 2: "b", 3: "a", 4: "b", 5: None}
    a = visit_orders([1, 2, 3, 4, 5], 2, 5, seed=3, classes=classes)
    assert a == visit_orders([5, 4, 3, 2, 1], 2, 5, seed=3, classes=dict(reversed(classes.items())))
    assert a != visit_orders([1, 2, 3, 4, 5], 2, 5, seed=4, classes=classes)
    assert visit_orders([1, 2, 3, 4, 5], 2, 8, seed=3, classes=classes) == {
        m: o + visit_orders([1, 2, 3, 4, 5], 2, 8, seed=3, classes=classes)[m][5:] for m, o in a.items()}
    pairs = visit_orders([1, 2, 3, 4], 2, 5, seed=3, classes={1: "a", 2: "b", 3: "a", 4: "b"})
    for epoch in range(5):  # two classes of 2 on 2 paths of 2: each class shares its path
        assert pairs[1][epoch] == pairs[3][epoch] and pairs[2][epoch] == pairs[4][epoch]
        assert pairs[1][epoch] != pairs[2][epoch]


def test_a_clone_goes_its_sources_path_and_joins_its_group_where_it_was_made():
    """Models 1-4 of one class go two paths on 2 segments, two models a path.  Model 5, a
    clone of model 1 made after its first epoch (2 sub-epochs), has model 1's orders from
    epoch 1 on and trains its own steps 0 and 1 in the units of model 1's steps 2 and 3; a
    clone of the clone follows too; a resumed job's dispatcher does the same."""
    classes = {1: "a", 2: "a", 3: "a", 4: "a"}
    initial = [1, 2, 3, 4]
    orders = visit_orders(initial, 2, 3, 11, classes)
    dispatcher = Dispatcher(dict(orders), 2, fusion=dict.fromkeys(initial, 0), classes=classes)
    while dispatcher.progress[1].done < 2:
        for segment in (0, 1):
            given = dispatcher.next_visit(segment)
            for model in given[0] if given else ():
                dispatcher.finish(model, segment, 1.0)
    clones = {5: (1, 2)}
    clone_orders = model_orders(5, initial, 2, 2, 11, classes, clones)
    assert clone_orders == orders[1][1:]
    dispatcher.add(5, clone_orders, offset=clock_offsets(clones)[5], fusion=0, source=1)
    partners = dispatcher.group(1, 1)
    assert 5 in partners and len(partners) == 3 and dispatcher.group(5, 0) == partners
    others = [m for m in initial if m not in partners]
    for model in others:
        dispatcher.hold(model)  # (the other pair waits: the segments are this unit's)
    segment = orders[1][1][0]
    assert dispatcher.next_visit(segment) == (partners, 2)
    assert [dispatcher.step_of(m, 1, 2) for m in partners] == [2, 2, 0]
    for model in partners:
        dispatcher.finish(model, segment, 1.0)
    assert dispatcher.next_visit(1 - segment) == (partners, 3)
    clones[6] = (5, 2)
    assert model_orders(6, initial, 2, 1, 11, classes, clones) == orders[1][2:]
    assert clock_offsets(clones) == {5: 2, 6: 4}
    resumed = dispatcher_for({1: 3, 2: 3, 3: 3, 4: 3, 5: 2, 6: 1}, {1: 4, 2: 4, 3: 4, 4: 4, 5: 2, 6: 0},
                             2, 11, None, {5, 6}, classes, clones)
    assert resumed.orders[5] == clone_orders and resumed.offsets == {5: 2, 6: 4}
    resumed.fuse({1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0})
    unit = resumed.group(1, 2)  # (epoch 2's pairs are drawn afresh)
    assert {5, 6} <= set(unit) and len(unit) == 4 and resumed.group(6, 0) == resumed.group(5, 1) == unit
    for model in set(initial) - set(unit):
        resumed.hold(model)
    assert resumed.next_visit(orders[1][2][0]) == (unit, 4)


def test_a_clone_of_another_class_or_of_a_job_that_does_not_fuse_trains_alone_on_its_sources_path():
    orders = {1: [[0, 1], [1, 0]], 2: [[0, 1], [1, 0]]}
    dispatcher = Dispatcher(dict(orders), 2, fusion={1: 0, 2: 0})
    for segment in (0, 1):
        assert dispatcher.next_visit(segment) == ((1, 2), segment)
        for model in (1, 2):
            dispatcher.finish(model, segment, 1.0)
    dispatcher.add(3, orders[1][1:], offset=2)  # (no class: `fusing.clone_class` gave None)
    assert dispatcher.group(3, 0) == (3,)
    assert dispatcher.next_visit(1) in (((1, 2), 2), ((3,), 0))


def test_a_clone_hops_only_in_its_source_s_groups_where_they_have_room():
    """In every epoch a clone is in its source's group (the one whose models wait for its
    source, so none of them had trained the step before the clone was made), never in
    another of its class and path, whose models may have gone on ahead; where that group is
    full (MAX_GROUP), or its source no longer trains, it trains alone."""
    orders = {m: [[0, 1], [1, 0]] for m in range(1, 21)}  # 20 of one class on one path: 16 + 4
    fusion = dict.fromkeys(range(1, 22), 0)
    with_clone = {**orders, 21: [[0, 1], [1, 0]]}
    full = fusion_groups(with_clone, fusion, 0, {}, 2, {21: 3})  # model 3's group has 16
    assert full[3] == tuple(range(1, MAX_GROUP + 1)) and full[17] == (17, 18, 19, 20) and 21 not in full
    room = fusion_groups(with_clone, fusion, 0, {}, 2, {21: 18})
    assert room[21] == room[18] == (17, 18, 19, 20, 21)
    # Model 18 trains one epoch; its clone, made at its end (2 sub-epochs), would hop with
    # it in epoch 1 of the job's clock: model 18 is not there, the clone trains alone.
    ended = fusion_groups({**orders, 18: [[0, 1]], 21: [[1, 0]]}, fusion, 1, {21: 2}, 2, {21: 18})
    assert 21 not in ended and ended[17] == (17, 19, 20)
    dispatcher = Dispatcher({**orders, 18: [[0, 1]]}, 2, fusion=dict.fromkeys(range(1, 21), 0))
    dispatcher.add(21, [[1, 0]], offset=2, fusion=0, source=18)
    assert dispatcher.group(21, 0) == (21,) and dispatcher.group(17, 1) == (17, 19, 20)


def test_a_clone_leaves_its_source_s_groups_where_a_stop_ends_the_source():
    """A person's stop lowers the source's sub-epochs in all and leaves its orders: from the
    epoch it no longer trains, its clone trains alone, as in a resumed job, whose
    dispatcher has the source's orders cut where the stop ended them."""
    orders = {m: [[0, 1], [1, 0]] for m in range(17, 21)}
    dispatcher = Dispatcher(dict(orders), 2, fusion=dict.fromkeys(orders, 0))
    dispatcher.add(21, [[0, 1], [1, 0]], fusion=0, source=18)
    assert dispatcher.group(21, 0) == dispatcher.group(21, 1) == (17, 18, 19, 20, 21)
    dispatcher.limit(18, 2)  # model 18: 1 epoch of 2 sub-epochs in all
    assert dispatcher.group(21, 0) == (17, 18, 19, 20, 21) and dispatcher.group(21, 1) == (21,)
    assert dispatcher.group(17, 1) == (17, 18, 19, 20)  # (18 is skipped there: `unit`)
    resumed = dispatcher_for({17: 2, 18: 1, 19: 2, 20: 2, 21: 2}, {}, 2, 11, None, {21}, None, {21: (18, 0)})
    resumed.fuse(dict.fromkeys(range(17, 22), 0))
    assert resumed.group(21, 1) == (21,)
