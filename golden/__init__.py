"""fusekit's golden data: NumPy references for each operator (independent of the C++ kernels)."""
