"""Test kit for dif and for backend authors: per-op conformance cases and dtype tolerances.

Import the submodules directly (`dif.testing.conformance`, `dif.testing.tolerances`); nothing here
imports pytest unless a pytest helper is called.
"""
