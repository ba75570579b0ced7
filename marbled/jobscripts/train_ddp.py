"""A PyTorch DistributedDataParallel job, one process per GPU, that marbled suspends and
resumes on another GPU count. The same script runs unchanged on any count, as one
process when it is started alone.

    marble example ddp > train_ddp.py
    python train_ddp.py --steps 300                                # one process
    torchrun --standalone --nproc-per-node=2 train_ddp.py          # two, by torchrun

What a DDP script adds for marbled: `init_distributed()` (the env:// rendezvous with a
bounded timeout, and the device), `Suspendable(model, optimizer, global_batch=...)`
BEFORE `DDP(model)` (every rank restores the checkpoint, which holds the unwrapped
model), and the loop over `run.steps()` with this rank's rows of each step's global
batch (`run.batch`). The global batch stays the same on any count; `--linear-scaling`
instead keeps the batch per rank and scales the learning rate with the count.

The model is a small MLP on synthetic data: the global batch of step s is a pure function
of (seed, s), so that a run resumed on another count continues the same data order.
The learning task is a fixed random linear teacher. On CPUs the ranks use gloo.
"""

from marbled.worker.protocol import JobProtocol

JobProtocol.current()  # first: a suspension asked during the imports is not lost

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch import distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from marbled.worker.torch import Suspendable, init_distributed, mean_over_ranks  # noqa: E402

FEATURES, CLASSES = 32, 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_ddp", description="Suspendable PyTorch DDP training on synthetic data.")
    p.add_argument("--steps", type=int, default=None,
                   help="steps in all, across suspensions (default: MARBLE_TARGET_STEPS, "
                        "else 200)")
    p.add_argument("--batch", type=int, default=64,
                   help="the global batch: rows per step over all ranks, on any count")
    p.add_argument("--linear-scaling", action="store_true",
                   help="--batch is per rank instead, and the learning rate is scaled by "
                        "the rank count (the linear scaling rule)")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="Adam learning rate (for one rank with --linear-scaling)")
    p.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-log", metavar="FILE",
                   help="rank 0 appends 'step loss' (the global batch's mean loss) for every "
                        "step; a {rank} in FILE: every rank writes its own")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a rank whose peer died fails after this long (torch's default: 30 min)")
    p.add_argument("--report-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress reports (default: MARBLE_REPORT_INTERVAL, "
                        "else 1)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch threads per rank (one process per core on CPUs)")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = int(os.environ.get("MARBLE_TARGET_STEPS") or 200)
    if min(args.steps, args.batch, args.hidden, args.threads) < 1 or args.timeout <= 0:
        p.error("--steps, --batch, --hidden, --threads and --timeout must be positive")
    return args


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


class SyntheticData:
    """The global batch of a step, the same on every rank and every count."""

    def __init__(self, seed: int):
        self.seed = seed
        g = torch.Generator().manual_seed(seed * 1_000_003 - 1)  # never a step's seed
        self.teacher = torch.randn((FEATURES, CLASSES), generator=g)

    def __call__(self, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        x = torch.randn((rows, FEATURES), generator=g)
        return x, (x @ self.teacher).argmax(dim=1)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same initial model on every rank
    # Built on the CPU before the rendezvous, the optimizer too (making the first one
    # imports seconds more of torch): a prestarted rank has done it when its go comes.
    model = build_model(args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    ranks = init_distributed(timeout=args.timeout)  # a prestarted rank waits here for its run
    model.to(ranks.device)  # in place, before the restore, which puts Adam's state there too
    batch = {"batch_per_rank": args.batch} if args.linear_scaling else {"global_batch": args.batch}
    run = Suspendable(model, optimizer, steps=args.steps, **batch)  # restores, on every rank
    if args.report_interval is not None:
        run.protocol.report_interval = args.report_interval
    net = DDP(model) if dist.is_initialized() else model  # after the restore
    data, loss_fn = SyntheticData(args.seed), nn.CrossEntropyLoss()
    log = None
    if args.loss_log and ("{rank}" in args.loss_log or ranks.rank == 0):
        log = open(args.loss_log.format(rank=ranks.rank), "a", buffering=1)  # noqa: SIM115
    if ranks.rank == 0:
        print(f"train_ddp: rank 0 of {ranks.world} on {ranks.device}, steps {run.start}->"
              f"{run.target}, global batch {run.batch.size}", file=sys.stderr, flush=True)
    loss = None
    for step in run.steps():  # every rank stops at the same step when the broker asks
        x, y = run.batch.take(*data(step, run.batch.size))
        optimizer.zero_grad(set_to_none=True)
        local = loss_fn(net(x.to(ranks.device)), y.to(ranks.device)) * run.batch.weight
        local.backward()
        optimizer.step()
        if args.loss_log or step == run.target:  # the same on every rank: a collective
            loss = mean_over_ranks(local)  # the mean over the global batch
            if log:
                log.write(f"{step} {loss!r}\n")  # line-buffered: written before any exit
    if ranks.rank == 0:
        print(f"train_ddp: steps={run.step} (this run {run.start}->{run.step}) on {ranks.world} "
              f"rank(s), final_loss={'n/a' if loss is None else repr(loss)}", flush=True)


def main() -> None:
    train(parse_args())
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group() or interpreter teardown: after gloo or NCCL these abort
    # a rank (SIGABRT) in 10-35% of exits, which the broker would count as a failure.
    os._exit(0)


if __name__ == "__main__":
    main()
