"""The recent-token window (``recent_tokens``, lynx_layout.window_layout, lynx_stream.py): the
page(s) holding a layer's last tokens carry those rows' residual codes and exact scalars after
the anchor, so the anchor stage restores them as the full stage does; their residual stream
leaves those rows out (payload format 9), so each code crosses the wire once; nothing else
changes."""
import pytest
import torch

import lynx_npu
from lynx_npu.codec.lynx_layout import (RECENT_SHARE, page_spans, recent_window,
                                        residual_nbytes, rows_left_out, stream_layout,
                                        window_rows, window_start)
from lynx_npu.codec.lynx_stream import trim_residual, window_residual
from lynx_npu.codec.packing import packed_nbytes

H, D = 3, 64


def kv(t, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(H, t, D, generator=g) * 2 + torch.randn(1, 1, D, generator=g) * 4)
    v = torch.randn(H, t, D, generator=g)
    return k.to(dtype), v.to(dtype)


def codecs(**kw):
    return lynx_npu.get_codec("lynx", **kw), lynx_npu.get_codec("lynx", recent_tokens=0, **kw)


@pytest.mark.parametrize("grid", ["byte", "float16"])
@pytest.mark.parametrize("tokens, page_size", [(3000, 256), (2569, 64), (2048 + 4, 256)])
def test_the_window_restores_the_last_tokens_at_the_anchor_stage(tokens, page_size, grid):
    """Window rows: bit for bit the full stage's; V's other tokens (chunks within a token) and
    K's tokens outside the window's chunks: bit for bit the window-less anchor's."""
    win, plain = codecs(page_size=page_size, scalar_grid=grid)
    k, v = kv(tokens, seed=tokens)
    w = recent_window(win.config, tokens)
    assert w == 32  # every layer of 32 x 64 = 2048 tokens or more
    enc, enc0 = win.encode(k, v), plain.encode(k, v)
    full, full0 = win.decode(enc, "full"), plain.decode(enc0, "full")
    anchor, anchor0 = win.decode(enc, "anchor"), plain.decode(enc0, "anchor")
    for x, x0 in zip(full, full0):
        assert torch.equal(x, x0)  # the full stage does not change
    last = slice(tokens - w, tokens)
    for xa, xf in zip(anchor, full):
        assert torch.equal(xa[:, last], xf[:, last])
    assert not torch.equal(anchor0[1][:, last], full0[1][:, last])  # it was not so before
    assert torch.equal(anchor[1][:, :tokens - w], anchor0[1][:, :tokens - w])
    spans = page_spans(win.config, tokens)
    first_chunk = min(s.body_start + (s.num_tokens - window_rows(win.config, s.body_start,
                                                                 s.token_end, tokens))
                      // 32 * 32 for s in spans
                      if window_rows(win.config, s.body_start, s.token_end, tokens))
    assert torch.equal(anchor[0][:, :first_chunk], anchor0[0][:, :first_chunk])
    err = [(x.float() - y.float()).pow(2).sum() for x, y in zip(anchor + anchor0, (k, v, k, v))]
    assert err[0] < err[2] and err[1] < err[3]


def test_the_window_may_span_two_pages_and_pages_decode_alone():
    """2569 tokens in pages of 64: the last page has 5 rows, the one before 27 of the 32. Page
    by page (the transport's unit) equals the whole layer, at both stages."""
    codec, _ = codecs(page_size=64)
    k, v = kv(2569, seed=1)
    pages = codec.encode_pages(k, v)
    spans = page_spans(codec.config, 2569)
    rows = [window_rows(codec.config, s.body_start, s.token_end, 2569) for s in spans]
    assert rows[-2:] == [27, 5] and not any(rows[:-2])
    enc = codec.encode(k, v)
    for stage in ("anchor", "full"):
        whole = codec.decode(enc, stage)
        for p in pages:
            pk, pv = codec.decode_page(p.anchor, p.residual if stage == "full" else None,
                                       p.token_start, p.token_end, num_kv_heads=H, head_dim=D,
                                       dtype=k.dtype)
            assert torch.equal(pk, whole[0][:, p.token_start:p.token_end])
            assert torch.equal(pv, whole[1][:, p.token_start:p.token_end])


def test_layers_under_64_windows_and_the_paper_preset_have_none():
    """A window costs ~5.5 bits per value: it is sent only where it is at most a 64th of the
    layer, so that the anchor stays within 4.75 bits per value."""
    codec, plain = codecs()
    k, v = kv(32 * RECENT_SHARE)
    assert recent_window(codec.config, 32 * RECENT_SHARE - 1) == 0
    assert recent_window(codec.config, 32 * RECENT_SHARE) == 32
    assert torch.equal(codec.encode(k[:, :-1], v[:, :-1]).anchor,
                       plain.encode(k[:, :-1], v[:, :-1]).anchor)
    enc = codec.encode(k, v)
    assert enc.nbytes("anchor") > plain.encode(k, v).nbytes("anchor")
    assert enc.bits_per_value("anchor") <= 4.75
    assert lynx_npu.get_codec("lynx", preset="paper").config.recent_tokens == 0
    assert codec.config.recent_tokens == 32
    with pytest.raises(ValueError, match=r"recent_tokens=-1 must be in \[0, 1048576\]"):
        lynx_npu.get_codec("lynx", recent_tokens=-1)


def _last_page(codec, tokens=3000):
    k, v = kv(tokens)
    page = codec.encode_pages(k, v)[-1]
    span = page_spans(codec.config, tokens)[-1]
    slay = stream_layout(codec.config, H, D, k.dtype, span.num_tokens, span.num_sink)
    return page, slay, k.dtype


@pytest.mark.parametrize("rows, match", [
    (0, "declares a window of 0 recent rows; this page of 180 tokens may carry 1..32"),
    (33, "declares a window of 33 recent rows"),
    (31, "with its window of 31 recent rows the layout needs"),
])
def test_a_bad_window_is_refused_naming_it(rows, match):
    codec, _ = codecs()
    page, slay, dtype = _last_page(codec)
    anchor = page.anchor.clone()
    start = window_start(slay)
    anchor[start:start + 4] = torch.tensor(list(rows.to_bytes(4, "little")), dtype=torch.uint8)
    with pytest.raises(ValueError, match=match):
        codec.decode_page(anchor, None, page.token_start, page.token_end, num_kv_heads=H,
                          head_dim=D, dtype=dtype)


def test_a_window_for_a_codec_without_one_is_a_size_error():
    codec, plain = codecs()
    page, slay, dtype = _last_page(codec)
    with pytest.raises(ValueError, match=f"anchor page buffer has {page.anchor.numel()} bytes; "
                                         f"the layout needs {slay.anchor_nbytes}$"):
        plain.decode_page(page.anchor, None, page.token_start, page.token_end, num_kv_heads=H,
                          head_dim=D, dtype=dtype)
    truncated = page.anchor[:window_start(slay) + 2]
    with pytest.raises(ValueError, match=r"or more, with a window of 1\.\.32 recent rows"):
        codec.decode_page(truncated, None, page.token_start, page.token_end, num_kv_heads=H,
                          head_dim=D, dtype=dtype)


@pytest.mark.parametrize("grid", ["byte", "float16"])
def test_the_residual_stream_sends_the_window_rows_once(grid):
    """Pages of 64 over 2569 tokens (windows of 27 and 5 rows): each windowed page's residual
    is the window-less codec's less exactly its window's codes (the last page is all window:
    its residual goes whole, a frame carries at least one byte), and the full stage is bit
    for bit the window-less one's."""
    win, plain = codecs(page_size=64, scalar_grid=grid)
    k, v = kv(2569, seed=3)
    pages, pages0 = win.encode_pages(k, v), plain.encode_pages(k, v)
    spans = page_spans(win.config, 2569)
    r, cuts = win.config.residual_bits("k"), []
    for p, p0, s in zip(pages, pages0, spans):
        rows = window_rows(win.config, s.body_start, s.token_end, 2569)
        slay = stream_layout(win.config, H, D, k.dtype, s.num_tokens, s.num_sink)
        assert p.residual.numel() == residual_nbytes(win.config, slay, H, D, rows)
        cuts.append(rows_left_out(slay, rows))
        saved = p0.residual.numel() - p.residual.numel()
        assert saved == 2 * packed_nbytes(H * cuts[-1] * D, r) and p.residual.numel() > 0
        if rows:  # put back, the window's rows make the window-less residual
            whole = window_residual(p.anchor, slay, win.config, H, D, rows, p.residual)
            assert torch.equal(whole, p0.residual)
            assert torch.equal(trim_residual(whole, slay, win.config, H, D, rows), p.residual)
    assert cuts[-2:] == [27, 0] and not any(cuts[:-2])
    for x, x0 in zip(win.decode(win.encode(k, v), "full"),
                     plain.decode(plain.encode(k, v), "full")):
        assert torch.equal(x, x0)


def test_rows_that_do_not_end_on_a_byte_trim_and_merge_too():
    """head_dim 5 at 4 residual bits: a row is 2.5 bytes, so rows are cut from the unpacked
    codes; the round trip still gives the window-less residual."""
    win, plain = codecs(page_size=64)
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(2, 2100, 5, generator=g).to(torch.bfloat16) for _ in range(2))
    page, page0 = win.encode_pages(k, v)[-1], plain.encode_pages(k, v)[-1]
    span = page_spans(win.config, 2100)[-1]
    rows = window_rows(win.config, span.body_start, span.token_end, 2100)
    slay = stream_layout(win.config, 2, 5, k.dtype, span.num_tokens, span.num_sink)
    assert rows and (5 * win.config.residual_bits("v")) % 8
    assert torch.equal(window_residual(page.anchor, slay, win.config, 2, 5, rows, page.residual),
                       page0.residual)


def test_a_windowed_residual_of_the_wrong_size_is_refused_naming_both():
    codec, _ = codecs()
    page, slay, dtype = _last_page(codec)
    want = page.residual.numel()
    with pytest.raises(ValueError, match=f"residual page buffer has {want + 32} bytes; with its "
                                         f"window of 32 recent rows the layout needs {want}"):
        codec.decode_page(page.anchor, torch.cat([page.residual, page.residual[:32]]),
                          page.token_start, page.token_end, num_kv_heads=H, head_dim=D,
                          dtype=dtype)
