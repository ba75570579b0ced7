"""marbled's tests, by tier (the directories); REPO is the checkout they run from."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # contrib/ is not in the package
