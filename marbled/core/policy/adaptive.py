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
  reshape), and the decision takes the candidate with the smallest total of
  completion times among those whose last job ends within `makespan_slack` of
  the earliest end any candidate reaches. With more jobs, every job gets one
  GPU or few, and the bias hardly matters: the plan uses bias 1.
* Reshape only when it pays. A running job moves to its planned count only if
  the time its remaining steps save exceeds its own suspend-and-resume cost by
  `reshape_margin` times; GPUs are taken from it for newcomers only if they gain
  more than it loses. A job near its end is never moved. A job keeps its node
  and GPUs while its count stays; a new job goes where it gets its planned count.
* FIFO: jobs start in FIFO order among those whose dependencies are met; rigid
  (`--gpus K`), multi-node and unprofiled jobs run on exactly their count and are
  never moved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice

from marbled.core.model import Job, JobState, Placement, Start, State, Suspend
from marbled.core.policy.base import (
    Option,
    Policy,
    fifo_candidates,
    reshape_cost,
    role_for,
    settled,
)

# The candidates the look-ahead weighs: (bias, whether the critical job -- the one with the
# longest time left even on its fastest count -- gets that count first).
CANDIDATES = ((-1.0, False), (0.0, False), (0.5, False), (1.0, False), (2.0, False), (1.0, True),
              (0.0, True))
FUTURES = ((-1.0, False), (0.0, False), (1.0, False), (1.0, True))  # the rule for later events
LOOKAHEAD_JOBS = 16  # jobs in the system up to which the candidates are played forward


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

    def speed(self, g: int) -> float:
        return self.speeds[min(g, len(self.speeds)) - 1] if self.speeds else 1.0

    def can(self, g: int) -> bool:
        return not self.speeds or self.speeds[min(g, len(self.speeds)) - 1] is not None

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
    room = dict(room)
    out: dict[int, list] = {}
    for item in items:
        if item.fixed:
            out[item.id] = [(item.home,), item.count]
            continue
        if item.home is not None and room.get(item.home, -1) >= item.low:  # stays: the common case
            room[item.home] -= item.low
            out[item.id] = [(item.home,), item.low]
            continue
        fits = [n for n in room if room[n] >= item.low]
        whole = [n for n in fits if room[n] >= item.high]
        if item.nodes > 1:
            nodes = fits[:item.nodes]
        elif whole:  # the tightest node that still holds its fastest count
            nodes = [min(whole, key=lambda n: room[n])]
        else:
            nodes = sorted(fits, key=lambda n: -room[n])[:1]
        if len(nodes) < item.nodes:
            break  # strict FIFO: the jobs behind it wait too
        for n in nodes:
            room[n] -= item.low
        out[item.id] = [tuple(nodes), item.low]
    by_id = {i.id: i for i in items}
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
    on_node: dict[str, list[Item]] = {}
    for i, (nodes, _) in out.items():
        if len(nodes) == 1 and not by_id[i].fixed:
            on_node.setdefault(nodes[0], []).append(by_id[i])
    for node, items_there in on_node.items():  # each node's growth is its own
        left = room[node]
        # the items that may still grow, each with what divides its gain: its speed on its
        # fewest GPUs, times its time left there to the power `bias` (work unknown: 1)
        mine = [(item, item.speed(item.low) * ((item.work / item.speed(item.low)) ** bias
                                               if item.work > 0 else 1.0))
                for item in items_there if left > 0 and out[item.id][1] < item.high]
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
    return {i: tuple(v) for i, v in out.items()}


def play_forward(items: list[Item], room: dict[str, int], candidate: tuple[float, bool],
                 queue: list[Item] = (), first: tuple[float, bool] | None = None,
                 ) -> tuple[float, float]:
    """(sum of completion times, the last one) from now, in a fluid model: the items run
    at their curve's speed, are planned with `first` (default: `candidate`) now and
    re-planned with `candidate` whenever one ends, and pay their cost whenever their
    count changes; `queue` waits behind them in FIFO order."""
    now, total, last = 0.0, 0.0, 0.0
    live = {i.id: i for i in [*items, *queue]}
    delay: dict[int, float] = {}  # start-up still to wait before progress
    rule = first or candidate
    for _ in range(4 * len(live) + 4):
        if not live:
            break
        plan = allocate(list(live.values()), _free_room(live, room), *rule)
        rule = candidate
        running = {i: plan[i][1] for i in plan}
        for i, g in running.items():
            item = live[i]
            if item.count and item.count != g:
                delay[i] = delay.get(i, 0.0) + item.cost
            live[i] = replace(item, count=g, home=plan[i][0][0] if len(plan[i][0]) == 1
                              else item.home)
        ends = {i: delay.get(i, 0.0) + live[i].work / live[i].speed(g)
                for i, g in running.items()}
        if not ends:
            break
        step = min(ends.values())
        now += step
        for i, g in running.items():
            if ends[i] <= step + 1e-9:
                total += now
                last = now
                del live[i]
                delay.pop(i, None)
                continue
            used = min(step, delay.get(i, 0.0))
            delay[i] = delay.get(i, 0.0) - used
            live[i] = replace(live[i], work=live[i].work - (step - used) * live[i].speed(g))
    return total, last


def _free_room(live: dict[int, Item], room: dict[str, int]) -> dict[str, int]:
    out = dict(room)
    for item in live.values():
        if item.fixed:
            out[item.home] -= item.count
    return out


class AdaptivePolicy(Policy):
    name = "adaptive"
    summary = ("each job's GPU count from its curve and the load, reshaped only when it "
               "pays (marbled's own)")
    options = (
        Option("reshape_margin", 1.0, "a running job is reshaped only if that saves more "
                                      "than 1 + this times its suspend-and-resume cost"),
        Option("makespan_weight", 1.0, "how much the look-ahead weighs the end of the last "
                                       "job against the mean completion time"),
    )
    multi_node = True
    reshape_margin: float
    makespan_weight: float

    def __init__(self, **settings: float | None):
        super().__init__(**settings)
        self._cache: dict[tuple[int, int], tuple] = {}

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
        # waiting job, a job may change only by growing into its node's free GPUs.
        first_end, movable, suspending = float("inf"), [], JobState.SUSPENDING
        for job in engaged:
            if job.state is suspending:
                return []  # as above
            if job.expected_end is not None and job.expected_end < first_end:
                first_end = job.expected_end
            if (everything or job.placement.node in free or queued and
                    len(job.placement.gpus) > 1) and self._movable(job, now):
                movable.append(job)
        # a shrink saves each newcomer the wait until some run ends and frees GPUs
        wait = max(first_end - now, 0.0) if first_end < float("inf") else 0.0
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
        candidate = self._candidate(running, waiting, room) if everything else (1.0, False)
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
                                 sorted([*waiting, *(replace(i, count=0, home=None)
                                                     for i in moved)], key=lambda i: i.id),
                                 room, candidate, wait)
            back = {i.id for i in moved if after.get(i.id, ((), 0))[1] == i.count}
            if not back:
                return self._reshape(state, moved, plan)
            running = [replace(i, fixed=True) if i.id in back else i for i in running]
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
        movers = {}
        for item in items:
            most = item.high if queued else item.count + free.get(item.home, 0)
            if any(self._pays(item, c, False, newcomers, wait)
                   for c in range(item.low, most + 1) if c != item.count and item.can(c)):
                movers[item.id] = item
        # the movers' nodes, with their fixed jobs; and a waiting job may take free GPUs,
        # beside fixed jobs that need not be planned
        homes = {i.home for i in movers.values()}
        running = [movers.get(j.id) or self._item(j, now) for j in engaged
                   if j.placement.node in homes]
        return running, (homes | set(free)) if queued else homes

    @staticmethod
    def _reshape(state: State, moved: list[Item], plan: dict[int, tuple]) -> list:
        """Suspend the moved jobs, each with its new GPUs reserved where they are its own or
        free (it then resumes on exactly the planned count); the others wait in the FIFO."""
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
            actions.append(Suspend(job.id, target, _why(item, count)))
        return actions

    # -- the plan

    def _candidate(self, running: list[Item], waiting: list[Item],
                   room: dict[str, int]) -> tuple[float, bool]:
        """The candidate whose future looks best (bias 1 when many jobs are in the system)."""
        n = len(running) + len(waiting)
        if not n or n > LOOKAHEAD_JOBS:
            return 1.0, False
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
        outcomes = {(c, f): play_forward(running, kept, f, waiting, first=c)
                    for c in CANDIDATES for f in FUTURES}
        total = min(t for t, _ in outcomes.values()) or 1.0
        last = min(end for _, end in outcomes.values()) or 1.0

        def score(pair) -> tuple[float, float]:
            t, end = outcomes[pair]
            return (t / total) * (end / last) ** self.makespan_weight, t

        return min(outcomes, key=score)[0]

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
            items = [replace(i, fixed=True) if i.id in kept else i for i in items]
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
        # Shrinking: the newcomers it makes room for gain the wait until GPUs free up.
        return wait * newcomers > (1 + self.reshape_margin) * (after - before)

    # -- jobs as items

    def _speeds(self, curve, high: int) -> tuple[float | None, ...]:
        """The curve on 1..high GPUs, cached: a decision reads every running job's."""
        key = (id(curve), high)
        hit = self._cache.get(key)
        if hit is None or hit[0] is not curve:  # the curve kept with it: ids are reused
            if len(self._cache) > 4096:  # a long-lived broker sees ever new curves
                self._cache.clear()
            hit = self._cache[key] = (curve, tuple(
                curve.steps_per_second[min(g, curve.max_gpus) - 1] for g in range(1, high + 1)))
        return hit[1]

    def _item(self, job: Job, now: float, movable: bool = False) -> Item:
        curve = job.curve
        fixed_size = not job.malleable or curve is None or job.nodes > 1
        high = job.demand
        speeds = self._speeds(curve, high) if curve else ()
        if job.placement is not None:
            count = len(job.gpus)
            share = job.placement.share
            left = max((job.expected_end or now) - now, 0.0)
            work = left * (curve.throughput(count, share) if curve else 1.0)
            return Item(job.id, speeds, work, job.fewest if not fixed_size else high, high,
                        job.nodes, job.placement.node, count, not movable, reshape_cost(job))
        work = job.steps_left if job.steps_left is not None else 0.0
        low = high if fixed_size else job.fewest
        return Item(job.id, speeds, work, low, high, job.nodes, cost=reshape_cost(job))

    @staticmethod
    def _movable(job: Job, now: float) -> bool:
        """May this running job be reshaped: resizable, not near its end, settled?"""
        return (job.state is JobState.RUNNING and job.malleable and job.nodes == 1
                and job.curve is not None and job.placement.share == 1
                and job.expected_end is not None
                and job.expected_end - now > reshape_cost(job) and settled(job, now))


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
