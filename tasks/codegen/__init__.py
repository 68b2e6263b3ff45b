"""Code generators: C++ kernels and (later) Triton kernels, and the C++ wrapper."""
