"""numba.cuda device code: one kernel family per module, each holding its kernels and their launchers."""
