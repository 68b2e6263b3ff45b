"""link: model.so from the wrapper, the kernels' objects and kiln's runtime."""
