"""The ready training scripts and batch scripts that ship in the package (jobscripts/), by
name: `marble example NAME`, or `python -m marbled.examples NAME` where the broker's
dependencies are not installed (a training image). Standard library only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

SCRIPTS = Path(__file__).resolve().parent / "jobscripts"  # linked from the checkout's top


class Example(NamedTuple):
    file: str
    summary: str
    usage: str  # how to run it once saved as `file`


EXAMPLES = {
    "torch": Example(
        "train_torch.py", "PyTorch: LeNet-5 or a small ResNet, on synthetic data; DDP too",
        "marble submit --model lenet --steps 400 -- python train_torch.py --arch lenet"),
    "tf": Example(
        "train_tf.py", "TensorFlow 2 / Keras 3: the same; a tf.function loop or model.fit",
        "marble submit --model lenet --steps 400 -- python train_tf.py --arch lenet"),
    "ddp": Example(
        "train_ddp.py", "PyTorch DDP, one process per GPU: an MLP on synthetic data",
        "marble submit --steps 2000 --per-gpu -- python train_ddp.py"),
    "sbatch": Example(
        "marble.sbatch", "Slurm batch script: the broker, a job set, the allocation's end",
        "sbatch marble.sbatch jobs.yaml"),
    "sbatch-chain": Example(
        "marble-chain.sbatch", "the same, resubmitting itself until every job has ended",
        "sbatch marble-chain.sbatch jobs.yaml"),
}
ALIASES = {"pytorch": "torch", "tensorflow": "tf", "keras": "tf", "slurm": "sbatch"}


class UnknownExample(LookupError):
    pass


def find(name: str) -> tuple[str, Example]:
    """The example of a name or an alias (any case), with its canonical name."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in EXAMPLES:
        raise UnknownExample(f"no example named '{name}'; the examples are "
                             f"{', '.join(EXAMPLES)} (also {', '.join(ALIASES)})")
    return key, EXAMPLES[key]


def text(name: str) -> str:
    return (SCRIPTS / find(name)[1].file).read_text()


def listing(prog: str = "marble example") -> str:
    """The examples as a table, and how to use one (`prog NAME` prints it)."""
    name_w = max(map(len, EXAMPLES))
    file_w = max(len(ex.file) for ex in EXAMPLES.values())
    lines = [f"{key:<{name_w}}  {ex.file:<{file_w}}  {ex.summary}"
             for key, ex in EXAMPLES.items()]
    also = ", ".join(f"{alias} ({key})" for alias, key in ALIASES.items())
    torch = EXAMPLES["torch"]
    return "\n".join([*lines, f"also: {also}", "",
                      f"{prog} torch > {torch.file}, then:", f"  {torch.usage}"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m marbled.examples [NAME] > FILE", file=sys.stderr)
        return 2
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m marbled.examples [NAME] > FILE\n\n"
              "Print a ready script (with no NAME: list them); `marble example`, where the\n"
              "broker is installed, does the same.\n")
        print(listing("python -m marbled.examples"))
        return 0
    try:
        sys.stdout.write(text(args[0]))
    except UnknownExample as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
