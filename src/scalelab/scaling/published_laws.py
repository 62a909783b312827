"""Published scaling laws L(N, D) = E + A/N^alpha + B/D^beta, and their closed forms."""

from __future__ import annotations

import numpy as np

# Hoffmann et al. (2022), eq. 10 (Approach 3 fit).
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
# Besiroglu et al. (2024), "Chinchilla Scaling: A replication attempt" (Epoch AI).
EPOCH_2024 = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}


def law_loss(n, d, law: dict[str, float] = CHINCHILLA) -> np.ndarray:
    """L(N, D) = E + A/N^alpha + B/D^beta."""
    n, d = np.asarray(n, float), np.asarray(d, float)
    return law["E"] + law["A"] / n ** law["alpha"] + law["B"] / d ** law["beta"]


def law_n_opt(c, law: dict[str, float] = CHINCHILLA) -> np.ndarray:
    """Closed-form compute-optimal N under C = 6ND."""
    al, be = law["alpha"], law["beta"]
    g = (al * law["A"] / (be * law["B"])) ** (1 / (al + be))
    return g * (np.asarray(c, float) / 6) ** (be / (al + be))
