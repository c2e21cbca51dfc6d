"""seam: training data for long-horizon coding agents that compact their own context."""

__version__ = "0.1.0"
