"""The huge-page arena a load packs its weights into (narrowmm._arena): where the arrays
go, that they never overlap, what turns it off, and that the bits stay the same."""

from __future__ import annotations

import gc
import itertools
import threading

import numpy as np
import pytest
from conftest import assert_same_bits

import narrowmm as nm
from narrowmm import _arena
from narrowmm._arena import HUGE_PAGE, WeightArena, weight_arena, weights_empty
from narrowmm.bench.kernels import gguf_converted_weights


def span(a: np.ndarray) -> tuple[int, int]:
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def test_arrays_start_on_a_line_one_after_another_and_never_overlap():
    arena = WeightArena(chunk=4 * HUGE_PAGE)
    shapes = [((1,), np.uint8), ((100, 3), np.float32), ((0,), np.int8),
              ((777, 5), np.float16), ((5, 2, 3), np.int8)]
    arrays = [arena.empty(shape, dtype) for shape, dtype in shapes]
    for a, (shape, dtype) in zip(arrays, shapes, strict=True):
        assert a.shape == shape and a.dtype == dtype
        assert a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % 64 == 0 and arena.holds(a)
    for i, a in enumerate(arrays):
        a.view(np.uint8).fill(i + 1)
    for i, a in enumerate(arrays):  # no later array wrote over an earlier one
        assert (a.view(np.uint8) == i + 1).all()
    assert arrays[0].ctypes.data % HUGE_PAGE == 0  # the mapping starts on a huge page
    assert arena.mapped == 4 * HUGE_PAGE  # all in one mapping
    assert arena.handed_out == sum(a.nbytes for a in arrays)
    assert not arena.holds(np.zeros(4))


def test_a_full_mapping_starts_another_and_a_large_array_gets_its_own():
    arena = WeightArena(chunk=HUGE_PAGE)
    half = arena.empty(HUGE_PAGE // 2, np.uint8)
    rest = arena.empty(HUGE_PAGE // 2, np.uint8)  # fills the mapping exactly
    assert arena.mapped == HUGE_PAGE and rest.ctypes.data == half.ctypes.data + HUGE_PAGE // 2
    third = arena.empty(1, np.uint8)
    assert arena.mapped == 2 * HUGE_PAGE and third.ctypes.data % HUGE_PAGE == 0
    large = arena.empty(3 * HUGE_PAGE + 1, np.uint8)  # over half a mapping: its own
    assert arena.mapped == 6 * HUGE_PAGE and large.ctypes.data % HUGE_PAGE == 0
    after = arena.empty(10, np.uint8)  # the mapping being filled goes on
    assert arena.mapped == 6 * HUGE_PAGE and after.ctypes.data == third.ctypes.data + 64
    assert all(arena.holds(a) for a in (half, rest, third, large, after))


def test_an_array_outlives_its_arena():
    arena = WeightArena(chunk=HUGE_PAGE)
    a = arena.empty((1000,), np.float32)
    a[:] = np.arange(1000, dtype=np.float32)
    del arena
    gc.collect()
    assert (a == np.arange(1000, dtype=np.float32)).all()


@pytest.mark.parametrize("chunk", [0, HUGE_PAGE - 1, HUGE_PAGE + 4096, -HUGE_PAGE])
def test_a_chunk_that_is_no_multiple_of_a_huge_page_is_refused(chunk):
    with pytest.raises(ValueError, match=f"chunk must be a positive multiple of {HUGE_PAGE}"):
        WeightArena(chunk=chunk)


def test_a_negative_dimension_is_refused():
    with pytest.raises(ValueError, match="negative dimensions"):
        WeightArena().empty((3, -1), np.float32)


def test_a_mapping_the_system_refuses_is_a_memory_error_naming_its_size(monkeypatch):
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with pytest.raises(MemoryError, match=f"cannot map {2 * HUGE_PAGE} bytes for packed "
                                          "weights \\(Cannot allocate memory\\)"):
        WeightArena(chunk=HUGE_PAGE).empty(10, np.uint8)


def test_threads_drawing_at_once_get_disjoint_arrays():
    arena = WeightArena(chunk=HUGE_PAGE)
    spans: list[tuple[int, int]] = []
    keep: list[np.ndarray] = []
    lock = threading.Lock()

    def draw(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            a = arena.empty(int(rng.integers(1, 40000)), np.uint8)
            with lock:
                spans.append(span(a))
                keep.append(a)

    threads = [threading.Thread(target=draw, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 1200
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert arena.handed_out == sum(end - start for start, end in spans)


@pytest.fixture
def arena_on(monkeypatch):
    """The arena as this machine would open it, whatever its kernel's setting."""
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", "1")
    monkeypatch.setattr(_arena, "transparent_huge_pages", lambda: "madvise")


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "q4_k", "bf16"])
def test_weights_packed_within_an_arena_lie_in_it_with_the_same_bits(arena_on, fmt):
    """Packing (the slivers, the kernels' grid: binary16, float32 or factored) draws from
    the open arena and from NumPy outside it; the products are the same bits."""
    rng = np.random.default_rng(7)
    k, n = 512, 300
    if fmt == "q4_k":
        w = gguf_converted_weights(k, n, fmt, rng)
    elif fmt == "bf16":
        w = nm.Weights.encode(rng.standard_normal((k, n), dtype=np.float32), fmt)
    else:
        w = nm.Weights.quantize(rng.standard_normal((k, n), dtype=np.float32), fmt)
    outside = w.pack()
    with weight_arena() as arena:
        inside = w.pack()
        grid = inside.kernel_scales()[0] if inside.scales is not None else None
    after = weights_empty(16, np.float32)
    assert arena is not None and arena.holds(inside.bits)
    assert grid is None or arena.holds(grid)
    assert not arena.holds(outside.bits) and not arena.holds(after)
    x = rng.standard_normal((3, k), dtype=np.float32)
    assert_same_bits(nm.matmul(x, inside), nm.matmul(x, outside))


def test_layers_built_one_by_one_in_the_public_arena_share_it_with_the_same_bits(arena_on):
    """``nm.weight_arena()`` around layers made one at a time (``nm.Linear(..., pack=True)``
    from PyTorch's layout and from Weights): every layer's packed bits and grid lie in the
    one arena (the grid made at construction, not at the first call after the block), they
    outlive the block, and the outputs are those of layers built outside."""
    assert nm.weight_arena is weight_arena and nm.WeightArena is WeightArena
    rng = np.random.default_rng(11)
    k, n = 256, 200
    torch_layout = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    q8 = nm.Weights.quantize(rng.standard_normal((k, n), dtype=np.float32), "q8_0")
    with nm.weight_arena() as arena:
        inside = [nm.Linear(torch_layout, pack=True), nm.Linear(q8, pack=True)]
    outside = [nm.Linear(torch_layout, pack=True), nm.Linear(q8, pack=True)]
    assert arena is not None and arena.mapped == _arena.ARENA_CHUNK  # one mapping for all
    for layer in inside:
        assert arena.holds(layer.weights.bits)
        grid = layer.weights.kernel_scales()
        assert grid is None or arena.holds(grid[0])
    assert not any(arena.holds(layer.weights.bits) for layer in outside)
    gc.collect()
    x = rng.standard_normal((5, k), dtype=np.float32)
    for a, b in zip(inside, outside, strict=True):
        assert_same_bits(a(x), b(x))


@pytest.mark.parametrize("setting, thp", [("0", "madvise"), ("0", "always"), ("1", "never"),
                                          ("1", None)])
def test_no_arena_when_turned_off_or_without_transparent_huge_pages(monkeypatch, setting, thp):
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", setting)
    monkeypatch.setattr(_arena, "transparent_huge_pages", lambda: thp)
    with weight_arena() as arena:
        a = weights_empty((10, 3), np.float32)
    assert arena is None
    assert a.shape == (10, 3) and a.ctypes.data % 64 == 0


def test_a_bad_setting_is_refused_by_name_and_reported(monkeypatch, capsys):
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", "yes")
    with pytest.raises(nm.EnvironmentVariableError, match="NARROWMM_HUGE_PAGES must be 1"):
        with weight_arena():
            pass
    info = nm.runtime_info()
    assert info["huge_pages"]["enabled"] is None
    assert "NARROWMM_HUGE_PAGES" in info["environment_problems"]
    nm.show_runtime()
    assert ("a load's packed weights: unknown (NARROWMM_HUGE_PAGES is invalid) (see PROBLEM "
            "above)") in capsys.readouterr().out
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", "0")
    assert nm.runtime_info()["huge_pages"]["enabled"] is False
    assert "NARROWMM_HUGE_PAGES" not in nm.runtime_info()["environment_problems"]


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"),
                                        ("[always] madvise never\n", "always"),
                                        ("always madvise [never]\n", "never"),
                                        ("garbled\n", None)])
def test_the_kernels_mode_is_the_bracketed_word(tmp_path, monkeypatch, text, mode):
    setting = tmp_path / "enabled"
    setting.write_text(text)
    monkeypatch.setattr(_arena, "_THP_SETTING", str(setting))
    assert _arena.transparent_huge_pages() == mode
    monkeypatch.setattr(_arena, "_THP_SETTING", str(tmp_path / "absent"))
    assert _arena.transparent_huge_pages() is None


def smaps_field(address: int, field: str) -> str | None:
    """``field`` of the mapping holding ``address`` in /proc/self/smaps (None: no such
    field for it)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == field + ":":
                return line.split()[1]
    return None


def test_the_mappings_are_eligible_for_huge_pages():
    """On a kernel with transparent huge pages, the arena's mappings are advised for them
    (smaps' THPeligible: whether the kernel may back them so; whether it did depends on
    the memory free at the time)."""
    mode = _arena.transparent_huge_pages()
    if mode not in ("always", "madvise"):
        pytest.skip(f"this kernel's transparent huge pages are {mode or 'absent'}")
    arena = WeightArena()
    a = arena.empty(HUGE_PAGE, np.uint8)
    a.fill(1)
    eligible = smaps_field(a.ctypes.data, "THPeligible")
    if eligible is None:
        pytest.skip("this kernel's /proc/self/smaps has no THPeligible field")
    assert eligible == "1"
