"""Equipartition (Fujiwara et al.): how many GPUs, or how much of one, each job gets.

The moldable policy shares out the free GPUs among the waiting jobs; the
malleable one shares out the free GPUs and those of the running jobs it may
reshape. Both call `plan()`. Each job may get between p_min and p_max: p_max is
its demand (the profile's optimal count); p_min is its demand for a rigid job,
1 GPU for a malleable one, and 1/max_share of a GPU for one whose profile says
it tolerates sharing. With Q the jobs and A the vacant GPUs:

1. light, sum(p_max) <= |A|: every job gets p_max;
2. sum(p_min) < |A| (in whole GPUs): every job gets p_min and the spare GPUs go
   out one at a time by D'Hondt, votes = p_max (the next GPU to the job with
   the largest p_max / (s + 1); ties to the older job);
3. congested, otherwise: every job gets p_min; jobs that may share are spread
   over the GPUs with room, each to the GPU with fewest runs so far (the
   paper's case 4), and the runs a decision puts on one GPU split what is free
   of it evenly, in halves, thirds or quarters.

Shares are counted in twelfths of a GPU (UNITS), so 1/2, 1/3 and 1/4 are exact.
Where the paper leaves room: a job lives on one node (its own node first, then
the first with room, else the node with most room if that holds p_min); strict
FIFO (a job that fits nowhere stops the walk); a GPU's split keeps every run
on it within its own max_share (the paper's guard on p_min, enforced as the
runs are spread, so no run is dropped afterwards); a running job keeps its
own GPUs when its count and node stay (whole GPUs are counts until the plan
ends, then those jobs take their own first), and a running job on part of a
GPU stays there while it fits, so nobody is moved for nothing. A plan must
not depend on the order nodes happen to come in (`in_node_order`): one that
did reshaped jobs it had just started.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from marbled.core.model import MAX_SHARE, Job, Placement, Start, State
from marbled.core.policy.base import role_for

UNITS = 12  # a GPU in twelfths


@dataclass(frozen=True)
class Grant:
    node: str
    gpus: tuple[int, ...]
    share: int = 1  # > 1: 1/share of the one GPU

    def same_as(self, p: Placement | None) -> bool:
        return p is not None and (p.node, tuple(sorted(p.gpus)), p.share) == (
            self.node, self.gpus, self.share)

    def start(self, job: Job) -> Start:
        """Start `job` here; below its demand it is marked SECONDARY (never promoted)."""
        return Start(job.id, self.node, self.gpus, role_for(job, len(self.gpus), self.share),
                     share=self.share)


def shares(job: Job) -> bool:
    return job.malleable and job.max_share > 1 and job.fit(1) == 1


def p_min(job: Job) -> int:
    """In whole GPUs (a job that may share counts 1 here): one GPU for a resizable job
    (unless its curve rules one out), its count for a rigid one."""
    return job.fewest


def grow(job: Job):
    """The count after one more step up from s: the next count the job can run on."""
    return (lambda s: s + 1) if job.curve is None else (lambda s: job.curve.smallest(s + 1))


def dhondt(minimum: list[int], votes: list[int], seats: int, steps=None) -> list[int]:
    """Add `seats` to `minimum`, each to the largest votes/(share+1) below its vote.
    `steps[k](s)`: job k's next share after s (default s + 1; a job whose curve rules some
    counts out jumps them, taking as many seats at once).

    The quotients wait in a heap (largest first, ties to the older job): a seat costs
    O(log jobs), not a look at every job. A job whose next step takes more seats than are
    left is dropped for good, as the seats only ever shrink."""
    out = list(minimum)

    def offer(k: int) -> None:
        after = steps[k](out[k]) if steps else out[k] + 1
        if after is not None and after <= votes[k]:
            heapq.heappush(quotients, (-(votes[k] / after), k, after))

    quotients: list[tuple[float, int, int]] = []
    for k in range(len(out)):
        offer(k)
    while seats > 0 and quotients:
        _, k, after = heapq.heappop(quotients)
        if after - out[k] > seats:
            continue
        seats -= after - out[k]
        out[k] = after
        offer(k)
    return out


def split(free_units: int, runs: int) -> int | None:
    """n such that `runs` runs of 1/n each fit in `free_units` (the largest such share);
    None if even quarters do not."""
    return next((n for n in range(1, MAX_SHARE + 1) if runs * (UNITS // n) <= free_units),
                None)


def free_units(state: State) -> dict[str, dict[int, int]]:
    """node -> GPU -> free twelfths, for every GPU with room (vacant or shared)."""
    out = {n: dict.fromkeys(state.free(n), UNITS) for n in state.nodes_with_free_gpus()}
    for (node, g), runs in state.sharing().items():
        left = UNITS - sum(UNITS // n for n in runs.values())
        if left > 0:
            out.setdefault(node, {})[g] = left
    return in_node_order(state, out)


def in_node_order(state: State, free: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    """The same GPUs with the nodes in the state's order: plans must not depend on which
    node happened to come first (a plan that moves with it would reshape forever)."""
    return {n: free[n] for n in state.nodes if n in free}


def plan(candidates: Iterable[Job], free: dict[str, dict[int, int]],
         homes: dict[int, Placement]) -> dict[int, Grant]:
    """Grants for the first jobs of `candidates` (FIFO order), on `free` (node -> GPU ->
    free twelfths; UNITS = vacant). `homes`: where running candidates are now."""
    total = sum(u for gpus in free.values() for u in gpus.values())
    if not total:
        return {}
    jobs, need = [], 0  # read the queue only as far as it can matter
    low: dict[int, int] = {}  # p_min of each job read, worked out once per plan
    for job in candidates:
        jobs.append(job)
        low[job.id] = p_min(job)
        need += UNITS // job.max_share if shares(job) else UNITS * low[job.id]
        if need >= total:
            break
    held = {(p.node, g) for p in homes.values() for g in p.gpus}
    # Vacant GPUs per node: those no running candidate holds first, so it can keep them.
    vacant = _Vacant({n: sorted((g for g, u in gpus.items() if u == UNITS),
                                key=lambda g, n=n: ((n, g) in held, g))
                      for n, gpus in free.items()})
    if sum(low.values()) < sum(vacant.room.values()):
        return _by_node(jobs, vacant, homes, low)
    return _congested(jobs, free, vacant, homes, low)


class _Vacant:
    """The vacant GPUs of each node, how many are not yet promised, and the promises.

    Whole-GPU grants are counts until `assign()`: then the running jobs left on their
    node with their count keep their own GPUs, and the others take what is left, so
    nobody is moved only because an earlier job took the GPU it stands on.
    """

    def __init__(self, gpus: dict[str, list[int]]):
        self.gpus = gpus  # in the order they are handed out
        self.room = {n: len(v) for n, v in gpus.items()}
        self.promised: list[tuple[Job, str, int, Placement | None]] = []
        self.claimed: set[tuple[str, int]] = set()  # GPUs promised to the jobs on them
        self.kept: dict[str, int] = {}  # room kept for running jobs further down the queue
        self._nodes = list(gpus)
        self._index = {n: i for i, n in enumerate(self._nodes)}
        # (less what is kept?, share) -> no node before this index has room for that share:
        # room only shrinks, so a first-fit search goes on from where the last one stopped.
        self._first: dict[tuple[bool, int], int] = {}

    def keep(self, node: str, count: int) -> None:
        self.kept[node] = self.kept.get(node, 0) + count

    def release(self, node: str, count: int) -> None:
        """Room kept on `node` is no longer kept: a search for room less what is kept must
        look at that node again."""
        self.kept[node] -= count
        i = self._index.get(node)
        if i is not None:
            for key, first in self._first.items():
                if key[0] and first > i:
                    self._first[key] = i

    def _avail(self, node: str, less_kept: bool) -> int:
        return self.room[node] - self.kept.get(node, 0) if less_kept else self.room[node]

    def _fit(self, share: int, low: int, prefer: str | None, job: Job,
             less_kept: bool) -> tuple[str, int] | None:
        """(node, GPU count) for a job of `share` GPUs that accepts `low`, on the vacant GPUs
        per node (less what is kept for others, if `less_kept`): the preferred node if its
        share fits there, else the first node it fits on, else the node with most room if
        that holds `low` (as many as `job` can run on); None if no node does."""
        if prefer is not None and prefer in self.room and self._avail(prefer, less_kept) >= share:
            return prefer, share
        nodes, i = self._nodes, self._first.get((less_kept, share), 0)
        while i < len(nodes) and self._avail(nodes[i], less_kept) < share:
            i += 1
        self._first[less_kept, share] = i
        if i < len(nodes):
            return nodes[i], share
        node = max(nodes, key=lambda n: self._avail(n, less_kept))
        count = job.fit(self._avail(node, less_kept))
        return (node, count) if count is not None and count >= low else None

    def unclaimed(self, node: str, g: int) -> bool:
        return self.room[node] > 0 and g in self.gpus[node] and (node, g) not in self.claimed

    def first(self) -> tuple[str, int] | None:
        """A vacant GPU no promise stands on (there is one wherever room is left)."""
        return next(((n, g) for n, v in self.gpus.items() if self.room[n] > 0
                     for g in v if (n, g) not in self.claimed), None)

    def remove(self, node: str, g: int) -> None:
        self.gpus[node].remove(g)
        self.room[node] -= 1

    def promise(self, job: Job, count: int, homes: dict[int, Placement],
                least: int | None = None) -> bool:
        """`count` GPUs (or as many as p_min allows: `least`, if known) of one node for
        `job`, if any fits: if it can, outside the room `kept` for others."""
        home = homes.get(job.id)
        prefer = home.node if home else None
        least = p_min(job) if least is None else least
        spot = None
        if self.kept:
            spot = self._fit(count, least, prefer, job, True)
        spot = spot or self._fit(count, least, prefer, job, False)
        if spot is None:
            return False
        self.promise_on(job, *spot, home)
        return True

    def promise_on(self, job: Job, node: str, count: int, home: Placement | None) -> None:
        self.room[node] -= count
        self.promised.append((job, node, count, home))
        if self._stays(node, count, home):
            self.claimed.update((home.node, g) for g in home.gpus)

    def _stays(self, node: str, count: int, home: Placement | None) -> bool:
        return home is not None and (home.node, len(home.gpus), home.share) == (
            node, count, 1) and all(self.unclaimed_or_mine(node, g) for g in home.gpus)

    def unclaimed_or_mine(self, node: str, g: int) -> bool:
        return g in self.gpus[node] and (node, g) not in self.claimed

    def assign(self) -> dict[int, Grant]:
        grants = {}
        for job, node, _, home in self.promised:
            if home is not None and all((node, g) in self.claimed for g in home.gpus):
                self.gpus[node] = [g for g in self.gpus[node] if g not in home.gpus]
                grants[job.id] = Grant(node, tuple(sorted(home.gpus)))
        for job, node, count, _ in self.promised:
            if job.id not in grants:
                chosen, self.gpus[node] = self.gpus[node][:count], self.gpus[node][count:]
                grants[job.id] = Grant(node, tuple(sorted(chosen)))
        return grants


def _by_node(jobs: list[Job], vacant: _Vacant, homes: dict[int, Placement],
             least: dict[int, int]) -> dict[int, Grant]:
    """Whole GPUs, node by node. Each job is given a node -- a running one its own, the
    others in FIFO order the node with most GPUs left over the minimums given so far -- and
    each node's vacant GPUs are shared among its jobs: p_max each if they fit, else p_min
    and D'Hondt for the rest. A job is never moved to another node with the same count.
    `least`: each job's p_min."""
    left = dict(vacant.room)
    on: dict[str, list[Job]] = {n: [] for n in left}
    running = [j for j in jobs if j.id in homes and left[homes[j.id].node] >= least[j.id]]
    for job in running:
        left[homes[job.id].node] -= least[job.id]
        on[homes[job.id].node].append(job)
    placed = {j.id for j in running}
    # The node with most left (the first in node order on ties) tops a heap; an entry whose
    # count has changed since is stale and dropped when it comes up.
    order = {n: i for i, n in enumerate(left)}
    most = [(-r, i, n) for i, (n, r) in enumerate(left.items())]
    heapq.heapify(most)
    for job in (j for j in jobs if j.id not in placed):
        while most and -most[0][0] != left[most[0][2]]:
            heapq.heappop(most)
        if not most or left[most[0][2]] < least[job.id]:
            break  # strict FIFO: the jobs behind it get nothing this time
        node = heapq.heappop(most)[2]
        left[node] -= least[job.id]
        heapq.heappush(most, (-left[node], order[node], node))
        on[node].append(job)
    counts = {}
    for node, mine in on.items():
        mine.sort(key=lambda j: j.id)
        counts[node] = _shares(mine, vacant.room[node], least)
    _fill_idle(on, counts, vacant.room, homes, least)
    for node, mine in on.items():
        for job, count in zip(mine, counts[node], strict=True):
            vacant.promise_on(job, node, count, homes.get(job.id))
    return vacant.assign()


def _shares(mine: list[Job], seats: int, least: dict[int, int]) -> list[int]:
    """The counts of a node's jobs (in id order) on its `seats` vacant GPUs: p_max each
    if they fit, else p_min and D'Hondt for the rest."""
    low, high = [least[j.id] for j in mine], [j.demand for j in mine]
    return high if sum(high) <= seats else dhondt(low, high, seats - sum(low),
                                                  [grow(j) for j in mine])


def _fill_idle(on: dict[str, list[Job]], counts: dict[str, list[int]], room: dict[str, int],
               homes: dict[int, Placement], least: dict[int, int]) -> None:
    """A node given no job while it has vacant GPUs takes the job that gains most GPUs by
    moving there: no node idles beside a crowded one (a running job is kept on its node,
    and a waiting one goes to the node with most GPUs left, first on a tie, so two could
    share one on half each while the next emptied). The job may be the only one the plan
    has on its node: the rest of that node may be held by runs that are not the plan's to
    move (rigid, or near their end). A job moves only to more GPUs than the plan gives it
    and than it holds now (a running job never to its count on another node), and each
    node is filled once, so a plan ends."""
    for node in [n for n, mine in on.items() if not mine and room[n] > 0]:
        best, gain = None, 0
        for other, mine in on.items():
            for job, count in zip(mine, counts[other], strict=True):
                there = job.fit(min(job.demand, room[node]))
                home = homes.get(job.id)
                held = len(home.gpus) if home is not None else 0
                if there is None or there < least[job.id] or there <= max(count, held):
                    continue
                if there - count > gain:
                    best, gain = (job, other), there - count
        if best is None:
            continue
        job, other = best
        on[other].remove(job)
        on[node].append(job)
        counts[other] = _shares(on[other], room[other], least)
        counts[node] = _shares(on[node], room[node], least)


def _congested(jobs: list[Job], free: dict[str, dict[int, int]], vacant: _Vacant,
               homes: dict[int, Placement], least: dict[int, int]) -> dict[int, Grant]:
    """Every job p_min (`least`); jobs that may share spread over the GPUs with room (case
    4)."""
    spread: dict[tuple[str, int], list[Job]] = {}  # GPU -> jobs sharing it from now on
    partial = [(n, g) for n, gpus in free.items() for g, u in gpus.items() if u < UNITS]
    # Room on their own node kept for the running jobs further down the queue, so that an
    # earlier job goes elsewhere if it can rather than move them at the same count.
    sharing = {j.id for j in jobs if shares(j)}
    for job in jobs:
        if job.id in homes and job.id not in sharing:
            vacant.keep(homes[job.id].node, least[job.id])
    for job in jobs:
        if job.id not in sharing:
            home = homes.get(job.id)
            if home is not None:
                vacant.release(home.node, least[job.id])
            if not vacant.promise(job, least[job.id], homes, least[job.id]):
                break
            continue
        home = homes.get(job.id)
        own = (home.node, home.gpus[0]) if home and len(home.gpus) == 1 else None
        if own and (vacant.unclaimed(*own) or (
                own not in vacant.claimed and own[1] not in vacant.gpus[own[0]]
                and _fits(job, own, spread, free))):
            key = own  # a running job stays on its GPU while it fits there
        else:
            key = vacant.first() or _least_shared(job, own, spread, partial, free)
        if key is None:
            break
        spread.setdefault(key, []).append(job)
        if key[1] in vacant.gpus[key[0]]:
            vacant.remove(*key)
    grants = vacant.assign()
    for (node, g), sharing in spread.items():
        n = split(free[node][g], len(sharing))
        for job in sharing:
            grants[job.id] = Grant(node, (g,), n)
    return grants


def _fits(job: Job, key: tuple[str, int], spread: dict[tuple[str, int], list[Job]],
          free: dict[str, dict[int, int]]) -> bool:
    """Can `job` join the runs planned on GPU `key`, every run within its max_share?"""
    with_it = [*spread.get(key, []), job]
    n = split(free[key[0]].get(key[1], 0), len(with_it))
    return n is not None and n <= min(j.max_share for j in with_it)


def _least_shared(job: Job, own, spread: dict[tuple[str, int], list[Job]],
                  partial: list[tuple[str, int]],
                  free: dict[str, dict[int, int]]) -> tuple[str, int] | None:
    """With no vacant GPU left: the GPU where `job` makes the fewest runs (one already
    shared before this decision counts one more), its own first, where the split keeps
    every run on it within its max_share."""
    best = None
    for key in dict.fromkeys([*spread, *partial]):
        if not _fits(job, key, spread, free):
            continue
        with_it = [*spread.get(key, []), job]
        rank = (len(with_it) + (free[key[0]][key[1]] < UNITS), key != own, key)
        best = min(best, rank) if best else rank
    return best[2] if best else None
