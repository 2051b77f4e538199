"""NumPy references for the float8 scale searches, shared by the addons op tests and the
LinearFP8 tests."""
import numpy as np

import popxl


def ref_device_scale(x, dtype):
    """The on-device estimate as documented, written out with scalar float32 loops: a
    histogram of |x| over the binades [2^(k-1), 2^k) for k = -125 .. 127 (levels in x's
    dtype, so float16 sees levels below 2^-24 as 0 and from 2^16 up as inf; values at or above
    the top level 2^127 in the last bin), then per scaling bias b = 0 .. 61 the sequential
    float32 sum over bins c = 1 .. 253 of the underflow / rounding / overflow cost."""
    fmt = {popxl.float8_143: (3, -10, 7), popxl.float8_152: (2, -17, 15)}[dtype]
    mant, emin, emax = fmt
    first = emin - 31 + 126                      # where the range starts at bias 0
    span = emax - emin + 1
    qerr = np.float32(2.0 ** (-2 * (10 - mant)))  # upstream passes a popxl dtype: fp16's 10 bits
    levels = [np.float32(2.0 ** k) for k in range(-126, 128)]
    with np.errstate(over="ignore", under="ignore"):
        typed = [float(np.asarray(v).astype(x.dtype)) for v in levels]
    counts = np.zeros(255)
    for v in np.abs(x.astype(np.float64)).ravel():
        counts[sum(1 for lv in typed if lv <= v)] += 1
    h = (counts.astype(np.float32) / np.float32(x.size))[1:]
    costs = []
    for b in range(62):
        u, o = first + b, first + span + b
        acc = np.float32(0)
        with np.errstate(over="ignore"):
            for c in range(1, 254):
                if c < u:
                    acc += h[c] * levels[c] * levels[c]
                elif c < o:
                    acc += h[c] * levels[c] * levels[c] * qerr
                else:
                    d = levels[o - 1] - levels[c]
                    acc += h[c] * d * d
        costs.append(acc)
    best = min(costs)
    ties = sum(1 for c in costs if c == best)
    return -(costs.index(best) + ties // 2 - 31)
