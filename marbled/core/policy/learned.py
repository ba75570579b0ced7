"""A learned policy (SCHED²'s idea): a trained network picks which waiting job starts next.

At each decision it reads SCHED²'s view of the state (`core.features.observe`: the
remaining time of every GPU, the first 10 ready jobs, statistics of the rest), scores
"start job i" for each of them and "start nothing now", and takes the best allowed
action; the driver asks again at once (`settle`) until it picks "nothing". A job runs
on one node, placed by SCHED²'s packing rule (`features.pack`): on its demand (the
count its curve is fastest on, or the count it asked for) on the node with the fewest
free GPUs that hold it, else, if it is resizable, on as many as the node with the most
free GPUs has (a secondary). It keeps that count to its end: it is never suspended or
resized (moldable, as SCHED²'s jobs), and jobs on several nodes are refused.

It may reorder the FIFO: it starts a later job before an earlier one that fits, or
holds GPUs free for a job that does not fit yet. `--max-overtaken N` bounds that: once
N later jobs have started before a waiting job, only it may start next (FIFO from
there). With nothing running it always starts a job that fits.

The network is a small MLP trained with MaskablePPO on the project's simulator
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
from marbled.core.policy.base import Option, Policy, fifo_candidates, role_for
from marbled.core.target import gpus_text

if TYPE_CHECKING:
    import numpy as np

    from marbled.core.features import Observation

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "learned.npz"
OVERTAKEN = 10  # the default bound: SCHED²'s window


@dataclass(frozen=True)
class Network:
    """An MLP: tanh hidden layers, then one logit per action (the policy head of
    stable-baselines3's MlpPolicy, exported by `marbled.sim.train`)."""

    weights: tuple[np.ndarray, ...]  # (inputs, outputs) each
    biases: tuple[np.ndarray, ...]

    def logits(self, x: np.ndarray) -> np.ndarray:
        import numpy as np

        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            x = np.tanh(x @ w + b)
        return x @ self.weights[-1] + self.biases[-1]

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
    overtaking = ("the learned policy picks the next job among the first ready ones, not in "
                  "FIFO order; --max-overtaken bounds how many may pass the first")
    summary = "a trained network picks the next job (SCHED²), packed on the fullest node"
    options = (Option("max_overtaken", OVERTAKEN,
                      "later jobs that may start before a waiting job; then it goes next"),)

    def __init__(self, *, network: Network | None = None,
                 pick: Callable[[Observation, State, float], int] | None = None,
                 **settings: float | None):
        """`pick` replaces the network (the Gymnasium environment's agent); `network`
        replaces the shipped weights."""
        super().__init__(**settings)
        import marbled.core.features as features  # numpy: only when this policy is used

        self._features = features
        self._pick = pick
        # read at once: a missing or broken file stops `marbled` at its start
        self.network = network or (None if pick else shipped_network())

    def observe(self, state: State, now: float) -> Observation:
        return self._features.observe(state, now, self.max_overtaken)

    def scores(self, obs: Observation) -> np.ndarray:
        """The probability of each allowed action (0 for the others), as the network
        gives them."""
        import numpy as np

        logits = np.where(obs.mask, self.network.logits(obs.vector), -np.inf)
        p = np.exp(logits - logits.max())
        return p / p.sum()

    def choose(self, state: State, now: float) -> list:
        obs = self.observe(state, now)
        if not obs.mask[:self._features.NOTHING].any():
            return []  # nothing may start: no choice to make
        if self._pick is not None:
            i = self._pick(obs, state, now)
        else:
            i = int(self.scores(obs).argmax())
        if i >= len(obs.jobs):
            return []
        if not obs.mask[i]:
            raise ValueError(f"action {i} is masked out: {obs.mask.tolist()}")
        node, gpus = obs.places[i]
        return [Start(obs.jobs[i].id, node, gpus, role_for(obs.jobs[i], len(gpus)))]

    def why_waiting(self, job: Job, state: State, now: float) -> str:
        obs = self.observe(state, now)
        ids = [j.id for j in obs.jobs]
        if job.id not in ids:
            if job.id not in {j.id for j in fifo_candidates(state, now)}:
                return super().why_waiting(job, state, now)  # a dependency, a back-off
            return (f"waits behind the first {self._features.WINDOW} ready jobs, the only "
                    "ones the learned policy picks from")
        i = ids.index(job.id)
        head = obs.jobs[0]
        if not obs.mask[i]:
            if i and state.overtaken(head.id) >= self.max_overtaken:
                return (f"waits for job {head.id}: {self.max_overtaken:g} later jobs "
                        "started before it (--max-overtaken), so it goes next")
            most = max((len(state.free(n)) for n in state.nodes), default=0)
            return (f"needs {gpus_text(job.fewest)} on one node; the most free on a node "
                    f"is {most}")
        p = self.scores(obs)
        best = int(p.argmax())
        picked = f"job {obs.jobs[best].id}" if best < len(obs.jobs) else "start nothing now"
        runner = [int(a) for a in p.argsort()[::-1] if p[a] > 0 and a != best]
        second = (f"job {obs.jobs[runner[0]].id}" if runner[0] < len(obs.jobs)
                  else "nothing now") if runner else "none"
        return (f"is in the learned policy's window (position {i + 1}) with score "
                f"{p[i]:.3f}; its pick: {picked} ({p[best]:.3f}), runner-up: {second}"
                + (f" ({p[runner[0]]:.3f})" if runner else ""))
