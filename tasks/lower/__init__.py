"""The lower stage: aten ops to kiln's loop-level IR, one small lowering function per op."""

from tasks.lower import control, externs, indexing, pointwise, pooling, reductions, views  # noqa: F401  (fill the table)
