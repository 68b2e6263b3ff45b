"""The cpu target: C++ kernels with SIMD and threading variants, timed on the host (tune.py),
each kernel's winner compiled to an object that link links into model.so."""
