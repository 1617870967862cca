"""replayssm-eval: accuracy and numerics evaluation for ReplaySSM split-precision SSM state."""

__version__ = "0.1.0"
