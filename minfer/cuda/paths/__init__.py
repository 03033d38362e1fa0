"""GEMM path families, one package each (docs/paths.md): f16/, the seeds' exact q8_1 int8
kernels (q8_1/: r1, narrow, wide-kd4, wide-kd8) and the block-scaled int8 path (blk/), each with
its record, launchers, upload and numpy twin; their common shape (base.py) and the table with
its chooser (table.py). Nothing outside this
folder names a path to decide what to do: it asks the path object."""

from minfer.cuda.paths.base import (
    Q4_K,
    Q6_K,
    RAW_BYTES,
    GemmPath,
    LinearRoute,
    Operand,
    Part,
    qname,
    upload_weight,
)
from minfer.cuda.paths.table import (
    BLK_AUTO_WIDTH,
    CHOICES,
    EMULATIONS,
    INT8_PATHS,
    TABLE,
    TIERS,
    VARIANTS,
    Route,
    Tier,
    auto_tiers,
    choose_path,
)

__all__ = [
    "Q4_K",
    "Q6_K",
    "RAW_BYTES",
    "GemmPath",
    "LinearRoute",
    "Operand",
    "Part",
    "upload_weight",
    "qname",
    "BLK_AUTO_WIDTH",
    "CHOICES",
    "EMULATIONS",
    "INT8_PATHS",
    "TABLE",
    "TIERS",
    "VARIANTS",
    "Route",
    "Tier",
    "auto_tiers",
    "choose_path",
]
