"""Test helpers that ship with rucio-fs, for its own tests and for plugin authors.

:mod:`rucio_fs.testing.conformance` is the suite every backend passes (it needs pytest);
nothing here is imported by the mount itself.
"""
