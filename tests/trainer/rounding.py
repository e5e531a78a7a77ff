"""How far two float32 computations of one quantity may differ when only their rounding differs: the
tolerance of the trainer's numerical tests, derived from the arithmetic instead of chosen.

Two paths that compute the same value (the update on the device and its host-side reference, chunked and
whole logits, one micro-batch and four) add the same terms in different orders, and so do the kernels a CPU
picks (oneDNN and MKL by instruction set, torch by thread count). A sum of ``n`` float32 terms in any order is
within ``λ √n u Σ|terms|`` of the exact sum with probability at least ``1 - 2 exp(-λ² / 2)`` (Higham and Mary,
"A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019), ``u = 2⁻²⁴``; the
worst case, ``n u``, is reached only by adversarial inputs. Each path is that far from exact, so they are at
most twice that apart; a network chains many sums, of which the longest dominates (the vocabulary's, in
every log-softmax and in the backward of the output layer; the others have at most a few hundred terms),
and ``CHAIN`` allows as much again for all the others together.

So a quantity computed from terms of size ``scale`` through sums of at most ``n`` terms may differ between two
paths by ``rounding(n, scale)``. The test names the scale of the terms a statistic is computed from, which
is not the statistic's own size: the approximate KL (about 0.01) is a mean of differences of log-probs of
about 10, so its rounding is 10's. Defects a tolerance exists to catch change a result by a large fraction
of its own size (a wrong mask, denominator or advantage sign: tens of percent to a sign), far above these.
"""

from __future__ import annotations

import math

# float32's unit roundoff.
U32 = 2.0**-24
# At λ = 6 a sum exceeds the bound with probability below 3e-8: none of the ~10⁶ values a test compares.
LAMBDA = 6.0
# The rounding of every shorter sum of the chain, together, at most as much again as the longest one's.
CHAIN = 2.0


def rounding(n: int, scale: float) -> float:
    """The most two float32 computations of a value may differ: each within ``λ √n u scale`` of exact for
    the longest of its sums (``n`` terms of size ``scale``), ``CHAIN`` times that for the whole chain."""
    if n < 1 or scale < 0:
        raise ValueError(f"rounding needs n >= 1 and scale >= 0, got n={n}, scale={scale}")
    return 2 * CHAIN * LAMBDA * math.sqrt(n) * U32 * scale
