"""scalelab: transformer experiments and scaling-law studies."""

__version__ = "0.1.0"
