"""Learning from a teacher: label the learned policy's decisions with the what-if planner's.

A teacher is any policy of the zoo (the what-if planner by default). At a decision the
student's observation lists the moves it may make (`core.features`); the teacher decides
on the same state, and its label is the first of its own actions that one of those moves
does (`Observation.index`: the same job started on as many GPUs, or moved to as many), or
"nothing now" when it takes none; the rest of its actions label the next steps at that
instant (`Teacher`). A teacher's action no move does (a start on several
nodes, of a job outside the window) leaves the decision unlabelled.

`collect()` runs episodes in the simulator under a mixture (DAgger, Ross et al. 2011): at
each decision the teacher's label is kept, and the move taken is the teacher's with
probability `beta`, else the student network's. Round 0 (`beta` = 1, no student) is
behaviour cloning; later rounds label the states the student reaches itself.
`marbled.sim.scorer.fit()` trains the network on the labels.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from marbled.core.features import GLOBAL, NOTHING, ROW, Observation
from marbled.core.model import Action, Cancel, Start, State
from marbled.core.policy import get_policy
from marbled.core.policy.base import Policy
from marbled.core.policy.learned import PRIOR_WEIGHT, LearnedPolicy, Network, fifo_pick
from marbled.sim.engine import Simulator

# (name, arrivals, nodes, GPUs per node) of one episode, drawn from a seed
Episode = tuple[str, list, int, int]


class Teacher:
    """A policy of the zoo as a labeller: the move of an observation it makes next.

    Its decision is a list of actions taken together (`settle` applies them all, then asks
    again); a step makes one move, so the rest of the list is kept and labels the next
    steps at the same instant, before it is asked again."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._rest: list[Action] = []
        self._at: float | None = None

    def labels(self, obs: Observation, state: State, now: float) -> list[int]:
        """The moves of `obs` the teacher makes at this instant, in its order: the first is
        its next; [] if it makes only moves that no move of `obs` does, or none where
        "nothing" is refused."""
        if self._at != now:
            self._rest = []
        found = self._found(obs, self._rest)
        if not found:
            self._at = now
            self._rest = [a for a in self.policy.decide(state, now) if not isinstance(a, Cancel)
                          and not (isinstance(a, Start) and state.jobs[a.job].resume_on
                                   is not None)]
            if not self._rest:
                return [NOTHING] if obs.mask[NOTHING] else []
            found = self._found(obs, self._rest)
        if found:
            self._rest = self._rest[found[0][0] + 1:]
        return [i for _, i in found]

    def label(self, obs: Observation, state: State, now: float) -> int | None:
        """The move of `obs` the teacher makes next; None if it makes one no move does."""
        found = self.labels(obs, state, now)
        return found[0] if found else None

    @staticmethod
    def _found(obs: Observation, actions: list[Action]) -> list[tuple[int, int]]:
        return [(k, i) for k, a in enumerate(actions) if (i := obs.index(a)) is not None]

    def next_decision(self, state: State, now: float) -> float | None:
        return self.policy.next_decision(state, now)


def fallback(obs: Observation) -> int:
    """The move where the teacher's has no label and there is no student: nothing if allowed,
    else FIFO's (`fifo_pick`)."""
    return NOTHING if obs.mask[NOTHING] else fifo_pick(obs, None, 0.0)


def cat(parts: list[np.ndarray], dtype, *shape: int) -> np.ndarray:
    """`parts` end to end, as `dtype` (none: an empty array of that shape)."""
    return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *shape), dtype)


@dataclass
class Samples:
    """Labelled decisions, packed: each decision's global entries, and only its allowed
    rows (most of an observation is rows of moves it does not allow)."""

    g: np.ndarray  # (n, GLOBAL) float32
    rows: np.ndarray  # (rows, ROW) float32: the allowed rows of every decision, in turn
    offsets: np.ndarray  # (n + 1,) decision i's rows are rows[offsets[i]:offsets[i + 1]]
    target: np.ndarray  # (rows,) bool: a move the teacher makes at that instant

    def __len__(self) -> int:
        return len(self.g)

    @classmethod
    def pack(cls, decisions: Sequence[tuple[Observation, list[int]]]) -> Samples:
        g, rows, offsets, target = [], [], [0], []
        for obs, labels in decisions:
            allowed = np.flatnonzero(obs.mask)
            g.append(obs.vector[:GLOBAL])
            rows.append(obs.rows[allowed])
            target.append(np.isin(allowed, labels))
            offsets.append(offsets[-1] + len(allowed))
        return cls(np.array(g, np.float32).reshape(-1, GLOBAL), cat(rows, np.float32, ROW),
                   np.array(offsets, np.int64), cat(target, bool))

    @classmethod
    def join(cls, parts: Sequence[Samples]) -> Samples:
        parts = [p for p in parts if len(p)] or [cls.pack([])]
        offsets, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offsets.append(p.offsets[1:] + base)
            base += p.offsets[-1]
        return cls(np.concatenate([p.g for p in parts]), np.concatenate([p.rows for p in parts]),
                   np.concatenate(offsets), np.concatenate([p.target for p in parts]))

    def decision(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decision i's global entries, allowed rows and the teacher's among them."""
        k = slice(self.offsets[i], self.offsets[i + 1])
        return self.g[i], self.rows[k], self.target[k]


def run_episode(episode: Episode, teacher: str, student: Network | None, beta: float,
                seed: int, book, costs: tuple[float, float],
                prior_weight: float = PRIOR_WEIGHT) -> tuple[Samples, dict]:
    """One episode under the mixture, with `costs` (launch, suspend seconds), the student
    leaning on the prior by `prior_weight`; its labelled decisions and its outcome."""
    name, arrivals, nodes, gpus = episode
    expert = Teacher(get_policy(teacher))
    scorer = (LearnedPolicy(network=student, prior_weight=prior_weight)
              if student is not None else None)
    rng = random.Random(seed)
    decisions: list[tuple[Observation, list[int]]] = []
    unlabelled = 0

    def pick(obs: Observation, state: State, now: float) -> int:
        nonlocal unlabelled
        labels = expert.labels(obs, state, now)
        label = labels[0] if labels else None
        if label is None:
            unlabelled += 1
        else:
            decisions.append((obs, labels))
        if label is not None and (scorer is None or rng.random() < beta):
            return label
        if scorer is not None:
            return int(scorer.scores(obs).argmax())
        return fallback(obs)

    policy = LearnedPolicy(pick=pick, wake=expert.next_decision)
    result = Simulator(book, policy, gpus, nodes, *costs).run(arrivals)
    outcome = {"episode": name, "decisions": len(decisions) + unlabelled,
               "unlabelled": unlabelled, "average_jct": result.average_jct,
               "makespan": result.makespan}
    return Samples.pack(decisions), outcome


def _one(args) -> tuple[Samples, dict]:
    from marbled.resources import load_profile

    episode, teacher, student, beta, seed, profile, costs, prior_weight = args
    return run_episode(episode, teacher, student, beta, seed, load_profile(profile), costs,
                       prior_weight)


def collect(episodes: Sequence[Episode], teacher: str, student: Network | None, beta: float,
            seed: int, profile: str, costs: tuple[float, float],
            processes: int = 1, prior_weight: float = PRIOR_WEIGHT
            ) -> tuple[Samples, list[dict]]:
    """Every episode under the mixture, in `processes` processes; the labels and outcomes."""
    jobs = [(e, teacher, student, beta, seed * 100_003 + k, profile, costs, prior_weight)
            for k, e in enumerate(episodes)]
    if processes > 1:
        with get_context("spawn").Pool(processes) as pool:
            done = pool.map(_one, jobs, chunksize=1)
    else:
        done = [_one(j) for j in jobs]
    return Samples.join([s for s, _ in done]), [r for _, r in done]


def agreement(net: Network, data: Samples) -> float:
    """The share of labelled decisions where the network picks a move the teacher makes."""
    if not len(data):
        return float("nan")
    hits = 0
    for i in range(len(data)):
        g, rows, target = data.decision(i)
        hits += bool(target[np.argmax(net.row_logits(g, rows))])
    return hits / len(data)
