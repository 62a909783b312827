"""Hydra configs of scalelab, shipped in the package (Hydra reads them as pkg://scalelab.conf)."""
