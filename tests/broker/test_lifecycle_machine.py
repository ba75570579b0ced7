"""A stateful property test of a job's lifecycle (issue 30): hypothesis drives a real `Broker`
(its policy, a SQLite store in a file, the protocol files on disk) through random
interleavings of submissions of every kind of job, user suspensions and cancels, shutdowns
and restarts, kill -9 of the broker and restarts, a full disk and its freeing (the store's
commits fail as SQLite's do: tests/broker/fakes.FullDisk), the clock, the jobs' own
progress, exits and crashes, and bad requests; after every step it checks the invariants:

- I1 work is kept: a job that speaks the protocol is asked to checkpoint before any stop the
  broker makes, restores its newest checkpoint, and trains no step twice unless it was
  killed without one by a fault (its crash, a cancel, its own silence past the timeout);
- I2 a command completes at most once, and nothing runs again after its job completed;
- I3 no GPU is held by nothing: a job that holds GPUs has a live process or a launch under
  way, every live process is one the broker watches, no GPU is held twice, and the store
  says what the state says.

At the end the last broker runs every job to its end: each ends exactly once, with its
steps run once. The processes are `SimProc`s (tests/broker/lifecycle_fakes.py): they keep
running while no broker watches, and the next broker adopts them.

The breaks it found (issue 30: a fixed-count job stopped without a checkpoint at a drain and
refused by `marble suspend`; a plain command run again after a crash) are fixed, and each has
a focused test below. MARBLE_LIFECYCLE_KNOWN=tag,... tolerates a tag while a fix is under way.
The brokers run marble; MARBLE_LIFECYCLE_POLICY runs a hunt under another policy (and
MARBLE_LIFECYCLE_EXAMPLES sets its length).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from marbled.core.errors import Invalid, Never, NotFound, NotNow, Refusal, Unavailable
from marbled.core.model import JobState
from marbled.core.policy import POLICIES, get_policy
from marbled.core.spec import JobSpec
from marbled.daemon.broker import Broker
from marbled.daemon.config import BrokerConfig
from marbled.daemon.storage_faults import StorageLost
from marbled.resources import load_profile
from marbled.store.db import Store
from tests.broker.fakes import FakeClock, FullDisk, pump
from tests.broker.lifecycle_fakes import JobTruth, SimLauncher, World

pytestmark = pytest.mark.broker

# Breaks the machine tolerates (tags, from MARBLE_LIFECYCLE_KNOWN): none. The breaks it found
# (issue 30 items 1 and 3) are fixed; a focused test below keeps each fixed.
KNOWN_BREAKS = frozenset(
    filter(None, os.environ.get("MARBLE_LIFECYCLE_KNOWN", "").split(",")))

EXAMPLES = int(os.environ.get("MARBLE_LIFECYCLE_EXAMPLES", "200"))
# Every broker's policy: marble here; a hunt runs the machine under another, with settings
# (MARBLE_LIFECYCLE_POLICY="name" or "name:setting=value,...", e.g. malleable:preempt_guard=0)
POLICY = os.environ.get("MARBLE_LIFECYCLE_POLICY", "marble")
NODES = {"n0": ("0", "1", "2", "3"), "n1": ("0", "1", "2", "3")}
BOOK = load_profile()
START = 1_700_000_000.0

# The kinds of job: the spec submitted, whether it speaks the protocol.
KINDS = {
    "auto": ({"command": ["train"]}, True),
    "fixed": ({"command": ["train"], "model": "resnet-50"}, True),  # gpus: 1 or 2
    "plain": ({"command": ["sh", "-c", "work && echo done >> out"]}, False),  # gpus: 1 or 2
    # a plain command that ignores SIGTERM: stopped, it completes (exit 0)
    "plain_stubborn": ({"command": ["sh", "-c", "trap '' TERM; work && echo done >> out"]},
                       False),
    "per_gpu": ({"command": ["python", "train.py"], "model": "lenet", "per_gpu": True}, True),
    "torchrun": ({"command": ["torchrun", "--nproc-per-node=$MARBLE_GPUS", "train.py"],
                  "model": "resnet-50"}, True),
    "multi_node": ({"command": ["train"], "model": "resnet-50", "gpus": 2, "nodes": 2}, True),
    "node_range": ({"command": ["python", "train.py"], "model": "resnet-50", "gpus": 2,
                    "nodes": "1-2", "per_gpu": True}, True),
}
# the kinds a hunt's policy runs (a single-node policy refuses the jobs of several nodes)
SUBMITTED = [k for k, (spec, _) in KINDS.items()
             if POLICIES[POLICY.partition(":")[0]].multi_node or "nodes" not in spec]
AUTO_MODELS = ("resnet-50", "lenet", "inception-v3")
PLAIN_TICKS = 3  # a plain command's work, in train() ticks

# Requests the broker must refuse, changing nothing: each beside a good job (all or nothing)
BAD = [
    {"command": ["train"], "model": "resnet-50", "gpus": 5, "steps": 10},  # a node has 4
    {"command": ["train"], "model": "resnet-50", "gpus": 1, "nodes": 3, "steps": 10},
    {"command": ["train"], "steps": 10},  # auto needs a model
    {"command": ["train"], "model": "resnet-50", "steps": 10, "after": [10**9]},
    {"command": ["train"], "model": "resnet-50", "steps": 10, "after": ["no-such-name"]},
    {"emulate": True, "model": "no-such-model", "steps": 10},
    {"command": ["train"], "model": "resnet-50", "steps": 0},
    {"command": [], "model": "resnet-50", "steps": 10},
    {"command": ["train"], "gpus": "two"},
]


def config(state_dir: Path) -> BrokerConfig:
    return BrokerConfig(state_dir=state_dir, nodes=dict(NODES), book=BOOK,
                        profile_ref="summit-v100", broker_node="n0", monitor_interval=1.0,
                        suspend_timeout=60.0, kill_timeout=10.0, prestart="off",
                        retry_delay=30.0, coalesce_s=0.0, workdir=state_dir)


def policy():
    name, _, settings = POLICY.partition(":")
    return get_policy(name, **{k: float(v) for k, v in
                               (pair.split("=") for pair in settings.split(",") if pair)})


class Brokers:
    """The broker generations on one state directory and store file, and the processes (a
    `World`) that outlive them."""

    def __init__(self, state_dir: Path, loop: asyncio.AbstractEventLoop):
        self.dir, self.loop = state_dir, loop
        self.now = START
        self.world = World(self.time)
        self.launcher = SimLauncher(self.world)
        self.broker: Broker | None = None
        self.clock: FakeClock | None = None
        self.store: Store | None = None
        self.task: asyncio.Task | None = None
        self.draining: asyncio.Task | None = None
        self.disk: FullDisk | None = None  # the up broker's store, while its disk is full
        self.log: list[str] = []  # what happened, for a failure's message

    def time(self) -> float:
        return self.clock.now if self.clock is not None else self.now

    def do(self, coro):
        return self.loop.run_until_complete(coro)

    # ------------------------------------------------------------ a broker's life

    def start(self) -> None:
        async def start() -> None:
            self.clock = FakeClock(self.now)
            self.store = Store(self.dir / "marble.db")
            self.broker = Broker(config(self.dir), self.store, self.launcher,
                                 policy(), self.clock)
            self.broker.recover()
            self.task = asyncio.get_running_loop().create_task(self.broker.run())
            await pump()

        self.log.append("start")
        self.do(start())
        self.settle()

    def kill9(self) -> None:
        """The broker dies at once: its tasks and timers go, what it had not committed is
        lost; the processes live on."""
        b = self.broker
        self.log.append("kill -9")
        self.task.cancel()
        if self.draining is not None:
            self.draining.cancel()
        for task in list(b._tasks):
            task.cancel()
        b.ledger._cancel_flush()
        b.ledger._pending.clear()  # written by no one now
        self.do(pump())
        self._gone()
        self.world.broker_killed()

    def _gone(self) -> None:
        self.now = self.clock.now
        for _, _, timer in self.clock._timers:
            timer.cancel()
        self.store.close()
        self.broker = self.clock = self.store = self.task = self.draining = self.disk = None

    def settle(self) -> None:
        """Let the broker act; a broker that stopped after a drain is gone, one that died of
        an exception fails the test (I3: nothing in the broker fails unobserved)."""
        self.do(pump())
        if self.task is not None and self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            if isinstance(exc, StorageLost) and self.disk is not None:
                self.log.append(f"stopped with writes held: {exc}")  # saved for the next
                exc = None
            if exc is not None or self.draining is None:
                raise AssertionError(f"the broker stopped by itself: {exc!r}") from exc
            self.log.append("stopped after the drain")
            self.broker.ledger.flush()
            self._gone()

    def advance(self, seconds: float) -> None:
        if self.clock is None:
            self.now += seconds
        else:
            self.do(self.clock.advance(seconds))
        self.settle()

    def fill_disk(self) -> None:
        """The state directory's disk fills: every commit of the broker's store fails."""
        ledger = self.broker.ledger
        self.disk = ledger.db = FullDisk(ledger.db)
        self.disk.full = True
        self.log.append("disk full")
        self.settle()

    def free_disk(self) -> None:
        """Space returns; the store's retry (a timer of the loop's real time) comes now."""
        self.disk.full = False
        self.log.append("disk freed")
        self.broker.ledger._try_again()
        self.settle()

    def holding_writes(self) -> bool:
        """The up broker holds writes its store refused: the store lags its state (I4)."""
        return self.broker.ledger.fault is not None

    def close(self) -> None:
        if self.broker is not None:
            self.task.cancel()
            for task in list(self.broker._tasks):
                task.cancel()
            self.broker.ledger._cancel_flush()
            with contextlib.suppress(Exception):
                self.do(pump())
            self.store.close()
            self.broker = None

    # ------------------------------------------------------------ requests

    def submit(self, doc: dict, *, kind: str, protocol: bool, ticks: int) -> int:
        (row,) = self.broker.submit([JobSpec.from_mapping(doc)])
        after = tuple(int(a) for a in doc.get("after", ()))
        self.world.jobs[row.id] = JobTruth(row.id, kind, protocol, ticks,
                                           fixed="gpus" in doc, after=after)
        self.log.append(f"submit {row.id} {kind} {doc}")
        self.settle()
        return row.id

    # ------------------------------------------------------------ invariants

    def violations(self) -> list[str]:
        return [str(v) for v in self.world.violations if v.tag not in KNOWN_BREAKS]

    def held_by_nothing(self) -> list[str]:
        """I3, on the broker that is up."""
        b, problems = self.broker, []
        holders: dict[tuple[str, int], list[int]] = {}
        for job in b.state.jobs.values():
            if not job.state.holds_gpus:
                continue
            live = b.runs.live.get(job.id)
            if live is None and job.id not in b.runs.launching:
                problems.append(f"job {job.id} is {job.state} with no process and no launch")
            elif live is not None and not live.handle.signal(0):
                problems.append(f"job {job.id} is {job.state}; its process is gone")
            if job.placement is not None:
                for node, gpus in ((job.placement.node, job.placement.gpus),
                                   *job.placement.others):
                    for g in gpus:
                        holders.setdefault((node, g), []).append(job.id)
        problems += [f"GPU {g} of {n} is held by jobs {j}" for (n, g), j in holders.items()
                     if len(j) > 1]
        for proc in self.world.alive():
            live = b.runs.live.get(proc.job)
            if live is None or live.run_id != proc.run_id:
                problems.append(f"{proc} lives, and the broker does not watch it "
                                f"(job {proc.job} is {b.state.outcome(proc.job)})")
        return problems

    def store_disagrees(self) -> list[str]:
        """The committed rows say what the state says (a job not yet committed is not one)."""
        b = self.broker
        rows = {r.id: r.state for r in self.store.jobs()}
        return [f"job {j}: state {job.state}, store {rows.get(j)}"
                for j, job in b.state.jobs.items() if rows.get(j) != job.state.value]

    # ------------------------------------------------------------ the end

    def run_to_the_end(self, rounds: int = 300) -> None:
        """Start a broker if none is up, let every process train, answer, finish; advance the
        clock past back-offs and timeouts until every job is final and no process lives."""
        for round_ in range(rounds):
            if self.broker is None:
                self.start()
            if self.disk is not None and self.disk.full:
                self.free_disk()
            if not self.world.alive() and all(j.state.finished
                                              for j in self.broker.state.jobs.values()):
                return
            for proc in self.world.alive():
                if proc.acked is not None and round_ >= 5:
                    # A process that acknowledged exits in its own time: a broker that knows
                    # it asked has killed it by now (the kill timeout is 10 s, a round 31 s);
                    # one that lost the request with a write the full disk held, has not.
                    proc.leave()
                elif proc.asked:
                    proc.answer()
                else:
                    proc.train(10**6)
            self.settle()
            for proc in self.world.alive():  # what started now trains in the time that passes
                if not proc.asked:
                    proc.train(10**6)
            self.advance(31.0)
        states = {j: str(job.state) for j, job in self.broker.state.jobs.items()}
        raise AssertionError(f"the jobs never all ended: {states}; alive {self.world.alive()}")

    def final_problems(self) -> list[str]:
        b, problems = self.broker, []
        self.broker.ledger.flush()
        events = {}
        for e in self.store.events():
            if e.job_id is not None:
                events.setdefault(e.job_id, []).append(e)
        for j, truth in self.world.jobs.items():
            state = b.state.outcome(j)  # a job that ended has left the state: the store's
            tag = ("plain-rerun-after-crash" if not truth.protocol
                   and any(p.kills_seen for p in truth.procs) else None)
            ends = [e.kind for e in events.get(j, []) if e.kind in ("done", "cancelled")
                    or (e.kind == "failed" and "retry_in" not in (e.data or {}))]
            if len(ends) != 1 and tag not in KNOWN_BREAKS:
                problems.append(f"job {j} ({truth.kind}) ended {len(ends)} times: {ends}")
            if (state is JobState.DONE) != bool(truth.completions) and tag not in KNOWN_BREAKS:
                problems.append(f"job {j} ({truth.kind}) is {state} and completed "
                                f"{truth.completions} times")
            if state is JobState.DONE and truth.protocol:
                missing = sorted(set(range(truth.steps)) - truth.trained.keys())
                if missing:
                    problems.append(f"job {j} ({truth.kind}) is done, steps {missing[:5]}... "
                                    "never trained")
            if state is JobState.DONE:
                undone = [d for d in truth.after if b.state.outcome(d) is not JobState.DONE]
                if undone:
                    problems.append(f"job {j} is done; it depended on {undone}, not done")
        return problems + self.store_disagrees()


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="marbled-lifecycle-"))
        self.loop = asyncio.new_event_loop()
        self.b = Brokers(self.dir, self.loop)

    @initialize()
    def first_broker(self):
        self.b.start()

    def teardown(self):
        try:
            if self.b.broker is not None or self.b.world.jobs:
                self.b.run_to_the_end()
                problems = self.b.violations() + self.b.final_problems()
                for v in {v.tag for v in self.b.world.violations}:
                    event(f"known break: {v}")
                for truth in self.b.world.jobs.values():
                    event(f"{truth.kind}: {self.b.broker.state.outcome(truth.job)}"
                          f"{' (launched)' if truth.launches else ''}")
                event(f"kill -9s: {min(self.b.world.generation, 3)}")
                assert not problems, "\n".join(problems + ["-- steps:", *self.b.log])
        finally:
            self.b.close()
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ preconditions

    def up(self) -> bool:
        return self.b.broker is not None and self.b.draining is None

    def down(self) -> bool:
        return self.b.broker is None

    def alive(self) -> bool:
        return bool(self.b.world.alive())

    def some_jobs(self) -> bool:
        return self.up() and any(self.b.broker.state.counts().values())

    def known_jobs(self) -> list[int]:
        """Every job the broker knows, ended ones included (they have left its state)."""
        b = self.b.broker
        return [j for j in sorted(set(b.state.jobs) | set(self.b.world.jobs))
                if b.state.outcome(j) is not None]

    # ------------------------------------------------------------ the user

    @precondition(up)
    @rule(kind=st.sampled_from(sorted(SUBMITTED)), steps=st.integers(1, 60),
          gpus=st.sampled_from([1, 2]), model=st.sampled_from(AUTO_MODELS),
          after=st.none() | st.integers(0, 10**6), retries=st.sampled_from([0, 0, 1]))
    def submit(self, kind, steps, gpus, model, after, retries):
        spec, protocol = KINDS[kind]
        doc = {**spec, "retries": retries}
        if kind == "auto":
            doc["model"] = model
        if kind in ("fixed", "plain", "plain_stubborn"):
            doc["gpus"] = gpus
        if protocol:
            doc["steps"] = steps
        jobs = sorted(self.b.world.jobs)
        if after is not None and jobs:
            doc["after"] = [jobs[after % len(jobs)]]
        try:
            self.b.submit(doc, kind=kind, protocol=protocol,
                          ticks=steps if protocol else PLAIN_TICKS)
        except Unavailable as exc:  # the disk is full: 503, and nothing was accepted
            assert self.b.disk is not None and self.b.disk.full, exc
            self.b.log.append(f"submit {kind} refused: {exc}")
            return
        except Refusal as exc:  # the policy cannot run it here: refused, as a bad request
            raise AssertionError(f"{kind} job {doc} refused: {exc}") from exc
        self.b.settle()

    @precondition(up)
    @rule(bad=st.sampled_from(BAD), first=st.booleans())
    def bad_request(self, bad, first):
        b = self.b.broker
        before = (b.intake.next_id, sum(b.state.counts().values()), len(self.b.store.jobs()))
        good = {"command": ["train"], "model": "resnet-50", "steps": 5}
        try:
            specs = [JobSpec.from_mapping(d) for d in ((bad, good) if first else (good, bad))]
            b.submit(specs)
        except (Invalid, NotFound) as exc:
            self.b.log.append(f"refused {bad}: {exc}")
        except Unavailable as exc:  # the disk is full: nothing is admitted now
            assert self.b.disk is not None and self.b.disk.full, exc
        else:
            raise AssertionError(f"a bad request was accepted: {bad}")
        self.b.settle()
        assert (b.intake.next_id, sum(b.state.counts().values()),
                len(self.b.store.jobs())) == before

    @precondition(some_jobs)
    @rule(pick=st.integers(0, 10**6))
    def suspend(self, pick):
        b = self.b.broker
        jobs = self.known_jobs()
        job = jobs[pick % len(jobs)]
        truth, state = self.b.world.jobs[job], b.state.outcome(job)
        try:
            b.suspend(job)
            self.b.log.append(f"suspend {job}")
        except Never as exc:
            self.b.log.append(f"suspend {job} refused: {exc}")
            if truth.protocol and state is JobState.RUNNING:
                self.b.world.violate("fixed-count-suspend-refused" if truth.fixed
                                     else "suspend-refused", job, str(exc))
        except NotNow:
            pass
        self.b.settle()

    @precondition(some_jobs)
    @rule(pick=st.integers(0, 10**6))
    def cancel(self, pick):
        b = self.b.broker
        jobs = self.known_jobs()
        job = jobs[pick % len(jobs)]
        truth = self.b.world.jobs[job]
        was = truth.cancelled
        truth.cancelled = True  # before the call: its SIGTERM is sent inside it
        try:
            b.cancel(job)
            self.b.log.append(f"cancel {job}")
        except Never:
            truth.cancelled = was
        except Unavailable as exc:  # the disk is full: refused, and nothing done
            assert self.b.disk is not None and self.b.disk.full, exc
            truth.cancelled = was
            self.b.log.append(f"cancel {job} refused: {exc}")
        self.b.settle()

    # ------------------------------------------------------------ the broker's life

    @precondition(up)
    @rule()
    def shutdown(self):
        self.b.log.append("shutdown")
        self.b.draining = self.loop.create_task(self.b.broker.drain("shutdown"))
        self.b.settle()

    @precondition(lambda self: self.b.broker is not None)
    @rule()
    def kill9(self):
        self.b.kill9()

    @precondition(lambda self: self.up() and self.b.disk is None)
    @rule()
    def fill_disk(self):
        self.b.fill_disk()

    @precondition(lambda self: self.b.disk is not None and self.b.disk.full)
    @rule()
    def free_disk(self):
        self.b.free_disk()

    @precondition(down)
    @rule()
    def restart(self):
        self.b.start()

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, 11.0, 31.0, 61.0, 300.0]))
    def advance(self, seconds):
        self.b.advance(seconds)

    # ------------------------------------------------------------ the jobs

    def _proc(self, pick):
        procs = self.b.world.alive()
        return procs[pick % len(procs)]

    @precondition(alive)
    @rule(pick=st.integers(0, 10**6), ticks=st.integers(1, 30))
    def train(self, pick, ticks):
        proc = self._proc(pick)
        proc.train(ticks)
        self.b.log.append(f"{proc}: trained {ticks}")
        self.b.settle()

    @precondition(alive)
    @rule(pick=st.integers(0, 10**6), exit_now=st.booleans())
    def answer(self, pick, exit_now):
        proc = self._proc(pick)
        proc.answer(exit_now)
        self.b.log.append(f"{proc}: answered (exit {exit_now})")
        self.b.settle()

    @precondition(alive)
    @rule(pick=st.integers(0, 10**6))
    def leave(self, pick):
        proc = self._proc(pick)
        proc.leave()
        self.b.settle()

    @precondition(alive)
    @rule(pick=st.integers(0, 10**6))
    def crash(self, pick):
        proc = self._proc(pick)
        proc.crash()
        self.b.log.append(f"{proc}: crashed")
        self.b.settle()

    # ------------------------------------------------------------ invariants

    @invariant()
    def no_unknown_break(self):
        problems = self.b.violations()
        assert not problems, "\n".join(problems + ["-- steps:", *self.b.log])

    @invariant()
    def no_gpu_held_by_nothing(self):
        if self.b.broker is not None:
            problems = self.b.held_by_nothing() + (
                [] if self.b.holding_writes() else self.b.store_disagrees())
            assert not problems, "\n".join(problems + ["-- steps:", *self.b.log])


LifecycleMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # MARBLE_LIFECYCLE_SHRINK=0: report the first failure as found (faster, longer)
    phases=tuple(Phase) if os.environ.get("MARBLE_LIFECYCLE_SHRINK", "1") == "1"
    else (Phase.explicit, Phase.reuse, Phase.generate))
test_lifecycle = LifecycleMachine.TestCase



# ---------------------------------------------------------------- each break, alone

@contextlib.contextmanager
def brokers(tmp_path):
    """A first broker up on `tmp_path` (the machine's world), closed at the end."""
    loop = asyncio.new_event_loop()
    b = Brokers(tmp_path, loop)
    try:
        b.start()
        yield b
    finally:
        b.close()
        loop.close()


def only(b: Brokers, job: int):
    """The job's one live process."""
    (proc,) = [p for p in b.world.alive() if p.job == job]
    return proc


FIXED = {"command": ["train"], "model": "resnet-50", "gpus": 2, "steps": 100}
PLAIN = {"command": ["sh", "-c", "work && echo done >> out"], "gpus": 1}


def test_a_protocol_job_on_auto_keeps_its_steps_across_shutdown_and_kill9(tmp_path):
    """The control: what the machine checks holds for a job that speaks the protocol."""
    with brokers(tmp_path) as b:
        job = b.submit({**FIXED, "gpus": "auto"}, kind="auto", protocol=True, ticks=100)
        only(b, job).train(30)
        b.draining = b.loop.create_task(b.broker.drain("shutdown"))
        b.settle()
        only(b, job).answer()
        b.settle()
        assert b.broker is None  # stopped after its drain
        b.start()
        only(b, job).train(20)
        b.kill9()
        b.start()
        b.run_to_the_end()
        truth = b.world.jobs[job]
        assert [p.restored for p in truth.procs] == [0, 30]  # the second one was adopted
        assert truth.trained == {s: 1 for s in range(100)} and truth.completions == 1
        assert not b.world.violations and not b.final_problems()


def test_a_fixed_count_job_is_checkpointed_at_shutdown(tmp_path):
    """submit --gpus 2 (speaks the protocol); it trains 40 steps; shutdown."""
    with brokers(tmp_path) as b:
        job = b.submit(FIXED, kind="fixed", protocol=True, ticks=100)
        proc = only(b, job)
        proc.train(40)
        b.draining = b.loop.create_task(b.broker.drain("shutdown"))
        b.settle()
        assert proc.signals[:1] == ["SIGTSTP"], proc.signals  # today: SIGCONT, SIGTERM
        proc.answer()
        b.settle()
        b.run_to_the_end()
        assert b.world.jobs[job].procs[1].restored == 40
        assert not b.world.violations


def test_a_fixed_count_job_can_be_suspended_by_the_user(tmp_path):
    with brokers(tmp_path) as b:
        job = b.submit(FIXED, kind="fixed", protocol=True, ticks=100)
        only(b, job).train(40)
        b.broker.suspend(job)  # today: Never("has a fixed GPU count and cannot checkpoint")
        b.settle()
        only(b, job).answer()
        b.settle()
        only(b, job).train(1)
        assert b.world.jobs[job].procs[1].restored == 40


def test_a_plain_command_that_completed_during_a_crash_is_not_run_again(tmp_path):
    with brokers(tmp_path) as b:
        job = b.submit(PLAIN, kind="plain", protocol=False, ticks=PLAIN_TICKS)
        only(b, job).train(1)
        b.kill9()
        b.world.jobs[job].procs[0].train(PLAIN_TICKS)  # it completes: exit 0, unwatched
        b.start()
        b.run_to_the_end()
        assert b.world.jobs[job].completions == 1 and b.world.jobs[job].launches == 1
        assert b.broker.state.outcome(job) is JobState.DONE


def test_an_adopted_plain_command_that_completes_is_not_run_again(tmp_path):
    with brokers(tmp_path) as b:
        job = b.submit(PLAIN, kind="plain", protocol=False, ticks=PLAIN_TICKS)
        only(b, job).train(1)
        b.kill9()
        b.start()  # adopts it alive
        only(b, job).train(PLAIN_TICKS)  # it completes under the new broker
        b.settle()
        assert b.broker.state.outcome(job) is JobState.DONE  # today: suspended, relaunched
        b.run_to_the_end()
        assert b.world.jobs[job].completions == 1 and b.world.jobs[job].launches == 1
