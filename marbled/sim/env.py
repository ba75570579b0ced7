"""A Gymnasium environment over the simulator: an agent picks the next move of a decision.

The episode is a workload run by `Simulator` under `LearnedPolicy` whose pick is the
agent's: the scheduling rules (the moves allowed, the packing, the bound on overtaking,
what the engine does between decisions) are the policy's and the engine's, not a copy.
The simulation runs in a thread that stops at each decision with a choice to make
(a job may start or a run may move) and waits for `step()`; so a step is one move, and
time moves on to the next event when the agent picks "nothing now".

* Observation: `core.features.observe`, a float32 vector of `features.DIM` entries in
  [-1, 1]: the state's global entries, then one row per action (its docstring lists them).
* Action: `Discrete(ACTIONS)`: start one of the first 8 ready jobs on 1-8 GPUs, move one
  of 16 running jobs to 0-8 GPUs, or `NOTHING`; `action_masks()` gives the allowed ones, as
  sb3-contrib's MaskablePPO expects.
* Reward (`reward=`): "effectiveness" (default), SCHED²'s E = T_ideal / (T_wait +
  T_actual) of each job started (T_ideal: its run on its demand, T_actual: on the GPUs
  it starts on), 0 for a move or "nothing"; "jct": minus the total completion time in
  hours, at the episode's last step (a job's time depends on every later move); "makespan":
  minus the hours elapsed since the last step (the sum is minus the makespan in hours).
* Episode: `workload` is a list of `Arrival`s (a trace, a job set), or a function of a
  `random.Random` that draws one, or one and its node count (and its GPUs a node), seeded
  by `reset(seed=...)`; the episode ends when every job has ended.

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

from marbled.core.features import ACTIONS, DIM, NOTHING, Observation, run_time
from marbled.core.model import Start, State
from marbled.core.policy.learned import MOVE_GUARD, OVERTAKEN, LearnedPolicy
from marbled.core.profiles import ProfileBook
from marbled.sim.engine import SimResult, Simulator
from marbled.sim.workloads import Arrival

REWARDS = ("effectiveness", "jct", "makespan")
HOUR = 3600.0

Workload = list[Arrival] | Callable[[random.Random], list[Arrival] | tuple]


class _Stop(Exception):
    """The episode was abandoned (reset or close): unwinds the simulation thread."""


class SchedulingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, book: ProfileBook, workload: Workload, *, gpus_per_node: int,
                 nodes: int = 1, reward: str = "effectiveness",
                 max_overtaken: float = OVERTAKEN, launch_s: float | None = None,
                 suspend_s: float | None = None,
                 wake: Callable[[State, float], float | None] | None = None,
                 move_guard: float = MOVE_GUARD):
        """`wake`: when to decide with no event (a teacher's `next_decision`); `move_guard`:
        the policy's option."""
        if reward not in REWARDS:
            raise ValueError(f"reward: '{reward}' is not one of {', '.join(REWARDS)}")
        self.book, self.workload, self.reward_kind = book, workload, reward
        self.gpus_per_node, self.nodes = gpus_per_node, nodes
        self.max_overtaken, self.launch_s, self.suspend_s = max_overtaken, launch_s, suspend_s
        self.wake, self.move_guard = wake, move_guard
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self.result: SimResult | None = None  # the finished episode's simulation
        self._thread: threading.Thread | None = None
        self._obs: Observation | None = None
        self._state: State | None = None
        self._now = self._last = 0.0

    # -- the simulation's side: the policy's pick waits for the agent

    def _pick(self, obs: Observation, state: State, now: float) -> int:
        self._state = state  # the state decided on, for a teacher (read after the queue)
        self._to_agent.put(("decide", obs, now))
        action = self._to_sim.get()
        if action is None:
            raise _Stop
        return action

    def _simulate(self, arrivals: list[Arrival], nodes: int, gpus: int) -> None:
        policy = LearnedPolicy(pick=self._pick, wake=self.wake, max_overtaken=self.max_overtaken,
                               move_guard=self.move_guard)
        sim = Simulator(self.book, policy, gpus, nodes, self.launch_s,
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
        arrivals, nodes, gpus = self.workload, self.nodes, self.gpus_per_node
        if callable(arrivals):
            arrivals = arrivals(random.Random(int(self.np_random.integers(2 ** 31))))
            if isinstance(arrivals, tuple):
                arrivals, nodes, *more = arrivals
                gpus = more[0] if more else gpus
        self.result, self._last = None, 0.0
        self._to_agent, self._to_sim = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._simulate, args=(arrivals, nodes, gpus),
                                        daemon=True, name="marbled-sim-env")
        self._thread.start()
        obs, done = self._advance()
        if done:
            raise ValueError("workload: an episode needs at least one job to schedule")
        return obs, {}

    def action_masks(self) -> np.ndarray:
        if self._obs is None:
            return np.eye(ACTIONS, dtype=bool)[NOTHING]
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
        elif self.reward_kind == "jct" and done:
            reward = -self.result.total_jct / HOUR
        self._last = self._now
        return vector, reward, done, False, {}

    def _start_reward(self, obs: Observation, action: int) -> float:
        move = obs.moves.get(action)
        if self.reward_kind != "effectiveness" or not isinstance(move, Start):
            return 0.0
        job = next(j for j in obs.jobs if j.id == move.job)
        ideal, actual = run_time(job), run_time(job, len(move.gpus))
        if ideal is None or actual is None:
            return 0.0
        wait = self._now - (job.submitted or 0.0)
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
