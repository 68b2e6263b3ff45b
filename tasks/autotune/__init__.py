"""autotune: every kernel's variants timed on random inputs; one record per kernel, cached per kernel."""
