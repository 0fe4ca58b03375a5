"""Which load to measure next, and what the measured levels say: the sweep's strategy.

Pure functions over measured levels (no store, no target), so the strategy is tested and
benchmarked against queueing ground truth directly (`benchmarks/sweep_accuracy.py`). The
parts: `probe` (what a level is and how it is judged), `plan` (the next probe), `model` (the
percentile against the rate, and what the levels say with confidence), `answer` (capacity,
interval, knee, limit).

Open loop (rates):

1. One client first (the method's first tier): its percentile is the unloaded latency and its
   throughput ``X1`` sets the first rate, ``X1 / 2`` (or ``--min-rate``).
2. Grow the rate geometrically (x2) while the level meets the SLO and the target keeps up.
3. Once a level fails, refine the bracket [highest passing, lowest failing rate] with longer
   levels (4x the base): at the model's capacity when a model can be read there (an
   interpolation, with levels near the SLO on both sides), else at the bracket's geometric
   midpoint; at most MAX_REFINE model-placed levels, and the search stops early once the
   capacity's interval is within the tolerance. A short growth level that passed only
   narrowly no longer vouches for its rate once a level has failed, and the bracket's passing
   end is measured again at the refining length before it is the answer ("confirm").
4. The capacity is the model's central estimate: the median of its bootstrap draws that agree
   with the bracket (a level passed at its low end, one missed at its high end), kept inside
   it; without a model, the bracket's passing end. (A low percentile of the draws, as before,
   landed 10-20% under the truth on working sweeps.) The model is fitted on the rate each level
   ACHIEVED: a short Poisson level's arrivals run a few percent off the offered rate, and its
   percentile follows the arrivals that came. Its interval is what the levels say with
   confidence: between the highest rate whose level met the SLO beyond its own noise and the
   lowest whose level missed it beyond its noise (or could not keep up at all); where no level
   did, the bootstrap's 95% bound stands in, the upper one capped at the bracket's failing end
   stretched by the bracket's width.
5. An inconclusive level is measured once more, at the same rate with its own seed, before it
   counts ("again"): one the load generator decided (it held requests back by enough to tip the
   level over the SLO; lag inside a level that met the SLO is already in its latency, counted
   from the intended send), or one that met the SLO but was INVALID (unstable halves, too few
   queries). Send lag moved 0.2-3.6 ms between identical quiet runs, and one such level used
   to end the sweep. A rate the generator decides twice caps the capacity (`generator`), and
   the search goes on below it. Every level has its own workload seed (from the experiment's
   and the level's position), so a seed whose arrivals run fast, or whose halves differ, does
   not bias or fail every level alike.

Why levels near capacity need care: a queue's latencies are autocorrelated and its tail is
set by a few busy periods, so one level's P99 is noisy and biased low when short. Simulated
M/M/c levels near capacity had a log-standard deviation of 0.19 at 20 s measured (0.23 at 5 s,
0.13 at 80 s) and a median 7% low (18% at 5 s), while batch means of their 1 s windows said
3-5x less noise. The model assumes at least that noise (NOISE_AT_20S) and corrects the bias
(BIAS_AT_20S), both scaled by the measured seconds. A tail fit (exponential above P80 or P90)
in place of the sample P99 cut the noise only from 0.19 to 0.15-0.18 in the same simulation:
the autocorrelation, not the order statistic, dominates, so it is not used.

The model: ln(percentile) as a straight line in ln(rate), fitted by weighted least squares
with a Gaussian kernel in ln(P / SLO) (KERNEL_WIDTH), so only levels near the crossing decide
it: the curve is flat near the unloaded latency and has a pole at saturation, and no single
global form fits both M/M/1 and M/M/8.

Measured (`benchmarks/sweep_accuracy.py`, simulated levels, 20 seeds each, SLO P99 <= 100 ms;
the README of benchmarks/ has the table), with the central estimate (the median of the
bootstrap draws inside the bracket): within +-10% of the truth in 14 (M/M/1), 20 (M/M/2),
20 (M/M/4), 19 (M/M/8), 20 (M/G/4) and 20 (M/D/2) of 20 sweeps (within +-5%: 8, 16, 18, 17,
20, 19); the interval covers the truth in 19, 20, 20, 20, 20, 18 of 20; 0.34-0.48 of the
measured seconds of a perf_analyzer-style binary search (within +-10%: 10, 15, 19, 20, 20,
20). The gentle curve of M/M/1 is the hard one: at +-5% in rate its P99 moves only ~6%
(elasticity ~1.2), well inside one level's noise, so no level short of minutes pins it.
`--real` sweeps such queues with real levels (`benchmarks/sweep_real.py`).

Closed loop (clients): 1, 2, 4, ... clients until the SLO breaks or throughput stops growing
(< 5% more for twice the clients), then bisection of the client count between the last
passing and the first failing level. The capacity is the highest throughput that met the SLO.
"""

from __future__ import annotations

from optlab.store.sweep_result import LIMITS, Limit
from optlab.sweep.answer import conclude, knee
from optlab.sweep.plan import next_probe
from optlab.sweep.probe import Level, Mode, Probe, Settings, judge

__all__ = [
    "LIMITS",
    "Level",
    "Limit",
    "Mode",
    "Probe",
    "Settings",
    "conclude",
    "judge",
    "knee",
    "next_probe",
]
