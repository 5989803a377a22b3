"""What the catalog and the data path are both built on: the switchable cache layers
(:mod:`.caches`), the on-disk block cache (:mod:`.disk_cache`), the memory budget
(:mod:`.budget`), and every backend call bounded, counted and shared (:mod:`.accounting`,
:mod:`.singleflight`).

May import: the top-level modules and :mod:`rucio_fs.observe`.
"""
