"""The cuda target: Triton kernels with tiling variants and configs, tuned on the GPU (tune.py)
or, without one, compiled with their defaults for the arch; the winners' cubins are linked into
model.so as data and launched through the driver."""
