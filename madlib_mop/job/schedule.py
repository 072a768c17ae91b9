"""Model hopping schedule: which model trains on which segment, in which order.

Every model visits every segment exactly once per epoch.  Its order of visits is drawn in
advance from the job's seed (`visit_orders`), so that its weights do not depend on timing:
a retried, resumed or concurrent run replays the same orders and ends with the same
weights.  Dispatch is dynamic and has no barrier (`Dispatcher`): whenever a segment is free
it is given an idle model whose next planned segment it is, preferring a pruner's promoted
models, then the model with the most work left (remaining sub-epochs times its observed
sub-epoch time), so that the slowest models do not finish last and alone; a model never
waits for the other models to finish their epoch.

The orders of the models a job starts with are rotations (each model starts at an offset
and moves one segment on each hop; offset i mod S for model i, or by class: `_starts`) of
a segment labelling drawn afresh each epoch, with the models' offsets shuffled too: when
models take equal time, S models proceed in lock-step without ever waiting.  A model
added later (a searcher's new configuration) draws its orders from its own stream
(`added_model_orders`), a clone follows its source (`model_orders`), and a stopped model is only
no longer dispatched, so adding or stopping models changes no other model's order.

Fused groups (`runtime.fusion`; madlib_mop.fuse_models).  The rotation sends several models
along the same path in an epoch: those of them that can train as one program (one fusion
class) hop as one unit, `group(model, epoch)`.  A job draws its paths by class (the classes
its `orders` recorded; a job started before jobs recorded them keeps its rotations): the
models of a class go one path where the paths' lengths allow (`_starts`), so that a class
of 3 on 2 segments fuses as 3, not as 2 and 1.  The classes come from the configurations
alone, whether or not the job fuses, so a fused model sees the rows an unfused one sees,
in the same order.  Which models a fused call trains together is decided by the plan, the pruner's
stops and a person's requests, never by timing, because a fused model's bits depend on its
partners (a batched product of K models rounds as it does): a unit waits for each member
still behind it in the epoch (it has steps to train there) and for a held member's decision;
members already past the step (only a person's request makes one) are not waited for.
A person's clone of a model (`job.steering`) goes its source's path from where it was made,
one step of the job's clock with it (`clock_offsets`), and hops in its source's groups (only
those: `fusion_groups`) where it is of its source's fusion class; models a searcher or a
person adds train alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

_STREAM = 0x4D4F50  # separates the schedule's random stream from the job's other uses
_ADDED = 0xADD  # the streams of models added after the start
MAX_GROUP = 16  # models in one fused call at most (bench_fusion: no gain beyond 8-16)


def visit_orders(models: list[int], segments: int, epochs: int, seed: int,
                 classes: dict[int, Hashable] | None = None) -> dict[int, list[list[int]]]:
    """orders[model][epoch] = the segments the model visits that epoch, in order.

    Epoch e's orders depend only on the seed, the models, their `classes` and e (not on how
    many epochs there are), so a job extended later (warm start) keeps its past orders.
    `classes` (model -> its fusion class as the job recorded it, `job.fusing.path_grouping`;
    a model without one is alone): see `_starts`.
    """
    if segments < 1:
        raise ValueError("segments must be at least 1")
    models = sorted(models)
    rng = np.random.default_rng([seed, _STREAM])
    orders: dict[int, list[list[int]]] = {m: [] for m in models}
    for _ in range(epochs):
        labels = rng.permutation(segments)
        starts = _starts(models, rng.permutation(len(models)), segments, classes)
        for model in models:
            orders[model].append([int(labels[(starts[model] + j) % segments]) for j in range(segments)])
    return orders


def _starts(models: list[int], offsets: np.ndarray, segments: int,
            classes: dict[int, Hashable] | None) -> dict[int, int]:
    """Each model's first segment in an epoch (an index into its labels), from the epoch's
    random `offsets` (a permutation of the models' positions).

    Without classes, or where no two models share one, model i starts at offsets[i] mod S.
    Otherwise the models of a class go the same path where they can, so that they fuse
    whole (whether or not the job fuses: a fused model's orders are an unfused one's):
    classes in the order of their members' least offset, the members of each in the order
    of theirs, that line cut into S runs whose lengths differ by one at most (position p
    in run p * S // M), run r starting at segment r.  Every path has as many models as a
    rotation's."""
    offset = {model: int(offsets[i]) for i, model in enumerate(models)}
    named = [classes.get(m) for m in models if classes and classes.get(m) is not None]
    if len(set(named)) == len(named):
        return {model: offset[model] % segments for model in models}
    blocks: dict[object, list[int]] = {}  # (in the order of each class's least offset)
    for model in sorted(models, key=offset.get):
        found = classes.get(model)
        blocks.setdefault(("alone", model) if found is None else found, []).append(model)
    line = [model for block in blocks.values() for model in block]
    return {model: position * segments // len(line) for position, model in enumerate(line)}


def added_model_orders(model: int, segments: int, epochs: int, seed: int) -> list[list[int]]:
    """The orders of a model added after the job started: from a stream of its own (job
    seed, model), the same whenever it is added."""
    rng = np.random.default_rng([seed, _STREAM, _ADDED, model])
    return [[int(s) for s in rng.permutation(segments)] for _ in range(epochs)]


def started_with(keys, initial_models: int | None, added=frozenset()) -> list[int]:
    """The models a job started with: not added later by a searcher (mst_key above
    `initial_models`) or a person steering it (`added`)."""
    return sorted(k for k in keys if k <= (initial_models or k) and k not in added)


def model_orders(model: int, initial: list[int], segments: int, rounds: int, seed: int,
                 classes: dict[int, Hashable] | None = None,
                 clones: dict[int, tuple[int, int]] | None = None) -> list[list[int]]:
    """A model's first `rounds` orders, as `dispatcher_for` gives them (prefix-stable: more
    rounds keep the earlier ones).  A clone (`clones`: clone -> (its source, the source's
    sub-epochs done when it was made), for a job whose clones follow their sources) goes
    its source's path from there on."""
    if clones and model in clones:
        source, at = clones[model]
        shift = at // segments
        return model_orders(source, initial, segments, shift + rounds, seed, classes, clones)[shift:]
    if model in initial:
        return visit_orders(initial, segments, rounds, seed, classes)[model]
    return added_model_orders(model, segments, rounds, seed)


def clock_offsets(clones: dict[int, tuple[int, int]] | None) -> dict[int, int]:
    """model -> the sub-epochs on the job's clock before its own first one: a clone's
    source's, plus the source's sub-epochs done when the clone was made (0 for the others:
    a clone's step s is its source's step s + offset, so that they train one step together)."""
    offsets: dict[int, int] = {}

    def offset(model: int) -> int:
        if model not in offsets:
            source, at = clones[model]
            offsets[model] = (offset(source) if source in clones else 0) + at
        return offsets[model]
    for model in clones or {}:
        offset(model)
    return offsets


def dispatcher_for(rounds: dict[int, int], done: dict[int, int], segments: int, seed: int,
                   initial_models: int | None, added=frozenset(),
                   classes: dict[int, Hashable] | None = None,
                   clones: dict[int, tuple[int, int]] | None = None) -> "Dispatcher":
    """The dispatcher of a job's models (`rounds`: each one's passes over the segments;
    `done`: its sub-epochs done; `classes`: the fusion classes of the models it started
    with, for a job that draws its orders by class; `clones`: see `model_orders`).  Models
    added while the job ran (`started_with`) have orders of their own, drawn the same
    whenever they are added, or their source's, so that a resumed job gives every model
    the orders it had."""
    initial = started_with(rounds, initial_models, added)
    orders = visit_orders(initial, segments, max(rounds[k] for k in initial), seed, classes) if initial else {}
    for key in set(rounds) - set(initial):
        orders[key] = model_orders(key, initial, segments, rounds[key], seed, classes, clones)
    return Dispatcher({k: o[: rounds[k]] for k, o in orders.items()}, segments, done,
                      classes=dict(classes or {}), offsets=clock_offsets(clones),
                      sources={clone: source for clone, (source, _) in (clones or {}).items()})


def fusion_groups(orders: dict[int, list[list[int]]], fusion: dict[int, int], epoch: int,
                  offsets: dict[int, int] | None = None, segments: int = 1,
                  sources: dict[int, int] | None = None, totals: dict[int, int] | None = None
                  ) -> dict[int, tuple]:
    """model -> its group in `epoch` of the job's clock (a model's own epoch is that less
    its offset, `clock_offsets`, in epochs of `segments` sub-epochs): the models of its
    fusion class whose path that epoch is its own, in key order, in chunks of MAX_GROUP.

    A clone (`sources`: clone -> its source) is in its source's group only, where both
    train that epoch (by their sub-epochs in all, `totals`: a stop lowers them, the orders
    stay) and fewer than MAX_GROUP of the group do (then at its end, clones in key order):
    the models of that group wait for the source, so none had trained the step before the
    clone was made; a group without the source may have (its models went on ahead), and
    which steps they then shared would depend on timing."""
    paths: dict[tuple, list[int]] = defaultdict(list)

    def own(model: int) -> int | None:  # the model's own epoch, if it trains it
        found = epoch - (offsets or {}).get(model, 0) // segments
        return found if 0 <= found < len(orders[model]) else None
    for model in sorted(set(fusion) - set(sources or {})):
        if own(model) is not None:
            paths[(fusion[model], tuple(orders[model][own(model)]))].append(model)
    groups: dict[int, list[int]] = {}
    for members in paths.values():
        for start in range(0, len(members), MAX_GROUP):
            chunk = members[start:start + MAX_GROUP]
            groups.update({member: chunk for member in chunk})
    def trains(model: int) -> bool:  # (a resumed job's orders end where its stop put its total)
        return own(model) is not None and (totals is None or own(model) * segments < totals[model])
    for clone in sorted(set(sources or {}) & set(fusion)):  # (a clone of a clone after its source)
        chunk = groups.get(sources[clone])
        if chunk and trains(sources[clone]) and trains(clone) and sum(map(trains, chunk)) < MAX_GROUP:
            chunk.append(clone)
            groups[clone] = chunk
    return {member: tuple(chunk) for member, chunk in groups.items()}


def most_work_left(due, progress: dict[int, "_ModelProgress"], total: dict[int, int]) -> int | None:
    """Among the models `due` on a segment: the highest priority, then the most work left
    (sub-epochs left x the model's observed time; a model not timed yet counts the
    others' mean), then the fewest done, then the lowest key."""
    due = [(model, progress[model]) for model in due]
    if not due:
        return None
    default = 1.0
    if any(not p.seconds for _, p in due):
        known = [p.seconds for p in progress.values() if p.seconds is not None]
        default = sum(known) / len(known) if known else 1.0
    *_, model = min((-p.priority, -(total[model] - p.done) * (p.seconds or default), p.done, model)
                    for model, p in due)
    return model


@dataclass
class _ModelProgress:
    done: int = 0  # sub-epochs completed
    busy: bool = False
    held: bool = False
    priority: int = 0  # higher first (a searcher's promoted models)
    seconds: float | None = None  # observed time of one sub-epoch (moving average)


@dataclass
class Dispatcher:
    """Barrier-free dispatch of planned visits (pure bookkeeping, no I/O).  `done` gives, per
    model, the sub-epochs already completed (a resumed job starts there)."""

    orders: dict[int, list[list[int]]]
    segments: int
    done: dict[int, int] = field(default_factory=dict)
    fusion: dict[int, int] = field(default_factory=dict)  # model -> its fusion class
    classes: dict[int, Hashable] = field(default_factory=dict)  # the classes its orders were drawn by
    offsets: dict[int, int] = field(default_factory=dict)  # model -> `clock_offsets` (clones)
    sources: dict[int, int] = field(default_factory=dict)  # clone -> its source (`fusion_groups`)

    def __post_init__(self) -> None:
        self.progress = {m: _ModelProgress(self.done.get(m, 0)) for m in self.orders}
        self.busy_segments: set[int] = set()
        self.running: dict[int, set[int]] = {}  # segment -> the models of its call not finished
        self._groups: dict[tuple[int, int], tuple[int, ...]] = {}  # (clock epoch, model) -> group
        self.total = {m: len(o) * self.segments for m, o in self.orders.items()}
        # The models that may be dispatched, by the segment each is due on next (a scan of every
        # model for every free segment took 8 ms per hop at 2,560 models: bench_coordinator.py).
        self.due: dict[int, set[int]] = {s: set() for s in range(self.segments)}
        self._due_on: dict[int, int] = {}
        for model in self.orders:
            self._index(model)

    def _index(self, model: int) -> None:
        """The unit of the model's next step (`unit`) among those due on its segment, or not."""
        unit = self.unit(model)
        for member in unit or (model,):
            self._unindex(member)
        if unit:
            segment = self.planned(unit[0], self.progress[unit[0]].done)[2]
            self.due[segment].add(unit[0])
            self._due_on[unit[0]] = segment

    def _reindex(self, model: int, *steps: int) -> None:
        """After a change of the model: the units its groups at these steps may now form."""
        members = {model}
        for step in steps:
            members.update(self.group(model, step // self.segments))
        for member in sorted(members):
            self._index(member)

    def _reindex_span(self, model: int, first: int, last: int) -> None:
        """Its groups in the epochs of steps first..last (a partner may wait for it there)."""
        self._reindex(model, *range(first // self.segments * self.segments, last + 1, self.segments))

    def group(self, model: int, epoch: int) -> tuple[int, ...]:
        """The models that hop with `model` in its own `epoch` (`fusion_groups`)."""
        if model not in self.fusion or epoch >= len(self.orders[model]):
            return (model,)
        clock = epoch + self.offsets.get(model, 0) // self.segments
        if (clock, model) not in self._groups:
            self._groups.update({(clock, m): g for m, g in fusion_groups(
                self.orders, self.fusion, clock, self.offsets, self.segments, self.sources, self.total).items()})
        return self._groups.get((clock, model), (model,))  # (a clone its source's groups leave out)

    def step_of(self, member: int, model: int, step: int) -> int:
        """`member`'s own step at `model`'s step `step` (they differ for a clone)."""
        return step + self.offsets.get(model, 0) - self.offsets.get(member, 0)

    def unit(self, model: int) -> tuple[int, ...]:
        """The models that train the model's next step with it if they may go now, else ()."""
        if not self.dispatchable(model):
            return ()
        step = self.progress[model].done
        unit = []
        for member in self.group(model, step // self.segments):
            p, own = self.progress[member], self.step_of(member, model, step)
            if self.total[member] <= own or p.done > own:
                continue  # never trains this step, or already past it
            if p.done < own or p.busy or p.held:
                return ()  # the unit waits for it
            unit.append(member)
        return tuple(unit)

    def dispatchable(self, model: int) -> bool:
        """Idle, not held, and with planned visits left."""
        return not (p := self.progress[model]).busy and not p.held and p.done < self.total[model]

    def _unindex(self, model: int) -> None:
        segment = self._due_on.pop(model, None)
        if segment is not None:
            self.due[segment].discard(model)

    def fuse(self, fusion: dict[int, int]) -> None:
        """The fusion classes of the models the job started with (before any dispatch)."""
        self.fusion = dict(fusion)
        self._groups.clear()
        for model in self.orders:
            self._index(model)

    def planned(self, model: int, step: int) -> tuple[int, int, int]:
        """(epoch, position, segment) of a model's sub-epoch number `step`."""
        epoch, position = divmod(step, self.segments)
        return epoch, position, self.orders[model][epoch][position]

    def next_visit(self, segment: int) -> tuple[tuple[int, ...], int] | None:
        """Give the free `segment` a unit: (its models, their step), or None if no idle
        unit's next planned segment is this one."""
        if segment in self.busy_segments:
            raise ValueError(f"segment {segment} is busy")
        leader = self.choose(self._due(segment))
        if leader is None:
            return None
        models = self.unit(leader)
        if not models:  # (an index not yet told of a change: never dispatch an empty unit)
            self._unindex(leader)
            return None
        for model in models:
            self.progress[model].busy = True
            self._unindex(model)
        self.busy_segments.add(segment)
        self.running[segment] = set(models)
        return models, self.progress[leader].done

    def _due(self, segment: int):
        """The models due on `segment` that may be dispatched now (the index's)."""
        return self.due[segment]

    def choose(self, due) -> int | None:
        """Among the models due on a segment, the one to go (`most_work_left`)."""
        return most_work_left(due, self.progress, self.total)

    def finish(self, model: int, segment: int, seconds: float | None = None) -> int:
        """The model's visit to the segment succeeded (in `seconds`); returns its completed
        sub-epochs."""
        self._release(model, segment)
        progress = self.progress[model]
        progress.done += 1
        if seconds is not None:
            progress.seconds = seconds if progress.seconds is None else (
                0.5 * progress.seconds + 0.5 * seconds)
        self._reindex(model, progress.done - 1, progress.done)
        return progress.done

    def add(self, model: int, orders: list[list[int]], done: int = 0, offset: int = 0,
            fusion: int | None = None, source: int | None = None) -> None:
        """A model joins the job (`model_orders`, `clock_offsets`; a clone fused: `fusion_groups`)."""
        if model in self.orders:
            raise ValueError(f"model {model} is already scheduled")
        self.orders[model] = orders
        self.progress[model] = _ModelProgress(done)
        self.total[model] = len(orders) * self.segments
        self.offsets[model] = offset
        if fusion is not None:  # (a clone of `source`, in its class: it hops in its groups)
            self.fusion[model], self.sources[model] = fusion, source
            self._groups.clear()  # the groups it is in gain it
        self._reindex(model, done)

    def stop(self, model: int) -> None:
        """The model trains no further (a running visit of it may still finish)."""
        progress, before = self.progress[model], self.total[model]
        self.total[model] = progress.done + (1 if progress.busy else 0)
        self._groups.clear()  # (its clones leave its groups where it no longer trains)
        self._reindex_span(model, progress.done, before)  # its groups go on without it

    def limit(self, model: int, total: int, orders: list[list[int]] | None = None) -> None:
        """The model's sub-epochs in all become `total` (fewer, or more with `orders` long
        enough: `model_orders`), from the next one it is dispatched on."""
        if orders is not None:
            self.orders[model] = orders
        self._groups.clear()  # its path in later epochs may join it (and its clones) to groups
        if total > len(self.orders[model]) * self.segments:
            raise ValueError(f"model {model} has orders for {len(self.orders[model])} rounds only")
        before, self.total[model] = self.total[model], total
        for other in self.orders if orders is not None else ():
            self._index(other)
        self._reindex_span(model, self.progress[model].done, max(before, total))

    def prefer(self, model: int, priority: int) -> None:
        """Among the models due on a segment, those of a higher priority go first (before
        the most work left)."""
        self.progress[model].priority = priority

    def planned_total(self) -> int:
        """Sub-epochs of all models as planned now (stopped models count what they did)."""
        return sum(self.total.values())

    def hold(self, model: int, held: bool = True) -> None:
        """A held model is not dispatched (it waits for a decision about it)."""
        self.progress[model].held = held
        self._reindex(model, self.progress[model].done)

    def retry(self, model: int, segment: int) -> None:
        """The visit failed: the model and segment are free, the visit is to be run again."""
        self._release(model, segment)
        self._reindex(model, self.progress[model].done)

    def _release(self, model: int, segment: int) -> None:
        if not self.progress[model].busy or model not in self.running.get(segment, ()):
            raise ValueError(f"model {model} is not running on segment {segment}")
        self.progress[model].busy = False
        self.running[segment].discard(model)
        if not self.running[segment]:  # the unit's last model: the segment is free
            del self.running[segment]
            self.busy_segments.discard(segment)

    def finished(self) -> bool:
        return all(p.done >= self.total[m] for m, p in self.progress.items())
