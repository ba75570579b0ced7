"""A Gymnasium environment over the simulator: an agent picks which waiting job starts next.

The episode is a workload run by `Simulator` under `LearnedPolicy` whose pick is the
agent's: the scheduling rules (the FIFO window, the packing, the bound on overtaking,
what the engine does between decisions) are the policy's and the engine's, not a copy.
The simulation runs in a thread that stops at each decision with a choice to make
(a job may start) and waits for `step()`; so a step is one SCHED² action, and time moves
on to the next event when the agent picks "nothing now".

* Observation: `core.features.observe`, a float32 vector of `features.DIM` entries in
  [-1, 1] (its docstring lists them).
* Action: `Discrete(WINDOW + 1)`: start the i-th of the first 10 ready jobs, or
  `NOTHING` (10); `action_masks()` gives the allowed ones, as sb3-contrib's MaskablePPO
  expects.
* Reward (`reward=`): "effectiveness" (default), SCHED²'s E = T_ideal / (T_wait +
  T_actual) of each job started (T_ideal: its run on its demand, T_actual: on the GPUs
  it starts on), 0 for "nothing"; "jct": minus the job's wait and its run time in
  hours when it starts (a job keeps its count to its end, so the sum is minus the total
  JCT); "makespan": minus the hours elapsed since the last step (the sum is minus the
  makespan in hours).
* Episode: `workload` is a list of `Arrival`s (a trace, a job set), or a function of a
  `random.Random` that draws one, or one and its node count (seeded by
  `reset(seed=...)`); the episode ends when every job has ended.

    env = SchedulingEnv(load_profile("summit-v100"), workload, gpus_per_node=6, nodes=4)
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from marbled.core.features import DIM, NOTHING, WINDOW, Observation, run_time
from marbled.core.model import State
from marbled.core.policy.learned import OVERTAKEN, LearnedPolicy
from marbled.core.profiles import ProfileBook
from marbled.sim.engine import SimResult, Simulator
from marbled.sim.workloads import Arrival

REWARDS = ("effectiveness", "jct", "makespan")
HOUR = 3600.0

Workload = list[Arrival] | Callable[[random.Random], list[Arrival] | tuple[list[Arrival], int]]


class _Stop(Exception):
    """The episode was abandoned (reset or close): unwinds the simulation thread."""


class SchedulingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, book: ProfileBook, workload: Workload, *, gpus_per_node: int,
                 nodes: int = 1, reward: str = "effectiveness",
                 max_overtaken: float = OVERTAKEN, launch_s: float | None = None,
                 suspend_s: float | None = None):
        if reward not in REWARDS:
            raise ValueError(f"reward: '{reward}' is not one of {', '.join(REWARDS)}")
        self.book, self.workload, self.reward_kind = book, workload, reward
        self.gpus_per_node, self.nodes = gpus_per_node, nodes
        self.max_overtaken, self.launch_s, self.suspend_s = max_overtaken, launch_s, suspend_s
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(WINDOW + 1)
        self.result: SimResult | None = None  # the finished episode's simulation
        self._thread: threading.Thread | None = None
        self._obs: Observation | None = None
        self._now = self._last = 0.0

    # -- the simulation's side: the policy's pick waits for the agent

    def _pick(self, obs: Observation, state: State, now: float) -> int:
        self._to_agent.put(("decide", obs, now))
        action = self._to_sim.get()
        if action is None:
            raise _Stop
        return action

    def _simulate(self, arrivals: list[Arrival], nodes: int) -> None:
        policy = LearnedPolicy(pick=self._pick, max_overtaken=self.max_overtaken)
        sim = Simulator(self.book, policy, self.gpus_per_node, nodes, self.launch_s,
                        self.suspend_s)
        try:
            self._to_agent.put(("end", sim.run(arrivals), None))
        except _Stop:
            pass
        except BaseException as exc:  # handed to the agent's thread, raised there
            self._to_agent.put(("error", exc, None))

    def _advance(self) -> tuple[np.ndarray, bool]:
        """Wait for the simulation's next decision (or its end)."""
        kind, what, now = self._to_agent.get()
        if kind == "error":
            raise what
        if kind == "end":
            self.result, self._obs = what, None
            self._now = what.makespan
            return np.zeros(DIM, dtype=np.float32), True
        self._obs, self._now = what, now
        return what.vector, False

    # -- the agent's side

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._stop()
        arrivals, nodes = self.workload, self.nodes
        if callable(arrivals):
            arrivals = arrivals(random.Random(int(self.np_random.integers(2 ** 31))))
            if isinstance(arrivals, tuple):
                arrivals, nodes = arrivals
        self.result, self._last = None, 0.0
        self._to_agent, self._to_sim = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._simulate, args=(arrivals, nodes), daemon=True,
                                        name="marbled-sim-env")
        self._thread.start()
        obs, done = self._advance()
        if done:
            raise ValueError("workload: an episode needs at least one job to schedule")
        return obs, {}

    def action_masks(self) -> np.ndarray:
        if self._obs is None:
            return np.eye(WINDOW + 1, dtype=bool)[NOTHING]
        return self._obs.mask.copy()

    def step(self, action: Any):
        if self._obs is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        action = int(action)
        obs = self._obs
        if not obs.mask[action]:  # an agent without masking: treated as "nothing", if allowed
            action = NOTHING if obs.mask[NOTHING] else int(np.flatnonzero(obs.mask)[0])
        reward = self._start_reward(obs, action)
        self._to_sim.put(action)
        vector, done = self._advance()
        if self.reward_kind == "makespan":
            reward -= (self._now - self._last) / HOUR
        self._last = self._now
        return vector, reward, done, False, {}

    def _start_reward(self, obs: Observation, action: int) -> float:
        if action == NOTHING or self.reward_kind == "makespan":
            return 0.0
        job = obs.jobs[action]
        wait = self._now - (job.submitted or 0.0)
        if self.reward_kind == "jct":
            return -(wait + (run_time(job, len(obs.places[action][1])) or 0.0)) / HOUR
        ideal, actual = run_time(job), run_time(job, len(obs.places[action][1]))
        if ideal is None or actual is None:
            return 0.0
        return ideal / (wait + actual) if wait + actual > 0 else 1.0

    def _stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._to_sim.put(None)
            thread.join()
        self._obs = None

    def close(self) -> None:
        self._stop()
        super().close()
