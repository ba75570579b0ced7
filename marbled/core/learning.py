"""Throughput curves learned from the runs themselves (pure).

Every run measures its model at its GPU count: how many steps per second it made
once it was training, how long it took from launch to its first step, and how
long a suspension took. `Knowledge` keeps the newest of these per model and
count and says what the broker should believe:

* a count's throughput is the median of its newest `RECENT` samples (robust to
  an outlier run), trusted once it has `min_samples`;
* what a measurement says is either *scale* or *shape*. Scale: this machine runs
  the model k times faster or slower than its profile; k (the median ratio of the
  measurements to the profile) rescales the whole curve and keeps its shape, so the
  optimum, and every decision, stays the profile's. Shape: the speed-up from one
  count to another differs from the profile's; only measurements at two counts or
  more whose ratios to the profile differ by more than `tolerance` plus their noise
  say it (`shape_holds()`). One count measured is always scale;
* the curve (`curve()`): with the shape held, the profile times k; with it
  contradicted, the measured counts as measured and the others the profile's value
  times the ratio of the measured counts beside them (interpolated between two, held
  beyond the last), so the profile's shape is corrected, never replaced by a flat or
  extrapolated one; with no profile, Optimus's scaling model
  1/v(g) = a + b/g + c*g fitted to the measured counts (Peng et al., EuroSys 2018;
  three counts or more), else the nearest measured count's value;
* the count the model's next run should use (`next_count()`; `core.target` decides
  it and says why): the curve's optimum once it is measured; while it is not (a
  model no profile knows, or a corrected profile that peaks on a count not
  measured yet), a search: double while a doubling pays at least `gain`, try the
  corrected or fitted optimum until it is measured.

What a move costs (lifecycle I6) is learned beside the throughput: a model's
start-up (launch to first step: interpreter, imports, restore) and its suspension
(SIGTSTP to exit: the checkpoint) are the medians of its newest `RECENT` runs on
this machine, and every curve the book gives carries them. Until one is measured,
the profile's figure stands (on the scale its throughput was measured at); a
start-up neither measured nor profiled is assumed to be `Learning.startup_s`
(`DEFAULT_STARTUP_S`, a few seconds: a Python interpreter and a framework's
imports), never 0, so that no move looks free before the first run has told.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import median
from typing import TYPE_CHECKING

from marbled.core.profiles import ProfileBook, ThroughputCurve, model_key

if TYPE_CHECKING:
    from marbled.core.target import Target

RECENT = 9  # samples per count that the median is taken over
# seconds a model's start-up is assumed to take until one of its runs is measured (and its
# profile gives none): a conservative few seconds, what importing a framework takes
DEFAULT_STARTUP_S = 5.0


@dataclass(frozen=True)
class Learning:
    """How the broker learns: `min_samples` runs make a count trusted; measurements within
    `tolerance` of the profile keep its shape; a doubling must add `gain` to be tried
    further; a model no profile knows starts on `start_gpus`; a start-up neither measured
    nor profiled is taken to be `startup_s` seconds (None: unknown, costs nothing)."""

    min_samples: int = 1
    tolerance: float = 0.15
    gain: float = 0.05
    start_gpus: int = 1
    startup_s: float | None = DEFAULT_STARTUP_S


def fit_scaling(points: dict[int, float]) -> tuple[float, float, float] | None:
    """(a, b, c) of 1/v = a + b/g + c*g by least squares over `points` {g: v} (three or
    more counts); None if they do not determine it."""
    if len(points) < 3:
        return None
    rows = [(1.0, 1.0 / g, float(g), 1.0 / v) for g, v in points.items()]
    # normal equations, 3x3, solved by Cramer's rule (no numerical library in the core)
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * r[3] for r in rows) for i in range(3)]
    det = _det3(ata)
    if abs(det) < 1e-18:
        return None
    coef = []
    for k in range(3):
        m = [[aty[i] if j == k else ata[i][j] for j in range(3)] for i in range(3)]
        coef.append(_det3(m) / det)
    return coef[0], coef[1], coef[2]


def _det3(m: list[list[float]]) -> float:
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def scaled(coef: tuple[float, float, float], g: int) -> float | None:
    a, b, c = coef
    inverse = a + b / g + c * g
    return 1.0 / inverse if inverse > 0 else None


@dataclass(frozen=True)
class Knowledge:
    """What the broker knows of one model: its profile curve (if any) and its samples."""

    model: str
    profile: ThroughputCurve | None = None
    throughput: dict[int, tuple[float, ...]] = field(default_factory=dict)  # g -> steps/s
    startup: tuple[float, ...] = ()  # seconds from launch to the first step
    suspend: tuple[float, ...] = ()  # seconds from SIGTSTP to the exit
    learning: Learning = Learning()

    # -- what was measured

    def measured(self) -> dict[int, float]:
        """Trusted counts and their median throughput."""
        return {g: median(v) for g, v in sorted(self.throughput.items())
                if len(v) >= self.learning.min_samples}

    def with_sample(self, kind: str, value: float, gpus: int = 0) -> Knowledge:
        """This knowledge with one more sample: 'throughput' at `gpus`, 'startup' or
        'suspend' (seconds); the oldest beyond RECENT is forgotten."""
        if kind == "throughput":
            samples = (*self.throughput.get(gpus, ()), value)[-RECENT:]
            return replace(self, throughput={**self.throughput, gpus: samples})
        return replace(self, **{kind: (*getattr(self, kind), value)[-RECENT:]})

    # -- what to believe

    def ratios(self) -> dict[int, float]:
        """Each measured count's throughput over the profile's (empty without a profile)."""
        if self.profile is None:
            return {}
        return {g: v / self.profile.throughput(g) for g, v in self.measured().items()
                if self.profile.possible(g)}

    def scale(self) -> float:
        """k: how many times the profile's speed this machine runs the model (1 if unknown)."""
        ratios = self.ratios()
        return median(ratios.values()) if ratios else 1.0

    def noise(self, gpus: int) -> float:
        """The relative spread of a count's samples: twice their median absolute deviation
        over their median (0 with one sample)."""
        samples = self.throughput.get(gpus, ())[-RECENT:]
        if len(samples) < 2:
            return 0.0
        mid = median(samples)
        return 2 * median(abs(v - mid) for v in samples) / mid

    def shape_holds(self) -> bool:
        """Do the measurements keep the profile's shape? One count measured always does
        (it only says the scale); two or more contradict it when their ratios to the
        profile differ by more than `tolerance` plus the noise of the two counts."""
        if self.profile is None:
            return False
        ratios = self.ratios()
        if len(ratios) < 2:
            return True
        lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
        allowed = 1 + self.learning.tolerance + self.noise(lo) + self.noise(hi)
        return ratios[hi] / ratios[lo] <= allowed

    def curve(self, max_gpus: int) -> ThroughputCurve | None:
        """The best estimate of steps/s on 1..max_gpus GPUs; None if nothing is known."""
        points = self.measured()
        if not points:  # the profile's speeds, at the costs measured (or assumed)
            return self.profile and replace(self.profile, **self._costs())
        if self.profile is None:
            values = tuple(points.get(g) or self._fitted(points, g)
                           for g in range(1, max_gpus + 1))
            return ThroughputCurve(self.model, values, (), **self._costs())
        prof = self.profile
        if self.shape_holds():  # scale: the profile's shape at the measured level, all over
            k = self.scale()
            values = tuple(prof.throughput(g) * k if prof.possible(g) else None
                           for g in range(1, max_gpus + 1))
        else:
            ratios = self.ratios()
            values = tuple(None if not prof.possible(g) else points[g] if g in points
                           else prof.throughput(g) * _between(ratios, g)
                           for g in range(1, max_gpus + 1))
        return ThroughputCurve(prof.model, values, prof.shared, **self._costs())

    @staticmethod
    def _fitted(points: dict[int, float], g: int) -> float:
        """A model no profile knows at a count not measured: the fitted scaling model's
        value, else the nearest measured count's."""
        coef = fit_scaling(points)
        fitted = scaled(coef, g) if coef else None
        return fitted if fitted is not None else \
            points[min(points, key=lambda m: (abs(m - g), m))]

    def _costs(self, assumed: bool = True) -> dict:
        """Start-up and suspension as measured; until then the profile's, on the scale its
        throughput was measured at (a machine k times as fast takes 1/k of the time); a
        start-up neither measured nor profiled: `Learning.startup_s` if `assumed`."""
        out, k = {}, self.scale() if self.shape_holds() else 1.0
        for kind in ("startup", "suspend"):
            samples = getattr(self, kind)
            known = getattr(self.profile, f"{kind}_s", None) if self.profile else None
            known = known / k if known is not None else None
            out[f"{kind}_s"] = (median(samples[-RECENT:])
                                if samples and len(samples) >= self.learning.min_samples
                                else known)
        if assumed and out["startup_s"] is None:
            out["startup_s"] = self.learning.startup_s
        return out

    def next_count(self, max_gpus: int) -> int | None:
        """The GPU count the model's next run should use (`core.target`, which says why)."""
        return self.target(max_gpus).count

    def target(self, max_gpus: int) -> Target:
        """`core.target.target`: the count and its reason."""
        from marbled.core.target import target  # it reads this module

        return target(self, max_gpus)

    def report(self, max_gpus: int) -> dict:
        """Profile against measurement against the estimate, count by count (for people)."""
        points, curve, aim = self.measured(), self.curve(max_gpus), self.target(max_gpus)
        holds = self.shape_holds()
        counts = []
        for g in range(1, max_gpus + 1):
            profiled = self.profile.throughput(g) if self.profile and \
                self.profile.possible(g) else None
            estimate = curve.throughput(g) if curve and curve.possible(g) else None
            source = ("measured" if g in points else "none" if estimate is None
                      else "profile" if not points else "scaled profile" if holds
                      else "corrected profile" if self.profile else "fitted")
            counts.append({"gpus": g, "profile": profiled, "measured": points.get(g),
                           "samples": len(self.throughput.get(g, ())), "estimate": estimate,
                           "source": source})
        said = self.profile.optimal_gpus(max_gpus) if self.profile else None
        return {"model": self.model, "counts": counts, "profile_optimum": said,
                "optimum": curve.optimal_gpus(max_gpus) if curve else None,
                "next_count": aim.count, "next_reason": aim.as_dict(),
                **self._costs(assumed=False),  # measured or profiled, not assumed
                "disagrees": self.disagreement(max_gpus)}

    def disagreement(self, max_gpus: int) -> str | None:
        """Why the measurements contradict the profile (for `marble curves`), if they do:
        its shape (an optimum elsewhere, counts off the scale of the others) or its level
        alone (the same factor at every count)."""
        if self.profile is None or not (ratios := self.ratios()):
            return None
        points, k, tol = self.measured(), self.scale(), self.learning.tolerance
        said = self.profile.optimal_gpus(max_gpus)
        found = self.next_count(max_gpus)
        reasons = []
        if found != said:
            reasons.append(f"optimum {found} GPUs, the profile says {said}")
        if self.shape_holds():
            if abs(k - 1) > tol:
                reasons.append(f"its runs train at {k:.3g}x the profile's speed; the "
                               "profile's shape holds")
        else:
            for g, r in ratios.items():
                if abs(r - 1) > tol:
                    reasons.append(f"{points[g]:.3g} steps/s on {g} GPU{'s' * (g > 1)}, "
                                   "the profile says "
                                   f"{self.profile.throughput(g):.3g}")
        return "; ".join(reasons) or None


def _between(ratios: dict[int, float], g: int) -> float:
    """The ratio to the profile at count `g`: interpolated between the measured counts
    beside it, the nearest one's beyond them (never extrapolated)."""
    below = [m for m in ratios if m < g]
    above = [m for m in ratios if m > g]
    if not below or not above:
        return ratios[max(below) if below else min(above)]
    lo, hi = max(below), min(above)
    return ratios[lo] + (ratios[hi] - ratios[lo]) * (g - lo) / (hi - lo)


class LearnedBook:
    """A profile book that learns: `lookup()` gives a model's best-estimate curve, `demand()`
    the count its next run should use, `record()` takes a measurement. Models no profile
    knows are learned from scratch (they start on `learning.start_gpus`)."""

    def __init__(self, book: ProfileBook, learning: Learning = Learning(),
                 max_gpus: int | None = None):
        self.profile, self.learning = book, learning
        self.max_gpus = max_gpus or book.gpus_per_node
        self.known: dict[str, Knowledge] = {}  # by model_key, for models with a measurement
        self.version = 0  # counts the measurements taken: what was derived before is stale

    @property
    def system(self) -> str:
        return self.profile.system

    @property
    def models(self) -> list[str]:
        return sorted({*self.profile.models, *(k.model for k in self.known.values())})

    def names(self) -> dict[str, str]:
        """`ProfileBook.names`, with the models learned from runs alone."""
        return {**{k: know.model for k, know in self.known.items()}, **self.profile.names()}

    def knowledge(self, model: str) -> Knowledge:
        key = model_key(model)
        profile = self.profile.lookup(model)
        # under the profile's name, whatever alias its first sample was recorded under
        return self.known.get(key) or Knowledge(profile.model if profile else model, profile,
                                                learning=self.learning)

    def lookup(self, model: str) -> ThroughputCurve | None:
        return self.knowledge(model).curve(self.max_gpus)

    def demand(self, model: str, limit: int) -> int | None:
        return self.target(model, limit).count

    def target(self, model: str, limit: int) -> Target:
        """The count the model's next run should use, at most `limit`, and why."""
        return self.knowledge(model).target(min(limit, self.max_gpus))

    def record(self, model: str, kind: str, value: float, gpus: int = 0) -> None:
        self.known[model_key(model)] = self.knowledge(model).with_sample(kind, value, gpus)
        self.version += 1

    def report(self, model: str | None = None) -> list[dict]:
        """`Knowledge.report` of one model, or of every model profiled or measured."""
        keys = [model_key(model)] if model else sorted(
            {*map(model_key, self.profile.models), *self.known})
        return [self.knowledge(self.known[k].model if k in self.known else
                               self.profile.lookup(k).model if self.profile.lookup(k) else k
                               ).report(self.max_gpus) for k in keys]

    def as_profile(self) -> dict:
        """The book as a profile document (what `marbled --profile` and the simulator load):
        every model's best estimate, with the costs learned."""
        models = {}
        for k in sorted({*map(model_key, self.profile.models), *self.known}):
            know = self.known.get(k) or self.knowledge(self.profile.lookup(k).model)
            curve = know.curve(self.max_gpus)
            entry = {"steps_per_second": list(curve.steps_per_second)}
            if curve.shared:
                entry["shared_steps_per_second"] = dict(curve.shared)
            for cost, value in know._costs(assumed=False).items():  # not what is assumed
                if value is not None:
                    entry[cost] = value
            models[curve.model] = entry
        return {"system": f"{self.profile.system} (learned)", "gpus_per_node": self.max_gpus,
                "models": models}
