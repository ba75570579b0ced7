"""Adaptive: each job's GPU count from its curve and the load; reshape only when it pays.

marbled's own policy, for a centre that does not know its load in advance.

* Size by load. The eligible jobs, in FIFO order, each get their minimum (one
  GPU for a job that may be resized, its count for a rigid one) while GPUs
  last; the GPUs left go one at a time to the job whose next GPU adds most,
  up to its fastest count. "Most" weighs the throughput a GPU adds against the
  work the job has left, to the power `bias`: with a positive bias the short
  job's next GPU comes first (it frees its GPUs soonest: the mean completion
  time), with a negative one the long job's (it decides when the last job ends:
  the makespan). Alone, a job gets its fastest count; in a long queue, one GPU
  each, the most efficient count.
* Look ahead. While few jobs are in the system (at most `LOOKAHEAD_JOBS`),
  each candidate bias is played forward in a fluid model of the jobs
  already known (their curves, the work they have left, the cost of each
  reshape), and the decision takes the candidate with the least product of its
  total of completion times and its last end (to the power `makespan_weight`),
  each relative to the best any candidate reaches; while jobs keep arriving (one
  came after a run had started), by the completion times alone: the last end of
  the jobs known is not the makespan then. With more jobs, every job gets
  one GPU or few, and the bias hardly matters: the plan uses bias 1. With at most
  `PLAN_JOBS`, the best static plan of the jobs in the system (a count each, FIFO:
  what a user could pick by hand, `marbled.core.static_plan`, searched with a small
  budget) is a candidate too: as planned, with its idle GPUs given by a bias, or with
  its counts as caps now and minimums from the next end on (a job it holds back starts
  early on GPUs the others lend). Where some candidates beat the plan on both counts,
  the decision is one of them: never behind a plan made by hand, unless that costs
  the mean completion time.
* Reshape only when it pays. A running job moves to its planned count only if
  the time its remaining steps save exceeds its own suspend-and-resume cost by
  `reshape_margin` times; GPUs are taken from it for newcomers only if they gain
  more than it loses. The cost is what the job's curve carries: its model's
  start-up and suspension as measured on this machine (assumed a few seconds of
  start-up before any is measured, `core.learning`), and a run that has not
  reported its first step is not moved at all (lifecycle I6: the drivers hold such
  a Suspend, `core.decision.starting_up`). A job near its end is never moved. A job keeps its node
  and GPUs while its count stays; a new job goes where it gets its planned count;
  GPUs a node has left go to a job on another node that gets more there, if the
  move pays (no node idles beside a crowded one).
* FIFO: jobs start in FIFO order among those whose dependencies are met; rigid
  (`--gpus K`), multi-node and unprofiled jobs run on exactly their count and are
  never moved.
"""

from __future__ import annotations

import heapq
from bisect import insort
from dataclasses import dataclass
from itertools import islice

from marbled.core.evolve import evolve
from marbled.core.model import Job, JobState, Placement, Start, State, Suspend
from marbled.core.policy.base import (
    Option,
    Policy,
    fifo_candidates,
    reshape_cost,
    role_for,
    settled,
)
from marbled.core.policy.spread import first_shape
from marbled.core.static_plan import StaticJob, search

# The candidates the look-ahead weighs: (bias, whether the critical job -- the one with the
# longest time left even on its fastest count -- gets that count first).
CANDIDATES = ((-1.0, False), (0.0, False), (0.5, False), (1.0, False), (2.0, False), (1.0, True),
              (0.0, True))
FUTURES = ((-1.0, False), (0.0, False), (1.0, False), (1.0, True))  # the rule for later events
LOOKAHEAD_JOBS = 16  # jobs in the system up to which the candidates are played forward
PLAN_GROWTH = ((1.0, False), (-1.0, False))  # how a static plan's idle GPUs may be given
LENDS = ((-1.0, False), (1.0, True))  # the first rules of a lent plan
PLAN_JOBS = 8  # jobs in the system up to which the best static plan is a candidate too
PLAN_BOUND = PLAN_BUDGET = 300  # static plans searched at a decision: a few ms at most


@dataclass(frozen=True)
class Item:
    """A job as the planner sees it."""

    id: int
    # steps/s on 1..high GPUs (None: a count it cannot run on); () for a job without a curve
    speeds: tuple[float | None, ...]
    work: float  # steps left
    low: int  # the fewest GPUs (on each node) it may get
    high: int  # the most that still make it faster
    nodes: int = 1
    home: str | None = None  # its node while it runs
    count: int = 0  # GPUs it runs on now (0: waiting)
    fixed: bool = False  # runs on `count`, not to be moved
    cost: float = 0.0  # seconds a reshape costs it (suspend + start-up)
    launch: float = 0.0  # seconds its first start costs it (start-up), while it waits
    nodes_min: int | None = None  # a node range: `low` x `nodes` GPUs on fewer nodes

    def speed(self, g: int) -> float:
        return self.speeds[min(g, len(self.speeds)) - 1] if self.speeds else 1.0

    def can(self, g: int) -> bool:
        return not self.speeds or self.speeds[min(g, len(self.speeds)) - 1] is not None

    def largest(self, limit: int) -> int:
        """The most GPUs up to min(`high`, limit) it can run on (0: none)."""
        return next((c for c in range(min(self.high, limit), 0, -1) if self.can(c)), 0)

    def rises(self, g: int) -> bool:
        """Whether each count it can run on above g, up to `high`, is faster than the last."""
        last = self.speed(g)
        for c in range(g + 1, self.high + 1):
            if self.can(c):
                if self.speed(c) <= last:
                    return False
                last = self.speed(c)
        return True

    def above(self, g: int) -> int | None:
        """The next count above g it can run on, up to `high`."""
        for c in range(g + 1, self.high + 1):
            if self.can(c):
                return c
        return None


def allocate(items: list[Item], room: dict[str, int], bias: float,
             critical: bool = False) -> dict[int, tuple]:
    """{id: (nodes, count)} for the FIFO prefix of `items` that fits in `room` (GPUs per
    node, the fixed items' already taken out); the spare GPUs by marginal gain, after the
    critical job's fastest count if `critical`."""
    return allocate_each(items, room, ((bias, critical),))[0]


def allocate_each(items: list[Item], room: dict[str, int],
                  rules: tuple[tuple[float, bool], ...]) -> list[dict[int, tuple]]:
    """allocate() under each (bias, critical) rule: the FIFO placement, which no rule
    changes, made once; and where every node's spare GPUs take all its jobs to their
    fastest counts, one plan for all (no rule then changes who gets what)."""
    room = dict(room)
    rooms = _Rooms(room)
    out: dict[int, list] = {}
    for item in items:
        if item.fixed:
            out[item.id] = [(item.home,), item.count]
            continue
        if item.home is not None and room.get(item.home, -1) >= item.low:  # stays: the common case
            rooms.take(item.home, item.low)
            out[item.id] = [(item.home,), item.low]
            continue
        low = item.low
        if item.nodes > 1:  # the fewest nodes of its range that have room
            nodes, low = first_shape(item.low, item.nodes, item.nodes_min, lambda k, per: (
                (found, per) if len(found := rooms.first(per, k)) == k else None)) or ([], low)
        else:  # the tightest node that still holds its fastest count, else the roomiest
            node = rooms.tightest(item.low, max(item.low, item.high))
            nodes = [] if node is None else [node]
        if not nodes:
            break  # strict FIFO: the jobs behind it wait too
        for n in nodes:
            rooms.take(n, low)
        out[item.id] = [tuple(nodes), low]
    by_id = {i.id: i for i in items}
    on_node: dict[str, list[Item]] = {}
    for i, (nodes, _) in out.items():
        if len(nodes) == 1 and not by_id[i].fixed:
            on_node.setdefault(nodes[0], []).append(by_id[i])
    # Where each node's room takes its jobs to their most GPUs, and each job gains from
    # every GPU up to there, every rule plans each of them there.
    alike = len(rules) > 1 and all(
        sum(i.high - out[i.id][1] for i in there) <= room[n]
        and all(i.rises(out[i.id][1]) for i in there) for n, there in on_node.items())
    todo = rules[:1] if alike else rules
    plans = [_share(by_id, {i: list(v) for i, v in out.items()}, dict(room),
                    {n: list(there) for n, there in on_node.items()}, *rule)
             for rule in todo[:-1]]  # each rule but the last on copies
    plans.append(_share(by_id, out, room, on_node, *todo[-1]))
    return plans * len(rules) if alike else plans


def _share(by_id: dict[int, Item], out: dict[int, list], room: dict[str, int],
           on_node: dict[str, list[Item]], bias: float, critical: bool) -> dict[int, tuple]:
    """The placed items' spare GPUs under one rule: the critical job's fastest count
    first if `critical`, then each node's growth, then the spread between nodes."""
    if critical:
        free = [by_id[i] for i, (nodes, _) in out.items() if len(nodes) == 1
                and not by_id[i].fixed and by_id[i].work > 0]
        if free:
            first = max(free, key=lambda i: (i.work / i.speed(i.high), -i.id))
            node, have = out[first.id][0][0], out[first.id][1]
            target = max((c for c in range(have, first.high + 1)
                          if c - have <= room[node] and first.can(c)), default=have)
            out[first.id][1] = target
            room[node] -= target - have
    for node, items_there in on_node.items():  # each node's growth is its own
        room[node] = _grow(items_there, out, room[node], bias)
    _spread(out, on_node, room, bias)
    return {i: tuple(v) for i, v in out.items()}


def _scale(item: Item, bias: float) -> float:
    """What divides the gain of an item's next GPU: its speed on its fewest GPUs, times its
    time left there to the power `bias` (work unknown: 1)."""
    return item.speed(item.low) * ((item.work / item.speed(item.low)) ** bias
                                   if item.work > 0 else 1.0)


def _grow(items: list[Item], out: dict[int, list], left: int, bias: float) -> int:
    """Give a node's `left` GPUs, one step at a time, to its items whose next GPU adds most;
    the GPUs still left."""
    mine = [(item, _scale(item, bias)) for item in items
            if left > 0 and out[item.id][1] < item.high]
    while left > 0 and mine:
        best, gain, step = None, 0.0, 0
        for item, scale in mine:
            g = out[item.id][1]
            nxt = item.above(g)
            if nxt is None or nxt - g > left:
                continue
            value = (item.speed(nxt) - item.speed(g)) / (nxt - g) / scale
            if value > gain:
                best, gain, step = item, value, nxt - g
        if best is None:
            break
        out[best.id][1] += step
        left -= step
    return left


def _spread(out: dict[int, list], on_node: dict[str, list[Item]], room: dict[str, int],
            bias: float) -> None:
    """GPUs a node is left with after growth go to an item planned below its fastest count
    on another node, if it gets more GPUs there: it changes node as its count changes, and
    the node it leaves regrows the others. No node idles while a job elsewhere could use it
    (a running job was kept on its node, which may hold two jobs on half each while another
    node empties). Each item moves at most once a plan, to the node that gives it most (the
    tightest such node), the item whose gain weighs most first."""
    moved: set[int] = set()
    scales: dict[int, float] = {}
    counts: dict[tuple[int, int], int] = {}  # (item, room) -> the most it runs on there
    while True:
        # the open nodes by their room, each room's nodes greatest name first: within one
        # room every node gives an item the same count, and the ties go to the greatest
        # name (the second where that is the item's own node)
        tops: dict[int, list[str]] = {}
        for n, k in room.items():
            if k > 0:
                tops.setdefault(k, []).append(n)
        if not tops:
            return
        kinds = sorted(tops, reverse=True)
        for k in kinds:
            tops[k] = heapq.nlargest(2, tops[k])
        best, gain = None, 0.0
        for node, items in on_node.items():
            for item in items:
                g = out[item.id][1]
                if g >= item.high or g >= kinds[0] or item.id in moved:
                    continue
                spot = None
                for k in kinds:
                    if k <= g:
                        break
                    names = [n for n in tops[k] if n != node]
                    c = counts.get((item.id, k))
                    if c is None:
                        c = counts[item.id, k] = item.largest(k)
                    if names and c > g and (spot is None or (c, -k, names[0]) > spot):
                        spot = (c, -k, names[0])
                if spot is None:
                    continue
                c, _, n = spot
                scale = scales.get(item.id)
                if scale is None:
                    scale = scales[item.id] = _scale(item, bias)
                value = (item.speed(c) - item.speed(g)) / scale
                if value > gain:
                    best, gain = (item, node, n, c), value
        if best is None:
            return
        item, node, there, c = best
        moved.add(item.id)
        room[node] += out[item.id][1]
        room[there] -= c
        out[item.id] = [(there,), c]
        on_node[node].remove(item)
        on_node.setdefault(there, []).append(item)
        room[node] = _grow(on_node[node], out, room[node], bias)


class _Rooms:
    """The GPUs left on each node of `room` as jobs take them, and the nodes grouped by
    what they have left, each group in the nodes' order: a job's node is then found among
    the few room sizes, not by reading every node (a decision on a large cluster places
    hundreds of jobs on dozens of nodes). The groups are built at the first search: a
    plan of running jobs that stay where they are needs none."""

    def __init__(self, room: dict[str, int]):
        self.room = room
        self._groups: dict[int, list[str]] | None = None  # room -> its nodes (none empty)

    def take(self, node: str, gpus: int) -> None:
        r = self.room[node]
        self.room[node] = r - gpus
        if self._groups is not None:
            group = self._groups[r]
            group.remove(node)
            if not group:
                del self._groups[r]
            insort(self._groups.setdefault(r - gpus, []), node, key=self._order.__getitem__)

    def _by_room(self) -> dict[int, list[str]]:
        if self._groups is None:
            self._order = {n: k for k, n in enumerate(self.room)}
            self._groups = {}
            for n, r in self.room.items():
                self._groups.setdefault(r, []).append(n)
        return self._groups

    def tightest(self, low: int, high: int) -> str | None:
        """The node with the fewest GPUs left among those with at least `high`, else the
        one with the most, if at least `low` (the first in order of equals)."""
        groups = self._by_room()
        r = min((r for r in groups if r >= high), default=None)
        if r is None:
            r = max(groups, default=low - 1)
        return groups[r][0] if r >= low else None

    def first(self, gpus: int, count: int) -> list[str]:
        """The first `count` nodes (or fewer) in order with at least `gpus` GPUs left."""
        return [n for n, r in self.room.items() if r >= gpus][:count]


def play_forward(items: list[Item], room: dict[str, int], candidate: tuple[float, bool],
                 queue: list[Item] = (), first: tuple[float, bool] | None = None,
                 then: dict[int, tuple[int, int]] | None = None) -> tuple[float, float]:
    """(sum of completion times, the last one) from now, in a fluid model: the items run
    at their curve's speed, are planned with `first` (default: `candidate`) now and
    re-planned with `candidate` whenever one ends (on `then`'s (fewest, most) GPUs, if
    given), and pay their cost whenever their count changes; `queue` waits behind them in
    FIFO order. One play at a time: the look-ahead plays many at once (`_Fluid.play_each`),
    which must give what this gives (tests/core/test_adaptive.py)."""
    return _Fluid([*items, *queue], room).step(first or candidate, then).play(candidate)


class _Fluid:
    """play_forward's state: the time, the completion times so far, the items left and the
    start-up each still waits."""

    def __init__(self, items: list[Item], room: dict[str, int]):
        self.room = room
        self.now = self.total = self.last = 0.0
        self.live = {i.id: i for i in items}
        self.delay: dict[int, float] = {}
        self.steps = 4 * len(self.live) + 4  # a bound: each step ends a job, or starts one
        self.over = False  # nothing runs, nothing is left, or no step is left

    def copy(self) -> _Fluid:
        new = object.__new__(_Fluid)
        new.__dict__.update(self.__dict__, live=dict(self.live), delay=dict(self.delay))
        return new

    def play(self, rule: tuple[float, bool]) -> tuple[float, float]:
        while not self.over:
            self.step(rule)
        return self.total, self.last

    def play_each(self, plays: list[tuple], then: dict | None = None,
                  ) -> dict[tuple, tuple[float, float]]:
        """{play: what play_forward gives} for each play (first rule, rule after it, and
        optionally the name in `then` of the bounds its items take after the first step),
        from this state: a step on which the plays' plans agree is taken once for all of
        them (few jobs often leave every rule the same plan)."""
        then = then or {}
        out: dict[tuple, tuple[float, float]] = {}
        todo = [(self, plays, 0)]
        while todo:
            fluid, plays, depth = todo.pop()
            if fluid._stops():
                out.update(dict.fromkeys(plays, (fluid.total, fluid.last)))
                continue
            rules = list(dict.fromkeys(play[min(depth, 1)] for play in plays))
            live = fluid.live
            plans = allocate_each(list(live.values()), _free_room(live, fluid.room),
                                  tuple(rules))
            distinct: list[dict] = []
            which = {}  # rule -> its plan's place in `distinct`
            for rule, plan in zip(rules, plans, strict=True):
                which[rule] = next((k for k, seen in enumerate(distinct)
                                    if seen is plan or seen == plan), len(distinct))
                if which[rule] == len(distinct):
                    distinct.append(plan)
            groups: dict[tuple, list] = {}  # (plan, bounds after it) -> the plays
            for play in plays:
                bounds = play[2] if depth == 0 and len(play) > 2 else None
                groups.setdefault((which[play[min(depth, 1)]], bounds), []).append(play)
            for k, ((plan, bounds), members) in enumerate(groups.items()):
                branch = fluid if k == len(groups) - 1 else fluid.copy()  # the last goes on
                todo.append((branch._advance(distinct[plan], then.get(bounds)), members,
                             depth + 1))
        return out

    def step(self, rule: tuple[float, bool],
             then: dict[int, tuple[int, int]] | None = None) -> _Fluid:
        """Plan with `rule` and run to the next end (from it on, `then`'s bounds)."""
        if self._stops():
            return self
        live = self.live
        return self._advance(allocate(list(live.values()), _free_room(live, self.room), *rule),
                             then)

    def _stops(self) -> bool:
        """Whether no step is left (else one is counted)."""
        if self.over or not self.live or self.steps <= 0:
            self.over = True
            return True
        self.steps -= 1
        return False

    def _advance(self, plan: dict[int, tuple],
                 then: dict[int, tuple[int, int]] | None = None) -> _Fluid:
        """Run `plan` to the next end (from it on, `then`'s bounds)."""
        live, delay = self.live, self.delay
        if then:
            live = self.live = {i.id: i for i in _bounded(list(live.values()), then)}
        running = {i: plan[i][1] for i in plan}
        for i, g in running.items():
            item = live[i]
            if item.count != g:  # a reshape, or a waiting job's first start
                delay[i] = delay.get(i, 0.0) + (item.cost if item.count else item.launch)
            live[i] = evolve(item, count=g,
                             home=plan[i][0][0] if len(plan[i][0]) == 1 else item.home)
        ends = {i: delay.get(i, 0.0) + live[i].work / live[i].speed(g)
                for i, g in running.items()}
        if not ends:
            self.over = True
            return self
        step = min(ends.values())
        self.now += step
        for i, g in running.items():
            if ends[i] <= step + 1e-9:
                self.total += self.now
                self.last = self.now
                del live[i]
                delay.pop(i, None)
                continue
            used = min(step, delay.get(i, 0.0))
            delay[i] = delay.get(i, 0.0) - used
            live[i] = evolve(live[i], work=live[i].work - (step - used) * live[i].speed(g))
        return self


def static_plan(running: list[Item], waiting: list[Item], room: dict[str, int],
                ) -> dict[int, int] | None:
    """{id: count} of the best static plan of these items (the running ones keep their
    count, the waiting ones start in FIFO order, each on a count of its own), searched
    with a small budget; None if an item spans nodes or fits none."""
    if any(i.nodes > 1 for i in [*running, *waiting]):
        return None
    largest = max(room.values(), default=0)  # a node's GPUs may be fewer than its size
    jobs = [StaticJob(0.0, {i.count: i.work / i.speed(i.count)}) for i in running]
    for i in waiting:
        seconds = {k: i.work / i.speed(k) for k in range(i.low, min(i.high, largest) + 1)
                   if i.can(k)}
        if not seconds:
            return None
        jobs.append(StaticJob(0.0, seconds))
    found = search(jobs, list(room.values()), bound=PLAN_BOUND, budget=PLAN_BUDGET)
    return {i.id: k for i, k in zip([*running, *waiting], found.best.counts, strict=True)}


def _bounded(items: list[Item], bounds: dict[int, tuple[int, int]]) -> list[Item]:
    """The items, each planned on `bounds`' (fewest, most) GPUs (a fixed one as it is)."""
    return [evolve(i, low=bounds[i.id][0], high=bounds[i.id][1])
            if i.id in bounds and not i.fixed else i for i in items]


def _free_room(live: dict[int, Item], room: dict[str, int]) -> dict[str, int]:
    out = dict(room)
    for item in live.values():
        if item.fixed:
            out[item.home] -= item.count
    return out


class AdaptivePolicy(Policy):
    name = "adaptive"
    reshapes = True
    summary = ("each job's GPU count from its curve and the load, reshaped only when it "
               "pays (marbled's own)")
    options = (
        Option("reshape_margin", 1.0, "a running job is reshaped only if that saves more "
                                      "than 1 + this times its suspend-and-resume cost"),
        Option("makespan_weight", 1.0, "how much the look-ahead weighs the end of the last "
                                       "job against the mean completion time (0 while jobs "
                                       "keep arriving)"),
    )
    multi_node = True
    reshape_margin: float
    makespan_weight: float

    def __init__(self, **settings: float | None):
        super().__init__(**settings)
        self._cache: dict[tuple[int, int], tuple] = {}
        self._ends: dict[str, list[tuple[float, int]]] = {}  # this decision's, by node
        self._now = 0.0

    def choose(self, state: State, now: float) -> list:
        if state.resumable():
            return []  # a reshape is under way: decide on what it leaves
        engaged = state.engaged()
        queued = sum(1 for _ in islice(fifo_candidates(state, now), LOOKAHEAD_JOBS + 1))
        everything = len(engaged) + queued <= LOOKAHEAD_JOBS  # the look-ahead plans all nodes
        free = {n: len(state.free(n)) for n in (state.nodes if everything else
                                                 state.nodes_with_free_gpus())}
        # One pass over the running jobs (on a loaded cluster, most of a decision): the first
        # end, and the jobs that may move. A shrink pays only for newcomers: without a
        # waiting job, a job may change only by growing into free GPUs, on its node or on
        # one with more free than it holds.
        most_free = 0 if queued else max(free.values(), default=0)
        first_end, movable, suspending = float("inf"), [], JobState.SUSPENDING
        ends: dict[str, list[tuple[float, int]]] = {}  # a node's first two ends, (time, job)
        for job in engaged:
            if job.state is suspending:
                return []  # as above
            if job.expected_end is not None:
                first_end = min(first_end, job.expected_end)
                two = ends.setdefault(job.placement.node, [])
                two.append((job.expected_end, job.id))
                if len(two) > 2:
                    two.remove(max(two))
            if (everything or job.placement.node in free or queued and
                    len(job.placement.gpus) > 1 or len(job.placement.gpus) < most_free) \
                    and self._movable(job, now):
                movable.append(job)
        # a shrink saves each newcomer the wait until some run ends and frees GPUs
        wait = max(first_end - now, 0.0) if first_end < float("inf") else 0.0
        self._ends, self._now = ends, now
        if everything:
            moving = {j.id for j in movable}
            running = [self._item(j, now, movable=j.id in moving) for j in engaged]
            open_ = set(state.nodes)
        else:
            running, open_ = self._running(state, engaged, movable, free, queued, now, wait)
        # the room of a node: its free GPUs and those of the jobs planned on it
        room = {n: free.get(n, 0) for n in state.nodes if n in open_}  # in the nodes' order
        for item in running:
            room[item.home] += item.count
        gpus = sum(room.values())
        waiting = []
        spare = gpus - sum(i.count for i in running if i.fixed)
        spare -= sum(i.low for i in running if not i.fixed)
        for job in fifo_candidates(state, now):
            # Past the jobs that fit at their fewest GPUs none is placed (strict FIFO); a few
            # more only count the jobs in the system for the look-ahead.
            if spare <= 0 and len(waiting) >= min(gpus, LOOKAHEAD_JOBS + 1):
                break
            item = self._item(job, now)
            spare -= item.low * item.nodes
            waiting.append(item)
        candidate, counts = self._candidate(running, waiting, room, _open(state, engaged, now)) \
            if everything else ((1.0, False), None)
        if counts:  # a static plan won the look-ahead: the GPUs each job may get now
            running, waiting = _bounded(running, counts), _bounded(waiting, counts)
        as_now = running  # the next decision sees every job that is not moved as now
        for _ in range(len(running) + 1):
            plan = self._settle(running, waiting, room, candidate, wait)
            moved = [i for i in running if not i.fixed and plan.get(i.id) != ((i.home,),
                                                                               i.count)]
            if not moved:
                break
            # Suspended, they are planned as waiting jobs next: one that would get its count
            # back is left running instead.
            gone = {i.id for i in moved}
            after = self._settle([i for i in as_now if i.id not in gone],
                                 sorted([*waiting, *(evolve(i, count=0, home=None)
                                                     for i in moved)], key=lambda i: i.id),
                                 room, candidate, wait)
            back = {i.id for i in moved if after.get(i.id, ((), 0))[1] == i.count}
            if not back:
                return self._reshape(state, moved, plan)
            running = [evolve(i, fixed=True) if i.id in back else i for i in running]
        free = {n: state.free(n) for n in room}
        actions: list = []
        for item in waiting:
            if item.id not in plan:
                break
            nodes, count = plan[item.id]
            parts = []
            for n in nodes:
                parts.append((n, tuple(free[n][:count])))
                free[n] = free[n][count:]
            job = state.jobs[item.id]
            actions.append(Start(job.id, *parts[0], role_for(job, count), tuple(parts[1:])))
        return actions

    def _running(self, state: State, engaged: list[Job], movable: list[Job],
                 free: dict[str, int], queued: int, now: float,
                 wait: float) -> tuple[list[Item], set[str]]:
        """The running jobs a decision plans, as items, and the nodes it plans: a job none of
        whose moves may pay is fixed, and only the nodes where something may change are
        planned (a move may pay, or a waiting job may take free GPUs). A decision on a loaded
        cluster then costs what those nodes cost, and the plan does not try, node after node,
        shrinks that cannot pay."""
        items = [self._item(job, now, movable=True) for job in movable]
        # the most newcomers shrinks can make room for: no more than are waiting, nor than GPUs
        can_free = sum(free.values()) + sum(i.count - i.low for i in items)
        newcomers = queued and sum(1 for _ in islice(fifo_candidates(state, now), can_free))
        movers, most_free = {}, max(free.values(), default=0)
        leaving = False  # a mover may go to another node's free GPUs (nothing waits)
        for item in items:
            most = item.high if queued else item.count + free.get(item.home, 0)
            if any(self._pays(item, c, False, newcomers, wait)
                   for c in range(item.low, most + 1) if c != item.count and item.can(c)):
                movers[item.id] = item
            elif not queued and any(self._pays(item, c, True, 0, wait) for c in range(
                    item.count + 1, min(item.high, most_free) + 1) if item.can(c)):
                movers[item.id], leaving = item, True
        # the movers' nodes, with their fixed jobs; and a waiting job, or a mover, may take
        # free GPUs, beside fixed jobs that need not be planned
        homes = {i.home for i in movers.values()}
        running = [movers.get(j.id) or self._item(j, now) for j in engaged
                   if j.placement.node in homes]
        return running, (homes | set(free)) if queued or leaving else homes

    @staticmethod
    def _reshape(state: State, moved: list[Item], plan: dict[int, tuple]) -> list:
        """Suspend the moved jobs, each with its new GPUs reserved where they are its own or
        free (it then resumes on exactly the planned count); one planned on no GPUs waits in
        the FIFO. A job planned on GPUs another job still holds (one that shrinks, or leaves
        for another node) keeps running: it moves at the next decision, once they are free
        (suspended without them, it would be planned as a waiting job, maybe on its count
        again elsewhere: a move for nothing)."""
        free = {n: state.free(n) for n in state.nodes}
        actions = []
        for item in moved:
            job = state.jobs[item.id]
            node, count = (plan[item.id][0][0], plan[item.id][1]) if item.id in plan else \
                (None, 0)
            own = list(job.gpus) if node == job.placement.node else []
            pool = own + free.get(node, [])
            target = None
            if count and len(pool) >= count:
                gpus = tuple(sorted(pool[:count]))
                free[node] = [g for g in free[node] if g not in gpus]
                target = Placement(node, gpus)
            elif count:
                continue
            actions.append(Suspend(job.id, target, _why(item, count)))
        return actions

    # -- the plan

    def _candidate(self, running: list[Item], waiting: list[Item], room: dict[str, int],
                   arriving: bool = False,
                   ) -> tuple[tuple[float, bool], dict[int, tuple[int, int]] | None]:
        """The candidate whose future looks best (bias 1 when many jobs are in the system),
        and, if a static plan's won, the GPUs it gives each job now: {id: (fewest, most)}.
        While jobs keep `arriving`, the last end of the jobs known is not the makespan (the
        next arrivals run after it): the future is judged by the completion times alone."""
        n = len(running) + len(waiting)
        if not n or n > LOOKAHEAD_JOBS:
            return (1.0, False), None
        # Nodes no job runs on are alike but for their room: the fluid model keeps, for each
        # room, the first as many as the jobs can fill (the plan takes the first it can).
        homes = {i.home for i in running}
        fill = sum(i.nodes for i in [*running, *waiting])
        alike: dict[int, int] = {}  # free nodes kept, by their room
        kept = {}
        for node, k in room.items():
            if node in homes or alike.get(k, 0) < fill:
                kept[node] = k
                alike[k] = alike.get(k, 0) + (node not in homes)
        pairs = [(c, f) for c in CANDIDATES for f in FUTURES]  # first rule, then the future's
        played = _Fluid([*running, *waiting], kept).play_each(pairs)
        outcomes = {(c, f, None, False): played[c, f] for c, f in pairs}  # ties: in this order
        # The best static plan of the jobs in the system (what a user could pick by hand):
        # run as planned; or with the GPUs it leaves idle given by a bias; or with its
        # counts as caps now (a job it holds back may start on GPUs lent by the others) and
        # as minimums from the first end on.
        counts = static_plan(running, waiting, kept) if n <= PLAN_JOBS else None
        # Where some candidates beat the plan on both counts (they end no later and complete
        # jobs sooner on average), the decision is one of them: never behind the makespan a
        # user could reach by hand, unless that costs the mean completion time.
        plan = None  # the plan's (total, end)
        if counts:
            everyone = [*running, *waiting]
            exact = {i: (k, k) for i, k in counts.items()}
            grown = {i.id: (counts[i.id], max(counts[i.id], i.high)) for i in everyone}
            lent = {i.id: (i.low, max(i.low, min(i.high, counts[i.id]))) for i in everyone}
            bounds = {"exact": exact, "grown": grown, "lent": lent}
            plays: dict[str, list] = {}  # bounds now -> (first, rule, bounds after it)
            for rule, now, then in ((PLAN_GROWTH[0], "exact", None),
                                    *((g, "grown", None) for g in PLAN_GROWTH),
                                    (PLAN_GROWTH[0], "lent", "exact"),
                                    *((g, "lent", "grown") for g in PLAN_GROWTH)):
                for c in LENDS if now == "lent" else (rule,):
                    plays.setdefault(now, []).append((c, rule, then))
            for now, these in plays.items():
                played = _Fluid([*_bounded(running, bounds[now]),
                                 *_bounded(waiting, bounds[now])], kept).play_each(these, bounds)
                for c, rule, then in these:
                    outcomes[c, rule, tuple(bounds[now].items()), then == "exact"] = \
                        played[c, rule, then]
            plan = outcomes[PLAN_GROWTH[0], PLAN_GROWTH[0], tuple(exact.items()), False]
        total = min(t for t, _ in outcomes.values()) or 1.0
        last = min(end for _, end in outcomes.values()) or 1.0
        better = plan and {k for k, (t, end) in outcomes.items()
                           if t < plan[0] and end <= plan[1] * (1 + 1e-9)}

        def score(key) -> tuple[bool, float, float]:
            t, end = outcomes[key]
            return bool(better) and key not in better, \
                (t / total) * (end / last) ** (0.0 if arriving else self.makespan_weight), t

        c, _, bounds, *_ = min(outcomes, key=score)
        return c, dict(bounds) if bounds else None

    def _settle(self, running: list[Item], waiting: list[Item], room: dict[str, int],
                candidate: tuple[float, bool], wait: float) -> dict[int, tuple]:
        """The plan, with every running job whose change does not pay kept as it is."""
        items = sorted([*running, *waiting], key=lambda i: i.id)
        for _ in range(len(running) + 1):
            live = {i.id: i for i in items}
            plan = allocate(items, _free_room(live, room), *candidate)
            newcomers = sum(1 for i in waiting if i.id in plan)
            # The first job of each node whose change does not pay is kept as it is; moves
            # on one node hardly change another's, so the nodes are settled together.
            keep: dict[str | None, int] = {}
            for i in items:
                if i.count and not i.fixed and i.home not in keep \
                        and plan.get(i.id) != ((i.home,), i.count) \
                        and not self._pays(i, *self._target(i, plan), newcomers, wait):
                    keep[i.home] = i.id
            if not keep:
                return plan
            kept = set(keep.values())
            items = [evolve(i, fixed=True) if i.id in kept else i for i in items]
        return plan

    @staticmethod
    def _target(item: Item, plan: dict[int, tuple]) -> tuple[int, bool]:
        """(the count `plan` gives a running item, whether on another node)."""
        nodes, count = plan.get(item.id, ((item.home,), 0))
        return count, nodes != (item.home,)

    def _pays(self, item: Item, count: int, elsewhere: bool, newcomers: int,
              wait: float) -> bool:
        """Does moving a running item to `count` GPUs (on another node if `elsewhere`) pay?"""
        if count == 0:
            return False
        before = item.work / item.speed(item.count)
        after = item.work / item.speed(count) + item.cost
        if count > item.count or elsewhere:
            return before - after > self.reshape_margin * item.cost
        # Shrinking: the newcomers it makes room for gain the wait until GPUs free up, which
        # must exceed what the job loses (its cost included) by the margin times its cost, as
        # a grow's gain must (twice the loss kept jobs on half a node each while newcomers
        # waited hours: 5-10% behind malleable's average JCT on 2 and 4 nodes). The job
        # loses the speed it gives up only until another run on its node ends: it may grow
        # back then (charging its whole run on fewer GPUs kept a wide job on its GPUs while
        # newcomers waited an hour: 3-8% behind malleable's average JCT on 2 nodes).
        slower = after - before - item.cost
        freed = min((t for t, j in self._ends.get(item.home, ()) if j != item.id),
                    default=None)
        if freed is not None:
            slower = min(slower, max(freed - self._now, 0.0)
                         * (1 - item.speed(count) / item.speed(item.count)))
        return wait * newcomers > slower + item.cost + self.reshape_margin * item.cost

    # -- jobs as items

    def _speeds(self, job: Job) -> tuple[tuple[float | None, ...], int]:
        """(its curve on 1..demand GPUs, its fewest GPUs), cached by curve, demand and
        malleability: a decision reads every running job's and hundreds of waiting ones'."""
        curve = job.curve
        key = (id(curve), job.demand, job.malleable)
        hit = self._cache.get(key)
        if hit is None or hit[0] is not curve:  # the curve kept with it: ids are reused
            if len(self._cache) > 4096:  # a long-lived broker sees ever new curves
                self._cache.clear()
            hit = self._cache[key] = (curve, tuple(
                curve.steps_per_second[min(g, curve.max_gpus) - 1]
                for g in range(1, job.demand + 1)) if curve else (), job.fewest)
        return hit[1], hit[2]

    def _item(self, job: Job, now: float, movable: bool = False) -> Item:
        curve = job.curve
        fixed_size = not job.malleable or curve is None or job.nodes > 1
        high = job.demand
        speeds, fewest = self._speeds(job)
        if job.placement is not None:
            count = len(job.gpus)
            share = job.placement.share
            left = max((job.expected_end or now) - now, 0.0)
            work = left * (curve.throughput(count, share) if curve else 1.0)
            return Item(job.id, speeds, work, fewest if not fixed_size else high, high,
                        job.nodes, job.placement.node, count, not movable, reshape_cost(job))
        work = job.steps_left if job.steps_left is not None else 0.0
        low = high if fixed_size else fewest
        return Item(job.id, speeds, work, low, high, job.nodes, cost=reshape_cost(job),
                    launch=(curve.startup_s or 0.0) if curve else 0.0,
                    nodes_min=job.nodes_min)

    @staticmethod
    def _movable(job: Job, now: float) -> bool:
        """May this running job be reshaped: resizable, not near its end, settled?"""
        return (job.state is JobState.RUNNING and job.malleable and job.nodes == 1
                and job.curve is not None and job.placement.share == 1
                and job.expected_end is not None
                and job.expected_end - now > reshape_cost(job) and settled(job, now))


def _open(state: State, engaged: list[Job], now: float) -> bool:
    """Do jobs arrive while others run: was a job in the system submitted after one that
    still runs had started and run past its start-up? A batch submitted at once (a paper
    job set, or jobs given one by one faster than a start-up) is not."""
    started = min((j.run_started + reshape_cost(j) for j in engaged
                   if j.run_started is not None), default=None)
    if started is None:
        return False
    return any(j.submitted is not None and j.submitted > started
               for j in [*engaged, *islice(fifo_candidates(state, now), LOOKAHEAD_JOBS)])


def _why(item: Item, count: int) -> str:
    """A reshape in one line, for the event log and `marble explain`."""
    head = f"adaptive: {item.count} -> {count} GPUs"
    if not count:
        return head + " (back to the FIFO: its GPUs gain more elsewhere)"
    if item.work <= 0:
        return head
    before, after = item.work / item.speed(item.count), item.work / item.speed(count)
    why = "to grow into idle GPUs" if count > item.count else \
        "to make room for waiting jobs" if count < item.count else "on another node"
    return (f"{head} {why}: its {before:.0f} s of work left take {after:.0f} s, for "
            f"{item.cost:.0f} s of suspend and resume")
