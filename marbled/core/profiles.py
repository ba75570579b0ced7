"""Offline-profiled throughput curves: how fast a model trains on g GPUs of one node.

A profile book is one system's curves (e.g. Summit's V100 nodes). The optimal
GPU count of a model is the count with the best throughput; ties go to the
smaller count, which leaves more GPUs for other jobs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from marbled.core.model import MAX_SHARE


class ProfileError(ValueError):
    """A profile document that cannot be used; the message names the place.

    `where` is the dotted path of the field at fault (e.g. 'models.vgg-16.aliases'),
    so that a file reader can add the line it stands on.
    """

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message)
        self.where = where


def model_key(name: str) -> str:
    """Canonical model name: 'ResNet-50', 'resnet50' and 'resnet_50' are the same model."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class ThroughputCurve:
    model: str
    # index g-1 holds the throughput on g GPUs; None: the model cannot run on g GPUs (e.g. its
    # batch does not fit in the memory of fewer); beyond the last count the curve is flat
    steps_per_second: tuple[float | None, ...]
    # (n, steps/s of one run on 1/n of a GPU shared with n-1 others); empty: never shares
    shared: tuple[tuple[int, float], ...] = ()
    startup_s: float | None = None  # launch -> first step (import, build, restore)
    suspend_s: float | None = None  # SIGTSTP -> exit (checkpoint, acknowledgement)

    @property
    def max_gpus(self) -> int:
        return len(self.steps_per_second)

    @property
    def max_share(self) -> int:
        """The most runs this model may share one GPU with (1: it never shares)."""
        return max((n for n, _ in self.shared), default=1) if self.possible(1) else 1

    def possible(self, gpus: int) -> bool:
        """Can the model run on `gpus` GPUs?"""
        return gpus >= 1 and self.steps_per_second[min(gpus, self.max_gpus) - 1] is not None

    def largest(self, limit: int) -> int | None:
        """The most GPUs, at most `limit`, the model can run on; None if none."""
        return next((g for g in range(limit, 0, -1) if self.possible(g)), None)

    def smallest(self, floor: int = 1) -> int | None:
        """The fewest GPUs, at least `floor`, the model can run on; None if none."""
        return next((g for g in range(max(floor, 1), self.max_gpus + 1) if self.possible(g)),
                    floor if floor > self.max_gpus and self.possible(floor) else None)

    def throughput(self, gpus: int, share: int = 1) -> float:
        """Steps per second on `gpus` GPUs (beyond the profiled range the curve is flat), or
        with `share` > 1 on 1/share of one GPU: the figure of the next profiled larger
        share (more of a GPU is never slower), without one 1/share of the 1-GPU speed.
        ValueError for a count the model cannot run on: a policy that asks is wrong."""
        if not self.possible(gpus):
            raise ValueError(f"{self.model} cannot run on {gpus} GPUs")
        if share > 1:
            return max((v for n, v in self.shared if n >= share),
                       default=self.steps_per_second[0] / share)
        return self.steps_per_second[min(gpus, self.max_gpus) - 1]

    def optimal_gpus(self, limit: int | None = None) -> int | None:
        """The GPU count (at most `limit`) with the best throughput; None if it can run on
        none of them."""
        n = self.max_gpus if limit is None else min(limit, self.max_gpus)
        counts = [g for g in range(1, n + 1) if self.possible(g)]
        return max(counts, key=lambda g: (self.steps_per_second[g - 1], -g), default=None)

    def in_time(self, scale: float) -> ThroughputCurve:
        """The curve on a clock that runs `scale` real seconds per profiled second (an
        emulated job's): steps per real second, costs in real seconds."""
        if scale == 1.0:
            return self
        return replace(
            self, steps_per_second=tuple(None if v is None else v / scale
                                         for v in self.steps_per_second),
            shared=tuple((n, v / scale) for n, v in self.shared),
            startup_s=None if self.startup_s is None else self.startup_s * scale,
            suspend_s=None if self.suspend_s is None else self.suspend_s * scale)

    def speedup(self, gpus: int) -> float:
        return self.throughput(gpus) / self.throughput(self.smallest())


@dataclass(frozen=True)
class ProfileBook:
    system: str
    gpus_per_node: int
    curves: Mapping[str, ThroughputCurve]  # by model_key, aliases included
    source: str = "<memory>"

    def lookup(self, model: str) -> ThroughputCurve | None:
        return self.curves.get(model_key(model))

    def demand(self, model: str, limit: int) -> int | None:
        """The count a job of `model` runs best on, on nodes of `limit` GPUs; None if the
        profile does not know the model (or it can run on no count up to `limit`)."""
        curve = self.lookup(model)
        return curve.optimal_gpus(limit) if curve else None

    @property
    def models(self) -> list[str]:
        return sorted({c.model for c in self.curves.values()})

    def names(self) -> dict[str, str]:
        """Every name and alias (as `model_key`) -> the model's name in the profile."""
        return {k: c.model for k, c in self.curves.items()}

    @classmethod
    def from_mapping(cls, doc: object, source: str = "<memory>") -> ProfileBook:
        """Build a book from a parsed profile document, naming the bad field on error."""

        def fail(where: str, what: str) -> ProfileError:
            return ProfileError(f"{source}: {where}: {what}", where)

        if not isinstance(doc, Mapping):
            raise fail("top level", "expected a mapping with 'system' and 'models'")
        unknown = set(doc) - {"system", "description", "gpus_per_node", "units", "models",
                              "measured"}
        if unknown:
            raise fail("top level", f"unknown field(s) {sorted(unknown)}")
        system = doc.get("system")
        if not isinstance(system, str) or not system:
            raise fail("system", "must be a non-empty string")
        per_node = doc.get("gpus_per_node")
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise fail("gpus_per_node", "must be a positive integer")
        models = doc.get("models")
        if not isinstance(models, Mapping) or not models:
            raise fail("models", "must map model names to curves")
        curves: dict[str, ThroughputCurve] = {}
        for name, entry in models.items():
            where = f"models.{name}"
            if not isinstance(entry, Mapping):
                raise fail(where, "must be a mapping with 'steps_per_second'")
            extra = set(entry) - {"steps_per_second", "shared_steps_per_second", "aliases",
                                  "note", "startup_s", "suspend_s", "measured"}
            if extra:
                raise fail(where, f"unknown field(s) {sorted(extra)}")
            values = entry.get("steps_per_second")
            field = f"{where}.steps_per_second"
            if not isinstance(values, list) or not values:
                raise fail(field, "must be a list of positive numbers, one per GPU count "
                                  "from 1 (null for a count the model cannot run on)")
            if len(values) > per_node:
                raise fail(field, f"has {len(values)} values but a node has {per_node} GPUs "
                                  f"(gpus_per_node); give at most {per_node}")
            speeds = tuple(None if v is None else _positive(v, f"{field}.{g}", fail)
                           for g, v in enumerate(values))
            if all(v is None for v in speeds):
                raise fail(field, "is null for every count: the model could never run")
            shared = entry.get("shared_steps_per_second", {})
            one = speeds[0] or 0.0
            if (not isinstance(shared, Mapping)
                    or not all(isinstance(n, int) and 2 <= n <= MAX_SHARE for n in shared)
                    or not all(not isinstance(v, bool) and isinstance(v, int | float)
                               and 0 < v <= one for v in shared.values())):
                raise fail(f"{where}.shared_steps_per_second",
                           f"must map runs per GPU (2..{MAX_SHARE}) to the steps per second "
                           "of one of them, positive and at most the 1-GPU throughput")
            costs = {k: _positive(entry[k], f"{where}.{k}", fail, zero=True)
                     for k in ("startup_s", "suspend_s") if entry.get(k) is not None}
            curve = ThroughputCurve(str(name), speeds,
                                    tuple(sorted((n, float(v)) for n, v in shared.items())),
                                    **costs)
            aliases = entry.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise fail(f"{where}.aliases", "must be a list of strings")
            for key in {model_key(str(name)), *map(model_key, aliases)}:
                if key in curves:
                    raise fail(where, f"name or alias '{key}' is used twice")
                curves[key] = curve
        return cls(system, per_node, curves, source)


def _positive(value: object, where: str, fail, zero: bool = False) -> float:
    """A finite number > 0 (>= 0 with `zero`) from a profile, or the error that says why not."""
    kind = "a number >= 0" if zero else "a positive number"
    if isinstance(value, bool):
        raise fail(where, f"must be {kind}, not {str(value).lower()}")
    if isinstance(value, str):
        raise fail(where, f"must be {kind}, not the text {value!r} (write it unquoted)")
    if not isinstance(value, int | float):
        raise fail(where, f"must be {kind}, not {type(value).__name__}")
    if not math.isfinite(value):
        raise fail(where, f"must be a finite number, not {value}")
    if value < 0 or (value == 0 and not zero):
        raise fail(where, f"must be {kind}, not {value}")
    return float(value)
