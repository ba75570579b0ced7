"""A job's target GPU count and why (pure): the one answer `marble curves` (next run on),
`marble status` (WANT), `marble explain`, the dashboard and the broker's own sizing read.

The count comes from what the broker knows of the model (`core.learning.Knowledge`):

* `explicit`: the job asked for exactly K GPUs (`--gpus K`);
* `profile`: nothing measured yet, or runs that keep the profile's shape: its optimum;
* `start`: a model no profile knows, nothing measured: it starts on `Learning.start_gpus`;
* `explore`: runs contradict the profile (or there is none) and the optimum is not found
  yet: double while a doubling pays, halve from a profile's optimum that proved too high,
  try the optimum fitted to three counts or more until it is measured;
* `learned`: the fastest count the runs measured (or the fitted optimum, once measured).

`capped`: the optimum lies beyond the largest node, which limits the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from marbled.core.learning import Knowledge, fit_scaling

EXPLICIT, PROFILE, START, EXPLORE, LEARNED = "explicit", "profile", "start", "explore", "learned"


def gpus_text(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


@dataclass(frozen=True)
class Target:
    """The count a job's next run (or its current one, once the policy moves it) aims for;
    None if its profile rules out every count."""

    count: int | None
    reason: str  # one of EXPLICIT, PROFILE, START, EXPLORE, LEARNED
    detail: str  # why, in words, for people
    capped: bool = False  # the optimum is beyond the largest node

    @property
    def text(self) -> str:
        """E.g. "2 GPUs: the fastest count its runs measured"."""
        count = "no count" if self.count is None else gpus_text(self.count)
        return f"{count}: {self.detail}" + (", limited by the node's size" if self.capped
                                            else "")

    @property
    def move(self) -> str:
        """What a policy's move of a running job to this count is called."""
        return {EXPLORE: "explore", START: "explore", LEARNED: "learned optimum",
                PROFILE: "profile optimum"}.get(self.reason, self.reason)

    def as_dict(self) -> dict:
        return {"count": self.count, "reason": self.reason, "text": self.text,
                "capped": self.capped}


def explicit(gpus: int) -> Target:
    return Target(gpus, EXPLICIT, f"it asked for exactly {gpus_text(gpus)} (--gpus {gpus})")


def target(know: Knowledge, max_gpus: int) -> Target:
    """The count `know`'s model should run on, at most `max_gpus` (the largest node)."""
    points = know.measured()
    profile = know.profile
    if not points:
        if profile is None:
            start = min(know.learning.start_gpus, max_gpus)
            return Target(start, START, f"a model no profile knows starts on {gpus_text(start)}"
                          " and is explored from there")
        best = profile.optimal_gpus(max_gpus)
        return Target(best, PROFILE, "its profile's optimum",
                      capped=best is not None and (profile.optimal_gpus() or 0) > max_gpus)
    curve = know.curve(max_gpus)
    if know.shape_holds():
        return Target(curve.optimal_gpus(max_gpus), PROFILE,
                      "its profile's optimum, which its runs confirm")
    best = max(points, key=lambda g: (points[g], -g))
    if len(points) >= 3 and fit_scaling(points):
        fitted = curve.optimal_gpus(max_gpus)
        if fitted in points:
            return Target(fitted, LEARNED, "the optimum of the curve fitted to its runs")
        return Target(fitted, EXPLORE, "exploring: the curve fitted to its runs peaks there, "
                                       "not measured yet")
    if best == max(points) and best < max_gpus:
        below = [g for g in points if g < best]
        up = curve.largest(min(2 * best, max_gpus))
        if up and up > best and (not below or points[best] >= (1 + know.learning.gain)
                                 * points[max(below)]):
            return Target(up, EXPLORE, f"exploring: {gpus_text(best)} measured fastest so "
                                       "far, trying more while a doubling pays")
    if best == min(points) and best > 1 and profile is not None:
        down = curve.largest(best // 2) or curve.smallest()
        if down < best:
            return Target(down, EXPLORE, f"exploring: its runs on {gpus_text(best)} were "
                                         "slower than its profile says, trying fewer")
    return Target(best, LEARNED, "the fastest count its runs measured")


def of_job(aim: Target, demand: int, reserved: int = 0) -> Target:
    """`aim` as it applies to a job whose scheduler demand is `demand` (its model's target,
    `aim`, unless it has GPUs reserved for a resume, `reserved`, or runs on several nodes,
    which keep the count they were submitted with)."""
    if aim.reason == EXPLICIT or demand == aim.count:
        return aim
    if reserved == demand:
        return Target(demand, aim.reason, f"GPUs reserved for its resume; then {aim.text}")
    return Target(demand, aim.reason, f"its count at submission (a job on several nodes keeps"
                                      f" it); its model's target is now {aim.text}")
