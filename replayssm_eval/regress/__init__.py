"""The numerics regression suite (`suite`), its comparison with the committed baseline (`compare`), and the
conformance check of an external decode kernel (`conformance`): `replayssm-eval regress`."""

from pathlib import Path

BASELINE = Path(__file__).with_name("baseline.json")  # the committed baseline
