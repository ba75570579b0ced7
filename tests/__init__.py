"""marbled's tests, by tier (the directories); REPO is the checkout they run from."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # jobscripts/, contrib/: not in the package
