"""The lower stage: aten ops to kiln's loop-level IR, one small lowering function per op."""

from tasks.lower import (  # noqa: F401  (fill the table)
    control,
    externs,
    indexing,
    norms,
    pointwise,
    pooling,
    reductions,
    scans,
    views,
)
