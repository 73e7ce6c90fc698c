"""A deliberately naive, loop-per-chunk transcription of the Lynx spec (lynx_ref.py docstring).

It shares no code with the vectorized reference except the tables, so the two agreeing means
the vectorization (reshapes, padding, chunk orders) is right. Small shapes only.
"""
import torch

from lynx_npu.codec import lynx_tables


def oracle_quantize(x: torch.Tensor, cfg, which: str):
    """x: [H, Tp, D] one page -> dict of anchor/residual codes [H,Tp,D] and per-value step."""
    h, tp, d = x.shape
    x = x.float().clone()
    thr = lynx_tables.thresholds(cfg.alpha(which), cfg.y_max(which))
    lv = lynx_tables.levels(cfg.alpha(which), cfg.y_max(which))
    anchor = torch.zeros(h, tp, d, dtype=torch.int64)
    residual = torch.zeros_like(anchor)
    spread = torch.zeros(h, tp, d)  # sigma * scale: xf units -> x units
    c = cfg.chunk(which)
    for hh in range(h):
        for dd in range(d):
            col = x[hh, :, dd]
            gmin, gmax = col.min(), col.max()
            scale = gmax - gmin
            inv = 1.0 / scale  # float32, once per channel; 0 if not finite (spec)
            xn = (col - gmin) * inv if torch.isfinite(inv) else torch.zeros_like(col)
            x[hh, :, dd] = xn
            spread[hh, :, dd] = scale
    chunks = []
    if cfg.axis(which) == "channel":
        for hh in range(h):
            for dd in range(d):
                for t0 in range(0, tp, c):
                    chunks.append((hh, slice(t0, min(t0 + c, tp)), dd))
    else:
        for hh in range(h):
            for t in range(tp):
                for d0 in range(0, d, c):
                    chunks.append((hh, t, slice(d0, min(d0 + c, d))))
    r = cfg.residual_bits(which)
    for idx in chunks:
        xn = x[idx]
        if cfg.center == "midrange":
            centre = (xn.max() + xn.min()) / 2
        else:  # adjacent-pairs tree, zero-padded to a power of two
            acc = list(xn.reshape(-1))
            while len(acc) & (len(acc) - 1):
                acc.append(torch.tensor(0.0))
            while len(acc) > 1:
                acc = [acc[i] + acc[i + 1] for i in range(0, len(acc), 2)]
            centre = acc[0] / xn.numel()
        if cfg.scalar_grid == "byte":  # u / 256 (round half up), then the first level >= need
            mu = torch.tensor(min(255, int(float(centre) * 256 + 0.5)) / 256)
            need = (xn - mu).abs().max()
            sigma = next((lvl for lvl in lynx_tables.sigma_levels() if lvl >= need),
                         lynx_tables.sigma_levels()[-1])
        else:
            mu = centre.half().float()
            sigma = (xn - mu).abs().max().half().float()
        xc = xn - mu
        inv = 1.0 / sigma
        xf = xc * inv if torch.isfinite(inv) else torch.zeros_like(xc)
        i = (thr.unsqueeze(0) <= xf.abs().reshape(-1, 1)).sum(1).reshape(xf.shape)
        m = (i + cfg.bias(which)) >> r
        residual[idx] = _residuals(xf.abs().reshape(-1), i.reshape(-1), m.reshape(-1), lv, r,
                                   cfg.y_max(which)).reshape(xf.shape)
        anchor[idx] = torch.where(xf < 0, -m - 1, m)
        spread[idx] = spread[idx] * sigma
    return anchor, residual, spread, lv


def _residuals(a, i, m, lv, r, y_max):
    """Per value: the residual field of code I with anchor magnitude m. A middle cell's is
    (m << r) - I. An end cell has 2^r levels, the k-th counted upwards from its bottom: cell 0's
    k = 0 (I = 0), 2 I - 1 + [|x| >= levels[I]] (0 < I < 2^(r-1)), 2^r - 1 (I = 2^(r-1)); the
    top cell's k = 2 (I - first) + [|x| >= levels[I]]; the field is (anchor's k - k) mod 2^r,
    the anchor's k being 0 in cell 0 and 2^r - 1 in the top cell."""
    n, half, top = 1 << r, 1 << (r - 1), y_max >> r
    out = []
    for av, iv, mv in zip(a.tolist(), i.tolist(), m.tolist()):
        if mv == 0:
            k = 0 if iv == 0 else (n - 1 if iv == half else 2 * iv - 1 + int(av >= lv[iv]))
            field = -k % n
        elif mv == top:
            k = 2 * (iv - (y_max - half + 1)) + int(av >= lv[iv])
            field = (n - 1 - k) % n
        else:
            field = ((mv << r) - iv) % n
        out.append(field - n if field >= half else field)
    return torch.tensor(out, dtype=torch.int64)
