"""What the broker counts for Prometheus (`GET /metrics`).

Counters and histograms follow the ledger: `Ledger` hands every event it writes to
`BrokerMetrics.event`, so a run start, a suspension or an acknowledgement is counted
where it is recorded, once, and no code path can change the state without being
counted. Gauges (jobs by state, GPUs busy or idle) are read from the live `State` at
scrape time, so they cannot drift from it. Each broker has its own registry: several
brokers in one process (the tests) share no series. Counters start at zero with each
broker process (Prometheus's `rate()` takes the reset); the store keeps the history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from marbled.core.model import JobState, State

# From a job that saves a small model in a blink to one that writes gigabytes.
ACK_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# A decision that starts nothing takes microseconds; one that starts runs writes the store.
DECISION_BUCKETS = (1e-5, 2.5e-5, 1e-4, 2.5e-4, 1e-3, 2.5e-3, 0.01, 0.025, 0.1, 0.25, 1.0)
RUN_ENDS = frozenset(s.value for s in JobState if s.finished or s is JobState.SUSPENDED)
USER_SUSPEND = "requested by the user"  # the reason Broker.suspend records


class BrokerMetrics:
    def __init__(self, state: State):
        self.registry = r = CollectorRegistry()
        self.submitted = Counter(
            "marbled_jobs_submitted", "Jobs accepted by the broker (POST /v1/jobs).",
            registry=r)
        self.runs_started = Counter(
            "marbled_runs_started", "Runs launched: a job's first run (kind=started) or a "
            "resume from its checkpoint (kind=resumed), as primary or secondary (role).",
            ["kind", "role"], registry=r)
        self.runs_ended = Counter(
            "marbled_runs_ended", "Runs ended, by outcome: done, suspended (checkpointed, "
            "to resume), failed or cancelled.", ["outcome"], registry=r)
        self.suspensions = Counter(
            "marbled_suspensions", "Runs asked to checkpoint and exit (SIGTSTP), by cause: "
            "policy (a promotion, a reshape, a time slice), user (marble suspend), drain "
            "(shutdown or the allocation's end).", ["reason"], registry=r)
        self.ack_latency = Histogram(
            "marbled_ack_latency_seconds", "Seconds from a run's SIGTSTP to the broker "
            "seeing its acknowledgement (the checkpoint written); runs that acknowledged "
            "without saying when they were signalled are not counted.",
            buckets=ACK_BUCKETS, registry=r)
        self.decision = Histogram(
            "marbled_decision_seconds", "Seconds the broker's loop spends in one decision: "
            "the policy, and carrying out its actions (store writes, launches begun).",
            buckets=DECISION_BUCKETS, registry=r)
        self.api_errors = Counter(
            "marbled_api_errors", "API requests answered with an error, by HTTP status code.",
            ["code"], registry=r)
        self.moves_held = Counter(
            "marbled_moves_held", "Reshapes held because the run had not trained its first "
            "step (a move then would throw its start-up away); once per run (and once while "
            "its launch is under way).", registry=r)
        self.store_held = Gauge(
            "marbled_store_writes_held", "Writes held in memory while the state directory "
            "refuses them (a full disk, a read-only store); 0 while it takes them.",
            registry=r)
        r.register(_Live(state))
        self._draining = False

    def watch_planner(self, planner) -> None:
        """The what-if planner's plans and their CPU, read from it (`policy.whatif`) at each
        scrape: what its process beside the broker costs."""
        for name, what, read in (
                ("marbled_planner_plans", "Plans the what-if planner adopted.", "plans"),
                ("marbled_planner_cpu_seconds", "CPU seconds the what-if planner's plans "
                 "took, in its process beside the broker's loop.", "cpu_s")):
            Gauge(name, what, registry=self.registry).set_function(
                lambda attr=read: getattr(planner, attr))

    def watch_store(self, held: Callable[[], int]) -> None:
        """Read the writes the ledger holds (`held`) at each scrape."""
        self.store_held.set_function(held)

    def event(self, kind: str, run_id: int | None, data: dict) -> None:
        """One event the ledger wrote (its kind, run and data); a submission's `submitted`
        events come as one, `jobs` of them."""
        if kind == "submitted":
            self.submitted.inc(data.get("jobs", 1))
        elif kind in ("started", "resumed"):
            self.runs_started.labels(kind, data.get("role", "")).inc()
        elif kind == "suspend-requested":
            self.suspensions.labels(self._cause(data.get("reason"))).inc()
        elif kind == "acknowledged":
            if data.get("latency") is not None:
                self.ack_latency.observe(data["latency"])
        elif kind in RUN_ENDS and run_id is not None:  # without a run: a queued job ended
            self.runs_ended.labels(kind).inc()
        elif kind == "drain":
            self._draining = True
        elif kind == "reshape-held":
            self.moves_held.inc()

    def _cause(self, reason: str | None) -> str:
        # The broker decides nothing while it drains, so every later suspension is the drain's.
        if self._draining:
            return "drain"
        return "user" if reason == USER_SUSPEND else "policy"

    def api_error(self, status: int) -> None:
        self.api_errors.labels(str(status)).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text format Prometheus scrapes, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Live:
    """The gauges, read from the broker's state at each scrape."""

    def __init__(self, state: State):
        self._state = state

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        state = self._state
        jobs, gpus = self._families()
        counts = state.counts()  # kept by the state: no job is read
        for s in JobState:
            jobs.add_metric([s.value], counts[s])
        busy: dict[str, set[int]] = {n: set() for n in state.nodes}
        for job in state.engaged():
            if job.placement is not None:  # engaged may only have GPUs reserved
                for node, slots in job.placement.parts():
                    busy[node].update(slots)
        for name, node in state.nodes.items():
            gpus.add_metric([name, "busy"], len(busy[name]))
            gpus.add_metric([name, "idle"], node.size - len(busy[name]))
        return iter((jobs, gpus))

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("marbled_jobs", "Jobs the broker knows, by state.",
                              labels=["state"]),
            GaugeMetricFamily("marbled_gpus", "GPUs of each node: busy (a run holds it, "
                              "alone or shared) or idle (no run does; it may be reserved "
                              "for a promoted job's resume).", labels=["node", "state"]),
        )
