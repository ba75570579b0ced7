"""A job's target GPU count and why (pure): the one answer `marble curves` (next run on),
`marble status` (WANT), `marble explain`, the dashboard and the broker's own sizing read.

The count comes from what the broker knows of the model (`core.learning.Knowledge`):

* `explicit`: the job asked for exactly K GPUs (`--gpus K`);
* `profile`: nothing measured yet, or runs that keep the profile's shape (one count
  measured always does: it says the scale, never the shape): its optimum;
* `start`: a model no profile knows, nothing measured: it starts on `Learning.start_gpus`;
* `explore`: runs at two counts or more contradict the profile's shape, and the corrected
  profile peaks on a count not measured yet; or a model no profile knows: double while a
  doubling pays, try the optimum fitted to three counts or more until it is measured;
* `learned`: the optimum of the corrected profile, or the fastest count the runs measured
  (a model no profile knows), once measured.

`capped`: the optimum lies beyond the largest node, which limits the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from marbled.core.learning import Knowledge, fit_scaling

# how counts and shapes are said: in core.shapes (for `marble`, which prints them without
# core.learning), and imported from here as well
from marbled.core.shapes import gpus_text as gpus_text
from marbled.core.shapes import shape_text as shape_text

EXPLICIT, PROFILE, START, EXPLORE, LEARNED = "explicit", "profile", "start", "explore", "learned"


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
    if know.shape_holds():  # the scale alone: the profile's optimum, whatever the level
        k = know.scale()
        level = "which its runs confirm" if abs(k - 1) <= know.learning.tolerance else \
            f"the same at the {k:.3g}x speed its runs measured"
        return Target(curve.optimal_gpus(max_gpus), PROFILE, f"its profile's optimum, {level}")
    if profile is not None:
        best = curve.optimal_gpus(max_gpus)
        # the profile's shape is in doubt: its optimum is found once the counts either side
        # are measured too (the more promising first)
        beside = sorted((g for g in (best - 1, best + 1)
                         if 1 <= g <= max_gpus and g not in points and curve.possible(g)),
                        key=lambda g: -curve.throughput(g))
        if best in points and beside:
            return Target(beside[0], EXPLORE, f"exploring: its runs contradict its profile's "
                                              f"shape; {gpus_text(best)} measured fastest so "
                                              "far, trying the count beside it")
        if best in points:
            return Target(best, LEARNED, "the optimum of its profile as its runs corrected it")
        return Target(best, EXPLORE, "exploring: its profile as its runs corrected it peaks "
                                     "there, not measured yet")
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
