"""Offline-profiled throughput curves: how fast a model trains on g GPUs of one node.

A profile book is one system's curves (e.g. Summit's V100 nodes). The optimal
GPU count of a model is the count with the best throughput; ties go to the
smaller count, which leaves more GPUs for other jobs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

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
    steps_per_second: tuple[float, ...]  # index g-1 holds the throughput on g GPUs
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
        return max((n for n, _ in self.shared), default=1)

    def throughput(self, gpus: int, share: int = 1) -> float:
        """Steps per second on `gpus` GPUs (beyond the profiled range the curve is flat), or
        with `share` > 1 on 1/share of one GPU: the figure of the next profiled larger
        share (more of a GPU is never slower), without one 1/share of the 1-GPU speed."""
        if gpus < 1:
            raise ValueError("a job needs at least one GPU")
        if share > 1:
            return max((v for n, v in self.shared if n >= share),
                       default=self.steps_per_second[0] / share)
        return self.steps_per_second[min(gpus, self.max_gpus) - 1]

    def optimal_gpus(self, limit: int | None = None) -> int:
        """The GPU count (at most `limit`) with the best throughput."""
        n = self.max_gpus if limit is None else min(limit, self.max_gpus)
        return max(range(1, n + 1), key=lambda g: (self.steps_per_second[g - 1], -g))

    def speedup(self, gpus: int) -> float:
        return self.throughput(gpus) / self.throughput(1)


@dataclass(frozen=True)
class ProfileBook:
    system: str
    gpus_per_node: int
    curves: Mapping[str, ThroughputCurve]  # by model_key, aliases included
    source: str = "<memory>"

    def lookup(self, model: str) -> ThroughputCurve | None:
        return self.curves.get(model_key(model))

    @property
    def models(self) -> list[str]:
        return sorted({c.model for c in self.curves.values()})

    @classmethod
    def from_mapping(cls, doc: object, source: str = "<memory>") -> ProfileBook:
        """Build a book from a parsed profile document, naming the bad field on error."""

        def fail(where: str, what: str) -> ProfileError:
            return ProfileError(f"{source}: {where}: {what}", where)

        if not isinstance(doc, Mapping):
            raise fail("top level", "expected a mapping with 'system' and 'models'")
        unknown = set(doc) - {"system", "description", "gpus_per_node", "units", "models"}
        if unknown:
            raise fail("top level", f"unknown field(s) {sorted(unknown)}")
        system = doc.get("system")
        if not isinstance(system, str) or not system:
            raise fail("system", "must be a non-empty string")
        per_node = doc.get("gpus_per_node")
        if not isinstance(per_node, int) or per_node < 1:
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
                                  "note"}
            if extra:
                raise fail(where, f"unknown field(s) {sorted(extra)}")
            values = entry.get("steps_per_second")
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int | float) and v > 0 for v in values)
            ):
                raise fail(
                    f"{where}.steps_per_second",
                    "must be a list of positive numbers, one per GPU count from 1",
                )
            shared = entry.get("shared_steps_per_second", {})
            if (not isinstance(shared, Mapping)
                    or not all(isinstance(n, int) and 2 <= n <= MAX_SHARE for n in shared)
                    or not all(isinstance(v, int | float) and 0 < v <= values[0]
                               for v in shared.values())):
                raise fail(f"{where}.shared_steps_per_second",
                           f"must map runs per GPU (2..{MAX_SHARE}) to the steps per second "
                           "of one of them, positive and at most the 1-GPU throughput")
            curve = ThroughputCurve(str(name), tuple(float(v) for v in values),
                                    tuple(sorted((n, float(v)) for n, v in shared.items())))
            aliases = entry.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise fail(f"{where}.aliases", "must be a list of strings")
            for key in {model_key(str(name)), *map(model_key, aliases)}:
                if key in curves:
                    raise fail(where, f"name or alias '{key}' is used twice")
                curves[key] = curve
        return cls(system, per_node, curves, source)
