"""The device under test: `REPLAYSSM_TEST_DEVICE=cuda python -m pytest` runs the same tests on the GPU."""

import os

TEST_DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")
