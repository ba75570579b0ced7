"""A suspendable PyTorch training job on synthetic data (LeNet-5 or a small ResNet), one
process per GPU (DistributedDataParallel) or one process.

Runs under marbled (checkpoints in MARBLE_CHECKPOINT_DIR, target steps from
MARBLE_TARGET_STEPS) or alone (checkpoints in ./marble-checkpoint). Started alone, or
by a job without --per-gpu, it is one process, which trains on the first GPU of
CUDA_VISIBLE_DEVICES where CUDA sees one, else on the CPU (on a machine without GPUs
the broker hands out emulated GPU ids, only counted and reported). Started once per
GPU (`marble submit --per-gpu`, torchrun, srun), it is a DDP rank: `init_distributed()`
joins the env:// rendezvous, each rank trains its rows of the step's global batch
(--batch, the same on any count) on its GPU (gloo on CPUs), and every rank stops at
the step they agree on. All it adds for marbled is `init_distributed()`, one object
and one loop (`Suspendable`, `run.steps()`). The model is built on the CPU before
`init_distributed()` and `Suspendable(...)`, so the broker may prestart one process:
the next run's process imports torch and builds while the previous run checkpoints,
then waits for its GPUs there, and moves to its GPU after.

The batch of global step s is a pure function of (seed, s), so no data-loader state
needs checkpointing, and on the CPU a suspended and resumed run computes the same losses
as an uninterrupted one with the same thread count (--threads), bit for bit. Labels are
learnable: each class has a fixed, smooth random prototype image (7x7 noise,
upsampled) and a sample is its class's prototype plus pixel noise of the same strength.

    marble example torch > train_torch.py      # this script, from the installed package
    python train_torch.py --arch lenet --steps 400 --loss-log losses.txt
    torchrun --standalone --nproc-per-node=2 train_torch.py --arch resnet   # 2 ranks
"""

import argparse
import os
import random
import sys

import torch
from torch import distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from marbled.worker.torch import Suspendable, init_distributed, mean_over_ranks

CLASSES = 10
INPUT_SHAPE = {"lenet": (1, 28, 28), "resnet": (3, 32, 32)}
NOISE = 1.0  # std of the per-pixel noise around the class prototype (whose std is 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_torch",
        description="Suspendable PyTorch training on synthetic data (a GPU, else the CPU; "
                    "one process per GPU under DDP).")
    p.add_argument("--arch", choices=sorted(INPUT_SHAPE), default="lenet")
    p.add_argument("--steps", type=int, default=None,
                   help="steps in all, across suspensions (default: MARBLE_TARGET_STEPS, "
                        "else 200)")
    p.add_argument("--batch", type=int, default=64,
                   help="the global batch: rows per step over all ranks, on any count")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-log", metavar="FILE",
                   help="append 'step loss' for every completed step (rank 0: the "
                        "global batch's mean loss)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (0: only when suspended, and at the end)")
    p.add_argument("--report-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress reports to the broker "
                        "(default: MARBLE_REPORT_INTERVAL, else 1)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's choice); losses are "
                        "bit-identical across runs only with the same thread count")
    p.add_argument("--no-fast-exit", dest="fast_exit", action="store_false",
                   help="end with a normal interpreter teardown instead of os._exit(0) "
                        "(one process only: a DDP rank always ends with os._exit(0))")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = int(os.environ.get("MARBLE_TARGET_STEPS") or 200)
    if (args.steps < 1 or args.batch < 1 or args.checkpoint_every < 0
            or (args.threads is not None and args.threads < 1)):
        p.error("--steps, --batch and --threads must be >= 1, --checkpoint-every >= 0")
    return args


# -- models


class LeNet5(nn.Module):
    """LeNet-5 for 1x28x28 input (the first convolution pads to 32x32's geometry)."""

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-14 for 3x32x32 input: 3 stages of 16/32/64 channels x 2 basic blocks."""

    def __init__(self, classes: int = CLASSES, widths: tuple[int, ...] = (16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            for j in range(2):
                blocks.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(arch: str) -> nn.Module:
    return LeNet5() if arch == "lenet" else SmallResNet()


# -- data: a pure function of (seed, step)


class SyntheticData:
    def __init__(self, arch: str, batch: int, seed: int):
        self.shape = INPUT_SHAPE[arch]
        self.batch = batch
        self.seed = seed
        g = torch.Generator().manual_seed(seed * 1_000_003 - 1)  # never a step's seed
        channels, height, width = self.shape
        coarse = torch.randn((CLASSES, channels, 7, 7), generator=g)
        smooth = F.interpolate(coarse, size=(height, width), mode="bilinear",
                               align_corners=False)
        self.prototypes = smooth / smooth.std()

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of global step `step` (1-based)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        labels = torch.randint(0, CLASSES, (self.batch,), generator=g)
        noise = torch.randn((self.batch, *self.shape), generator=g)
        return self.prototypes[labels] + NOISE * noise, labels


# -- the job


def visible_devices() -> int:
    return len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])


def to_training_device(model: nn.Module, optimizer: torch.optim.Optimizer,
                       device: torch.device) -> None:
    """Move the model and its optimizer's state to this rank's device (`init_distributed()`'s:
    the run's first GPU, or the rank's own, else the CPU). Only after Suspendable(...): a
    prestarted process learns its GPUs in init_distributed(), and the restore loaded onto
    the CPU."""
    model.to(device)
    for state in optimizer.state.values():  # Adam's moments, restored on the CPU
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":  # Adam keeps its step on the CPU
                state[key] = value.to(device)


def train(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model = build_model(args.arch)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)  # imports torch._dynamo
    data = SyntheticData(args.arch, args.batch, args.seed)
    loss_fn = nn.CrossEntropyLoss()
    # A process the broker prestarted waits in here (imports and build done, ~4 s) until
    # the old run has checkpointed; it then gets its run id and GPUs. One per GPU: the
    # ranks join their process group (none when started alone).
    ranks = init_distributed()
    # every rank restores the checkpoint, which holds the unwrapped model
    run = Suspendable(model, optimizer, steps=args.steps, every=args.checkpoint_every,
                      fast_exit=args.fast_exit, global_batch=args.batch)
    if args.report_interval is not None:
        run.protocol.report_interval = args.report_interval
    device = ranks.device
    to_training_device(model, optimizer, device)
    net = DDP(model) if dist.is_initialized() else model  # after the restore
    where = (f"GPU {torch.cuda.get_device_name(device)} ({device})" if device.type == "cuda"
             else f"the CPU with {torch.get_num_threads()} threads")
    ddp = f"; rank 0 of {ranks.world}, global batch {args.batch}" if ranks.world > 1 else ""
    if ranks.rank == 0:
        print(f"train_torch: CUDA_VISIBLE_DEVICES lists {visible_devices()} device(s) "
              f"(emulated GPU ids where there are no GPUs); training on {where}{ddp}",
              file=sys.stderr, flush=True)

    log = None
    if args.loss_log and ranks.rank == 0:
        log = open(args.loss_log, "a", buffering=1)  # noqa: SIM115
    loss = None
    model.train()
    for step in run.steps():  # every rank stops at the same step when the broker asks
        x, y = (t.to(device) for t in run.batch.take(*data(step)))  # this rank's rows
        optimizer.zero_grad(set_to_none=True)
        batch_loss = loss_fn(net(x), y)
        if run.batch.weight != 1:  # an uneven split: DDP's mean is then the batch's mean
            batch_loss = batch_loss * run.batch.weight
        batch_loss.backward()
        optimizer.step()
        # one process: every step (.item() also waits for the GPU, so that the reported
        # step times are the GPU's); several: a collective, so the same steps on every rank
        if ranks.world == 1 or args.loss_log or step == run.target:
            loss = mean_over_ranks(batch_loss)
            if log:
                log.write(f"{step} {loss!r}\n")  # line-buffered: written before any exit
    if log:
        log.close()
    final = "n/a (nothing to train)" if loss is None else repr(loss)
    if ranks.rank == 0:
        print(f"train_torch: arch={args.arch} steps={run.step} (this run {run.start}->"
              f"{run.step}) final_loss={final}{ddp}", flush=True)
    return 0


def main() -> None:
    args = parse_args()
    code = train(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the ~1 s teardown with torch loaded: the GPUs free at once; after gloo or NCCL a
    # teardown (or destroy_process_group()) aborts a rank in 10-35% of exits
    if args.fast_exit or dist.is_initialized():
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
