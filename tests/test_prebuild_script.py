"""scripts/prebuild.py builds the cubins under the keys the launchers look up: -arch=sm_90a
exactly where the kernel source declares it (the launchers' own option tuples), else none."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def prebuild():
    from helpers import load_script

    return load_script("scripts/prebuild.py", "prebuild_script")


def test_options_match_the_launchers(prebuild):
    from minfer.cuda.ops.attention import DEFAULT
    from minfer.cuda.paths.blk.launch import _OPTS as BLK_OPTS

    assert prebuild.options("mmq_blk", ()) == BLK_OPTS
    assert prebuild.options("attention_sm90a", ()) == ("-arch=sm_90a",)
    assert prebuild.options("dequant", ()) == ()
    shape_opts = DEFAULT.options()  # attention.cu's block shape, as its launcher passes
    assert prebuild.options("attention", shape_opts) == shape_opts


def test_no_argument_prints_the_usage(prebuild, capsys):
    assert prebuild.main([]) == 2
    assert "MINFER_CACHE=.cubin_cache" in capsys.readouterr().err
