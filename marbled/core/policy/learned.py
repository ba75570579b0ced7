"""A learned policy: a trained network picks the next move, a job and its GPU count or a resize.

At each decision it lists the moves the state allows (`core.features.observe`: start
one of the first 8 ready jobs on 1 to 8 GPUs, packed on the fullest node that holds
them; grow, shrink or stop one of the running resizable jobs; or take no more action),
scores each with one small network and takes the best allowed; the driver asks again at
once (`settle`) until it picks "nothing". A node left idle while a job could start on
it is not allowed; jobs on several nodes are refused.

A prior guides it: elastic (`PRIOR`) decides on the same state, the network sees which
moves it makes (a row entry), and `--prior-weight` is added to their logits. The network
learns where the planner departs from the prior; the weight keeps its small errors from
compounding. It decides again when the prior would (a run grown stable).

It may reorder the FIFO: it starts a later job before an earlier one that fits, or
holds GPUs free for a job that does not fit yet. `--max-overtaken N` bounds that: once
N later jobs have started before a waiting job, only it may start next (FIFO from
there). With nothing running it always starts a job that fits.

The network learned from the what-if planner (imitation, then DAgger rounds on the
states it reaches itself) and was then fine-tuned with MaskablePPO on the simulator
(`marbled/sim/train.py`); its weights ship as `marbled/weights/learned.npz`, and the
forward pass here is numpy, so the broker needs neither torch nor gymnasium.
`MARBLE_LEARNED_WEIGHTS` names another weights file (one `train.py` wrote).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from marbled.core.model import Job, Start, State
from marbled.core.policy.base import Option, Policy, fifo_candidates
from marbled.core.policy.elastic import STABLE_S
from marbled.core.target import gpus_text

if TYPE_CHECKING:
    import numpy as np

    from marbled.core.features import Observation

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "learned.npz"
OVERTAKEN = 10  # the default bound: SCHED²'s window
# A run is moved only after it has lasted this many times a move's cost: a network that
# grows and shrinks a job back and forth (one did, 12,775 moves for 640 jobs) spends at
# most about a tenth of the job's time moving it.
MOVE_GUARD = 10.0
# The prior: a cheap heuristic whose decision on the same state the network sees, each move
# it makes marked in its row (`features.PRIOR`). Elastic was within 5 % of the what-if
# planner on both figures in 36 of 44 tuning cells at a 60th of its CPU; the network
# learns where the planner departs from it. The weights are trained with this prior.
PRIOR = "elastic"
# Added to the logit of each move the prior makes: a product of the network's choice and
# the prior's. The network alone agreed with the planner at most decisions, yet its small
# errors compounded over a workload: of 44 tuning cells, 23 within 5 % of the planner at
# weight 0, 32 at 1, 34 at 2, 36 at 3 (docs/learned-policy.md).
PRIOR_WEIGHT = 3.0


@dataclass(frozen=True)
class Network:
    """The move scorer: one MLP (tanh hidden layers, one output) applied alike to every
    allowed move's row beside the state's global entries (`core.features`); its outputs
    are the moves' logits. Exported by `marbled.sim.train` from the torch module."""

    weights: tuple[np.ndarray, ...]  # (inputs, outputs) each
    biases: tuple[np.ndarray, ...]

    def logits(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """One logit per action of the observation vector `x`; -inf where `mask` (if
        given) refuses it, and only the allowed rows are computed."""
        import numpy as np

        from marbled.core.features import ACTIONS, GLOBAL, ROW

        rows = x[GLOBAL:].reshape(ACTIONS, ROW)
        which = np.arange(ACTIONS) if mask is None else np.flatnonzero(mask)
        out = np.full(ACTIONS, -np.inf)
        out[which] = self.row_logits(x[:GLOBAL], rows[which])
        return out

    def row_logits(self, g: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The logit of each row of `rows` beside the global entries `g`."""
        import numpy as np

        h = np.concatenate([np.broadcast_to(g, (len(rows), len(g))), rows], axis=1)
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            h = np.tanh(h @ w + b)
        return (h @ self.weights[-1] + self.biases[-1])[:, 0]

    @classmethod
    def load(cls, path: str | Path) -> Network:
        import numpy as np

        with np.load(path) as f:
            n = int(f["layers"])
            return cls(tuple(f[f"w{i}"].astype(np.float64) for i in range(n)),
                       tuple(f[f"b{i}"].astype(np.float64) for i in range(n)))

    def save(self, path: str | Path, **extra) -> None:
        import numpy as np

        arrays = {f"w{i}": w.astype(np.float32) for i, w in enumerate(self.weights)}
        arrays |= {f"b{i}": b.astype(np.float32) for i, b in enumerate(self.biases)}
        np.savez_compressed(path, layers=len(self.weights), **arrays, **extra)


def fifo_pick(obs: Observation, state: State, now: float) -> int:
    """FIFO order with the same packing: the first job of the window that may start, on the
    most GPUs it may (up to its demand); else nothing (allowed whenever no job may start).
    It never moves a running job: the baseline a network must beat."""
    import numpy as np

    from marbled.core.features import COUNTS, NOTHING, RESIZE

    starts = np.flatnonzero(obs.mask[:RESIZE])
    if len(starts):
        first = starts[0] // COUNTS
        return int(starts[starts // COUNTS == first][-1])
    return NOTHING


def shipped_network() -> Network:
    """The weights `MARBLE_LEARNED_WEIGHTS` names, else those shipped in the package."""
    path = Path(os.environ.get("MARBLE_LEARNED_WEIGHTS") or WEIGHTS)
    if not path.is_file():
        raise ValueError(f"--policy learned: no weights file {path}; set "
                         "MARBLE_LEARNED_WEIGHTS to a file marbled/sim/train.py wrote")
    try:
        return Network.load(path)
    except ModuleNotFoundError:
        raise ValueError("--policy learned needs numpy: pip install numpy") from None


class LearnedPolicy(Policy):
    name = "learned"
    reshapes = True
    overtaking = ("the learned policy picks the next job among the first ready ones, not in "
                  "FIFO order; --max-overtaken bounds how many may pass the first")
    summary = ("a network learned from the what-if planner picks the next job, its GPU count "
               "and resizes")
    options = (Option("max_overtaken", OVERTAKEN,
                      "later jobs that may start before a waiting job; then it goes next"),
               Option("move_guard", MOVE_GUARD,
                      "a running job is moved (resized or stopped) only once its run has "
                      "lasted this many times what a move costs it (checkpoint and relaunch)"),
               Option("prior_weight", PRIOR_WEIGHT,
                      f"how far the network leans to the move {PRIOR} would make (added to "
                      "that move's logit; 0: the network alone)"),
               # elastic's own option: the prior decides with it (trained with its default)
               Option("grow_after", STABLE_S,
                      "seconds a run lasts before its GPUs may double"))

    def __init__(self, *, network: Network | None = None,
                 pick: Callable[[Observation, State, float], int] | None = None,
                 wake: Callable[[State, float], float | None] | None = None,
                 **settings: float | None):
        """`pick` replaces the network (the Gymnasium environment's agent); `network`
        replaces the shipped weights; `wake` is `next_decision` (a teacher's, so that its
        labels come at the times it would decide)."""
        super().__init__(**settings)
        import marbled.core.features as features  # numpy: only when this policy is used
        from marbled.core.policy import get_policy  # the registry imports this module

        self._features = features
        self._pick, self._wake = pick, wake
        self.prior = get_policy(PRIOR, grow_after=self.grow_after)
        # read at once: a missing or broken file stops `marbled` at its start
        self.network = network or (None if pick else shipped_network())

    def next_decision(self, state: State, now: float) -> float | None:
        """When the prior (or `wake`) would decide again: the network then chooses whether
        to follow it."""
        times = [self.prior.next_decision(state, now),
                 self._wake(state, now) if self._wake is not None else None]
        return min((t for t in times if t is not None), default=None)

    def observe(self, state: State, now: float) -> Observation:
        return self._features.observe(state, now, self.max_overtaken, self.move_guard,
                                      self.prior.choose(state, now))

    def scores(self, obs: Observation) -> np.ndarray:
        """The probability of each allowed action (0 for the others), as the network
        gives them."""
        import numpy as np

        logits = self.network.logits(obs.vector.astype(np.float64), obs.mask)
        logits += self.prior_weight * obs.rows[:, self._features.PRIOR]
        p = np.exp(logits - logits.max())
        return p / p.sum()

    def choose(self, state: State, now: float) -> list:
        obs = self.observe(state, now)
        if not obs.mask[:self._features.NOTHING].any():
            return []  # nothing may start or move: no choice to make
        if self._pick is not None:
            i = self._pick(obs, state, now)
        else:
            i = int(self.scores(obs).argmax())
        if not obs.mask[i]:
            raise ValueError(f"action {i} is not allowed: {obs.mask.nonzero()[0].tolist()}")
        return [] if i == self._features.NOTHING else [obs.moves[i]]

    def why_waiting(self, job: Job, state: State, now: float) -> str:
        obs = self.observe(state, now)
        ids = [j.id for j in obs.jobs]
        if job.id not in ids:
            if job.id not in {j.id for j in fifo_candidates(state, now)}:
                return super().why_waiting(job, state, now)  # a dependency, a back-off
            return (f"waits behind the first {self._features.WINDOW} ready jobs, the only "
                    "ones the learned policy picks from")
        i = ids.index(job.id)
        own = [a for a, m in obs.moves.items() if isinstance(m, Start) and m.job == job.id]
        if not own:
            if i and state.overtaken(obs.jobs[0].id) >= self.max_overtaken:
                return (f"waits for job {obs.jobs[0].id}: {self.max_overtaken:g} later jobs "
                        "started before it (--max-overtaken), so it goes next")
            most = max((len(state.free(n)) for n in state.nodes), default=0)
            return (f"needs {gpus_text(job.fewest)} on one node; the most free on a node "
                    f"is {most}")
        p = self.scores(obs)
        prior = obs.rows[:, self._features.PRIOR]

        def said(a: int) -> str:  # the move, its probability, and whether the prior makes it
            return (f"{self._move(obs, a)} ({p[a]:.3f}"
                    + (f", {self.prior.name}'s move)" if prior[a] else ")"))

        mine = max(own, key=lambda a: p[a])
        ranked = [int(a) for a in p.argsort()[::-1] if p[a] > 0]
        line = (f"is in the learned policy's window (position {i + 1}); its best move: "
                f"{said(mine)}; the pick: {said(ranked[0])}")
        if ranked[0] == mine and len(ranked) > 1:  # its move is the pick: the runner-up
            line += f", runner-up: {said(ranked[1])}"
        return line

    def _move(self, obs: Observation, action: int) -> str:
        move = obs.moves.get(action)
        if isinstance(move, Start):
            return f"start job {move.job} on {gpus_text(len(move.gpus))}"
        if move is None:
            return "nothing now"
        if move.resume_on is None:
            return f"stop job {move.job}"
        return f"move job {move.job} to {gpus_text(len(move.resume_on.gpus))}"
