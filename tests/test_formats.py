import numpy as np
import pytest

import narrowmm as nm
from narrowmm._formats import FORMATS, get_format, operations
from narrowmm.providers.native import core


def test_python_and_c_format_tables_agree():
    c_table = list(core().formats())
    py_table = [(f.code, f.name, f.itemsize, int(f.scaled), f.scale_exponent, f.kpack,
                 int(f.offsets), int(f.half_scales), f.packed_xor) for f in FORMATS.values()]
    assert sorted(c_table) == sorted(py_table)


def test_storage_dtypes_match_item_sizes():
    for f in FORMATS.values():
        assert f.storage.itemsize == f.itemsize


@pytest.mark.parametrize("alias,name", [("float16", "fp16"), ("BF16", "bf16"), ("fp32", "f32")])
def test_aliases(alias, name):
    assert get_format(alias) is FORMATS[name]


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown format 'fp8'.*f32, fp16, bf16, e4m3fn, e5m2"):
        get_format("fp8")
    with pytest.raises(TypeError):
        get_format(16)


def test_operations_cover_matmul_for_all_and_codecs_for_narrow():
    pairs = {(op, f.name) for op, f in operations()}
    narrow = ("fp16", "bf16", "e4m3fn", "e5m2", "q8_0", "q4_0", "q4_1", "q5_1")
    assert pairs == ({("matmul", f) for f in ("f32", *narrow)}
                     | {(op, f) for op in ("encode", "decode") for f in narrow})


def test_f32_has_no_codec():
    with pytest.raises(ValueError, match="no codec"):
        nm.encode(np.zeros(3, np.float32), "f32")
