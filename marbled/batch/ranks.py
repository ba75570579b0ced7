"""One process per GPU: the ranks of a per-GPU run, their rendezvous variables, and
`python -m marbled.batch.ranks RANKS ARGV...`, which starts them on this host (RANKS: their
variables as a JSON list, or how many to prestart).

Every rank gets what `torch.distributed`'s env:// rendezvous reads (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), what picks its device (LOCAL_RANK, LOCAL_WORLD_SIZE) and
NODE_RANK, and sees the run's GPUs of its node (CUDA_VISIBLE_DEVICES), as under torchrun:
a script that runs under torchrun (`cuda:LOCAL_RANK`) runs unchanged. The run's MARBLE_*
variables are the same for every rank (only rank 0 reports and acknowledges:
marbled.worker.protocol).

The local launcher runs this module as the run's process, the leader of the run's own
session and group, and the ranks as its children in that group: the broker's killpg
(SIGTSTP, SIGTERM, SIGKILL) reaches every rank at once, which torchrun's workers, each in
its own session, are not (docs/distributed.md). It
- starts rank 0 first (a rank whose rendezvous starts before rank 0's store listens
  retries with a back-off of up to seconds);
- prefixes every line a rank prints with `[rank N] ` in the run's stdout and stderr logs;
- ends when every rank has ended. A rank that exits non-zero ends the run: the others
  may wait in a collective for the process group's timeout (30 minutes by default), so
  they are killed, with what any rank started, unless the run has acknowledged a
  suspension or been asked for one (rank 0 may still be saving; the broker's timeouts
  bound that). It says so in the run's stderr once the ranks' last lines are out (the
  last line: the failure's reason is read from the end), exits as the failed
  rank did and leaves RANK_FAILURE in the job's directory, naming the rank;
- outlives SIGTERM (its ranks get it too) to collect their exits and output, and ends
  through os._exit: past sys.exit, the interpreter's finalization restores the default
  action, and the stop's SIGTERM that comes as the ranks end would kill it (`_exit`);
- records how the run ended in the run's exit file (`supervise.write_exit`), as the
  supervisor of any other local run does, for a broker that adopts the run after a restart;
- prestarted (RANKS a count, MARBLE_STANDBY_FILE its go file): starts that many ranks, each
  waiting for its own go file, and at the broker's go hands each rank of the run its
  variables, cancels the ranks beyond the run's and starts those it lacks (`_prestarted`).

Under Slurm and jsrun the batch system starts the ranks (one task per GPU), and the step
shim (marbled.batch.step) maps the task's SLURM_* or JSM_* numbers to these variables.
It imports the standard library and the worker protocol only: it runs before every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from marbled.batch.supervise import write_exit
from marbled.worker.protocol import (
    ACK_FILE,
    STANDBY_BROKER_VAR,
    STANDBY_VAR,
    SUSPEND_FILE,
    atomic_write_json,
    read_json,
    wait_for_go,
)

RANK_FAILURE = "rank-failure.json"  # in the job's directory: the rank that ended a run
LOCAL_ADDR = "127.0.0.1"  # every node of a local broker is this host
MAX_LINE = 64 * 1024  # a rank's line longer than this is cut into several prefixed ones


def rank_prefix(rank: int) -> bytes:
    """What begins every line rank `rank` prints, in the run's logs (`marble logs --rank`)."""
    return f"[rank {rank}] ".encode()


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LISTEN_PORTS = (20000, 32767)  # where listening ports are drawn when no range can be read


def listen_port_range(path: str = EPHEMERAL_RANGE) -> tuple[int, int]:
    """Where a run's listening ports are drawn: the widest stretch above 10000 outside the
    kernel's ephemeral range. A port of that range, free now, can be given to any outgoing
    connection on the host before the rank that should listen binds it (EADDRINUSE at
    rank 0's rendezvous, with the other ranks left waiting); a port outside it cannot."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return LISTEN_PORTS
    below, above = (10000, low - 1), (high + 1, 65535)
    best = max(below, above, key=lambda r: r[1] - r[0])
    return best if best[1] - best[0] >= 1000 else LISTEN_PORTS


def free_ports(count: int, host: str = LOCAL_ADDR) -> list[int]:
    """`count` distinct TCP ports free on `host` now, drawn at random from
    listen_port_range() (so that two runs started at once do not draw the same), each
    bound to be sure and all held until every one is known."""
    low, high = listen_port_range()
    socks: list[socket.socket] = []
    try:
        for _ in range(100 * count):
            port = low + int.from_bytes(os.urandom(4), "big") % (high - low + 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:  # taken, or the host cannot bind there: draw again
                s.close()
                continue
            socks.append(s)
            if len(socks) == count:
                return [s.getsockname()[1] for s in socks]
        raise OSError(f"no {count} free TCP ports in {low}-{high} on {host}")
    finally:
        for s in socks:
            s.close()


def rendezvous_env(master_addr: str) -> dict[str, str]:
    """MASTER_ADDR and MASTER_PORT of a run whose ranks a batch system starts: the port is
    free on this host now, which is the first node's when the broker runs there, and outside
    the ephemeral range, where no outgoing connection of that node takes it meanwhile."""
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(free_ports(1)[0])}


def rank_envs(parts: tuple[tuple[str, tuple[str, ...]], ...], master_addr: str,
              master_port: int, tf_ports: list[int] | None = None) -> list[dict[str, str]]:
    """The variables of each rank of a run on `parts` ((node, GPU devices) in node order), in
    rank order: node 0's GPUs first. With `tf_ports` (one per rank), TF_CONFIG too, the
    cluster MultiWorkerMirroredStrategy reads (every rank a worker on this host)."""
    world = sum(len(devices) for _, devices in parts)
    envs: list[dict[str, str]] = []
    for node_rank, (_, devices) in enumerate(parts):
        for local_rank in range(len(devices)):
            envs.append({"RANK": str(len(envs)), "WORLD_SIZE": str(world),
                         "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(len(devices)),
                         "NODE_RANK": str(node_rank), "MASTER_ADDR": master_addr,
                         "MASTER_PORT": str(master_port),
                         "CUDA_VISIBLE_DEVICES": ",".join(devices)})
    if tf_ports:
        workers = [f"{LOCAL_ADDR}:{port}" for port in tf_ports]
        for index, env in enumerate(envs):
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                           "task": {"type": "worker", "index": index}})
    return envs


def local_rank_envs(parts: tuple[tuple[str, tuple[str, ...]], ...]) -> list[dict[str, str]]:
    """rank_envs of a run whose ranks all run on this host (every node of a local broker),
    with MASTER_PORT, and with 2 or more ranks the TF_CONFIG ports, free here now."""
    world = sum(len(devices) for _, devices in parts)
    ports = free_ports(1 + world if world > 1 else 1)
    return rank_envs(parts, LOCAL_ADDR, ports[0], ports[1:] or None)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, theirs, ...), read from /proc."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                if child not in found:
                    found.append(child)
                    stack.append(child)
    return found


def _kill_all_but_me(ranks: dict[int, int]) -> None:
    """SIGKILL the ranks left and what they started: what is below them, and what is left in
    the run's group (the failed rank's own children, orphaned at its death)."""
    me = os.getpid()
    doomed = [p for rank in ranks for p in (rank, *descendants(rank))]
    # only as the group's leader (as launched): a group of someone else's is not the run's
    for entry in os.listdir("/proc") if os.getpgrp() == me else ():
        if entry.isdigit() and int(entry) != me:
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == me:
                    doomed.append(int(entry))
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def read_rank_failure(job_dir: Path, run_id: int) -> dict | None:
    """The rank that ended run `run_id` of the job in `job_dir` ({rank, world, exit_code}),
    if a rank did."""
    doc = read_json(job_dir / RANK_FAILURE)
    return doc if doc is not None and doc.get("run_id") == run_id else None


# ------------------------------------------------------------------ the run's process

def _relay(pipe, out_fd: int, prefix: bytes) -> None:
    """Copy a rank's output to the run's log, each line behind `prefix`."""
    rest = b""
    while chunk := os.read(pipe.fileno(), MAX_LINE):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        while len(rest) >= MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        if lines:
            os.write(out_fd, b"".join(prefix + line + b"\n" for line in lines))
    if rest:
        os.write(out_fd, prefix + rest + b"\n")
    pipe.close()


def _of_this_run(name: str) -> bool:
    run_dir, run_id = os.environ.get("MARBLE_RUN_DIR"), os.environ.get("MARBLE_RUN_ID")
    doc = read_json(Path(run_dir) / name) if run_dir else None
    return doc is not None and str(doc.get("run_id")) == run_id


class _Ranks:
    """The ranks this process started and the threads relaying their output."""

    def __init__(self, command: list[str]):
        self.command = command
        self.ranks: dict[int, int] = {}  # pid -> rank, of the run's ranks still running
        # held: a Popen dropped while its child runs is reaped by the next Popen (subprocess's
        # cleanup of dropped ones), and os.wait() below would never see that rank end
        self.procs: list[subprocess.Popen] = []
        self.relays: list[threading.Thread] = []

    def start(self, rank: int, extra: dict[str, str]) -> subprocess.Popen:
        try:
            proc = subprocess.Popen(self.command, env={**os.environ, **extra},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, restore_signals=True)
        except OSError as exc:
            for started in self.procs:
                started.kill()
            print(f"marbled: cannot run {self.command[0]!r}: {exc.strerror}", file=sys.stderr)
            _record_exit(1)
            _exit(1)
        self.ranks[proc.pid] = rank
        self.procs.append(proc)
        for pipe, fd in ((proc.stdout, 1), (proc.stderr, 2)):
            relay = threading.Thread(target=_relay, args=(pipe, fd, rank_prefix(rank)),
                                     daemon=True)
            relay.start()
            self.relays.append(relay)
        return proc


def rank_go_file(go_file: Path, rank: int, standby: int) -> Path:
    """Where prestarted rank `rank` of a per-GPU run waits for its part of the run's go.
    Named by the standby's process (`standby`, its pid): a cancelled rank still importing
    must read its own cancel, never the next standby's go."""
    return go_file.with_name(f"go-{standby}-rank-{rank}.json")


def _prestarted(count: int, run: _Ranks) -> tuple[list[dict[str, str]], list, list[Path]]:
    """A prestarted per-GPU run: start `count` ranks waiting in ready(), wait for the broker's
    go, and give each rank of the run its variables; (the run's rank variables, the ranks
    told to exit, the ranks' go files).

    The go names the run's nodes and GPUs, so the world size, the rendezvous and each rank's
    GPUs are known only now. Rank r of the run is the rank started r-th: a go with fewer
    ranks cancels the rest (they exit at once), one with more starts the missing ranks now,
    cold, as it does a rank that died while it waited."""
    go_file = Path(os.environ.pop(STANDBY_VAR))
    files = [rank_go_file(go_file, rank, os.getpid()) for rank in range(count)]
    waiting = []
    for rank, file in enumerate(files):
        file.unlink(missing_ok=True)
        waiting.append(run.start(rank, {STANDBY_VAR: str(file)}))
    broker = os.environ.get("MARBLE_BROKER_PID", "")
    go = wait_for_go(go_file, int(broker) if broker.isdigit() else None,
                     os.environ.get(STANDBY_BROKER_VAR))
    if go is None:  # dropped, or no broker: no waiting rank may outlive the standby
        _kill_all_but_me(run.ranks)
        _remove(files)
        _exit(0)
    parts = tuple((node, tuple(devices)) for node, devices in go.pop("parts"))
    os.environ.update({k: str(v) for k, v in go.items()})  # the run's, for the ranks started now
    envs = local_rank_envs(parts)
    for rank, env in enumerate(envs):
        if rank < count and waiting[rank].poll() is None:
            atomic_write_json(files[rank], {**go, **env}, durable=False)
        else:
            if rank < count:
                del run.ranks[waiting[rank].pid]
            run.start(rank, env)
    for rank in range(len(envs), count):
        atomic_write_json(files[rank], {"cancel": True}, durable=False)
        run.ranks.pop(waiting[rank].pid, None)
    return envs, waiting[len(envs):], files


def _remove(files: list[Path]) -> None:
    for file in files:
        file.unlink(missing_ok=True)


def _record_exit(code: int) -> None:
    """The run's exit, for a broker that adopts it after a restart (none for a standby that
    was never given a run)."""
    run_dir, run_id = os.environ.get("MARBLE_RUN_DIR"), os.environ.get("MARBLE_RUN_ID")
    if run_dir and run_id:
        try:
            write_exit(run_dir, run_id, code)
        except OSError as exc:
            print(f"marbled: cannot record the exit of run {run_id}: {exc}", file=sys.stderr)


def _exit(code: int) -> None:
    """End now with `code`, not through the interpreter's finalization: it restores every
    signal's default action first, and the group's SIGTERM of a stop that comes as the ranks
    end would then kill this process after it recorded their exit (-15 for a run whose
    ranks all completed: taken for one stopped, a plain command ran again)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m marbled.batch.ranks RANKS ARGV...\n  RANKS: the ranks' "
                 "variables (a JSON list), or how many ranks to prestart (they wait for the "
                 f"go file in ${STANDBY_VAR})")
    spec, command = json.loads(argv[0]), argv[1:]
    # The ranks get the group's SIGTERM (and SIGINT, SIGHUP) too: stay to see them end.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: None)
    run, cancelled, files = _Ranks(command), [], []
    if isinstance(spec, int):
        envs, cancelled, files = _prestarted(spec, run)
    else:
        envs = spec
        for rank, extra in enumerate(envs):  # rank 0 first
            run.start(rank, extra)
    ranks = run.ranks
    failed: tuple[int, int] | None = None  # (rank, exit code) of the first rank that failed
    stopped = ""  # what this process says of the ranks it stopped, once their lines are out
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failed is None:
            failed = (rank, code)
            if not (_of_this_run(ACK_FILE) or _of_this_run(SUSPEND_FILE)):
                _kill_all_but_me(ranks)
                if ranks:
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                    stopped = f"marbled: rank {rank} {how}; stopping the other {len(ranks)} rank(s)"
    for proc in cancelled:  # they exit as they read their go: none outlives the run
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        proc.kill()
    _remove(files)  # each rank has read its part by now, or is gone
    for relay in run.relays:  # a rank's own child may hold its pipe open: do not wait for it
        relay.join(timeout=1.0)
    if stopped:  # the last line (a rank's line relayed after it was the last before)
        print(stopped, file=sys.stderr, flush=True)
    if failed is None:
        _record_exit(0)
        _exit(0)
    rank, code = failed
    if os.environ.get("MARBLE_RUN_DIR"):
        atomic_write_json(Path(os.environ["MARBLE_RUN_DIR"]) / RANK_FAILURE,
                          {"run_id": int(os.environ.get("MARBLE_RUN_ID", "0")), "rank": rank,
                           "world": len(envs), "exit_code": code}, durable=False)
    _record_exit(code if code < 0 or 0 < code < 256 else 1)
    if code < 0:  # end as the rank did: the broker reads the signal from the exit status
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    _exit(code if 0 < code < 256 else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
