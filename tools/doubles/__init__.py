"""Test doubles shared by the tests and the benchmarks: stand-ins that speak the real protocol."""
