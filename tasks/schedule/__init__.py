"""The schedule stage: fusion into kernels, launch order and buffer plan, for every graph."""
