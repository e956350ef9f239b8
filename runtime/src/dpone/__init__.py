"""dpone runtime: the pure planning core and the pieces that run in a pod."""

__version__ = "0.1.0"
