"""What a broker is told at start: its nodes and GPUs, its profile, and its timeouts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from marbled.core.learning import Learning
from marbled.core.profiles import ProfileBook

if TYPE_CHECKING:
    from marbled.batch.base import Watched


@dataclass
class BrokerConfig:
    state_dir: Path
    nodes: dict[str, tuple[str, ...]]  # node name -> device names (CUDA_VISIBLE_DEVICES entries)
    book: ProfileBook
    profile_ref: str  # what emulated jobs load (name or path)
    time_scale: float = 1.0  # for emulated jobs
    suspend_timeout: float = 60.0  # SIGTSTP -> acknowledgement, before SIGTERM
    kill_timeout: float = 10.0  # SIGTERM -> exit, before SIGKILL
    monitor_interval: float = 1.0  # how often acknowledgement markers are looked for
    # Runs that end this close together (s) are one decision, as the simulator takes the ends
    # of one instant; after an end the broker also waits for the runs whose progress says
    # they end within `coalesce_max_s`, which bounds every wait (`coalesce_s` 0: none).
    # The runs of one decision start about 1 ms apart through the shared supervisor, so end
    # as far apart (0.9 ms p50, 1.6 ms p90 between the ends of `sleep 0.1` x300 on 6 GPUs):
    # 4 ms holds them together, and a decision beside other runs waits 4 ms, not 10 (once
    # no run is left, or no unfinished job is movable, none: issue 32).
    coalesce_s: float = 0.004
    coalesce_max_s: float = 0.5
    # A job the policy reshapes again within this many seconds of its last reshape is left as
    # it is (a loop that makes no progress); the refusal is logged as a `reshape-refused` event.
    reshape_window: float = 1.0
    # When to start the process of a job's next run before its GPUs are free:
    # "ahead" keeps one waiting for every running secondary (the runs MARBLE
    # suspends) and starts one at any other suspension; "suspend" only at a
    # suspension; "off" never.
    prestart: str = "ahead"
    # The node the broker runs on: jobs there may also acknowledge with SIGUSR1; jobs on
    # other nodes only through their marker file on the shared state directory.
    broker_node: str | None = None
    # When the allocation ends (Unix time), and how long before it every job is suspended.
    end_time: float | None = None
    drain_before: float = 120.0
    # What reads the end (it may move: scontrol update TimeLimit=) and the nodes out of
    # service (DOWN, DRAIN) again, and how often (s)
    watch: Callable[[], Watched] | None = None
    allocation_poll: float = 30.0
    # Where a job submitted without a directory (`chdir`) runs: the broker's own working one.
    workdir: Path = field(default_factory=Path.cwd)
    retry_delay: float = 30.0  # before a failed job's first retry; doubles with each failure
    sample_interval: float = 10.0  # seconds between GPU samples (with a sampler)
    # How the broker learns its models from their runs (None: only the profile, and a model
    # the profile lacks is refused), and how often it samples the runs' progress.
    learning: Learning | None = field(default_factory=Learning)
    learn_interval: float = 30.0
