"""gen-cpp: the C++ wrapper that runs a schedule."""
