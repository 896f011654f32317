"""Online latency models for predicted-latency-producer: windowed least squares per endpoint, in process.

Each model keeps the sums XᵀX and Xᵀy of its last `window` samples (a ring buffer; the oldest sample is
subtracted as a new one arrives, and the sums are rebuilt from the buffer once per window against drift), so an
update is O(d²) and a fit one d×d solve, done lazily when a prediction needs it. A small ridge on the slopes keeps
the solve stable when a feature has not varied yet, and slopes are kept non-negative (more load never predicts
less latency): a negative slope is pinned to 0 and the rest refitted. No sidecar, no thread: a few microseconds
of numpy per request on the event loop.

`LatencyModels` holds one model per endpoint plus a pooled one (llm-d's predictor is pooled: the pool is assumed
homogeneous), and the prediction error of each: an endpoint uses its own model once it has `min_samples` and
predicts within `max_error` (relative, an exponential average), else the pooled one if that one is fit, else
nothing (the caller falls back to its non-latency path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


class WindowedLeastSquares:
    """y ≈ x·θ over the last `window` samples; x[0] is the constant 1 (the intercept)."""

    def __init__(self, dims: int, window: int = 256, ridge: float = 1e-3) -> None:
        self.dims = dims
        self.window = window
        self.ridge = ridge
        self._x = np.zeros((window, dims))
        self._y = np.zeros(window)
        self._xtx = np.zeros((dims, dims))
        self._xty = np.zeros(dims)
        self._pos = 0
        self.count = 0  # samples in the window
        self.total = 0  # samples ever added
        self._theta: Vector | None = None

    def add(self, x: Vector, y: float) -> None:
        pos = self._pos
        if self.count == self.window:
            old = self._x[pos]
            self._xtx -= np.outer(old, old)
            self._xty -= old * self._y[pos]
        else:
            self.count += 1
        self._x[pos] = x
        self._y[pos] = y
        self._xtx += np.outer(x, x)
        self._xty += x * y
        self._pos = (pos + 1) % self.window
        self.total += 1
        if self.total % self.window == 0:  # rebuild the sums: no drift from adding and subtracting forever
            xs, ys = self._x[: self.count], self._y[: self.count]
            self._xtx = xs.T @ xs
            self._xty = xs.T @ ys
        self._theta = None

    def coefficients(self) -> Vector:
        """θ (fitted on demand); zeros before the first sample."""
        if self._theta is None:
            self._theta = self._fit()
        return self._theta

    def _fit(self) -> Vector:
        d = self.dims
        theta = np.zeros(d)
        if self.count == 0:
            return theta
        penalty = np.full(d, self.ridge * self.count)
        penalty[0] = 0.0  # the intercept is not shrunk
        a = self._xtx + np.diag(penalty)
        free = np.ones(d, dtype=bool)
        for _ in range(d):  # active set: pin negative slopes to 0 and refit the rest
            idx = np.flatnonzero(free)
            try:
                sol = np.linalg.solve(a[np.ix_(idx, idx)], self._xty[idx])
            except np.linalg.LinAlgError:
                sol = np.linalg.lstsq(a[np.ix_(idx, idx)], self._xty[idx], rcond=None)[0]
            theta[:] = 0.0
            theta[idx] = sol
            negative = (theta < 0.0) & free
            negative[0] = False
            if not negative.any():
                break
            free &= ~negative
        return theta


@dataclass(slots=True)
class _Fit:
    """Relative prediction error of one model, as an exponential average of |pred − actual| / actual."""

    error: float = 0.0
    evaluated: int = 0

    def record(self, predicted: float, actual: float, alpha: float) -> float:
        rel = abs(predicted - actual) / max(actual, 1.0)
        self.error = rel if self.evaluated == 0 else (1 - alpha) * self.error + alpha * rel
        self.evaluated += 1
        return rel


class LatencyModels:
    """Per-endpoint and pooled models of one latency target (TTFT or TPOT, in ms)."""

    POOLED = ""

    def __init__(
        self, dims: int, window: int = 256, min_samples: int = 16, max_error: float = 0.5, alpha: float = 0.1
    ) -> None:
        self.dims = dims
        self.window = window
        self.min_samples = min_samples
        self.max_error = max_error
        self.alpha = alpha
        self.models: dict[str, WindowedLeastSquares] = {self.POOLED: WindowedLeastSquares(dims, window)}
        self.fits: dict[str, _Fit] = {self.POOLED: _Fit()}

    def observe(self, endpoint: str, x: Vector, y: float) -> None:
        """A measured sample: first score each model on it (prequential error), then learn from it."""
        m = self.models.get(endpoint)
        if m is None:
            m = self.models[endpoint] = WindowedLeastSquares(self.dims, self.window)
            self.fits[endpoint] = _Fit()
        pooled = self.models[self.POOLED]
        for key, model in ((endpoint, m), (self.POOLED, pooled)):
            if model.count >= self.min_samples:
                self.fits[key].record(max(0.0, float(x @ model.coefficients())), y, self.alpha)
        m.add(x, y)
        pooled.add(x, y)

    def forget(self, endpoint: str) -> None:
        self.models.pop(endpoint, None)
        self.fits.pop(endpoint, None)

    def _usable(self, key: str) -> bool:
        m = self.models.get(key)
        if m is None or m.count < self.min_samples:
            return False
        f = self.fits[key]
        return f.evaluated < self.min_samples or f.error <= self.max_error

    def model_for(self, endpoint: str) -> str | None:
        """Which model predicts for `endpoint`: its own, the pooled one, or None (cold or unfit)."""
        if self._usable(endpoint):
            return endpoint
        if self._usable(self.POOLED):
            return self.POOLED
        return None

    def predict(self, key: str, x: Vector) -> float:
        return max(0.0, float(x @ self.models[key].coefficients()))

    def predict_many(self, keys: Sequence[str], rows: Sequence[Sequence[float]]) -> list[float]:
        """One prediction per row, row i with model keys[i]: one vectorized product for all endpoints."""
        thetas = np.array([self.models[k].coefficients() for k in keys])
        out: list[float] = np.maximum(0.0, (np.array(rows) * thetas).sum(axis=1)).tolist()
        return out

    def cold(self) -> bool:
        return self.models[self.POOLED].count < self.min_samples
